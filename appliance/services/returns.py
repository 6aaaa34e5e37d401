"""POST /api/v1/leads/{leadId}/return: a buyer sends a delivered lead back.

One write unit reads the lead and its latest submission, checks the return (appliance/domain/returns:
the lead is `delivered`, inside the return window of the endpoint that delivered it, counted from
`delivery.deliveredAt` on the runtime clock), then writes together: the lead and the submission
`returned` (the submission with a `returned` journey event carrying the reason, the note and the
key that returned it), one `return` entry per currency reversing the revenue that delivery
earned, and the milestones whose `leadStatus` is `returned`. A refusal writes nothing.

The endpoint is the one the delivery went to (its journey event names it), else the delivery
endpoint of the submission's campaign; when it (or the campaign) no longer exists, the
default window of 30 days applies. A returned lead may be reposted (resold); its new submission
can be delivered and returned again, and the reversal of each delivery is kept once."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from appliance.clock import iso
from appliance.domain.delivery_target import delivery_endpoint_id
from appliance.domain.endpoint import DeliveryEndpoint
from appliance.domain.lead import Submission
from appliance.domain.pipeline import event
from appliance.domain.returns import DEFAULT_RETURN_WINDOW_DAYS, RETURNED, return_refusal, reversal_lines
from appliance.errors import InvalidState, NotFound
from appliance.model import Model
from appliance.runtime import Runtime
from appliance.services import audit, balances
from appliance.services.lead_events import record_lead_events
from appliance.services.ledger import LedgerEntry, earn
from appliance.services.tenant_settings import TenantSettings
from appliance.storage import DELIVERY_ENDPOINTS, LedgerFilter, Session

RETURN_EVENT = "returned"


class ReturnBody(Model):
    # At least one character that is not white space.
    reason: Annotated[str, Meta(min_length=1, max_length=500, pattern=r"\S")]
    note: Annotated[str, Meta(max_length=2000)] | None = None


class ReturnResult(Model):
    lead_id: str
    status: Literal["returned"]
    entry: LedgerEntry | None  # the (first) return entry; null when the delivery earned no revenue


def delivering_endpoint(tx: Session, settings: TenantSettings, tenant_id: str,
                        submission: Submission | None) -> tuple[str | None, DeliveryEndpoint | None]:
    """(id, stored endpoint) of the endpoint `submission` was delivered through, else its
    campaign's; the endpoint None when it no longer exists."""
    if submission is None:
        return None, None
    endpoint_id = delivery_endpoint_id(submission, settings.campaigns.get(submission.campaign.campaign_id or ""))
    return endpoint_id, tx.catalog.get_doc(DELIVERY_ENDPOINTS, tenant_id, endpoint_id) if endpoint_id else None


def delivered_at(submission: Submission | None) -> datetime | None:
    delivery = submission.delivery if submission is not None else None
    if delivery is None or not delivery.success or not delivery.delivered_at:
        return None
    try:
        return datetime.fromisoformat(delivery.delivered_at)
    except ValueError:
        return None


async def return_lead(runtime: Runtime, settings: TenantSettings, tenant_id: str, returned_by: str, lead_id: str,
                      body: ReturnBody) -> ReturnResult:
    now_dt = runtime.clock.now()
    return await runtime.store.write(lambda tx: apply_return(tx, settings, tenant_id, returned_by, lead_id, body, now_dt),
                                     may_refuse=True)


def apply_return(tx: Session, settings: TenantSettings, tenant_id: str, returned_by: str, lead_id: str,
                 body: ReturnBody, now_dt: datetime) -> ReturnResult:
    """The return, inside the caller's unit of work (a return request's approval runs it too)."""
    now = iso(now_dt)
    lead = tx.leads.get_lead(tenant_id, lead_id)
    if lead is None:
        raise NotFound()
    submission = tx.leads.latest_submission(tenant_id, lead_id)
    endpoint_id, endpoint = delivering_endpoint(tx, settings, tenant_id, submission)
    window = endpoint.return_window_days if endpoint is not None else DEFAULT_RETURN_WINDOW_DAYS
    refusal = return_refusal(lead.status, delivered_at(submission), window, now_dt)
    if refusal is not None:
        raise InvalidState([refusal])
    assert submission is not None  # a delivered lead has a delivered submission
    submission_id = submission.submission_id
    submission = msgspec.structs.replace(
        submission, status=RETURNED, updated_at=now,
        journey_events=[*submission.journey_events, event(
            now, RETURN_EVENT, body.reason,
            details={"returnedBy": returned_by, "note": body.note, "previous": lead.status,
                     "deliveryEndpointId": endpoint_id, "returnWindowDays": window})])
    tx.leads.update_submission(tenant_id, submission)
    returned = msgspec.structs.replace(lead, status=RETURNED, updated_at=now)
    tx.leads.update_lead(tenant_id, returned)
    client_id = settings.client_of(endpoint_id, None) or submission.campaign.client_id
    lines = reversal_lines(tx.ledger.delivered_revenue(tenant_id, submission_id), submission_id=submission_id,
                           campaign_id=submission.campaign.campaign_id, client_id=client_id,
                           source_id=lead.source_id, delivery_endpoint_id=endpoint_id)
    if lines:  # the client's balance gets back what the sale took
        balances.follow_ledger(tx, settings, tenant_id, lead_id,
                               tx.ledger.record_new(tenant_id, lead_id, submission_id, lines, now), now)
    earn(tx, settings, tenant_id, returned, submission_id, (RETURNED,), now_dt, endpoint_id=endpoint_id)
    record_lead_events(tx, settings, tenant_id, returned, submission, (RETURNED,), now)
    entry = None
    if lines:
        found = [row for row in tx.ledger.page(tenant_id, LedgerFilter(lead_id=lead_id, kind="return"), 1000)
                 if row["submissionId"] == submission_id and row["currency"] == lines[0].currency]
        entry = msgspec.convert(found[0], LedgerEntry) if found else None
    audit.record(tx, tenant_id, returned_by, "lead.return", lead_id, now, before={"status": lead.status},
                 after={"status": RETURNED, "reason": body.reason, "note": body.note,
                        "deliveryEndpointId": endpoint_id, "submissionId": submission_id})
    return ReturnResult(lead_id=lead_id, status=RETURNED, entry=entry)
