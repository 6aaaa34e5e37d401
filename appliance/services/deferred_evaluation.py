"""Routing and qualifying a lead after its submit answered (`evaluate` jobs): a source that asks
for a quick answer (`shortCircuitSyncEvaluation`), or a campaign that verifies TrustedForm
certificates, leaves the lead `pending` for the claim loop (jobs/delivery.py) to bring here. The
certificate is claimed first, then the campaign's verification steps run, then routing and
qualification; a qualified lead gets its `deliver` job."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import timedelta

import httpx
import msgspec

from appliance.adapters import trustedform
from appliance.clock import Clock, iso
from appliance.domain.approval import held_by_approval
from appliance.domain.documents import first_job
from appliance.domain.pipeline import evaluate, snapshot
from appliance.domain.submission import facts_of
from appliance.domain.verification import apply_verdict
from appliance.domain.webhooks import RETRY_SCHEDULE
from appliance.plugins import Registry
from appliance.runtime import Runtime
from appliance.services.delivery_attempt import Attempt, ClaimedWrite, settle
from appliance.services.intake import run_intake_action
from appliance.services.verification import verify_lead
from appliance.storage import Job, Session

log = logging.getLogger("appliance.delivery")


async def evaluate_later(runtime: Runtime, registry: Registry, write: ClaimedWrite, job: Job, attempt: Attempt | None,
                         http: httpx.AsyncClient) -> None:
    """`write`: the claim loop's writes, each committed only while it holds the job."""
    clock = runtime.clock
    now = iso(clock.now())
    if attempt is None:
        await write(job, lambda tx: tx.jobs.finish(job.job_id, "dead", now, "lead missing"))
        return
    intake = attempt.settings.campaigns.get(attempt.submission.campaign.campaign_id)
    if intake is None:
        await write(job, lambda tx: settle(tx, clock, attempt, None, "error", "campaign no longer exists",
                                           job_state="dead"))
        return
    claimed: dict | None = None  # compliance.trustedForm, when the campaign verifies certificates
    if intake.qualification.tcpa_policy.ingestion_policy.verify_certificate:
        claim = await _claim_certificate(runtime, attempt, http)
        if claim.kind == "retry":
            await write(job, lambda tx: _claim_later(tx, clock, attempt, claim))
            return
        claimed = claim.stored()
        attempt = replace(attempt, lead=msgspec.structs.replace(
            attempt.lead, compliance={**attempt.lead.compliance, "trustedForm": claimed}))
        if claim.kind == "failed":
            failed, reason = attempt, claim.reason or "TrustedForm certificate could not be verified"

            def disqualify(tx: Session) -> None:
                _store_claim(tx, failed, claimed)
                settle(tx, clock, failed, None, "disqualified", reason, job_state="done",
                       event_kind="trustedform_failed", details={"statusCode": claim.status_code})

            await write(job, disqualify)
            log.info("TrustedForm certificate of %s not verified: %s", job.lead_id, reason)
            return
    source = next((s for s in intake.ingestion.sources if s.source_id == attempt.lead.source_id), None)
    facts = facts_of(attempt.lead)
    verdict = None
    if intake.qualification.verifications:
        lead, verdict = await verify_lead(runtime, registry, intake, attempt.lead, facts, job.tenant_id, clock.now(),
                                          http)
        attempt = replace(attempt, lead=lead)
    evaluation = evaluate(facts, intake, attempt.settings.campaigns, source,
                          value_sets=attempt.settings.value_sets, today=attempt.now.date(), now=now,
                          prompt_evaluator=registry.prompt_evaluator())
    if verdict is not None:
        evaluation = apply_verdict(evaluation, verdict, now)

    def unit(tx: Session) -> None:
        status, reason = evaluation.status, evaluation.qualification.reason or evaluation.status
        if claimed is not None:
            _store_claim(tx, attempt, claimed)
        if verdict is not None and verdict.results:
            _store_verification(tx, attempt)
        stored = tx.leads.get_lead(job.tenant_id, job.lead_id)
        stored_approval = stored.approval if stored is not None and evaluation.approval is None else None
        if (held := held_by_approval(status, stored_approval)) is not None:
            status, reason = held, f"the lead's approval is {stored_approval.status}"
        evaluated = replace(attempt, events=(*attempt.events, *evaluation.events),
                            submission=msgspec.structs.replace(
                                attempt.submission, campaign=snapshot(evaluation.campaign),
                                qualification=evaluation.qualification, routing=evaluation.routing,
                                qualified_at=evaluation.qualification.qualified_at))
        submission = tx.leads.get_submission(job.tenant_id, job.submission_id)
        if submission is not None:
            tx.leads.update_submission(job.tenant_id, msgspec.structs.replace(
                submission, qualification=evaluation.qualification, routing=evaluation.routing,
                qualified_at=evaluation.qualification.qualified_at))
        settle(tx, clock, evaluated, None, status, reason, job_state="done", event_kind="evaluated")
        if evaluation.approval is not None:
            lead = tx.leads.get_lead(job.tenant_id, job.lead_id)
            if lead is not None:
                tx.leads.update_lead(job.tenant_id, msgspec.structs.replace(lead, approval=evaluation.approval))
        if status == "qualified":
            tx.jobs.insert_job(tenant_id=job.tenant_id, kind=first_job(evaluation.campaign), lead_id=job.lead_id,
                               submission_id=job.submission_id, due_at=now, now=now)

    await write(job, unit)
    if evaluation.intake_action in ("engage", "workflow"):
        run_intake_action(registry, evaluation.campaign, attempt.lead, job.submission_id, evaluation.intake_action)


