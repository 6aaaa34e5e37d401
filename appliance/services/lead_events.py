"""Lead events: every path that changes a lead's status calls `record_lead_events` inside its own
unit of work, beside `earn`, so an event is committed with the change that caused it, or not at
all. The webhook sender (appliance/jobs/webhooks) sends them after the commit, with the `data`
`lead_summary` makes."""

from __future__ import annotations

import msgspec

from appliance.domain.lead import LeadRecord, Submission
from appliance.domain.webhooks import lane_of, lead_event_types, subscribed
from appliance.services.tenant_settings import TenantSettings
from appliance.storage import NewEvents, Session

_encode = msgspec.json.Encoder().encode


def record_lead_events(tx: Session, settings: TenantSettings, tenant_id: str, lead: LeadRecord,
                       submission: Submission | None, statuses: tuple[str, ...], now: str, *,
                       processed: bool = False) -> None:
    """Queue the events of `lead` reaching `statuses` (the last is where it is now), for every
    subscriber that wants them; `processed`: intake just ended (`lead.processed` first)."""
    if not settings.subscribers:
        return
    types = lead_event_types(statuses, processed=processed)
    lane = lane_of(lead.lead_id)
    queued = [NewEvents(webhook_id, lane, wanted) for webhook_id, events in settings.subscribers
              if (wanted := tuple(kind for kind in types if subscribed(events, kind)))]
    if queued:
        tx.webhooks.enqueue(tenant_id, lead.lead_id, submission.submission_id if submission else None,
                            statuses[-1], queued, now)


# The statuses a delivery attempt decided: their events carry the submission's `delivery`; the
# events before one (qualified, queued...) carry none, as when they happened.
_AFTER_DELIVERY = frozenset({"delivered", "failed", "returned"})


def lead_summary(lead: LeadRecord, submission: Submission | None, status: str | None) -> bytes:
    """A lead event's `data`: the lead record as it is when the event is sent (never its
    submissions), with the status the event is about, and the submission's `submissionId` and
    `delivery` at the top level."""
    if status is not None and status != lead.status:
        lead = msgspec.structs.replace(lead, status=status)
    if submission is None:
        return _encode(lead)[:-1] + b',"submissionId":null,"delivery":null}'
    delivery = submission.delivery if status in _AFTER_DELIVERY else None
    return (_encode(lead)[:-1] + b',"submissionId":' + _encode(submission.submission_id)
            + b',"delivery":' + _encode(delivery) + b"}")
