"""Buyers' health: GET /api/v1/endpoints, POST /api/v1/endpoints/{id}/pause and /resume
(appliance/services/endpoints.py)."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, get, post
from litestar.params import PathParameter, QueryParameter

from appliance.api.auth import principal
from appliance.api.io import ok, query_int, query_str, read_json
from appliance.services import endpoints
from appliance.services.endpoints import EndpointItem, EndpointPage, PauseBody

DEFAULT_LIMIT, MAX_LIMIT = 25, 100
Query = Annotated[str | None, QueryParameter()]
EndpointId = Annotated[str, PathParameter(name="deliveryEndpointId")]
TAGS = ["Delivery endpoints"]  # this module's group in the OpenAPI document


@get("/api/v1/endpoints", operation_id="listEndpoints",
     summary="List delivery endpoints and their health", tags=TAGS,
     description=("The tenant's buyer endpoints in id order with their state, errors in a row, the last day's "
                  "outcomes and the deliveries waiting for them."),
     opt={"data": EndpointPage, "errors": ["VALIDATION_ERROR"]})
async def list_endpoints(request: Request, cursor: Query = None, limit: Query = None) -> Response:
    """Delivery endpoints with their health, in id order; `cursor` is the previous page's last id."""
    tenant_id = principal(request.scope).tenant_id
    per_page = query_int(request, "limit", DEFAULT_LIMIT, maximum=MAX_LIMIT)
    return ok(endpoints.page(request.app.state.runtime, tenant_id, query_str(request, "cursor"), per_page))


async def _body(request: Request) -> PauseBody:
    """The body is optional: none, or `{}`, or `{"reason": ...}`."""
    return await read_json(request, PauseBody) if await request.body() else PauseBody()


@post("/api/v1/endpoints/{deliveryEndpointId:str}/pause", operation_id="pauseEndpoint",
      summary="Pause a delivery endpoint", tags=TAGS,
      description=("Its deliveries wait, not fail, until it is resumed; pausing a paused endpoint changes nothing. "
                   "404 NOT_FOUND for an endpoint the tenant does not have."),
      status_code=200,
      opt={"body": PauseBody, "body_optional": True, "data": EndpointItem,
           "errors": ["VALIDATION_ERROR", "NOT_FOUND"]})
async def pause_endpoint(request: Request, endpoint_id: EndpointId) -> Response:
    """Its deliveries wait (not failed) until it is resumed; pausing a paused endpoint changes nothing."""
    who = principal(request.scope)
    body = await _body(request)
    state = request.app.state
    done = await endpoints.pause(state.runtime, state.settings.get(who.tenant_id, who.config_rev), who.tenant_id,
                                 who.actor, endpoint_id, body.reason)
    return ok(done.item)


@post("/api/v1/endpoints/{deliveryEndpointId:str}/resume", operation_id="resumeEndpoint",
      summary="Resume a delivery endpoint", tags=TAGS,
      description=("Makes the endpoint active again with its counters reset; the deliveries that waited are due at "
                   "once. 404 NOT_FOUND for an endpoint the tenant does not have."),
      status_code=200,
      opt={"body": PauseBody, "body_optional": True, "data": EndpointItem,
           "errors": ["VALIDATION_ERROR", "NOT_FOUND"]})
async def resume_endpoint(request: Request, endpoint_id: EndpointId) -> Response:
    """The deliveries that waited for it are due at once."""
    who = principal(request.scope)
    body = await _body(request)
    state = request.app.state
    done = await endpoints.resume(state.runtime, state.settings.get(who.tenant_id, who.config_rev), who.tenant_id,
                                  who.actor, endpoint_id, body.reason)
    state.worker.wake()
    return ok(done.item)


ROUTES = [list_endpoints, pause_endpoint, resume_endpoint]
