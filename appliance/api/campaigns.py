"""GET /api/v1/campaigns (interface 4.1)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from litestar import Request, Response, get
from litestar.params import QueryParameter

from appliance.api.auth import principal
from appliance.api.io import ok_raw, query_bool, query_int
from appliance.api.schemas import CampaignPage
from appliance.storage.catalog import CampaignFilter, list_campaigns

DEFAULT_LIMIT, MAX_LIMIT = 50, 100
# Declared as optional strings (as the interface lists them) and parsed by us, so a bad value is a
# VALIDATION_ERROR naming the parameter.
Query = Annotated[str | None, QueryParameter()]


@get("/api/v1/campaigns", operation_id="listCampaigns", sync_to_thread=False, opt={"data": CampaignPage})
def campaigns_list(
    request: Request,
    page: Query = None,
    limit: Query = None,
    active: Query = None,
    client_id: Annotated[str | None, QueryParameter(name="clientId")] = None,
    offer_id: Annotated[str | None, QueryParameter(name="offerId")] = None,
    include_archived: Annotated[str | None, QueryParameter(name="includeArchived")] = None,
    search: Query = None,
) -> Response:
    tenant_id = principal(request.scope).tenant_id
    page_no = query_int(request, "page", 1)
    per_page = query_int(request, "limit", DEFAULT_LIMIT, maximum=MAX_LIMIT)
    where = CampaignFilter(
        active=query_bool(request, "active"),
        client_id=client_id or None,
        offer_id=offer_id or None,
        include_archived=bool(query_bool(request, "includeArchived")),
        search=search or None,
    )
    total, docs = list_campaigns(request.app.state.runtime.db.reader(), tenant_id, where, page_no, per_page)
    pagination = msgspec.json.encode({"total": total, "page": page_no, "limit": per_page})
    return ok_raw(b'{"campaigns":[' + b",".join(docs) + b'],"pagination":' + pagination + b"}")


ROUTES = [campaigns_list]
