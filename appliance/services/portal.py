"""The portal's use cases (appliance/portal/ is its HTTP layer, CONTRACT 9.4): what a buyer user
and a supplier user may see of their tenant, and nothing else.

A buyer's leads are the leads sold to its client: a `revenue` ledger entry names the client. It
sees their contact fields and answers, its own sales of them, its return requests and its
statement.

A supplier's leads are those of its sources: a source belongs to the supplier its `supplierId`
names, or, naming none, to the supplier whose id is its `sourceId`. Leads carry only their
`sourceId`, so a source id that campaigns give to two suppliers is neither's. A supplier sees
each lead's status and a reason in the appliance's own words (never a buyer's answer, which may
name the buyer), its payouts (its sources' `cost` entries), caps, ping limits and posting
specs, and counts by day; never a buyer's name or id, nor a sale price.

Every list is an index walk that stops at its page's end (storage/leads.py source_page,
storage/ledger.py sales_to_client): the first page costs the same at a million leads."""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import msgspec

from appliance.domain.campaign import IngestionSource
from appliance.domain.lead import LeadRecord, Submission
from appliance.domain.returns import ReturnRequest
from appliance.errors import InvalidState, NotFound, ValidationFailed
from appliance.model import describe_validation_error
from appliance.runtime import Runtime
from appliance.services import return_requests, users
from appliance.services.tenant_settings import TenantSettings
from appliance.storage import ConsoleSessionRecord, LeadFilter, Session

SEARCH_LIMIT = 200  # leads a search looks at before keeping the buyer's own
CSV_PAGE = 1000  # sales read per statement while a CSV export streams
DAYS_SHOWN = 30  # the days of the counts and payouts by day
_DAY = 86400

# ---- who is signed in -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Party:
    tenant_id: str
    user_id: str
    role: str  # buyer or supplier
    client_id: str | None  # a buyer's client
    supplier_id: str | None  # a supplier's id

    @property
    def actor(self) -> str:
        return "user:" + self.user_id


def party_of(runtime: Runtime, found: ConsoleSessionRecord) -> Party:
    user = users.get(runtime, found.tenant_id, found.user_id)
    return Party(found.tenant_id, found.user_id, user.role, user.client_id, user.supplier_id)


# ---- buyers ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sale:
    """A sale of a lead to the buyer's client: one `revenue` entry."""

    lead: LeadRecord
    entry_id: str
    submission_id: str
    price: float
    currency: str
    sold_at: str


@dataclass
class SalePage:
    sales: list[Sale]
    next_cursor: str | None


def _sales(tx: Session, tenant_id: str, rows: list[tuple]) -> list[Sale]:
    leads = {lead.lead_id: lead for lead in tx.leads.get_leads(tenant_id, list(dict.fromkeys(r[1] for r in rows)))}
    return [Sale(leads[lead_id], entry_id, submission_id, amount, currency, at)
            for entry_id, lead_id, submission_id, amount, currency, at in rows if lead_id in leads]


def _sale_bound(cursor: str | None) -> tuple[str, str] | None:
    """A cursor is the last sale shown: `<soldAt>|<entryId>`."""
    if cursor is None:
        return None
    sold_at, _, entry_id = cursor.partition("|")
    if not sold_at or not entry_id.startswith("led_"):
        raise ValidationFailed(["cursor: not a cursor of this list"])
    return sold_at, entry_id


def sales_page(runtime: Runtime, tenant_id: str, client_id: str, cursor: str | None, limit: int) -> SalePage:
    """The client's sales, newest first."""
    tx = runtime.store.reader()
    with tx:
        rows = tx.ledger.sales_to_client(tenant_id, client_id, _sale_bound(cursor), limit + 1)
        sales = _sales(tx, tenant_id, rows[:limit])
    more = len(rows) > limit
    last = rows[limit - 1] if more else None
    return SalePage(sales, f"{last[5]}|{last[0]}" if last else None)


