"""POST /api/v1/leads/{leadId}/repost and /deliver. The lead is read and checked, and
qualification runs, on a read snapshot (a prompt evaluator plugin may be slow: it must not hold
the single writer); then one write unit checks that the lead and its last submission are still as read (else 409: a concurrent repost,
approve or delivery got there first) and writes the lead, the new submission and its deliver
job together. Two concurrent reposts of one lead give one 201 and one 409. Sending is the job
loop's work: these only create `deliver` job rows (and wake the loop).

Order of answers: unknown lead (or another tenant's) 404, then a body reference that does not
resolve 400 (VALIDATION_ERROR naming the field), then the lead's state 409 (INVALID_STATE).

Repost (lead status failed, rejected, error or returned; anything else 409 naming the status). A
returned lead may be resold: typically a modified retry to another campaign, or `deliveryInfo` naming
another buyer's endpoint; its new submission can earn revenue (and be returned) again.
- Simple retry (no modifiedPayload, no campaignId): a new `repost` submission for the campaign of
  the last submission (still existing, active and not archived, else 409: use a modified retry),
  qualification skipped (`qualification.method` "skipped"), status qualified, a deliver job.
  `deliveryInfo.deliveryEndpointId` names another delivery endpoint of the tenant for this one
  delivery. It is recorded in the details of the submission's `repost` journey event
  (`{"deliveryEndpointId": ...}`), read back by `endpoint_override` (appliance/domain/delivery_target.py
  reads it the same way).
  `deliveryInfo` is honoured by a modified retry as well.
- Modified retry (modifiedPayload, which then needs campaignId; campaignId alone means a
  modified retry with no changes, i.e. re-qualification against that campaign): the payload
  (submit body field names, without leadId and campaignId) is merged into the lead as a
  resubmission would be (names re-normalized, field library rules checked; problems are named
  `modifiedPayload.<field>`), then the lead is qualified against campaignId only.
  Disqualified: the submission and the lead become disqualified, no job (requiresQualification
  is still true: the answer says re-qualification happened, not that it passed).
- A pending approval refuses a repost (409: decide it first), except on a failed lead, whose
  approval can no longer be decided (an earlier version left some so): it is overridden as a
  rejected one is. A rejected approval is overridden: reposting is the operator's explicit
  decision to send the lead, so when the repost schedules a delivery the approval becomes
  `approved`, decidedBy the caller's key id, and an `approval_approved` journey event says it
  came from the repost.

Deliver (body {campaignId}): a new `manual_delivery` submission, routingMethod `manual`,
qualification against that campaign then a deliver job when it passes; disqualified: the
submission and lead become disqualified, no job. Refused (409) when the approval is pending or
rejected, when the lead is already delivered, and while processing of the lead
is under way (pending: the engine has not run yet; qualified or queued: a delivery is scheduled),
since a second submission would race it and could deliver twice. Every other status (new,
pending_action, disqualified, duplicate, failed, rejected with the approval reset, error) may be
delivered manually.

Both manual flows are human decisions: no routing, no fallback campaigns (the caller chose the
campaign), the campaign's first intake action does not hold the lead again and a review-severity
rule does not hold it either (recorded as a `review_waived` event); disqualifying rules still
apply. Ingestion-only steps (source caps, source TCPA attestation, dedupe, cost milestones) are
not run again: the lead was ingested already. A delivery already running for the lead (job state
running) refuses both with 409; ready or held jobs of the last submission are cancelled."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from appliance.clock import iso
from appliance.domain.campaign import Campaign
from appliance.domain.delivery_target import REPOST_EVENT, delivery_endpoint_id
from appliance.domain.lead import (
    REPOSTABLE, Approval, JourneyEvent, LeadRecord, QualificationOutcome, RoutingOutcome,
    Submission,
)
from appliance.domain.pipeline import PromptEvaluator, evaluate, event, snapshot, usable
from appliance.domain.submission import LeadData, SubmitLead, build_lead, facts_of, field_library_problems
from appliance.errors import InvalidState, NotFound, ValidationFailed
from appliance.ids import floor_id, new_id
from appliance.model import Model
from appliance.runtime import Runtime
from appliance.services import audit
from appliance.services.lead_events import record_lead_events
from appliance.services.lead_updates import parse_iso
from appliance.services.ledger import earn
from appliance.services.tenant_settings import TenantSettings
from appliance.storage import DELIVERY_ENDPOINTS, Session

CampaignId = Annotated[str, Meta(min_length=1, max_length=64)]
# Lead statuses a manual delivery refuses: done, or processing under way that it would race.
NOT_DELIVERABLE = {"delivered": "already delivered",
                   "pending": "still waiting for the engine to evaluate it",
                   "qualified": "already scheduled for delivery",
                   "signed": "already scheduled for delivery",
                   "queued": "already queued for delivery"}


class DeliveryInfo(Model):
    delivery_endpoint_id: Annotated[str, Meta(min_length=1, max_length=128)] | None = None


class ModifiedPayload(LeadData):
    """SubmitLead's lead data fields (every one but leadId and campaignId), same rules."""


