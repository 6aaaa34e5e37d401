"""GET /api/v1/activity; see appliance/services/activity.py."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, get
from litestar.params import QueryParameter

from appliance.api.auth import principal
from appliance.api.io import ok, query_int
from appliance.api.leads import DEFAULT_LIMIT, MAX_LIMIT
from appliance.services import activity

Query = Annotated[str | None, QueryParameter()]
TAGS = ["Activity"]  # this module's group in the OpenAPI document


@get("/api/v1/activity", operation_id="listActivity",
     summary="List recent requests", tags=TAGS,
     description=("The requests made with the tenant's keys (key name, method, route template, status, duration), "
                  "newest first; the log is written about once a second, so the newest appear a moment later."),
     sync_to_thread=False,
     opt={"data": activity.ActivityPage, "errors": ["VALIDATION_ERROR"],
          "query": {"cursor": {"type": "string", "pattern": "^[0-9]+$",
                               "description": "nextCursor of the previous page."}}})
def list_activity(request: Request, cursor: Query = None, limit: Query = None) -> Response:
    """The key's tenant's requests, newest first, `limit` (default 25, at most 100) per page."""
    per_page = query_int(request, "limit", DEFAULT_LIMIT, maximum=MAX_LIMIT)
    before = query_int(request, "cursor", 0, minimum=1) or None
    return ok(activity.page(request.app.state.runtime, principal(request.scope).tenant_id, before, per_page))


ROUTES = [list_activity]