def search_sales(runtime: Runtime, tenant_id: str, client_id: str, where: LeadFilter) -> list[Sale]:
    """The client's sales of the leads a search finds (an email, a phone, a lead id or names:
    the newest SEARCH_LIMIT leads of the tenant that match are looked at)."""
    tx = runtime.store.reader()
    with tx:
        found = [lead_id for lead_id, _ in tx.leads.lead_page(tenant_id, where, SEARCH_LIMIT)]
        return _sales(tx, tenant_id, tx.ledger.sales_of_leads(tenant_id, client_id, found))


@dataclass(frozen=True)
class Delivery:
    sale: Sale
    delivered_at: str | None
    buyer_lead_id: str | None  # the id the buyer's system gave the lead, when it said one


@dataclass
class BoughtLead:
    lead: LeadRecord
    deliveries: list[Delivery]
    open_request: ReturnRequest | None
    may_request: bool  # delivered, its latest sale is this client's, and no request is open


def bought_lead(runtime: Runtime, tenant_id: str, client_id: str, lead_id: str) -> BoughtLead:
    """A lead sold to the client, as its page shows it; NotFound for any other lead."""
    tx = runtime.store.reader()
    with tx:
        sales = _sales(tx, tenant_id, tx.ledger.sales_of_leads(tenant_id, client_id, [lead_id]))
        if not sales:
            raise NotFound()
        submissions = {s.submission_id: s for s in tx.leads.submissions_of(tenant_id, lead_id)}
        open_request = tx.return_requests.open_for_lead(tenant_id, lead_id)
        latest_buyer = tx.ledger.latest_buyer(tenant_id, lead_id)
    deliveries = [_delivery(sale, submissions.get(sale.submission_id)) for sale in sales]
    if open_request is not None and open_request.client_id != client_id:
        open_request = None  # another buyer's, of a later sale
    lead = sales[0].lead
    return BoughtLead(lead, deliveries, open_request,
                      lead.status == "delivered" and latest_buyer == client_id and open_request is None)


def _delivery(sale: Sale, submission: Submission | None) -> Delivery:
    """The submission keeps the answer of its last post only: a lead sold to several buyers (a
    shared auction) shows each buyer its sale's time and no buyer's lead id, which may be another's."""
    delivery = submission.delivery if submission is not None else None
    buyers = {(e.details or {}).get("deliveryEndpointId") for e in submission.journey_events
              if e.type == "delivered"} if submission is not None else set()
    if len(buyers) > 1:
        return Delivery(sale, sale.sold_at, None)
    return Delivery(sale, delivery.delivered_at if delivery else None,
                    submission.client_lead_id if submission is not None else None)


async def request_return(runtime: Runtime, settings: TenantSettings, party: Party, lead_id: str,
                         reason: str, note: str | None) -> ReturnRequest:
    """A return request of the buyer's own lead (another lead: NotFound, as if it did not exist),
    checked against its client's return policy like any other (services/return_requests.py)."""
    try:
        body = msgspec.convert({"reason": reason, "note": note}, return_requests.ReturnRequestBody)
    except msgspec.ValidationError as refused:
        raise ValidationFailed([describe_validation_error(refused)]) from None
    tx = runtime.store.reader()
    with tx:
        owned = tx.ledger.sales_of_leads(party.tenant_id, party.client_id, [lead_id])
        latest_buyer = tx.ledger.latest_buyer(party.tenant_id, lead_id)
    if not owned:
        raise NotFound()
    if latest_buyer != party.client_id:
        raise InvalidState(["leadId: the lead was sold again since; ask the agency about its return"])
    return await return_requests.request(runtime, settings, party.tenant_id, party.actor, lead_id, body)


CSV_COLUMNS = ("leadId", "soldAt", "price", "currency", "status", "firstName", "lastName", "email", "phone",
               "street", "city", "state", "zip", "dateOfBirth", "country", "answers")


_PHONE = re.compile(r"\+[0-9]{6,15}")  # an E.164 number: not a formula, and a CRM wants it as it is


def _cell(value: object) -> object:
    """Text a spreadsheet would run as a formula is written as text; numbers stay numbers."""
    if value is None:
        return ""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r") and not _PHONE.fullmatch(value):
        return "'" + value
    return value


def csv_header() -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(CSV_COLUMNS)
    return out.getvalue()


