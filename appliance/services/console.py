"""The admin console's use cases (appliance/console/ is its HTTP layer): sessions signed in with
a tenant key, and the pages' data gathered from the services and repositories the API uses.
Templates only lay this data out."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import msgspec

from appliance.clock import iso
from appliance.domain.auction import shown as auction_shown
from appliance.domain.report import ReportSummary
from appliance.runtime import Runtime
from appliance.services import endpoints, reports, sms, webhooks
from appliance.services.endpoints import EndpointItem
from appliance.storage import ConsoleSessionRecord, KeyRecord, LeadFilter, LedgerFilter, Session

SESSION_LIFETIME = timedelta(hours=12)
# Every status a lead may have, in the order a person reads a funnel.
STATUSES = ("new", "pending", "qualified", "queued", "pending_action", "delivered", "failed", "error", "rejected",
            "disqualified", "duplicate", "suppressed", "returned")
REPOSTABLE = ("failed", "error")  # what the failures page lists
REPOST_ONE = ("failed", "rejected", "error")  # what a repost accepts (CONTRACT 3)
_DELIVERY_EVENTS = ("delivered", "delivery_failure", "delivery_duplicate", "delivery_error")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


# ---- sessions ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NewSession:
    token: str  # the cookie's value: only its hash is stored
    csrf_token: str
    expires_at: datetime


async def start_session(runtime: Runtime, key: KeyRecord) -> NewSession:
    """A session for a tenant key already checked live by the caller."""
    now = runtime.clock.now()
    made = NewSession(secrets.token_urlsafe(32), secrets.token_urlsafe(32), now + SESSION_LIFETIME)

    def unit(tx: Session) -> None:
        tx.console_sessions.purge_expired(iso(now))  # sign-ins are rare: the table stays small
        tx.console_sessions.insert(_digest(made.token), key.tenant_id, key.key_id, made.csrf_token, iso(now),
                                   iso(made.expires_at))

    await runtime.store.write(unit)
    return made


def find_session(runtime: Runtime, token: str) -> ConsoleSessionRecord | None:
    """The live session of a cookie: None when unknown, signed out, expired or its key revoked."""
    return runtime.store.reader().console_sessions.find_live(_digest(token), iso(runtime.clock.now()))


async def end_session(runtime: Runtime, token: str) -> None:
    await runtime.store.write(lambda tx: tx.console_sessions.delete(_digest(token)))


# ---- overview ------------------------------------------------------------------------------------

@dataclass
class Overview:
    today: dict[str, int]
    week: dict[str, int]
    week_summary: ReportSummary  # by day: the money
    per_day: list[tuple[str, int, int]]  # (YYYY-MM-DD, leads, delivered) of each of the 7 days, for the chart
    queue_depth: int
    paused: list[EndpointItem] = field(default_factory=list)


def _status_counts(tx: Session, tenant_id: str, span: reports.ReportRange) -> dict[str, int]:
    counts = dict.fromkeys(STATUSES, 0)
    for _, status, leads in tx.reports.lead_counts(tenant_id, "campaign", span.first, span.end):
        counts[status] = counts.get(status, 0) + leads
    return counts


def overview(runtime: Runtime, tenant_id: str) -> Overview:
    """Today and the last 7 days (UTC days, today included), from the report rollups."""
    now = runtime.clock.now()
    today = now.date().isoformat()
    week_start = (now.date() - timedelta(days=6)).isoformat()
    day_span = reports.summary_range("campaign", today, today, "UTC", now)
    week_span = reports.summary_range("day", week_start, today, "UTC", now)
    tx = runtime.store.reader()
    with tx:
        today_counts = _status_counts(tx, tenant_id, day_span)
        week_counts = _status_counts(tx, tenant_id, week_span)
        depth = tx.jobs.open_count(tenant_id)
    summary = reports.read_summary(tx, tenant_id, week_span)
    paused = [item for item in endpoints.page(runtime, tenant_id, None, 100).items if item.state == "paused"]
    rows = {row.key: row for row in summary.rows}
    days = [(now.date() - timedelta(days=6 - i)).isoformat() for i in range(7)]
    per_day = [(day, rows[day].leads if day in rows else 0, rows[day].delivered if day in rows else 0) for day in days]
    return Overview(today_counts, week_counts, summary, per_day, depth, paused)


# ---- leads ---------------------------------------------------------------------------------------

@dataclass
class LeadList:
    leads: list[dict[str, Any]]
    next_cursor: str | None


def lead_list(runtime: Runtime, tenant_id: str, where: LeadFilter | None, limit: int) -> LeadList:
    """A page of lead records, newest first (`where` None: a search that can match nothing)."""
    rows = [] if where is None else runtime.store.reader().leads.lead_page(tenant_id, where, limit + 1)
    more = len(rows) > limit
    leads = [msgspec.json.decode(doc) for _, doc in rows[:limit]]
    return LeadList(leads, leads[-1]["leadId"] if more else None)


@dataclass
class DeliveryAttempt:
    at: str | None
    outcome: str
    endpoint_id: str | None
    status_code: int | None
    message: str | None


@dataclass
class LeadView:
    lead: dict[str, Any]
    submissions: list[dict[str, Any]]
    attempts: list[DeliveryAttempt]
    files: list[dict[str, Any]]
    messages: list[Any]
    ledger: list[dict[str, Any]]
    auctions: list[Any]  # its auction rounds, newest first (domain/auction.AuctionShown)


def lead_view(runtime: Runtime, tenant_id: str, lead_id: str) -> LeadView | None:
    """Everything the lead page shows, as of one commit; None for a lead this tenant does not have."""
    tx = runtime.store.reader()
    with tx:
        doc = tx.leads.lead_doc(tenant_id, lead_id)
        if doc is None:
            return None
        submissions = [msgspec.json.decode(d) for d in tx.leads.submission_docs_of(tenant_id, lead_id)]
        files = [msgspec.json.decode(d) for d in tx.files.docs_of(tenant_id, lead_id)]
        ledger = tx.ledger.page(tenant_id, LedgerFilter(lead_id=lead_id), 200)
        auctions = [auction_shown(record) for record in tx.auctions.of_lead(tenant_id, lead_id, None, 50)]
    attempts = [DeliveryAttempt(e.get("timestamp"), e["type"], (e.get("details") or {}).get("deliveryEndpointId"),
                                (e.get("details") or {}).get("statusCode"), e.get("reason"))
                for s in submissions for e in s.get("journeyEvents", ()) if e.get("type") in _DELIVERY_EVENTS]
    messages = sms.lead_messages(runtime, tenant_id, lead_id, None, 100).items
    return LeadView(msgspec.json.decode(doc), submissions, attempts, files, messages, ledger, auctions)


# ---- webhooks ------------------------------------------------------------------------------------

@dataclass
class WebhookView:
    webhook: Any
    attempts: list[Any]


def webhook_views(runtime: Runtime, tenant_id: str, recent: int = 10) -> list[WebhookView]:
    """Subscriptions (at most 100) and each one's latest delivery attempts."""
    return [WebhookView(hook, webhooks.attempts(runtime, tenant_id, hook.webhook_id, None, recent).items)
            for hook in webhooks.page(runtime, tenant_id, None, 100).items]
