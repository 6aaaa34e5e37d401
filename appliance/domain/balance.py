"""A client's balance (CONTRACT 9.4): every sale to a client debits it by the sale's revenue,
every approved return and every credit credits it. The balance is never a column of its own:
each entry carries the running balance after it, so a statement is its entries read in order.

A `prepaid` client may buy while its balance covers the sale, a `credit` client while its
balance plus its credit limit does; a sale under way holds its amount until its outcome, so
that two sales at once cannot both spend the same money. A client with billing `none` is never
refused, though its sales are still on its statement."""

from __future__ import annotations

from typing import Literal

from appliance.domain.client import Billing, ClientRecord
from appliance.model import Model

BalanceKind = Literal["sale", "return", "credit"]
CENTS = 6  # places kept in a running balance: floats summed entry by entry must not drift


class BalanceLine(Model):
    """An entry of a statement: `amount` negative for a sale, positive for a return or a credit;
    `balance` the balance after it."""

    at: str
    kind: BalanceKind
    amount: float
    balance: float
    currency: str
    lead_id: str | None = None
    note: str | None = None


class Statement(Model):
    client_id: str
    start_date: str
    end_date: str
    opening_balance: float
    closing_balance: float
    currency: str
    lines: list[BalanceLine]


class ClientBalance(Model):
    """A client record with its balance: the `client.low_balance` event's data."""

    client_id: str
    name: str
    active: bool
    billing: Billing
    balance: float
    available: float | None  # what it may still buy for now; null when its billing limits nothing


def after(balance: float, amount: float) -> float:
    return round(balance + amount, CENTS)


def spendable(billing: Billing, balance: float, held: float) -> float | None:
    """What the client may still buy for: None when its billing limits nothing."""
    if billing.mode == "none":
        return None
    limit = billing.credit_limit if billing.mode == "credit" else 0
    return round(balance + limit - held, CENTS)


def covers(billing: Billing, balance: float, held: float, amount: float) -> bool:
    """Whether a sale of `amount` may go to the client now, the sales under way (`held`) counted."""
    room = spendable(billing, balance, held)
    return room is None or room >= amount


def may_bid(billing: Billing, balance: float, held: float, floor: float) -> bool:
    """Whether a client is pinged at all: its money must cover the auction's floor, and more than
    nothing (a bid is at least a cent)."""
    room = spendable(billing, balance, held)
    return room is None or (room > 0 and room >= floor)


def crossed_low(billing: Billing, before: float, now: float) -> bool:
    """Whether this entry took the balance below the client's low-balance mark (once a crossing:
    the next entry below it does not cross again until one brings it back up)."""
    return billing.low_balance is not None and before >= billing.low_balance > now


def with_balance(client: ClientRecord, balance: float, held: float) -> ClientBalance:
    return ClientBalance(client_id=client.client_id, name=client.name, active=client.active, billing=client.billing,
                         balance=balance, available=spendable(client.billing, balance, held))