def csv_chunk(runtime: Runtime, tenant_id: str, client_id: str, cursor: str | None) -> tuple[str, str | None]:
    """One page of the export's rows (CSV_PAGE sales) and the cursor of the next (None: done)."""
    page = sales_page(runtime, tenant_id, client_id, cursor, CSV_PAGE)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for sale in page.sales:
        lead, address = sale.lead, sale.lead.address
        answers = {a.key or a.question: a.answer for a in lead.questionnaire}
        writer.writerow([_cell(v) for v in (
            lead.lead_id, sale.sold_at, sale.price, sale.currency, lead.status, lead.first_name, lead.last_name,
            lead.email, lead.phone_e164 or lead.phone, address.street if address else None,
            address.city if address else None, address.state if address else None, address.zip if address else None,
            lead.date_of_birth, lead.country, msgspec.json.encode(answers).decode() if answers else None)])
    return out.getvalue(), page.next_cursor


# ---- suppliers ------------------------------------------------------------------------------------

def supplier_of(source: IngestionSource) -> str:
    return source.supplier_id or source.source_id


@dataclass(frozen=True)
class OwnSource:
    campaign_id: str
    source: IngestionSource


@dataclass
class Supply:
    """A supplier's sources: each (campaign, source) naming it, and the source ids whose leads are its."""

    sources: list[OwnSource]
    source_ids: tuple[str, ...]


def supply_of(settings: TenantSettings, supplier_id: str) -> Supply:
    claims: dict[str, set[str]] = {}
    named: list[OwnSource] = []
    for campaign in sorted(settings.campaigns.values(), key=lambda c: c.campaign_id):
        for source in campaign.ingestion.sources:
            claims.setdefault(source.source_id, set()).add(supplier_of(source))
            if supplier_of(source) == supplier_id:
                named.append(OwnSource(campaign.campaign_id, source))
    mine = tuple(sorted(source_id for source_id, claimants in claims.items() if claimants == {supplier_id}))
    return Supply([s for s in named if s.source.source_id in mine], mine)


# What a supplier is told of each status: the appliance's words, never a buyer's.
REASONS = {
    "new": "Received.",
    "pending": "Received; being checked.",
    "qualified": "Accepted; waiting to be sent to a buyer.",
    "queued": "Accepted; waiting to be sent to a buyer.",
    "document_sent": "Accepted; waiting for the consumer to sign.",
    "signed": "Accepted and signed; waiting to be sent to a buyer.",
    "pending_action": "Held for a review by the agency.",
    "delivered": "Accepted and sold.",
    "failed": "Accepted, but no buyer took it.",
    "error": "Accepted, but its delivery could not be completed.",
    "rejected": "Rejected at the agency's review.",
    "disqualified": "It did not meet the campaign's rules.",
    "duplicate": "A duplicate of an earlier lead.",
    "suppressed": "Its email address or phone number is on a suppression list.",
    "returned": "Sold, then returned by the buyer.",
}


def reason_for(status: str, submission: Submission | None) -> str:
    """REASONS, and for a lead refused at the source (its caps, its consent certificate) the
    check's own words, which speak of the source alone."""
    qualification = submission.qualification if submission is not None else None
    if status == "disqualified" and qualification is not None and qualification.method == "source_check" \
            and qualification.reason:
        return f"Refused at the source: {qualification.reason}."
    return REASONS.get(status, "")


@dataclass(frozen=True)
class SuppliedLead:
    lead_id: str
    source_id: str | None
    status: str
    reason: str
    received_at: str


@dataclass
class SuppliedPage:
    leads: list[SuppliedLead]
    next_cursor: str | None


def supplied_page(runtime: Runtime, tenant_id: str, supply: Supply, cursor: str | None, limit: int) -> SuppliedPage:
    """The supplier's leads, newest first."""
    if cursor is not None and not cursor.startswith("lead_"):
        raise ValidationFailed(["cursor: not a cursor of this list"])
    tx = runtime.store.reader()
    with tx:
        records = tx.leads.source_page(tenant_id, supply.source_ids, cursor, limit + 1)
        shown = [_supplied(lead, tx.leads.latest_submission(tenant_id, lead.lead_id)) for lead in records[:limit]]
    return SuppliedPage(shown, shown[-1].lead_id if len(records) > limit else None)