class RepostBody(Model):
    delivery_info: DeliveryInfo | None = None
    modified_payload: ModifiedPayload | None = None
    campaign_id: CampaignId | None = None


class RepostResult(Model):
    new_submission_id: str
    lead_id: str
    requires_qualification: bool


class DeliverBody(Model):
    campaign_id: CampaignId


class DeliverResult(Model):
    new_submission_id: str
    lead_id: str


# ---- shared steps --------------------------------------------------------------------------------


def _read(runtime: Runtime, tenant_id: str, lead_id: str) -> tuple[LeadRecord, Submission | None, set[str]]:
    """The lead, its last submission and the tenant's delivery endpoint ids, as of one commit."""
    tx = runtime.store.reader()
    with tx:
        lead = tx.leads.get_lead(tenant_id, lead_id)
        if lead is None:
            raise NotFound()
        previous = tx.leads.latest_submission(tenant_id, lead_id)
        endpoints = tx.catalog.doc_ids(DELIVERY_ENDPOINTS, tenant_id)
    return lead, previous, endpoints


def _still_as_read(tx: Session, tenant_id: str, lead: LeadRecord, previous: Submission | None) -> None:
    """Inside the write unit: what was decided from the read still holds. Qualification runs
    before the write transaction (a prompt evaluator plugin may be slow and must not hold the
    writer), so a lead changed in between (a concurrent repost, approve, delivery) refuses."""
    current = tx.leads.get_lead(tenant_id, lead.lead_id)
    if current is None:
        raise NotFound()
    latest = tx.leads.latest_submission(tenant_id, lead.lead_id)
    if current != lead or (latest is None) != (previous is None) or (
            latest is not None and previous is not None
            and (latest.submission_id, latest.updated_at) != (previous.submission_id, previous.updated_at)):
        raise InvalidState([f"lead: it changed while this request was handled (now {current.status}); "
                            "read it again and retry"])
    if tx.jobs.lead_has_running_job(tenant_id, lead.lead_id):
        raise InvalidState(["lead: a delivery attempt is running for this lead; try again when it ends"])


def _audited(lead: LeadRecord, submission: Submission | None) -> dict[str, Any]:
    """What the audit log keeps of a lead a repost or delivery changes."""
    return {"status": lead.status, "submissionId": submission.submission_id if submission else None,
            "campaignId": lead.campaign_id}


