"""Report summaries (GET /api/v1/reports/summary and `appliance report`): the query checked
into a range (domain/report.py), the rollups read in one read transaction (storage/reports.py),
the keys labelled from the tenant's campaigns.

Labels: a campaign's name, its client's clientName, an ingestion source's name, the endpoint's
id (endpoints have no name), the date itself by day; a key the catalog does not know (a deleted
campaign) is its own label, and the leads and entries without one (no source: submitted with a
tenant key; no endpoint) are one row with key null and label "(none)". Lead counts by endpoint
are those of the campaigns whose delivery names the endpoint (the campaign's configuration now:
a campaign with a distribution counts under its `deliveryEndpointId`, else under none); money by
endpoint is the entries' own deliveryEndpointId (with a distribution, the buyer each lead went to)."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from datetime import datetime

from appliance.domain.campaign import Campaign
from appliance.domain.report import ReportQueryError, ReportRange, ReportSummary, report_range, summarize
from appliance.errors import ValidationFailed
from appliance.storage import Session, Store


def summary_range(group_by: str | None, start: str | None, end: str | None, timezone: str | None,
                  now: datetime) -> ReportRange:
    """The query's range, or VALIDATION_ERROR naming each bad field."""
    try:
        return report_range(group_by, start, end, timezone, now)
    except ReportQueryError as exc:
        raise ValidationFailed(exc.problems) from None


def _labels(group_by: str, campaigns: Mapping[str, Campaign]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for campaign in campaigns.values():
        if group_by == "campaign":
            labels[campaign.campaign_id] = campaign.name
        elif group_by == "client" and campaign.client and campaign.client.client_id and campaign.client.client_name:
            labels.setdefault(campaign.client.client_id, campaign.client.client_name)
        elif group_by == "source":
            for source in campaign.ingestion.sources:
                if source.name:
                    labels.setdefault(source.source_id, source.name)
    return labels


def read_summary(tx: Session, tenant_id: str, span: ReportRange,
                 campaigns: Mapping[str, Campaign] | None = None) -> ReportSummary:
    """The summary, read in one transaction of `tx` (the tenant's campaigns too when not given)."""
    by = "bucket" if span.group_by == "day" else span.group_by
    with tx:
        if campaigns is None:
            campaigns = {c.campaign_id: c for c in tx.catalog.all_campaigns(tenant_id)}
        counts = tx.reports.lead_counts(tenant_id, "campaign" if by == "endpoint" else by, span.first, span.end,
                                        utc_days=span.utc_days)
        money = tx.reports.money(tenant_id, by, span.first, span.end, utc_days=span.utc_days)
    if by == "endpoint":
        endpoint_of = {cid: c.delivery.delivery_endpoint_id or "" for cid, c in campaigns.items()}
        counts = [(endpoint_of.get(key, ""), status, leads) for key, status, leads in counts]  # type: ignore[arg-type]
    return summarize(span, counts, money, _labels(span.group_by, campaigns))


async def summary(store: Store, tenant_id: str, span: ReportRange,
                  campaigns: Mapping[str, Campaign] | None = None) -> ReportSummary:
    """`read_summary` on a worker thread with its own read session."""
    return await store.read_off_loop(lambda tx: read_summary(tx, tenant_id, span, campaigns))


CSV_COLUMNS = ("key", "label", "leads", "qualified", "delivered", "failed", "duplicate", "disqualified", "returned",
               "cost", "revenue", "margin", "currency")


def summary_csv(data: dict) -> str:
    """A summary (as the API's `data` object) as CSV: a header row, one row per key and currency
    (`appliance report --csv` and the console's download)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    writer.writerows([[_cell(row[c]) for c in CSV_COLUMNS] for row in data["rows"]])
    return out.getvalue()


def _cell(value: object) -> object:
    """A label a spreadsheet would run as a formula (`=HYPERLINK(...)`, a campaign named so) is
    written as text; numbers stay numbers."""
    if value is None:
        return ""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value
