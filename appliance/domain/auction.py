"""Selling a lead at auction, the pure part: how a buyer's ping answer is read into a bid
(`read_ping_answer`), how a round's answers rank (`close_round`: highest bid first, ties to the
faster answer; below the floor loses), what bids still stand after some were tried or expired
(`standing`), and what a pinging supplier is offered (`payout`). services/auction.py pings the
buyers and stores the record; services/buyer_choice.py sells to the standing bids in order."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

import msgspec

from appliance.domain.campaign import MAX_BID, Auction, AuctionMargin
from appliance.domain.delivery_mapping import (
    MAX_MESSAGE_CHARS, body_text, json_path, parse_json, response_matches, short_text,
)
from appliance.domain.endpoint import PingResponseRules
from appliance.domain.rules import MISSING
from appliance.model import Model

PingOutcome = Literal["bid", "no_bid", "error"]
BidOutcome = Literal["bid", "no_bid", "below_floor", "timeout", "error", "skipped"]
MAX_TOKEN_CHARS = 500


class PingResult(msgspec.Struct, kw_only=True):
    """What one buyer answered a ping, as an adapter reports it (plugins import it from
    appliance.sdk). `bid`: a bid, with its amount (and the token the post carries back);
    `no_bid`: the buyer passed; `error`: the answer could not be read as either."""

    outcome: PingOutcome
    bid: float | None = None
    ping_token: str | None = None
    reason: str | None = None
    message: str | None = None
    status_code: int | None = None


class Bid(msgspec.Struct, kw_only=True, rename="camel"):
    """One buyer's part in a round, as recorded. `pingToken` stays in storage (the post carries
    it); the API never shows it."""

    delivery_endpoint_id: str
    outcome: BidOutcome
    bid: float | None = None
    response_ms: int | None = None
    reason: str | None = None
    ping_token: str | None = None


class AuctionRecord(msgspec.Struct, kw_only=True, rename="camel"):
    """One ping round: every buyer of the distribution with its outcome, and the buyers the lead
    was sold to (or reserved for, when a supplier pinged)."""

    auction_id: str
    submission_id: str | None  # None for a supplier's ping until the lead is posted
    started_at: str
    ended_at: str
    duration_ms: int
    mode: Literal["exclusive", "shared"]
    floor: float
    currency: str
    bid_ttl_seconds: int
    bids: list[Bid]
    winners: list[str]
    lead_id: str | None = None
    ping_id: str | None = None
    campaign_id: str | None = None


class Sale(msgspec.Struct, frozen=True):
    """A won bid on its way to its buyer: the revenue it books and what the post may carry back."""
    auction_id: str
    bid: float
    currency: str
    ping_token: str | None

    def fields(self) -> dict[str, Any]:
        """What the post's field mapping may read under `auction.`."""
        return {"auctionId": self.auction_id, "bid": self.bid, "pingToken": self.ping_token}


def sale_of(record: AuctionRecord | None, endpoint_id: str | None) -> Sale | None:
    """The sale `record` holds for `endpoint_id` (its bid), if that buyer bid in it."""
    if record is None or endpoint_id is None:
        return None
    bid = next((b for b in record.bids if b.delivery_endpoint_id == endpoint_id and b.outcome == "bid"), None)
    if bid is None or bid.bid is None:
        return None
    return Sale(record.auction_id, bid.bid, record.currency, bid.ping_token)


def parse_bid(value: Any) -> tuple[float | None, str | None]:
    """(amount, None) for a usable bid, else (None, why not). A JSON number, or text that is
    only a number; never a boolean, a currency sign, NaN, a negative or an absurd amount."""
    if isinstance(value, bool) or value is None:
        return None, f"bid is {msgspec.json.encode(value).decode()}, not a number"
    if isinstance(value, str):
        text = value.strip()
        try:
            amount = float(text)
        except ValueError:
            return None, f"bid {short_text(value, 40)!r} is not a number"
        if not text or not (text[0].isdigit() or text[0] in "+-.") or text.lower() in ("inf", "nan"):
            return None, f"bid {short_text(value, 40)!r} is not a number"
    elif isinstance(value, int | float):
        amount = float(value)
    else:
        return None, "bid is not a number"
    if math.isnan(amount) or math.isinf(amount):
        return None, "bid is not a finite number"
    if amount < 0:
        return None, f"bid {amount:g} is negative"
    if amount > MAX_BID:
        return None, f"bid {amount:g} is over {MAX_BID:,}"
    return amount, None


