"""Return requests (CONTRACT 9.4): a buyer (or staff on its behalf) asks to send a delivered lead
back; the client's return policy (domain/returns.request_refusal) refuses what is past its age or
over its share, approves at once what is within it when `autoApprove` is on, and leaves the rest
pending for a manager. Approving is the return itself (services/returns.apply_return: the lead
`returned`, its revenue reversed), in the same transaction as the decision."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from appliance.clock import iso
from appliance.domain.client import ReturnPolicy
from appliance.domain.returns import (
    DEFAULT_RETURN_WINDOW_DAYS, POLICY_DAYS, ReturnRequest, request_refusal, return_refusal,
)
from appliance.errors import InvalidState, NotFound
from appliance.ids import new_id
from appliance.model import Model
from appliance.runtime import Runtime
from appliance.services import audit
from appliance.services.returns import ReturnBody, apply_return, delivered_at, delivering_endpoint
from appliance.services.tenant_settings import TenantSettings
from appliance.storage import CLIENTS, Session

PENDING, APPROVED, REJECTED = "pending", "approved", "rejected"


class ReturnRequestBody(ReturnBody):
    """`reason` and `note`, as a return takes them."""


class DecisionBody(Model):
    decision: Literal["approve", "reject"]
    note: Annotated[str, Meta(max_length=2000)] | None = None


class ReturnRequestPage(Model):
    items: list[ReturnRequest]
    next_cursor: str | None
    has_more: bool


def _client_of(tx: Session, settings: TenantSettings, tenant_id: str, lead_id: str) -> tuple[str | None, datetime | None]:
    """(the client the lead was sold to, when it was delivered): the delivering endpoint's
    `clientId`, else its campaign's client."""
    submission = tx.leads.latest_submission(tenant_id, lead_id)
    if submission is None:
        return None, None
    _, endpoint = delivering_endpoint(tx, settings, tenant_id, submission)
    client_id = (endpoint.client_id if endpoint is not None else None) or submission.campaign.client_id
    return client_id, delivered_at(submission)


def _approve(tx: Session, settings: TenantSettings, tenant_id: str, row: ReturnRequest, actor: str, now: datetime,
             note: str | None) -> ReturnRequest:
    apply_return(tx, settings, tenant_id, actor, row.lead_id, ReturnBody(reason=row.reason, note=row.note), now)
    tx.return_requests.decide(tenant_id, row.request_id, APPROVED, actor, iso(now), note)
    return msgspec.structs.replace(row, state=APPROVED, decided_by=actor, decided_at=iso(now), decision_note=note)


async def request(runtime: Runtime, settings: TenantSettings, tenant_id: str, actor: str, lead_id: str,
                  body: ReturnRequestBody) -> ReturnRequest:
    """A new request, 201 whether pending or approved at once; 409 INVALID_STATE naming why when
    the lead is not a delivered one, already has a request open, or is outside the policy."""
    now = runtime.clock.now()

    def unit(tx: Session) -> ReturnRequest:
        lead = tx.leads.get_lead(tenant_id, lead_id)
        if lead is None:
            raise NotFound()
        client_id, delivered = _client_of(tx, settings, tenant_id, lead_id)
        if lead.status != "delivered" or delivered is None:
            raise InvalidState([return_refusal(lead.status, delivered, DEFAULT_RETURN_WINDOW_DAYS, now)])
        if tx.return_requests.open_for_lead(tenant_id, lead_id) is not None:
            raise InvalidState(["leadId: a return request of this lead is pending already"])
        record = tx.catalog.get_doc(CLIENTS, tenant_id, client_id) if client_id else None
        policy = record.return_policy if record is not None else ReturnPolicy()
        since = iso(now - timedelta(days=POLICY_DAYS))
        sold = tx.ledger.sales_since(tenant_id, client_id, since) if client_id else 0
        requested = tx.return_requests.count_recent(tenant_id, client_id, since) if client_id else 0
        refusal = request_refusal(policy, delivered, now, sold, requested)
        if refusal is not None:
            raise InvalidState([refusal], message="The client's return policy does not allow this request")
        row = ReturnRequest(request_id=new_id("rtr"), lead_id=lead_id, client_id=client_id, state=PENDING,
                            reason=body.reason, note=body.note, requested_by=actor, created_at=iso(now))
        tx.return_requests.insert(tenant_id, row)
        audit.record(tx, tenant_id, actor, "return_request.create", row.request_id, iso(now),
                     after={"leadId": lead_id, "clientId": client_id, "reason": body.reason})
        if policy.auto_approve:
            row = _approve(tx, settings, tenant_id, row, actor, now, "approved by the client's return policy")
        return row

    return await runtime.store.write(unit, may_refuse=True)


async def decide(runtime: Runtime, settings: TenantSettings, tenant_id: str, actor: str, request_id: str,
                 body: DecisionBody) -> ReturnRequest:
    """A manager's decision on a pending request; approving returns the lead (409 when it can
    no longer be returned, e.g. its endpoint's return window closed: nothing is changed)."""
    now = runtime.clock.now()

    def unit(tx: Session) -> ReturnRequest:
        row = tx.return_requests.get(tenant_id, request_id)
        if row is None:
            raise NotFound()
        if row.state != PENDING:
            raise InvalidState([f"state: the request is {row.state} already"])
        if body.decision == "approve":
            row = _approve(tx, settings, tenant_id, row, actor, now, body.note)
        else:
            tx.return_requests.decide(tenant_id, request_id, REJECTED, actor, iso(now), body.note)
            row = msgspec.structs.replace(row, state=REJECTED, decided_by=actor, decided_at=iso(now),
                                          decision_note=body.note)
        audit.record(tx, tenant_id, actor, f"return_request.{body.decision}", request_id, iso(now),
                     before={"state": PENDING}, after={"state": row.state, "note": body.note})
        return row

    return await runtime.store.write(unit, may_refuse=True)


def page(runtime: Runtime, tenant_id: str, state: str | None, before: str | None, limit: int) -> ReturnRequestPage:
    rows = runtime.store.reader().return_requests.page(tenant_id, state, before, limit + 1)
    items = rows[:limit]
    more = len(rows) > limit
    return ReturnRequestPage(items=items, next_cursor=items[-1].request_id if more else None, has_more=more)