async def _claim_certificate(runtime: Runtime, attempt: Attempt, http: httpx.AsyncClient) -> trustedform.Claim:
    """Claim the lead's TrustedForm certificate (the submit made sure it has a URL)."""
    cert_url = attempt.lead.compliance.get("trustedFormCertUrl")
    if not isinstance(cert_url, str) or not cert_url:
        return trustedform.Claim("failed", "TrustedForm certificate could not be verified: "
                                           "compliance.trustedFormCertUrl is missing")
    return await trustedform.claim(http, runtime.config.plugins.trustedform, cert_url, lead_id=attempt.lead.lead_id,
                                   allow_private=runtime.config.delivery.allow_private_addresses)


def _store_claim(tx: Session, attempt: Attempt, claimed: dict) -> None:
    """`compliance.trustedForm` on the stored lead, when this is still its latest submission."""
    lead = tx.leads.get_lead(attempt.job.tenant_id, attempt.lead.lead_id)
    if lead is None or lead.submission_count != attempt.submission.submission_number:
        return
    tx.leads.update_lead(attempt.job.tenant_id, msgspec.structs.replace(
        lead, compliance={**lead.compliance, "trustedForm": claimed}))


def _store_verification(tx: Session, attempt: Attempt) -> None:
    """The steps' results on the stored lead, when this is still its latest submission."""
    lead = tx.leads.get_lead(attempt.job.tenant_id, attempt.lead.lead_id)
    if lead is None or lead.submission_count != attempt.submission.submission_number:
        return
    tx.leads.update_lead(attempt.job.tenant_id, msgspec.structs.replace(lead, verification=attempt.lead.verification))


def _claim_later(tx: Session, clock: Clock, attempt: Attempt, claim: trustedform.Claim) -> None:
    """TrustedForm could not answer: the lead waits at `pending`, the claim is tried again on
    the webhooks' schedule (about a day and a half), then the lead ends at `error`."""
    now_dt = clock.now()
    attempts = attempt.job.attempts
    if attempts > len(RETRY_SCHEDULE):
        settle(tx, clock, attempt, None, "error", f"{claim.reason}; TrustedForm did not answer after {attempts}"
               " attempts", job_state="dead", event_kind="trustedform_error",
               details={"attempt": attempts, "statusCode": claim.status_code})
        return
    due = iso(now_dt + timedelta(seconds=float(RETRY_SCHEDULE[attempts - 1])))
    tx.jobs.reschedule(attempt.job.job_id, due, iso(now_dt), error=claim.reason)
    settle(tx, clock, attempt, None, None, f"{claim.reason}; claim retry {attempts + 1} at {due}",
           job_state=None, event_kind="trustedform_error",
           details={"attempt": attempts, "statusCode": claim.status_code})
