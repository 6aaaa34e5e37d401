"""POST /api/v1/leads/ping and GET /api/v1/pings; the rules are in services/supplier_pings.py."""

from __future__ import annotations

from typing import Annotated

import httpx
from litestar import Request, Response, get, post
from litestar.params import QueryParameter

from appliance.api.auth import PING_PATH, principal
from appliance.api.io import ok, query_int, query_str, read_json
from appliance.api.leads import DEFAULT_LIMIT, MAX_LIMIT, query_id_range
from appliance.domain.submission import PingLead
from appliance.errors import ValidationFailed
from appliance.model import Model
from appliance.runtime import Runtime
from appliance.services import supplier_pings
from appliance.services.opened_endpoints import OpenedEndpoints

TAGS = ["Auctions"]
Query = Annotated[str | None, QueryParameter()]


class PingDesk:
    """What answering pings holds between requests: the buyers' endpoints opened, and a client
    for plugin adapters (the built-in http adapter keeps its own connections)."""

    def __init__(self, runtime: Runtime) -> None:
        self.endpoints = OpenedEndpoints(runtime)
        self._http: httpx.AsyncClient | None = None

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(follow_redirects=False, trust_env=False, timeout=None)
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()


class PingItem(Model):
    ping_id: str
    source_id: str | None
    campaign_id: str
    accepted: bool
    bid: float | None
    currency: str
    reason: str | None
    created_at: str
    lead_id: str | None


class PingPage(Model):
    items: list[PingItem]
    next_cursor: str | None
    has_more: bool


@post(PING_PATH, operation_id="pingLead",
      summary="Ask what a lead would be paid before posting it", tags=TAGS,
      description=("A supplier's ping: the submit body with the contact fields optional, plus `emailHash` / "
                   "`phoneHash` (lowercase hex SHA-256 of the normalized email or the E.164 phone) for the duplicate "
                   "check. The source's checks, ping limits, duplicate check, routing and qualification run on what "
                   "the ping carries; an auction campaign pings its buyers. Always 200: `accepted` with the payout "
                   "offered in `bid` until `expiresAt`, or `accepted: false` with the `reason` (duplicate, "
                   "disqualified, cap, no bid). Post the lead with its `pingId` to sell it at those bids. 429 "
                   "RATE_LIMITED with Retry-After over the source's ping limits; 400 VALIDATION_ERROR for fields "
                   "that fail validation as on submit."),
      status_code=200,
      opt={"body": PingLead, "data": supplier_pings.PingAnswer, "errors": ["VALIDATION_ERROR", "FORBIDDEN", "RATE_LIMITED"]})
async def ping_lead(request: Request) -> Response:
    who = principal(request.scope)
    body = await read_json(request, PingLead)
    state = request.app.state
    desk: PingDesk = state.ping_desk
    answer = await supplier_pings.ping(state.runtime, state.settings.get(who.tenant_id, who.config_rev), who, body,
                                       state.registry, desk.http, desk.endpoints)
    return ok(answer)


@get("/api/v1/pings", operation_id="listPings",
     summary="List suppliers' pings", tags=TAGS,
     description=("Pings kept for `[retention] ping_days`, newest first, filtered by source, campaign or dates: "
                  "what each was offered and, once posted, its lead. 400 names a bad filter."),
     sync_to_thread=False,
     opt={"data": PingPage, "errors": ["VALIDATION_ERROR"],
          "query": {"cursor": {"type": "string", "pattern": "^png_",
                               "description": "nextCursor of the previous page (a pingId)."}}})
def list_pings(request: Request, cursor: Query = None, limit: Query = None,
               source_id: Annotated[str | None, QueryParameter(name="sourceId")] = None,
               campaign_id: Annotated[str | None, QueryParameter(name="campaignId")] = None,
               start_date: Annotated[str | None, QueryParameter(name="startDate")] = None,
               end_date: Annotated[str | None, QueryParameter(name="endDate")] = None) -> Response:
    per_page = query_int(request, "limit", DEFAULT_LIMIT, maximum=MAX_LIMIT)
    after_id, before_id = query_id_range(request, "png")
    after = query_str(request, "cursor")
    if after is not None and not after.startswith("png_"):
        raise ValidationFailed(["cursor: not a ping id (use nextCursor of the previous page)"])
    return ok(supplier_pings.ping_page(
        request.app.state.runtime, principal(request.scope).tenant_id, source_id=query_str(request, "sourceId"),
        campaign_id=query_str(request, "campaignId"), after_id=after_id,
        before_id=min(filter(None, (before_id, after)), default=None), limit=per_page))


ROUTES = [ping_lead, list_pings]
