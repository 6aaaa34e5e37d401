"""GET /api/v1/campaigns (interface 4.1)."""

from __future__ import annotations

import msgspec
from litestar import Request, Response, get
from litestar.params import Parameter

from appliance.api.auth import principal
from appliance.api.io import ok_raw, query_bool, query_int
from appliance.api.schemas import CampaignPage
from appliance.storage.catalog import CampaignFilter, list_campaigns

DEFAULT_LIMIT, MAX_LIMIT = 50, 100


@get("/api/v1/campaigns", operation_id="listCampaigns", sync_to_thread=False, opt={"data": CampaignPage})
def campaigns_list(
    request: Request,
    page: str | None = None,
    limit: str | None = None,
    active: str | None = None,
    client_id: str | None = Parameter(query="clientId", default=None),
    offer_id: str | None = Parameter(query="offerId", default=None),
    include_archived: str | None = Parameter(query="includeArchived", default=None),
    search: str | None = None,
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