def _qualify_manually(lead: LeadRecord, campaign: Campaign, settings: TenantSettings, now_dt: datetime, now: str,
                      prompt_evaluator: PromptEvaluator | None
                      ) -> tuple[str, QualificationOutcome, RoutingOutcome, list[JourneyEvent]]:
    """Qualification against `campaign` alone: no routing, no fallback, no first intake action,
    a review hold waived. Status qualified or disqualified."""
    chosen = msgspec.structs.replace(
        campaign, first_intake_action=msgspec.structs.replace(campaign.first_intake_action, enabled=False),
        qualification=msgspec.structs.replace(campaign.qualification, fallback_campaigns=[]))
    found = evaluate(facts_of(lead), chosen, settings.campaigns, None, value_sets=settings.value_sets,
                     today=now_dt.date(), now=now, route=False, prompt_evaluator=prompt_evaluator)
    events = [e for e in found.events if e.type != "held_for_review"]
    status = found.status
    if status == "pending_action":  # only a review-severity rule can hold here
        status = "qualified"
        events.append(event(now, "review_waived", found.qualification.reason, campaign,
                            {"why": "a manual repost or delivery is itself the human decision"}))
    if campaign.first_intake_action.enabled and status == "qualified":
        events.append(event(now, "first_intake_action_skipped", campaign.first_intake_action.action, campaign,
                            {"why": "a manual repost or delivery is itself the human decision"}))
    return status, found.qualification, found.routing, events


def _store(tx: Session, settings: TenantSettings, tenant_id: str, lead: LeadRecord, previous: Submission | None, *,
           campaign: Campaign, status: str, flow_type: str, qualification: QualificationOutcome,
           routing: RoutingOutcome, events: list[JourneyEvent], approval: Approval | None, now_dt: datetime,
           names_changed: bool = False) -> str:
    """The new submission, the lead's new state, the milestones it earns and (qualified) the
    deliver job."""
    now = iso(now_dt)
    if previous is not None:
        tx.jobs.cancel_open_jobs(previous.submission_id, now)
    number = max(lead.submission_count, previous.submission_number if previous else 0) + 1
    if status == "qualified":
        events = [*events, event(now, "delivery_scheduled", None, campaign)]
    client, offer = campaign.client, campaign.offer
    submission = Submission(
        submission_id=new_id("sub"), lead_id=lead.lead_id, submission_number=number, campaign=snapshot(campaign),
        status=status, qualification=qualification, routing=routing,
        result=qualification.reason if status == "disqualified" else None,
        journey_events=events, flow_type=flow_type, submitted_at=now,
        qualified_at=now if status == "qualified" else None, created_at=now, updated_at=now)
    lead = msgspec.structs.replace(
        lead, status=status, campaign_id=campaign.campaign_id, client_id=client.client_id if client else None,
        offer_id=offer.offer_id if offer else None, approval=approval, submission_count=number, updated_at=now)
    tx.leads.update_lead(tenant_id, lead, names_changed=names_changed)
    tx.leads.insert_submission(tenant_id, submission)
    earn(tx, settings, tenant_id, lead, submission.submission_id, (status,), now_dt, campaign=campaign)
    record_lead_events(tx, settings, tenant_id, lead, submission, (status,), now)
    if status == "qualified":
        tx.jobs.insert_job(tenant_id=tenant_id, kind="deliver", lead_id=lead.lead_id,
                           submission_id=submission.submission_id, due_at=now, now=now)
    return submission.submission_id


# ---- repost ----------------------------------------------------------------------------------

