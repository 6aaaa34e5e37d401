"""Which money entries a lead earns when it reaches a status.

Cost milestones belong to the lead's ingestion source, revenue milestones to the delivery of the
campaign that holds it. Each fires when the lead reaches the milestone's `leadStatus` by any path,
inside its validity window and when its conditions match, at most once per submission: every
line carries its milestone's identity, and storage keeps one line per (milestone, submission).
A delivery adapter's `price`, when it returns one, is the revenue of that delivery instead of
the milestone amounts; so is a won auction bid (`sale`), one entry per buyer sold to."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import msgspec

from appliance.domain.campaign import Campaign, IngestionSource, Milestone
from appliance.domain.pipeline import milestones_due

DEFAULT_CURRENCY = "USD"  # of a price returned by a campaign that names no revenue milestone


class LedgerLine(msgspec.Struct, frozen=True):
    kind: str                 # cost | revenue | return
    milestone: str | None     # the milestone's identity; None for a return
    lead_status: str
    amount: float
    currency: str
    campaign_id: str | None
    client_id: str | None
    source_id: str | None
    delivery_endpoint_id: str | None


def source_of(campaigns: Mapping[str, Campaign], campaign_id: str | None,
              source_id: str | None) -> IngestionSource | None:
    """The ingestion source a lead came through: looked up in its campaign first, then in the
    campaign it may have been routed from (any campaign of the tenant declaring that source)."""
    if source_id is None:
        return None
    ordered = [campaigns[campaign_id]] if campaign_id in campaigns else []
    for campaign in (*ordered, *campaigns.values()):
        for source in campaign.ingestion.sources:
            if source.source_id == source_id:
                return source
    return None


def lines_for(statuses: tuple[str, ...], *, campaign: Campaign | None, source: IngestionSource | None,
              source_id: str | None, facts: Mapping[str, Any], value_sets: Mapping, now: datetime,
              price: float | None = None, endpoint_id: str | None = None,
              sale: tuple[float, str] | None = None, payout: tuple[float, str] | None = None,
              client_id: str | None = None) -> list[LedgerLine]:
    """The entries a lead earns on reaching `statuses` (a status, plus `lead_ingested` at intake);
    `endpoint_id`: the endpoint the lead went to, else the campaign's; `client_id`: the client
    its sales are charged to (the endpoint's), else the campaign's."""
    campaign_id = campaign.campaign_id if campaign is not None else None
    if client_id is None:
        client_id = campaign.client.client_id if campaign is not None and campaign.client else None
    if endpoint_id is None and campaign is not None:
        endpoint_id = campaign.delivery.delivery_endpoint_id
    today = now.date()

    def due(milestones: list[Milestone]) -> list[tuple[int, Milestone]]:
        chosen = milestones_due(milestones, statuses, facts, value_sets=value_sets, now=now, today=today)
        return [(i, m) for i, m in enumerate(milestones) if any(m is c for c in chosen)]

    lines = []
    costs = due(source.cost_milestones) if source is not None else []
    if payout is not None and "lead_ingested" in statuses:
        # A lead posted after its supplier's ping costs what the ping offered, at intake.
        amount, currency = payout
        lines.append(LedgerLine("cost", f"cost:{source_id or ''}:ping", "lead_ingested", float(amount), currency,
                                campaign_id, client_id, source_id, endpoint_id))
        costs = [(i, m) for i, m in costs if m.lead_status != "lead_ingested"]
    if source is not None:
        lines += [LedgerLine("cost", f"cost:{source.source_id}:{i}", m.lead_status, float(m.amount), m.currency,
                             campaign_id, client_id, source_id, endpoint_id)
                  for i, m in costs]
    if campaign is not None:
        revenue = due(campaign.delivery.revenue_milestones)
        if sale is not None and "delivered" in statuses:
            amount, currency = sale  # a shared lead is several sales: one entry per buyer
            revenue_lines = [LedgerLine("revenue", f"revenue:{campaign_id}:sale:{endpoint_id}", "delivered",
                                        float(amount), currency, campaign_id, client_id, source_id, endpoint_id)]
            revenue = [(i, m) for i, m in revenue if m.lead_status != "delivered"]
        elif price is not None and "delivered" in statuses:
            first = next(((i, m) for i, m in revenue if m.lead_status == "delivered"), None)
            key = f"revenue:{campaign_id}:{first[0]}" if first else f"revenue:{campaign_id}:price"
            currency = first[1].currency if first else next(
                (m.currency for m in campaign.delivery.revenue_milestones), DEFAULT_CURRENCY)
            revenue_lines = [LedgerLine("revenue", key, "delivered", float(price), currency,
                                        campaign_id, client_id, source_id, endpoint_id)]
            revenue = [(i, m) for i, m in revenue if m.lead_status != "delivered"]
        else:
            revenue_lines = []
        lines += revenue_lines + [
            LedgerLine("revenue", f"revenue:{campaign_id}:{i}", m.lead_status, float(m.amount), m.currency,
                       campaign_id, client_id, source_id, endpoint_id) for i, m in revenue]
    return lines


def expected_sale(campaign: Campaign, facts: Mapping[str, Any], value_sets: Mapping, now: datetime,
                  currency: str) -> float:
    """What delivering the lead would earn in `currency` by the campaign's revenue milestones: the
    amount a client's balance must cover before it is sent (a buyer's own price, known only
    from its answer, may differ)."""
    lines = lines_for(("delivered",), campaign=campaign, source=None, source_id=None, facts=facts,
                      value_sets=value_sets, now=now)
    return sum(line.amount for line in lines if line.kind == "revenue" and line.currency == currency)
