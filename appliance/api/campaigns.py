"""GET /api/v1/campaigns."""

from __future__ import annotations

from collections import OrderedDict
from typing import Annotated

import msgspec
from litestar import Request, Response, get
from litestar.params import QueryParameter

from appliance.api.auth import principal
from appliance.api.io import query_bool, query_int
from appliance.errors import JSON
from appliance.api.schemas import CampaignPage
from appliance.storage import CampaignFilter

DEFAULT_LIMIT, MAX_LIMIT = 50, 100
# Declared as optional strings (as the interface lists them) and parsed by us, so a bad value is a
# VALIDATION_ERROR naming the parameter.
Query = Annotated[str | None, QueryParameter()]
TAGS = ["Campaigns"]  # this module's group in the OpenAPI document


@get("/api/v1/campaigns", operation_id="listCampaigns",
     summary="List campaigns", tags=TAGS,
     description=("The tenant's campaigns as its bundle configures them, a page at a time, filtered by active, "
                  "client, offer or text; archived ones only with includeArchived=true. Ingestion sources show "
                  "their key's prefix, never the key."),
     sync_to_thread=False, opt={"data": CampaignPage})
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
    who = principal(request.scope)
    page_no = query_int(request, "page", 1)
    per_page = query_int(request, "limit", DEFAULT_LIMIT, maximum=MAX_LIMIT)
    where = CampaignFilter(
        active=query_bool(request, "active"),
        client_id=client_id or None,
        offer_id=offer_id or None,
        include_archived=bool(query_bool(request, "includeArchived")),
        search=search or None,
    )
    # Campaigns change only through config imports and key changes, which move config_rev (read
    # with the key), so a rendered page stays right until then.
    cache: PageCache = request.app.state.campaign_pages
    cache_key = (who.tenant_id, who.config_rev, where, page_no, per_page)
    body = cache.get(cache_key)
    if body is None:
        total, docs = request.app.state.runtime.store.reader().catalog.list_campaigns(who.tenant_id, where, page_no, per_page)
        pagination = msgspec.json.encode({"total": total, "page": page_no, "limit": per_page})
        body = cache.put(cache_key, b"".join(
            (b'{"success":true,"data":{"campaigns":[', b",".join(docs), b'],"pagination":', pagination, b"}}")))
    return Response(body, media_type=JSON)


class PageCache:
    """Rendered list pages, least recently used out first."""

    def __init__(self, size: int = 512) -> None:
        self.size = size
        self._pages: OrderedDict[tuple, bytes] = OrderedDict()

    def get(self, key: tuple) -> bytes | None:
        body = self._pages.get(key)
        if body is not None:
            self._pages.move_to_end(key)
        return body

    def put(self, key: tuple, body: bytes) -> bytes:
        self._pages[key] = body
        if len(self._pages) > self.size:
            self._pages.popitem(last=False)
        return body


ROUTES = [campaigns_list]