async def repost(runtime: Runtime, settings: TenantSettings, tenant_id: str, actor: str, lead_id: str,
                 body: RepostBody, prompt_evaluator: PromptEvaluator | None = None, *,
                 action: str = "lead.repost") -> RepostResult:
    """`action` names the change in the audit log (redeliver's own)."""
    if body.modified_payload is not None and body.campaign_id is None:
        raise ValidationFailed(["campaignId: required with modifiedPayload"])
    modified = body.campaign_id is not None
    endpoint_id = body.delivery_info.delivery_endpoint_id if body.delivery_info else None
    now_dt = runtime.clock.now()
    now = iso(now_dt)
    stored, previous, endpoints = _read(runtime, tenant_id, lead_id)

    problems: list[str] = []
    target = None
    if modified:
        try:
            target = settings.usable_campaign(body.campaign_id)
        except ValidationFailed as exc:
            problems += exc.details or []
    if endpoint_id is not None and endpoint_id not in endpoints:
        problems.append("deliveryInfo.deliveryEndpointId: unknown delivery endpoint")
    lead = stored
    if body.modified_payload is not None:
        payload = body.modified_payload
        merged = SubmitLead(campaign_id=body.campaign_id,
                            **{name: getattr(payload, name) for name in payload.__struct_fields__})
        lead, found = build_lead(merged, lead_id=stored.lead_id, existing=stored, labels=settings.labels,
                                 region=runtime.config.defaults.region, now=now)
        found += field_library_problems(facts_of(lead), settings.checked_fields, now_dt.date())
        problems += [f"modifiedPayload.{p}" for p in found]
    if problems:
        raise ValidationFailed(problems)

    if stored.status not in REPOSTABLE:
        raise InvalidState([f"status: the lead is {stored.status}; only failed, rejected, error or returned "
                            "leads can be reposted"])
    # A failed lead's approval can no longer be decided (appliance/domain/approval.py): a pending
    # one, left by an earlier version, is overridden as a rejection is, or the lead stays stuck.
    if stored.approval is not None and stored.approval.status == "pending" and stored.status != "failed":
        raise InvalidState(["approval: the lead's approval is pending; decide it first"])
    details: dict[str, Any] = {"mode": "modified" if modified else "simple", "requestedBy": actor,
                               "previousStatus": stored.status,
                               "previousSubmissionId": previous.submission_id if previous else None}
    if endpoint_id is not None:
        details["deliveryEndpointId"] = endpoint_id

    if target is None:  # simple retry
        campaign_id = previous.campaign.campaign_id if previous else stored.campaign_id
        target = settings.campaigns.get(campaign_id) if campaign_id else None
        if target is None or not usable(target):
            raise InvalidState([f"campaign: {campaign_id or 'the last campaign'} of the last submission is not "
                                "an active campaign; repost with modifiedPayload and campaignId"])
        events = [event(now, REPOST_EVENT, f"simple retry after {stored.status}", target, details)]
        status = "qualified"
        qualification = QualificationOutcome(passed=True, method="skipped",
                                             reason="simple retry: qualification skipped", qualified_at=now)
        routing = RoutingOutcome(was_routed=False, original_campaign_id=target.campaign_id,
                                 routing_method="original", routing_reason="simple retry of the last campaign",
                                 routing_evaluated_at=now)
    else:
        events = [event(now, REPOST_EVENT, f"modified retry after {stored.status}", target, details)]
        status, qualification, routing, found_events = _qualify_manually(lead, target, settings, now_dt, now,
                                                                         prompt_evaluator)
        events += found_events

    approval = lead.approval
    approval_word = {"rejected": "rejection", "pending": "pending approval"}
    if status == "qualified" and approval is not None and approval.status in approval_word:
        approval = Approval(status="approved", campaign_id=target.campaign_id, decided_at=now, decided_by=actor,
                            reason="approved by repost")
        events.append(event(now, "approval_approved", f"repost overrides the {approval_word[lead.approval.status]}",
                            target, {"decidedBy": actor, "previous": lead.approval.status, "via": "repost"}))
    campaign = target

    def unit(tx: Session) -> RepostResult:
        _still_as_read(tx, tenant_id, stored, previous)
        submission_id = _store(tx, settings, tenant_id, lead, previous, campaign=campaign, status=status,
                               flow_type="repost", qualification=qualification, routing=routing, events=events,
                               approval=approval, now_dt=now_dt, names_changed=lead is not stored)
        audit.record(tx, tenant_id, actor, action, lead_id, now, before=_audited(stored, previous),
                     after={"status": status, "submissionId": submission_id, "campaignId": campaign.campaign_id,
                            "mode": details["mode"], "deliveryEndpointId": endpoint_id})
        return RepostResult(new_submission_id=submission_id, lead_id=lead_id, requires_qualification=modified)

    return await runtime.store.write(unit, may_refuse=True)