def _supplied(lead: LeadRecord, submission: Submission | None) -> SuppliedLead:
    return SuppliedLead(lead.lead_id, lead.source_id, lead.status, reason_for(lead.status, submission), lead.created_at)


@dataclass(frozen=True)
class Payout:
    entry_id: str
    lead_id: str
    source_id: str
    lead_status: str  # the status that earned it
    amount: float
    currency: str
    at: str


@dataclass
class SuppliedLeadView:
    lead: SuppliedLead
    payouts: list[Payout]


def supplied_lead(runtime: Runtime, tenant_id: str, supply: Supply, lead_id: str) -> SuppliedLeadView:
    """A lead of the supplier's sources; NotFound for any other lead."""
    tx = runtime.store.reader()
    with tx:
        lead = tx.leads.get_lead(tenant_id, lead_id)
        if lead is None or lead.source_id not in supply.source_ids:
            raise NotFound()
        submission = tx.leads.latest_submission(tenant_id, lead_id)
        payouts = [Payout(*row) for row in tx.ledger.source_costs(tenant_id, (lead.source_id,), None, 100, lead_id)]
    return SuppliedLeadView(_supplied(lead, submission), payouts)


@dataclass
class PayoutPage:
    payouts: list[Payout]
    next_cursor: str | None
    by_day: list[tuple[str, str, float]]  # (UTC day, currency, total) of the last DAYS_SHOWN days, newest first


def payouts(runtime: Runtime, tenant_id: str, supply: Supply, cursor: str | None, limit: int) -> PayoutPage:
    if cursor is not None and not cursor.startswith("led_"):
        raise ValidationFailed(["cursor: not a cursor of this list"])
    first, end = _days(runtime)
    tx = runtime.store.reader()
    with tx:
        rows = tx.ledger.source_costs(tenant_id, supply.source_ids, cursor, limit + 1)
        days = tx.ledger.source_costs_by_day(tenant_id, supply.source_ids, first, end)
    shown = [Payout(*row) for row in rows[:limit]]
    by_day = sorted(((_day_text(day), currency, round(total, 6)) for day, currency, total in days), reverse=True)
    return PayoutPage(shown, shown[-1].entry_id if len(rows) > limit else None, by_day)


def _days(runtime: Runtime) -> tuple[int, int]:
    """The last DAYS_SHOWN UTC days, today included, as days since the epoch [first, end)."""
    today = int(runtime.clock.now().timestamp()) // _DAY
    return today - DAYS_SHOWN + 1, today + 1


def _day_text(day: int) -> str:
    return (datetime(1970, 1, 1) + timedelta(days=day)).date().isoformat()


# How acceptance by day groups the statuses (docs/portal.md): `accepted` is sold (and a sale
# later returned), `refused` never went on past the checks, `unsold` went on but no buyer took it
# (or its delivery broke), `open` is still on its way.
OUTCOMES = {
    "accepted": ("delivered", "returned"),
    "refused": ("disqualified", "duplicate", "suppressed", "rejected"),
    "unsold": ("failed", "error"),
    "open": ("new", "pending", "qualified", "document_sent", "signed", "queued", "pending_action"),
}


@dataclass
class DayCounts:
    day: str
    received: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))

    @property
    def accepted_share(self) -> str:
        return f"{100 * self.outcomes['accepted'] / self.received:.0f} %" if self.received else "–"


def acceptance(runtime: Runtime, tenant_id: str, supply: Supply) -> list[DayCounts]:
    """The supplier's leads of each of the last DAYS_SHOWN UTC days (by the day they came in),
    by what became of them, newest day first; from the report rollups."""
    first, end = _days(runtime)
    outcome_of = {status: outcome for outcome, statuses in OUTCOMES.items() for status in statuses}
    days = {day: DayCounts(_day_text(day)) for day in range(end - 1, first - 1, -1)}
    tx = runtime.store.reader()
    with tx:
        rows = tx.leads.source_day_counts(tenant_id, supply.source_ids, first, end)
    for day, status, leads in rows:
        counts = days[day]
        counts.received += leads
        counts.outcomes[outcome_of.get(status, "open")] += leads
    return list(days.values())
