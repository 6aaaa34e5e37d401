"""Returns: whether a buyer may send a delivered lead back, and the entries that reverse the
revenue of that delivery.

A lead may be returned while it is `delivered`, within its delivery endpoint's
`returnWindowDays` (default 30; 0: the endpoint takes no returns), counted from the latest
submission's `delivery.deliveredAt`. The reversal is one `return` entry per currency of the
revenue the delivery earned, for minus its sum; its milestone identity
`return:<submissionId>:<currency>` lets storage keep at most one per submission and currency, so
a second return of the same delivery can never be counted twice."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Literal

from appliance.clock import iso
from appliance.domain.client import ReturnPolicy
from appliance.domain.ledger import LedgerLine
from appliance.model import Model

DEFAULT_RETURN_WINDOW_DAYS = 30
POLICY_DAYS = 30  # a client's maxPercent counts its deliveries and requests of this many days


class ReturnRequest(Model):
    """A client's request to send a delivered lead back, as stored and as the API shows it."""

    request_id: str
    lead_id: str
    client_id: str | None
    state: Literal["pending", "approved", "rejected"]
    reason: str
    note: str | None
    requested_by: str
    created_at: str
    decided_by: str | None = None
    decided_at: str | None = None
    decision_note: str | None = None
MAX_RETURN_WINDOW_DAYS = 3650
RETURNED = "returned"


def return_refusal(status: str, delivered_at: datetime | None, window_days: int, now: datetime) -> str | None:
    """Why a lead at `status`, delivered at `delivered_at` through an endpoint taking returns for
    `window_days` days, may not be returned at `now` (a `field: reason` detail); None: it may."""
    if status == RETURNED:
        return "status: the lead is returned already"
    if status != "delivered":
        return f"status: the lead is {status}; only a delivered lead can be returned"
    if delivered_at is None:
        return "delivery: the latest submission has no deliveredAt; the return window cannot be measured"
    if window_days <= 0:
        return "returnWindowDays: the delivery endpoint takes no returns (returnWindowDays is 0)"
    closes = delivered_at + timedelta(days=window_days)
    if now > closes:
        return f"returnWindowDays: the return window of {window_days} days closed at {iso(closes)}"
    return None


def return_milestone(submission_id: str, currency: str) -> str:
    return f"return:{submission_id}:{currency}"


Revenue = tuple[float, str, str | None, str | None]  # amount, currency, client charged, endpoint sold through


def reversal_lines(revenue: Iterable[Revenue], *, submission_id: str, campaign_id: str | None,
                   client_id: str | None, source_id: str | None,
                   delivery_endpoint_id: str | None) -> list[LedgerLine]:
    """One `return` line per currency and buyer of the delivered `revenue`, for minus the sum,
    each to the client and endpoint its revenue was charged to (`client_id` and
    `delivery_endpoint_id` stand in for an entry that names none): a lead sold to several buyers
    gives each its own money back. Lines in the order their revenue first appears; nothing when
    there was no revenue. A currency's first buyer keeps the plain milestone identity."""
    sums: dict[tuple[str, str | None, str | None], float] = {}
    for amount, currency, client, endpoint in revenue:
        key = (currency, client or client_id, endpoint or delivery_endpoint_id)
        sums[key] = sums.get(key, 0.0) + float(amount)
    lines, seen = [], set()
    for (currency, client, endpoint), total in sums.items():
        milestone = return_milestone(submission_id, currency) + (f":{endpoint}" if currency in seen else "")
        seen.add(currency)
        lines.append(LedgerLine("return", milestone, RETURNED, -total, currency, campaign_id, client, source_id,
                                endpoint))
    return lines


def request_refusal(policy: ReturnPolicy, delivered_at: datetime, now: datetime, sold: int, requested: int) -> str | None:
    """Why a client's request to return a lead delivered at `delivered_at` is outside its
    policy at `now`, given `sold` of its deliveries that earned revenue and `requested` of its
    requests pending or approved in the last POLICY_DAYS days; None: within it. With nothing sold
    in those days the share cannot be measured (and no revenue would be reversed): not applied."""
    if policy.max_age_days == 0:
        return "returnPolicy.maxAgeDays: this client's return requests are not taken (maxAgeDays is 0)"
    age = now - delivered_at
    if age > timedelta(days=policy.max_age_days):
        return (f"returnPolicy.maxAgeDays: the lead was delivered {age.days} days ago; this client's requests "
                f"are taken for {policy.max_age_days} days")
    if sold and (requested + 1) * 100 > policy.max_percent * sold:
        return (f"returnPolicy.maxPercent: {requested + 1} of its {sold} deliveries of the last {POLICY_DAYS} days "
                f"would be returned, over this client's {policy.max_percent:g} %")
    return None