# ---- manual delivery ---------------------------------------------------------------------------

async def deliver(runtime: Runtime, settings: TenantSettings, tenant_id: str, actor: str, lead_id: str,
                  body: DeliverBody, prompt_evaluator: PromptEvaluator | None = None) -> DeliverResult:
    now_dt = runtime.clock.now()
    now = iso(now_dt)
    lead, previous, _ = _read(runtime, tenant_id, lead_id)
    campaign = settings.usable_campaign(body.campaign_id)
    if lead.approval is not None and lead.approval.status in ("pending", "rejected"):
        raise InvalidState([f"approval: the lead's approval is {lead.approval.status}; "
                            "a lead with a pending or rejected approval cannot be delivered"])
    if lead.status in NOT_DELIVERABLE:
        raise InvalidState([f"status: the lead is {lead.status} ({NOT_DELIVERABLE[lead.status]})"])
    events = [event(now, "manual_delivery", f"manual delivery to {campaign.campaign_id}", campaign,
                    {"requestedBy": actor, "previousStatus": lead.status,
                     "previousSubmissionId": previous.submission_id if previous else None})]
    status, qualification, routing, found_events = _qualify_manually(lead, campaign, settings, now_dt, now,
                                                                     prompt_evaluator)
    events += found_events
    routing = msgspec.structs.replace(routing, routing_method="manual",
                                      routing_reason=f"manual delivery to {campaign.campaign_id}")

    def unit(tx: Session) -> DeliverResult:
        _still_as_read(tx, tenant_id, lead, previous)
        submission_id = _store(tx, settings, tenant_id, lead, previous, campaign=campaign, status=status,
                               flow_type="manual_delivery", qualification=qualification, routing=routing,
                               events=events, approval=lead.approval, now_dt=now_dt)
        audit.record(tx, tenant_id, actor, "lead.deliver", lead_id, now, before=_audited(lead, previous),
                     after={"status": status, "submissionId": submission_id, "campaignId": campaign.campaign_id})
        return DeliverResult(new_submission_id=submission_id, lead_id=lead_id)

    return await runtime.store.write(unit, may_refuse=True)


# ---- redeliver ---------------------------------------------------------------------------------

MAX_REDELIVER = 10_000
LeadIdText = Annotated[str, Meta(min_length=1, max_length=64)]


class RedeliverBody(Model):
    """Which leads to send again: every one at `status` that matches every filter given."""
    status: Literal["failed", "error", "queued"]
    campaign_ids: Annotated[list[CampaignId], Meta(max_length=100)] | None = None
    delivery_endpoint_id: Annotated[str, Meta(min_length=1, max_length=128)] | None = None
    start_date: Annotated[str, Meta(max_length=64)] | None = None
    end_date: Annotated[str, Meta(max_length=64)] | None = None
    lead_ids: Annotated[list[LeadIdText], Meta(max_length=MAX_REDELIVER)] | None = None


class RedeliverResult(Model):
    matched: int       # leads at the status that match the filters (at most 10,000 are looked at)
    reposted: int      # sent again: a simple-retry repost, or a queued delivery tried at once
    skipped: list[str]  # why the others were not (lead id: reason), the first 100


def _date_bound(field: str, text: str | None, *, end: bool) -> str | None:
    if text is None:
        return None
    parsed = parse_iso(text)
    if parsed is None:
        raise ValidationFailed([f"{field}: must be an ISO 8601 date or timestamp"])
    moment, bare_date = parsed
    epoch_ms = int(moment.timestamp() * 1000)
    if end:  # inclusive: a date through the end of that UTC day
        epoch_ms += 86_400_000 if bare_date else 1
    return floor_id("lead", epoch_ms)


