"""Money: the entries a lead earns as its status changes, the ledger's pages and the summary
report. Every path that changes a status calls `earn` inside its own unit of work, so an entry
is committed with the change that earned it, or not at all."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from appliance.clock import iso
from appliance.domain.campaign import Campaign, IngestionSource
from appliance.domain.lead import LeadRecord
from appliance.domain.ledger import lines_for, source_of
from appliance.domain.submission import facts_of
from appliance.model import Model
from appliance.services import balances
from appliance.services.tenant_settings import TenantSettings
from appliance.storage import Session


class LedgerEntry(Model):
    """An entry as the API shows it (GET /api/v1/ledger, the answer of a return)."""

    entry_id: str
    lead_id: str
    submission_id: str
    campaign_id: str | None
    client_id: str | None
    source_id: str | None
    delivery_endpoint_id: str | None
    kind: Literal["cost", "revenue", "return"]
    amount: float
    currency: str
    lead_status: str
    created_at: str


_LOOK_UP = object()  # `source` not given: found from the lead's campaign and source id


def earn(tx: Session, settings: TenantSettings, tenant_id: str, lead: LeadRecord, submission_id: str,
         statuses: tuple[str, ...], now: datetime, *, campaign: Campaign | None = None,
         source: IngestionSource | None | object = _LOOK_UP, facts: dict | None = None,
         price: float | None = None, endpoint_id: str | None = None,
         sale: tuple[float, str] | None = None, payout: tuple[float, str] | None = None) -> None:
    """Record the milestones `lead` (as it now is: its campaign and source) earns by reaching
    `statuses` for `submission_id`; `campaign` defaults to the lead's. The submit passes the
    source it already resolved; a delivery passes the endpoint it went to."""
    if lead.is_test:  # a test lead runs the whole pipeline and books no money
        return
    campaign = campaign or settings.campaigns.get(lead.campaign_id or "")
    if source is _LOOK_UP:
        source = source_of(settings.campaigns, lead.campaign_id, lead.source_id)
    if not (source and source.cost_milestones) and not (campaign and campaign.delivery.revenue_milestones) \
            and price is None and sale is None and payout is None:
        return
    if endpoint_id is None and campaign is not None:
        endpoint_id = campaign.delivery.delivery_endpoint_id
    lines = lines_for(statuses, campaign=campaign, source=source, source_id=lead.source_id,
                      facts=facts if facts is not None else facts_of(lead), value_sets=settings.value_sets,
                      now=now, price=price, endpoint_id=endpoint_id, sale=sale,
                      payout=payout, client_id=settings.client_of(endpoint_id, campaign))
    if not lines:
        return
    if any(line.client_id in settings.clients for line in lines if line.kind == "revenue"):
        # A client's balance follows the sales written now, never one already booked.
        written = tx.ledger.record_new(tenant_id, lead.lead_id, submission_id, lines, iso(now))
        balances.follow_ledger(tx, settings, tenant_id, lead.lead_id, written, iso(now))
    else:
        tx.ledger.record(tenant_id, lead.lead_id, submission_id, lines, iso(now))
