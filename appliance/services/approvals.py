"""POST /api/v1/leads/{leadId}/approve: the human review decisions (approved, rejected, pending).
Decisions on one lead are serialized by the one writer: each reads the lead inside its own write
unit. What a decision does, and when it comes too late, is decided in appliance/domain/approval."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from appliance.clock import iso
from appliance.domain.approval import starts_delivery, status_after_decision, too_late
from appliance.domain.documents import ESIGN_JOB, first_job
from appliance.domain.lead import Approval, ApprovalStatus
from appliance.domain.pipeline import event
from appliance.errors import InvalidState, NotFound
from appliance.model import Model
from appliance.runtime import Runtime
from appliance.services import audit
from appliance.services.lead_events import record_lead_events
from appliance.services.ledger import earn
from appliance.services.tenant_settings import TenantSettings
from appliance.storage import Session

# The audit log's action for each decision.
ACTIONS = {"approved": "lead.approve", "rejected": "lead.reject", "pending": "lead.approval_reset"}


class ApproveBody(Model):
    status: ApprovalStatus
    reason: Annotated[str, Meta(max_length=2000)] | None = None


class ApproveResult(Model):
    lead_id: str
    approval: Approval


async def decide(runtime: Runtime, settings: TenantSettings, tenant_id: str, decided_by: str, lead_id: str,
                 body: ApproveBody) -> ApproveResult:
    now_dt = runtime.clock.now()
    now = iso(now_dt)

    def unit(tx: Session) -> ApproveResult:
        lead = tx.leads.get_lead(tenant_id, lead_id)
        if lead is None:
            raise NotFound()
        if lead.approval is None:
            raise InvalidState(["approval: this lead has no approval on record"])
        submission = tx.leads.latest_submission(tenant_id, lead_id)
        # Checked in this write unit: the worker claims a delivery in a write unit too, and this
        # unit runs alone (SQLite's one writer; on PostgreSQL it names no locks, so it excludes
        # every other unit), so a claim committed before this read refuses the decision, and
        # one after it finds the lead as decided.
        # Any submission's: a resubmission does not stop an older one's attempt from posting.
        running = tx.jobs.lead_has_running_job(tenant_id, lead_id, "deliver")
        if (refusal := too_late(body.status, lead.status, delivery_running=running)) is not None:
            raise InvalidState([refusal])
        current = lead.approval.status
        if body.status != "pending" and current != "pending":
            raise InvalidState([f"approval: the decision is already {current}; reset it to pending first"])
        approval = Approval(status=body.status, campaign_id=lead.approval.campaign_id, decided_at=now,
                            decided_by=decided_by, reason=body.reason)
        # A qualified lead whose documents wait for their provider is `pending`: still governed.
        governed = "qualified" if lead.status == "pending" and submission is not None \
            and tx.jobs.has_open_job(submission.submission_id, ESIGN_JOB) else lead.status
        status = status_after_decision(governed, body.status)
        if submission is not None:
            if status in ("pending_action", "rejected") and status != lead.status:
                tx.jobs.cancel_waiting_jobs(submission.submission_id, now)  # none runs: refused above
            delivered = submission.delivery is not None and submission.delivery.success
            if starts_delivery(status, lead.status, delivered=delivered,
                               delivery_open=tx.jobs.has_open_job(submission.submission_id, "deliver")
                               or tx.jobs.has_open_job(submission.submission_id, ESIGN_JOB)):
                # The campaign's documents are sent after the review, before the delivery.
                tx.jobs.insert_job(tenant_id=tenant_id, kind=first_job(settings.campaigns.get(
                                   submission.campaign.campaign_id)), lead_id=lead_id,
                                   submission_id=submission.submission_id, due_at=now, now=now)
            submission = msgspec.structs.replace(
                submission, status=status if status != lead.status else submission.status, updated_at=now,
                journey_events=[*submission.journey_events,
                                event(now, f"approval_{body.status}", body.reason,
                                      details={"decidedBy": decided_by, "previous": current})])
            tx.leads.update_submission(tenant_id, submission)
        decided = msgspec.structs.replace(lead, status=status, approval=approval, updated_at=now)
        tx.leads.update_lead(tenant_id, decided)
        if submission is not None and status != lead.status:
            earn(tx, settings, tenant_id, decided, submission.submission_id, (status,), now_dt)
            record_lead_events(tx, settings, tenant_id, decided, submission, (status,), now)
        audit.record(tx, tenant_id, decided_by, ACTIONS[body.status], lead_id, now,
                     before={"status": lead.status, "approval": current},
                     after={"status": status, "approval": body.status, "reason": body.reason})
        return ApproveResult(lead_id=lead_id, approval=approval)

    return await runtime.store.write(unit, may_refuse=True)
