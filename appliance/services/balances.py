"""Clients' balances (CONTRACT 9.4; the rules in domain/balance.py). An entry is written in the
transaction of what caused it: a sale with the ledger's revenue (`follow_ledger`, from
services/ledger.earn), a return with its reversal, a credit by itself (`credit`). A delivery to a
client whose billing limits what it buys takes a hold for the sale in the write transaction that
chooses its buyer (`short_of_funds`, then `tx.balances.hold` on its job): the writes of a store run one at a time, so two
sales that together pass the money cannot both be chosen. A buyer that cannot cover the sale is
left out as a paused one is, with the reason `balance`; a credit lets the leads waiting for it go."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Annotated

import msgspec
from msgspec import Meta

from appliance.clock import iso
from appliance.domain.balance import (
    BalanceLine, ClientBalance, Statement, after, covers, crossed_low, may_bid, with_balance,
)
from appliance.domain.client import MAX_MONEY, ClientRecord
from appliance.domain.ledger import LedgerLine
from appliance.domain.webhooks import PLUGIN_SUBSCRIBER, lane_of, subscribed
from appliance.errors import NotFound
from appliance.model import Model
from appliance.runtime import Runtime
from appliance.services import audit
from appliance.services.tenant_settings import TenantSettings
from appliance.storage import CLIENTS, NewEvents, Session

LOW_BALANCE = "client.low_balance"
STATEMENT_DAYS = 30  # a statement without dates: the last 30 days
EARLIEST = "0001-01-01T00:00:00.000Z"


class CreditBody(Model):
    amount: Annotated[float, Meta(gt=0, le=MAX_MONEY)]
    note: Annotated[str, Meta(max_length=500)] | None = None


def entry(tx: Session, settings: TenantSettings, tenant_id: str, client: ClientRecord, kind: str, amount: float,
          at: str, *, lead_id: str | None = None, note: str | None = None) -> BalanceLine:
    """Append one entry with the balance after it; crossing the client's low-balance mark
    queues `client.low_balance` for the subscribers that want it."""
    seq, before = tx.balances.last(tenant_id, client.client_id)
    line = BalanceLine(at=at, kind=kind, amount=amount, balance=after(before, amount),
                       currency=client.billing.currency, lead_id=lead_id, note=note)
    tx.balances.append(tenant_id, client.client_id, seq + 1, line)
    if crossed_low(client.billing, before, line.balance):
        data = with_balance(client, line.balance, tx.balances.held(tenant_id, client.client_id))
        queued = [NewEvents(webhook_id, lane_of(client.client_id), (LOW_BALANCE,))
                  for webhook_id, events in settings.subscribers
                  if webhook_id != PLUGIN_SUBSCRIBER and subscribed(events, LOW_BALANCE)]
        if queued:
            tx.webhooks.enqueue_payload(tenant_id, queued, msgspec.json.encode(data), at)
    return line


def follow_ledger(tx: Session, settings: TenantSettings, tenant_id: str, lead_id: str,
                  written: Iterable[LedgerLine], at: str) -> None:
    """The balance entries of ledger lines just written: a revenue line debits its client, a
    return line credits it back (lines in another currency than the client's are not its balance's)."""
    for line in written:
        client = settings.clients.get(line.client_id or "")
        if client is None or line.currency != client.billing.currency or line.kind == "cost" or not line.amount:
            continue
        kind = "sale" if line.kind == "revenue" else "return"
        entry(tx, settings, tenant_id, client, kind, -line.amount, at, lead_id=lead_id)
        if kind == "return":
            release_waiting(tx, settings, tenant_id, client.client_id, at)


# ---- before a sale: may the client buy it? ------------------------------------------------------

def short_of_funds(tx: Session, tenant_id: str, client: ClientRecord, amount: float,
                   job_id: int | None = None) -> bool:
    """Whether the client cannot cover `amount` now, counting what its other deliveries under
    way hold (read in the caller's transaction: the write one, when a hold follows)."""
    _, balance = tx.balances.last(tenant_id, client.client_id)
    return not covers(client.billing, balance, tx.balances.held(tenant_id, client.client_id, job_id), amount)


def may_be_pinged(tx: Session, tenant_id: str, client: ClientRecord, floor: float) -> bool:
    _, balance = tx.balances.last(tenant_id, client.client_id)
    return may_bid(client.billing, balance, tx.balances.held(tenant_id, client.client_id), floor)


def endpoints_charged_to(settings: TenantSettings, client_id: str) -> set[str]:
    """The endpoints whose sales are charged to the client: its own, and those of its campaigns
    that name no other client."""
    charged = {endpoint_id for endpoint_id, owner in settings.endpoint_clients.items() if owner == client_id}
    for campaign in settings.campaigns.values():
        if campaign.client is None or campaign.client.client_id != client_id:
            continue
        distribution = campaign.delivery.distribution
        named = [e.delivery_endpoint_id for e in distribution.endpoints] if distribution is not None else []
        for endpoint_id in (campaign.delivery.delivery_endpoint_id, *named):
            if endpoint_id and endpoint_id not in settings.endpoint_clients:
                charged.add(endpoint_id)
    return charged


def release_waiting(tx: Session, settings: TenantSettings, tenant_id: str, client_id: str, now: str) -> None:
    """Money came in: the leads waiting for a buyer of this client are tried again at once."""
    for endpoint_id in sorted(endpoints_charged_to(settings, client_id)):
        tx.jobs.release_paused(tenant_id, endpoint_id, now)


# ---- the API ------------------------------------------------------------------------------------

async def credit(runtime: Runtime, settings: TenantSettings, tenant_id: str, actor: str, client_id: str,
                 body: CreditBody) -> BalanceLine:
    """Funds added: the entry, with the balance after it. Leads waiting for a buyer of this
    client (paused for its money) are tried again at once."""
    def unit(tx: Session) -> BalanceLine:
        now = iso(runtime.clock.now())  # taken in the unit: entries' times follow their order
        client = tx.catalog.get_doc(CLIENTS, tenant_id, client_id)
        if client is None:
            raise NotFound()
        line = entry(tx, settings, tenant_id, client, "credit", body.amount, now, note=body.note)
        release_waiting(tx, settings, tenant_id, client_id, now)
        audit.record(tx, tenant_id, actor, "client.credit", client_id, now,
                     after={"amount": body.amount, "note": body.note, "balance": line.balance})
        return line

    return await runtime.store.write(unit, may_refuse=True)


def statement(runtime: Runtime, tenant_id: str, client_id: str, start: str | None, end: str | None) -> Statement:
    """The client's entries with `start` <= at < `end` (timestamps; by default the last 30
    days), oldest first, between the balance before the first and after the last."""
    end = end or iso(runtime.clock.now() + timedelta(milliseconds=1))
    if start is None:
        try:
            start = iso(datetime.fromisoformat(end) - timedelta(days=STATEMENT_DAYS))
        except OverflowError:  # an end in the first days of year 1: from the start of time
            start = EARLIEST
    end = max(start, end)  # a start after now, the end left to its default: nothing yet, not an error
    tx = runtime.store.reader()
    with tx:
        client = tx.catalog.get_doc(CLIENTS, tenant_id, client_id)
        if client is None:
            raise NotFound()
        opening = tx.balances.balance_before(tenant_id, client_id, start)
        lines = tx.balances.lines(tenant_id, client_id, start, end)
    return Statement(client_id=client_id, start_date=start, end_date=end, opening_balance=opening,
                     closing_balance=lines[-1].balance if lines else opening, currency=client.billing.currency,
                     lines=lines)


def balances_of(runtime: Runtime, tenant_id: str) -> list[ClientBalance]:
    """Every client with its balance and what it may still buy for (the console's list)."""
    tx = runtime.store.reader()
    with tx:
        clients = tx.catalog.load_docs(CLIENTS, tenant_id)
        balances = tx.balances.balances(tenant_id)
        return [with_balance(c, balances.get(c.client_id, 0.0), tx.balances.held(tenant_id, c.client_id))
                for c in clients]
