"""The admin console's use cases (appliance/console/ is its HTTP layer): people's sign-ins and
sessions, and the pages' data gathered from the services and repositories the API uses.
Templates only lay this data out."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

import msgspec

from appliance import passwords
from appliance.clock import iso
from appliance.domain.normalize import normalize_email
from appliance.domain.suppression import phone_hash
from appliance.domain.tenant_options import TenantOptions, owes_enrolment
from appliance.domain.auction import shown as auction_shown
from appliance.domain.report import ReportSummary
from appliance.runtime import Runtime
from appliance.services import audit, endpoints, reports, sign_in_throttle, sms, webhooks
from appliance.services.users import token_digest as session_hash
from appliance.services.endpoints import EndpointItem
from appliance.storage import ConsoleSessionRecord, LeadFilter, LedgerFilter, Session, UserRecord

SESSION_LIFETIME = timedelta(hours=12)
STEP_LIFETIME = timedelta(minutes=15)  # a session that owes its code or enrolment
LIVE = "live"
# Every status a lead may have, in the order a person reads a funnel.
STATUSES = ("new", "pending", "qualified", "document_sent", "signed", "queued", "pending_action", "delivered", "failed",
            "error", "rejected", "disqualified", "duplicate", "suppressed", "returned")
REPOSTABLE = ("failed", "error")  # what the failures page lists
REPOST_ONE = ("failed", "rejected", "error")  # what a repost accepts (CONTRACT 3)
_DELIVERY_EVENTS = ("delivered", "delivery_failure", "delivery_duplicate", "delivery_error")


# ---- sessions ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NewSession:
    token: str  # the cookie's value: only its hash is stored
    csrf_token: str
    expires_at: datetime
    stage: str  # "live", or the step still owed: "code" (TOTP) or "enrol" (two-factor the tenant requires)
    role: str  # staff go on to the console, buyers and suppliers to the portal


@dataclass(frozen=True)
class SignIn:
    """What a sign-in came to: a session, or a refusal (`wait`: seconds until the next try)."""

    session: NewSession | None = None
    wait: int | None = None


def _stage(tx: Session, user: UserRecord) -> str:
    """What a new session of `user` owes: its TOTP code, an enrolment the tenant requires, or nothing."""
    if user.totp_secret is not None:
        return "code"
    if owes_enrolment(tx.tenants.settings(user.tenant_id), user.role, enrolled=False):
        return "enrol"
    return LIVE


async def sign_in(runtime: Runtime, email: str, password: str, address: str | None) -> SignIn:
    """Email and password checked against the active users with that address (any tenant:
    the first whose password matches), throttled per email and per client address
    (services/sign_in_throttle.py). An unknown email costs and answers what a wrong password
    does. A session that still owes a step lives STEP_LIFETIME until the step is done."""
    email = normalize_email(email)[:320]
    names = sign_in_throttle.subjects(f"email:{email}", address)
    now = runtime.clock.now()

    def counted(tx: Session) -> tuple[int | None, list[tuple[UserRecord, str]]]:
        wait = sign_in_throttle.attempt(tx, names, now)
        if wait is not None:
            return wait, []
        return None, [(u, _stage(tx, u)) for u in tx.users.all_by_email(email)
                      if u.active and u.password_hash]

    wait, candidates = await runtime.store.write(counted)
    if wait is not None:
        return SignIn(wait=wait)
    user, stage = None, LIVE
    for candidate, its_stage in candidates or [(None, LIVE)]:
        if await passwords.matches_async(candidate.password_hash if candidate else None,
                                         password[:passwords.MAX_LENGTH]):
            user, stage = candidate, its_stage
            break
    if user is None:
        if len(candidates) == 1:  # one tenant knows the address: its log shows the failure
            known = candidates[0][0]
            await runtime.store.write(lambda tx: audit.record(tx, known.tenant_id, audit.ANONYMOUS,
                                                              "user.sign_in_failed", known.user_id, iso(now)))
        return SignIn()
    made = NewSession(secrets.token_urlsafe(32), secrets.token_urlsafe(32),
                      now + (SESSION_LIFETIME if stage == LIVE else STEP_LIFETIME), stage, user.role)

    def unit(tx: Session) -> None:
        sign_in_throttle.succeeded(tx, names, now)
        tx.console_sessions.insert(session_hash(made.token), user.tenant_id, user.user_id, made.stage,
                                   made.csrf_token, iso(now), iso(made.expires_at))
        if made.stage == LIVE:
            tx.users.signed_in(user.user_id, iso(now))
        audit.record(tx, user.tenant_id, "user:" + user.user_id, "user.sign_in", user.user_id, iso(now),
                     after={"stage": made.stage})

    await runtime.store.write(unit)
    return SignIn(session=made)


def find_session(runtime: Runtime, token: str) -> ConsoleSessionRecord | None:
    """The session of a cookie: None when unknown, signed out, expired or its user disabled. A
    live session of a person who has not enrolled owes enrolment once the tenant requires it."""
    found = runtime.store.reader().console_sessions.find_live(session_hash(token), iso(runtime.clock.now()))
    if found is not None and found.stage == LIVE and owes_enrolment(_options(found.settings), found.role,
                                                                     found.two_factor):
        return found._replace(stage="enrol")
    return found


@lru_cache(maxsize=256)
def _options(settings: str) -> TenantOptions:
    return msgspec.json.decode(settings, type=TenantOptions)



async def end_session(runtime: Runtime, token: str) -> None:
    await runtime.store.write(lambda tx: tx.console_sessions.delete(session_hash(token)))


async def sign_out_everywhere(runtime: Runtime, found: ConsoleSessionRecord) -> int:
    """End every session of the signed-in user, this one included."""
    now = iso(runtime.clock.now())

    def unit(tx: Session) -> int:
        ended = tx.console_sessions.delete_of_user(found.user_id)
        audit.record(tx, found.tenant_id, "user:" + found.user_id, "user.sign_out_everywhere", found.user_id, now,
                     after={"ended": ended})
        return ended

    return await runtime.store.write(unit)


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
    messages: list[Any]  # its texts both ways, oldest first (a conversation reads down)
    ledger: list[dict[str, Any]]
    auctions: list[Any]  # its auction rounds, newest first (domain/auction.AuctionShown)
    opted_out_since: str | None = None  # when the lead's phone answered STOP to the tenant's texts


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
        phone = tx.leads.lead_of(tx.leads.lead_row(tenant_id, lead_id)).phone_e164
        opted_out_since = tx.messages.opted_out_since(tenant_id, phone_hash(phone)) if phone else None
    attempts = [DeliveryAttempt(e.get("timestamp"), e["type"], (e.get("details") or {}).get("deliveryEndpointId"),
                                (e.get("details") or {}).get("statusCode"), e.get("reason"))
                for s in submissions for e in s.get("journeyEvents", ()) if e.get("type") in _DELIVERY_EVENTS]
    messages = sms.lead_messages(runtime, tenant_id, lead_id, None, 100).items[::-1]
    return LeadView(msgspec.json.decode(doc), submissions, attempts, files, messages, ledger, auctions,
                    opted_out_since)


# ---- webhooks ------------------------------------------------------------------------------------

@dataclass
class WebhookView:
    webhook: Any
    attempts: list[Any]


def webhook_views(runtime: Runtime, tenant_id: str, recent: int = 10) -> list[WebhookView]:
    """Subscriptions (at most 100) and each one's latest delivery attempts."""
    return [WebhookView(hook, webhooks.attempts(runtime, tenant_id, hook.webhook_id, None, recent).items)
            for hook in webhooks.page(runtime, tenant_id, None, 100).items]
