"""A lead's auction rounds as the API shows them (GET /api/v1/leads/{leadId}/auctions): every
buyer's bid with its outcome and answer time, and the buyers the lead was sold to. Ping tokens
stay in storage."""

from __future__ import annotations

from appliance.domain.auction import AuctionShown, shown
from appliance.errors import NotFound
from appliance.model import Model
from appliance.runtime import Runtime


class LeadAuctionPage(Model):
    items: list[AuctionShown]
    next_cursor: str | None
    has_more: bool


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
