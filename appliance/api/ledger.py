"""GET /api/v1/ledger: the money entries leads earned, newest first."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, get
from litestar.params import QueryParameter

from appliance.api.auth import principal
from appliance.api.io import ok, query_int, query_str
from appliance.api.leads import DEFAULT_LIMIT, MAX_LIMIT, query_csv, query_id_range
from appliance.errors import ValidationFailed
from appliance.model import Model
from appliance.services.ledger import LedgerEntry
from appliance.storage import LedgerFilter

KINDS = ("cost", "revenue", "return")
TAGS = ["Ledger"]  # this module's group in the OpenAPI document
Query = Annotated[str | None, QueryParameter()]


class LedgerPage(Model):
    items: list[LedgerEntry]
    next_cursor: str | None
    has_more: bool


@get("/api/v1/ledger", operation_id="listLedgerEntries",
     summary="List ledger entries", tags=TAGS,
     description=("What leads cost and earned, entry by entry (cost, revenue, return), newest first, filtered by "
                  "lead, campaign, client, source, kind or dates. 400 names a bad filter."),
     opt={"data": LedgerPage, "errors": ["VALIDATION_ERROR"]})
async def list_ledger(
    request: Request,
    cursor: Query = None,
    limit: Query = None,
    lead_id: Annotated[str | None, QueryParameter(name="leadId")] = None,
    campaign_ids: Annotated[str | None, QueryParameter(name="campaignIds")] = None,
    client_ids: Annotated[str | None, QueryParameter(name="clientIds")] = None,
    source_ids: Annotated[str | None, QueryParameter(name="sourceIds")] = None,
    kind: Query = None,
    start_date: Annotated[str | None, QueryParameter(name="startDate")] = None,
    end_date: Annotated[str | None, QueryParameter(name="endDate")] = None,
) -> Response:
    """Newest first; `cursor` is the entryId of the previous page's last item. Entry ids are
    time-ordered, so the dates and the cursor are id bounds, as for leads."""
    tenant_id = principal(request.scope).tenant_id
    per_page = query_int(request, "limit", DEFAULT_LIMIT, maximum=MAX_LIMIT)
    after_id, before_id = query_id_range(request, "led")
    after = query_str(request, "cursor")
    if after is not None and not after.startswith("led_"):
        raise ValidationFailed(["cursor: not a ledger entry id (use nextCursor of the previous page)"])
    where = LedgerFilter(
        lead_id=query_str(request, "leadId"), campaign_ids=query_csv(request, "campaignIds"),
        client_ids=query_csv(request, "clientIds"), source_ids=query_csv(request, "sourceIds"),
        kind=query_str(request, "kind", choices=KINDS),
        after_id=after_id, before_id=min(filter(None, (before_id, after)), default=None))
    rows = await request.app.state.runtime.store.read_off_loop(
        lambda tx: tx.ledger.page(tenant_id, where, per_page + 1))
    more = len(rows) > per_page
    items = rows[:per_page]
    return ok({"items": items, "nextCursor": items[-1]["entryId"] if more else None, "hasMore": more})


ROUTES = [list_ledger]
