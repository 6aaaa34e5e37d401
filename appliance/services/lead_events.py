"""Lead events into the outbox: every path that changes a lead's status calls `record_lead_events`
inside its own unit of work, beside `earn`, so an event is committed with the change that caused
it, or not at all. The webhook sender (appliance/jobs/webhooks) sends them after the commit."""

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
    """Queue the events of `lead` (as it now is) reaching `statuses`, for every subscriber that
    wants them; `processed`: intake just ended (`lead.processed` first)."""
    if not settings.subscribers:
        return
    types = lead_event_types(statuses, processed=processed)
    queued = [NewEvents(webhook_id, lane_of(lead.lead_id), wanted)
              for webhook_id, events in settings.subscribers
              if (wanted := tuple(kind for kind in types if subscribed(events, kind)))]
    if queued:
        tx.webhooks.enqueue(tenant_id, lead.lead_id, lead_summary(lead, submission), queued, now)


def lead_summary(lead: LeadRecord, submission: Submission | None) -> bytes:
    """A lead event's `data`: the lead record (never its submissions), with the latest
    submission's `submissionId`, `status` and `delivery` at the top level. Spliced as bytes:
    this runs inside the submit's transaction."""
    if submission is None:
        return _encode(lead)[:-1] + b',"submissionId":null,"delivery":null}'
    if submission.status != lead.status:
        lead = msgspec.structs.replace(lead, status=submission.status)
    return (_encode(lead)[:-1] + b',"submissionId":' + _encode(submission.submission_id)
            + b',"delivery":' + _encode(submission.delivery) + b"}")
