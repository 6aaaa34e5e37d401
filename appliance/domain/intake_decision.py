"""What a submission comes to once its source checks, dedupe and evaluation are known: its
status, campaign, reason, journey events, and the job it needs. Pure: the write unit of
services/intake reads the cap counters and the earlier leads, then asks this."""

from __future__ import annotations

import msgspec

from appliance.domain.approval import held_by_approval
from appliance.domain.campaign import Campaign
from appliance.domain.documents import first_job
from appliance.domain.lead import Approval, JourneyEvent, QualificationOutcome, RoutingOutcome
from appliance.domain.pipeline import Evaluation, event


class IntakeDecision(msgspec.Struct, frozen=True):  # a struct: made on every submit, and cheap to make
    status: str
    campaign: Campaign
    reason: str | None
    approval: Approval | None
    qualification: QualificationOutcome | None = None
    routing: RoutingOutcome | None = None
    events: list[JourneyEvent] = []
    job: str | None = None  # "deliver", "esign" (documents first), "evaluate" or none
    counts_against_caps: bool = False  # the lead takes a slot of its source's caps


def decide_intake(*, intake: Campaign, now: str, refused_at_source: str | None, duplicate_of: str | None,
                  evaluation: Evaluation | None, approval: Approval | None,
                  suppressed_by: str | None = None) -> IntakeDecision:
    """`refused_at_source`: the attestation problem or the cap reached, if any; `duplicate_of`:
    the earlier lead dedupe found; `evaluation`: routing and qualification (None when the source
    asked for a quick answer and the job loop evaluates later); `approval`: the lead's, as stored;
    `suppressed_by`: the name (or id) of the suppression list holding the lead's email or phone."""
    events: list[JourneyEvent] = []
    if refused_at_source is not None:
        events.append(event(now, "source_check", refused_at_source))
        return IntakeDecision("disqualified", intake, refused_at_source, approval, events=events, qualification=(
            QualificationOutcome(passed=False, score=0, method="source_check", reason=refused_at_source,
                                 qualified_at=now)))
    if suppressed_by is not None:
        reason = f"suppressed by list {suppressed_by}"  # the list, never the value it matched
        events.append(event(now, "suppressed", reason))
        return IntakeDecision("suppressed", intake, reason, approval, events=events)
    if duplicate_of is not None:
        reason = f"duplicate of {duplicate_of}"
        events.append(event(now, "dedupe", reason, details={"originalLeadId": duplicate_of}))
        return IntakeDecision("duplicate", intake, reason, approval, events=events)
    if evaluation is None:
        why = ("the campaign verifies the TrustedForm certificate first"
               if intake.qualification.tcpa_policy.ingestion_policy.verify_certificate
               else "shortCircuitSyncEvaluation is set on the source")
        events.append(event(now, "evaluation_deferred", why))
        return IntakeDecision("pending", intake, None, approval, events=events, job="evaluate",
                              counts_against_caps=True)
    status, campaign = evaluation.status, evaluation.campaign
    events.extend(evaluation.events)
    if evaluation.approval is not None:
        approval = evaluation.approval
    elif (held := held_by_approval(status, approval)) is not None:
        status = held
        events.append(event(now, "held_by_approval", f"the lead's approval is {approval.status}", campaign))
    job = first_job(campaign) if status == "qualified" else None
    if job:
        events.append(event(now, "delivery_scheduled" if job == "deliver" else "documents_scheduled", None, campaign))
    return IntakeDecision(status, campaign, evaluation.qualification.reason, approval, evaluation.qualification,
                          evaluation.routing, events, job, counts_against_caps=True)