async def redeliver(runtime: Runtime, settings: TenantSettings, tenant_id: str, actor: str,
                    body: RedeliverBody) -> RedeliverResult:
    """Failed and error leads get a simple-retry repost each (as POST /leads/{id}/repost with no
    body); a queued lead's waiting delivery is tried at once (a raised cap or a widened window
    takes effect now). Each lead is its own write, so one refusal does not undo the others, and
    a call sent twice sends nothing twice: a lead sent again is no longer at `status`."""
    problems = [f"campaignIds[{i}]: unknown campaign" for i, c in enumerate(body.campaign_ids or [])
                if c not in settings.campaigns]
    after = _date_bound("startDate", body.start_date, end=False)
    before = _date_bound("endDate", body.end_date, end=True)
    if after is not None and before is not None and before <= after:
        problems.append("endDate: must not be before startDate")
    tx = runtime.store.reader()
    endpoints = tx.catalog.doc_ids(DELIVERY_ENDPOINTS, tenant_id)
    if body.delivery_endpoint_id is not None and body.delivery_endpoint_id not in endpoints:
        problems.append("deliveryEndpointId: unknown delivery endpoint")
    if problems:
        raise ValidationFailed(problems)
    with tx:
        if body.lead_ids is not None:
            leads = [lead for lead in tx.leads.get_leads(tenant_id, list(dict.fromkeys(body.lead_ids)))
                     if lead.status == body.status and (after is None or lead.lead_id >= after)
                     and (before is None or lead.lead_id < before)
                     and (not body.campaign_ids or lead.campaign_id in body.campaign_ids)]
        else:
            ids = tx.leads.ids_with_status(tenant_id, body.status, campaign_ids=body.campaign_ids or (),
                                           after_id=after, before_id=before, limit=MAX_REDELIVER)
            leads = tx.leads.get_leads(tenant_id, ids)
        if body.delivery_endpoint_id is not None:
            leads = [lead for lead in leads if _endpoint_of(tx, settings, tenant_id, lead) == body.delivery_endpoint_id]
    reposted, skipped = 0, []
    for lead in leads:
        try:
            if body.status == "queued":
                reposted += await _deliver_queued_now(runtime, tenant_id, actor, lead.lead_id)
            else:
                await repost(runtime, settings, tenant_id, actor, lead.lead_id, RepostBody(), action="lead.redeliver")
                reposted += 1
        except (InvalidState, NotFound) as exc:  # changed meanwhile, or not repostable as it stands
            if len(skipped) < 100:
                skipped.append(f"{lead.lead_id}: {'; '.join(exc.details or []) or 'not found'}")
    return RedeliverResult(matched=len(leads), reposted=reposted, skipped=skipped)


def _endpoint_of(tx: Session, settings: TenantSettings, tenant_id: str, lead: LeadRecord) -> str | None:
    submission = tx.leads.latest_submission(tenant_id, lead.lead_id)
    campaign = settings.campaigns.get(submission.campaign.campaign_id if submission else lead.campaign_id or "")
    return delivery_endpoint_id(submission, campaign) if submission is not None and campaign is not None else None


async def _deliver_queued_now(runtime: Runtime, tenant_id: str, actor: str, lead_id: str) -> int:
    now = iso(runtime.clock.now())

    def unit(tx: Session) -> int:
        lead = tx.leads.get_lead(tenant_id, lead_id)
        submission = tx.leads.latest_submission(tenant_id, lead_id)
        if lead is None or submission is None or lead.status != "queued":
            raise InvalidState([f"status: the lead is {lead.status if lead else 'gone'}, no longer queued"])
        if not tx.jobs.due_now(submission.submission_id, now):
            return 0
        audit.record(tx, tenant_id, actor, "lead.redeliver", lead_id, now, before=_audited(lead, submission),
                     after={"status": "queued", "submissionId": submission.submission_id, "dueAt": now})
        return 1

    return await runtime.store.write(unit, may_refuse=True)
