"""A lead's auction rounds as the API shows them (GET /api/v1/leads/{leadId}/auctions): every
buyer's bid with its outcome and answer time, and the buyers the lead was sold to. Ping tokens
stay in storage."""

from __future__ import annotations

from typing import Literal

from appliance.domain.auction import AuctionRecord, BidOutcome
from appliance.errors import NotFound
from appliance.model import Model
from appliance.runtime import Runtime


class AuctionBid(Model):
    delivery_endpoint_id: str
    outcome: BidOutcome
    bid: float | None
    response_ms: int | None
    reason: str | None


class LeadAuction(Model):
    auction_id: str
    submission_id: str | None
    started_at: str
    ended_at: str
    duration_ms: int
    mode: Literal["exclusive", "shared"]
    floor: float
    currency: str
    bids: list[AuctionBid]
    winners: list[str]


class LeadAuctionPage(Model):
    items: list[LeadAuction]
    next_cursor: str | None
    has_more: bool


def shown(record: AuctionRecord) -> LeadAuction:
    return LeadAuction(
        auction_id=record.auction_id, submission_id=record.submission_id, started_at=record.started_at,
        ended_at=record.ended_at, duration_ms=record.duration_ms, mode=record.mode, floor=record.floor,
        currency=record.currency, winners=list(record.winners),
        bids=[AuctionBid(delivery_endpoint_id=b.delivery_endpoint_id, outcome=b.outcome, bid=b.bid,
                         response_ms=b.response_ms, reason=b.reason) for b in record.bids])


def lead_auctions(runtime: Runtime, tenant_id: str, lead_id: str, before: str | None, limit: int) -> LeadAuctionPage:
    """The lead's rounds, newest first (NotFound for a lead that is not the tenant's)."""
    tx = runtime.store.reader()
    with tx:
        if not tx.leads.lead_exists(tenant_id, lead_id):
            raise NotFound()
        rows = tx.auctions.of_lead(tenant_id, lead_id, before, limit + 1)
    items = [shown(r) for r in rows[:limit]]
    more = len(rows) > limit
    return LeadAuctionPage(items=items, next_cursor=items[-1].auction_id if more else None, has_more=more)