def read_ping_answer(rules: PingResponseRules, status_code: int, body: bytes,
                     content_type: str | None = None) -> PingResult:
    """A buyer's answer to a ping: a 5xx (and 408, 429) or an accepted answer whose bid cannot
    be read is `error`; one the `accepted` matcher refuses (by default: not a 2xx, or no bid at
    `bidPath`) is `no_bid`; else a bid."""
    document = parse_json(body)
    message = short_text(json_path(document, rules.message_path), MAX_MESSAGE_CHARS) if rules.message_path else None
    if status_code in (408, 429) or status_code >= 500 or status_code < 200:
        return PingResult(outcome="error", reason=f"HTTP {status_code}", message=message, status_code=status_code)
    if document is MISSING and body.strip() and rules.accepted is None:
        return PingResult(outcome="error", reason=f"HTTP {status_code}: the answer is not JSON", message=message,
                          status_code=status_code)
    found = json_path(document, rules.bid_path)
    if rules.accepted is not None:
        accepted = response_matches(rules.accepted, status_code, document, body_text(body, content_type))
    else:
        accepted = 200 <= status_code < 300 and found is not MISSING and found is not None
    if not accepted:
        return PingResult(outcome="no_bid", reason=f"HTTP {status_code}: no bid", message=message,
                          status_code=status_code)
    if document is MISSING:
        return PingResult(outcome="error", reason=f"HTTP {status_code}: the answer is not JSON",
                          message=message, status_code=status_code)
    if found is MISSING:
        return PingResult(outcome="error", reason=f"HTTP {status_code}: no bid at {rules.bid_path}",
                          message=message, status_code=status_code)
    amount, problem = parse_bid(found)
    if problem is not None:
        return PingResult(outcome="error", reason=f"HTTP {status_code}: {problem}", message=message,
                          status_code=status_code)
    token = json_path(document, rules.ping_token_path) if rules.ping_token_path else MISSING
    return PingResult(outcome="bid", bid=amount, reason=None, message=message, status_code=status_code,
                      ping_token=short_text(token, MAX_TOKEN_CHARS) if token is not MISSING else None)


def checked_ping_result(result: Any) -> PingResult:
    """A plugin's answer with the types it declares and a bid that is a usable amount: anything
    else is an `error` with the reason, never a sale."""
    try:
        checked = msgspec.convert(msgspec.to_builtins(result), PingResult)
    except (msgspec.ValidationError, TypeError) as exc:
        return PingResult(outcome="error", reason=f"the adapter returned an invalid ping result: {exc}")
    if checked.outcome == "bid":
        amount, problem = parse_bid(checked.bid)
        if problem is not None:
            return PingResult(outcome="error", reason=problem, status_code=checked.status_code)
        checked = msgspec.structs.replace(checked, bid=amount)
    return checked


def close_round(bids: Iterable[Bid], floor: float) -> list[Bid]:
    """The round's bids as recorded: a bid under the floor becomes `below_floor`."""
    return [msgspec.structs.replace(b, outcome="below_floor", reason=f"bid {b.bid:g} is under the floor {floor:g}")
            if b.outcome == "bid" and b.bid is not None and b.bid < floor else b for b in bids]


def ranked(bids: Iterable[Bid]) -> list[Bid]:
    """The bids that stand, highest first; equal bids to the faster answer."""
    return sorted((b for b in bids if b.outcome == "bid" and b.bid is not None),
                  key=lambda b: (-(b.bid or 0.0), b.response_ms or 0))


def standing(record: AuctionRecord, tried: Sequence[str], now: datetime) -> list[Bid]:
    """The bids of `record` still standing at `now`: ranked, not tried yet, not older than the TTL."""
    if expired(record, now):
        return []
    done = set(tried)
    return [b for b in ranked(record.bids) if b.delivery_endpoint_id not in done]


def expired(record: AuctionRecord, now: datetime) -> bool:
    return now > datetime.fromisoformat(record.ended_at) + timedelta(seconds=record.bid_ttl_seconds)


def round_timeout_ms(auction: Auction, ping_timeouts: Iterable[int]) -> int:
    """The whole round's deadline: the campaign's, else the largest buyer's ping timeout."""
    if auction.timeout_ms is not None:
        return auction.timeout_ms
    return max(ping_timeouts, default=1000)


def payout(winning_bid: float, margin: AuctionMargin | None) -> float:
    """What a pinging supplier is offered for a lead whose best bid is `winning_bid`: the bid
    less the margin's percentage, then less its amount; never below zero; in cents, half a cent
    up (in decimal: a float's 2.675 is 2.67499...)."""
    bid = Decimal(str(winning_bid))
    offered = bid
    if margin is not None and margin.percent:
        offered -= bid * Decimal(str(margin.percent)) / 100
    if margin is not None and margin.amount:
        offered -= Decimal(str(margin.amount))
    return float(max(offered, Decimal(0)).quantize(CENT, rounding=ROUND_HALF_UP))


CENT = Decimal("0.01")


class BidShown(Model):
    """A bid as the API and the journey event show it: without the ping token."""
    delivery_endpoint_id: str
    outcome: BidOutcome
    bid: float | None
    response_ms: int | None
    reason: str | None


class AuctionShown(Model):
    """A round as GET /api/v1/leads/{leadId}/auctions lists it and the `auction` event carries it."""
    auction_id: str
    submission_id: str | None
    started_at: str
    ended_at: str
    duration_ms: int
    mode: Literal["exclusive", "shared"]
    floor: float
    currency: str
    bids: list[BidShown]
    winners: list[str]


def shown(record: AuctionRecord) -> AuctionShown:
    return AuctionShown(
        auction_id=record.auction_id, submission_id=record.submission_id, started_at=record.started_at,
        ended_at=record.ended_at, duration_ms=record.duration_ms, mode=record.mode, floor=record.floor,
        currency=record.currency, winners=list(record.winners),
        bids=[BidShown(delivery_endpoint_id=b.delivery_endpoint_id, outcome=b.outcome, bid=b.bid,
                       response_ms=b.response_ms, reason=b.reason) for b in record.bids])


def summary(record: AuctionRecord) -> dict[str, Any]:
    """The round as the `auction` journey event's details carry it."""
    return msgspec.to_builtins(shown(record))
