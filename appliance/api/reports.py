"""GET /api/v1/reports/summary: lead counts and money of a date range, grouped by campaign,
client, source, endpoint or day (services/reports.py)."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, get
from litestar.params import QueryParameter

from appliance.api.auth import principal
from appliance.api.io import ok, query_str
from appliance.domain.report import ReportSummary
from appliance.services import reports

TAGS = ["Reports"]  # this module's group in the OpenAPI document


@get("/api/v1/reports/summary", operation_id="getReportSummary",
     summary="Summarize leads and money", tags=TAGS,
     description=("Lead counts and cost, revenue and margin over a date range, grouped by campaign, client, source,"
                  " endpoint or day in a time zone. 400 names an unknown groupBy or time zone, or a bad range."),
     opt={"data": ReportSummary, "errors": ["VALIDATION_ERROR"]})
async def report_summary(
    request: Request,
    group_by: Annotated[str | None, QueryParameter(name="groupBy")] = None,
    start_date: Annotated[str | None, QueryParameter(name="startDate")] = None,
    end_date: Annotated[str | None, QueryParameter(name="endDate")] = None,
    timezone: Annotated[str | None, QueryParameter(name="timezone")] = None,
) -> Response:
    """Counts are the leads created in the range, by their current status; money is the ledger
    entries created in it, revenue net of returns."""
    who = principal(request.scope)
    state = request.app.state
    span = reports.summary_range(query_str(request, "groupBy"), query_str(request, "startDate"),
                                 query_str(request, "endDate"), query_str(request, "timezone"),
                                 state.runtime.clock.now())
    campaigns = state.settings.get(who.tenant_id, who.config_rev).campaigns
    return ok(await reports.summary(state.runtime.store, who.tenant_id, span, campaigns))


ROUTES = [report_summary]
