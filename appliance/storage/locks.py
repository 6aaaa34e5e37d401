"""What a write unit must be exact about, named: a scoped unit (`store.write(unit, locks=...)`)
holds these until its transaction commits, so no other process's unit changes the same thing in
between, while units naming other things commit alongside it. SQLite has one writer and needs
none of them; on PostgreSQL each name is an advisory lock (its 64-bit hash).

A unit names everything shared it reads to decide and then writes: two units naming nothing
in common must be able to commit in either order with the same result."""

from __future__ import annotations

import hashlib


def cap_counter(tenant_id: str, scope: str, period_start: str) -> str:
    """A cap's or delivery limit's counter for one period (storage/caps.py)."""
    return f"cap\x1f{tenant_id}\x1f{scope}\x1f{period_start}"


def dedupe_key(tenant_id: str, campaign_id: str, field: str, value: str) -> str:
    """Leads of one campaign with one email or phone: the dedupe window's lookup and the lead after it."""
    return f"dedupe\x1f{tenant_id}\x1f{campaign_id}\x1f{field}\x1f{value}"


def lead(tenant_id: str, lead_id: str) -> str:
    """One lead and its submissions (a resubmission, a delivery's outcome, a decision on it)."""
    return f"lead\x1f{tenant_id}\x1f{lead_id}"


def ping(tenant_id: str, ping_id: str) -> str:
    """A supplier's ping, taken by the one post it allows."""
    return f"ping\x1f{tenant_id}\x1f{ping_id}"


def delivery_state(tenant_id: str, campaign_id: str) -> str:
    """A campaign's delivery state: its rotation, its buyers' limits and health as its deliveries use them."""
    return f"delivery\x1f{tenant_id}\x1f{campaign_id}"


def endpoint(tenant_id: str, endpoint_id: str) -> str:
    """A buyer endpoint's health (its runs of errors pause it) and its limits."""
    return f"endpoint\x1f{tenant_id}\x1f{endpoint_id}"


def balance(tenant_id: str, client_id: str) -> str:
    """A client's balance: its next entry's number, and whether it can pay for a sale."""
    return f"balance\x1f{tenant_id}\x1f{client_id}"


def webhook_lane(tenant_id: str, webhook_id: str, lane: int | str) -> str:
    """A subscription's lane of events: which event is next, and its attempt recorded."""
    return f"webhook\x1f{tenant_id}\x1f{webhook_id}\x1f{lane}"


def key_of(name: str) -> int:
    """The advisory lock key of `name`: a signed 64-bit hash, the same in every process. Two names
    that share a key only wait for each other more than they must."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)
