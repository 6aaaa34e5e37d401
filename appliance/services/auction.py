"""One auction round: the buyers a lead may go to are pinged at once, each under its own ping
timeout and all under the round's deadline; a buyer with a fixed `bid` bids it without a ping.
What each answered becomes a `Bid` (domain/auction.py says how answers are read and ranked).
A buyer that has not answered when the round closes is cancelled and counts as `timeout`, so
a buyer that never answers costs the round its deadline and nothing more; one that answers after
its own ping timeout counts as `timeout` too. Nothing is written
here: the caller records the round with its decision in one write transaction."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from appliance.adapters.outbound import adapter_crash
from appliance.clock import Clock, iso
from appliance.domain.auction import AuctionRecord, Bid, checked_ping_result, close_round, round_timeout_ms
from appliance.domain.campaign import Auction, DistributionEndpoint
from appliance.plugins import Registry
from appliance.sdk import DeliveryAdapter, PingRequest
from appliance.services.opened_endpoints import OpenedEndpoint

log = logging.getLogger("appliance.auction")

# Beyond the round's deadline, how long a cancelled ping may take to end (an adapter that
# ignores cancellation is left behind, its answer never read).
CANCEL_GRACE_SECONDS = 0.02


@dataclass(frozen=True)
class Bidder:
    """A buyer the round asks: its distribution item, its endpoint opened, and its adapter."""
    entry: DistributionEndpoint
    opened: OpenedEndpoint | None
    adapter: DeliveryAdapter | None

    @property
    def endpoint_id(self) -> str:
        return self.entry.delivery_endpoint_id

    @property
    def pinged(self) -> bool:
        return self.opened is not None and self.opened.endpoint.ping is not None


async def hold_round(*, auction_id: str, auction: Auction, bidders: list[Bidder], skipped: list[Bid],
                     facts: dict[str, Any], registry: Registry, http: httpx.AsyncClient, clock: Clock,
                     allow_private_addresses: bool, submission_id: str | None = None,
                     lead_id: str | None = None) -> AuctionRecord:
    """The round's record, winners left empty for the caller to fill once it has chosen."""
    started = clock.now()
    began = time.monotonic()
    deadline = round_timeout_ms(auction, [b.opened.endpoint.ping.timeout_ms for b in bidders
                                          if b.pinged]) / 1000  # type: ignore[union-attr]

    async def ask(bidder: Bidder) -> Bid:
        return await _ask(bidder, auction_id, facts, deadline, began, started, registry, http,
                          allow_private_addresses)

    tasks = {asyncio.ensure_future(ask(b)): b for b in bidders}
    answered: dict[str, Bid] = {}
    if tasks:
        done, pending = await asyncio.wait(tasks, timeout=deadline + CANCEL_GRACE_SECONDS)
        for task in pending:
            task.cancel()
        for task, bidder in tasks.items():
            if task in done and not task.cancelled() and task.exception() is None:
                answered[bidder.endpoint_id] = task.result()
            else:
                answered[bidder.endpoint_id] = Bid(delivery_endpoint_id=bidder.endpoint_id, outcome="timeout",
                                                   reason=f"no answer before the round closed ({deadline * 1000:.0f} ms)")
    ended = clock.now()
    bids = close_round([*(answered[b.endpoint_id] for b in bidders), *skipped], float(auction.floor))
    return AuctionRecord(
        auction_id=auction_id, submission_id=submission_id, lead_id=lead_id, started_at=iso(started),
        ended_at=iso(ended), duration_ms=round((time.monotonic() - began) * 1000), mode=auction.mode,
        floor=float(auction.floor), currency=auction.currency, bid_ttl_seconds=auction.bid_ttl_seconds,
        bids=bids, winners=[])


async def _ask(bidder: Bidder, auction_id: str, facts: dict[str, Any], deadline: float, began: float,
               started: datetime, registry: Registry, http: httpx.AsyncClient, allow_private_addresses: bool) -> Bid:
    endpoint_id, opened, adapter = bidder.endpoint_id, bidder.opened, bidder.adapter

    def lost(outcome: str, reason: str) -> Bid:
        return Bid(delivery_endpoint_id=endpoint_id, outcome=outcome, reason=reason,  # type: ignore[arg-type]
                   response_ms=round((time.monotonic() - began) * 1000))

    if not bidder.pinged:
        if bidder.entry.bid is not None:
            return Bid(delivery_endpoint_id=endpoint_id, outcome="bid", bid=float(bidder.entry.bid), response_ms=0,
                       reason="fixed bid")
        return lost("error", "the endpoint does not exist" if opened is None
                    else "the endpoint has no ping and the distribution gives it no bid")
    assert opened is not None and opened.endpoint.ping is not None
    if opened.missing:
        return lost("error", "the endpoint's stored credentials are missing: " + ", ".join(opened.missing))
    if adapter is None:
        return lost("error", f"no delivery adapter named {opened.endpoint.adapter!r}")
    limit = min(opened.endpoint.ping.timeout_ms / 1000, deadline)
    request = PingRequest(lead=facts, auction_id=auction_id, endpoint=opened.endpoint, secrets=opened.secrets,
                          settings=registry.adapter_settings("delivery", adapter.name), timeout_seconds=limit,
                          allow_private_addresses=allow_private_addresses, now=started)
    scrub = opened.scrubber
    # No deadline of its own here: the adapter is given `limit` (the built-in one keeps it), the
    # round cancels what is still asking when it closes, and an answer later than `limit` loses.
    try:
        result = checked_ping_result(await adapter.ping(request, http))
    except TimeoutError:
        return lost("timeout", f"no answer within {limit * 1000:.0f} ms")
    except Exception as exc:  # an adapter bug loses this bid, never the round
        crash = adapter_crash(exc, scrub)
        log.error("delivery adapter %r raised %s while pinging\n%s", adapter.name, crash.message, crash.stack)
        return lost("error", f"adapter raised {crash.message}")
    elapsed = round((time.monotonic() - began) * 1000)
    if elapsed > deadline * 1000:
        return lost("timeout", f"answered after the round closed ({elapsed} ms)")
    if elapsed > limit * 1000:
        return lost("timeout", f"answered after its ping timeout ({elapsed} ms, {limit * 1000:.0f} ms allowed)")
    reason = scrub(result.reason if result.outcome != "bid" else None)
    return Bid(delivery_endpoint_id=endpoint_id, outcome=result.outcome, response_ms=elapsed,
               bid=result.bid if result.outcome == "bid" else None, reason=reason,
               ping_token=scrub(result.ping_token) if result.outcome == "bid" else None)
