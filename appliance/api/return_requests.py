"""Return requests: filed on a delivered lead, decided by a manager (services/return_requests.py)."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, get, post
from litestar.params import PathParameter, QueryParameter

from appliance.api.auth import principal
from appliance.api.io import ok, query_int, query_str, read_json
from appliance.api.leads import DEFAULT_LIMIT, MAX_LIMIT
from appliance.services import return_requests

Query = Annotated[str | None, QueryParameter()]
LeadId = Annotated[str, PathParameter(name="leadId")]
RequestId = Annotated[str, PathParameter(name="requestId")]
TAGS = ["Return requests"]  # this module's group in the OpenAPI document
STATES = ("pending", "approved", "rejected")


@post("/api/v1/leads/{leadId:str}/return-requests", operation_id="createReturnRequest",
      summary="Ask to return a delivered lead", tags=TAGS,
      description=("A request to send a delivered lead back, checked against its client's return policy: 201 with "
                   "the request, `approved` at once (and the lead returned) when the policy auto-approves, else "
                   "`pending` for a manager. 409 INVALID_STATE naming why: the lead is not delivered, a request of "
                   "it is pending, it is older than the policy's `maxAgeDays` or the client's returns would pass "
                   "its `maxPercent`."),
      status_code=201,
      opt={"body": return_requests.ReturnRequestBody, "data": return_requests.ReturnRequest, "status": 201,
           "errors": ["VALIDATION_ERROR", "NOT_FOUND", "INVALID_STATE"]})
async def create_return_request(request: Request, lead_id: LeadId) -> Response:
    who = principal(request.scope)
    body = await read_json(request, return_requests.ReturnRequestBody)
    state = request.app.state
    return ok(await return_requests.request(state.runtime, state.settings.get(who.tenant_id, who.config_rev),
                                            who.tenant_id, who.actor, lead_id, body), status=201)


@post("/api/v1/return-requests/{requestId:str}/decision", operation_id="decideReturnRequest",
      summary="Approve or reject a return request", tags=TAGS,
      description=("`approve` returns the lead (its revenue reversed) in the same transaction; `reject` closes the "
                   "request. 409 INVALID_STATE when it is decided already, or the lead can no longer be returned."),
      status_code=200,
      opt={"body": return_requests.DecisionBody, "data": return_requests.ReturnRequest,
           "errors": ["VALIDATION_ERROR", "NOT_FOUND", "INVALID_STATE"]})
async def decide_return_request(request: Request, request_id: RequestId) -> Response:
    who = principal(request.scope)
    body = await read_json(request, return_requests.DecisionBody)
    state = request.app.state
    return ok(await return_requests.decide(state.runtime, state.settings.get(who.tenant_id, who.config_rev),
                                           who.tenant_id, who.actor, request_id, body))


@get("/api/v1/return-requests", operation_id="listReturnRequests", summary="List return requests", tags=TAGS,
     description="The tenant's return requests, newest first, optionally of one `state`.",
     opt={"data": return_requests.ReturnRequestPage, "errors": ["VALIDATION_ERROR"],
          "query": {"state": {"type": "string", "enum": list(STATES)}}})
async def list_return_requests(request: Request, cursor: Query = None, limit: Query = None,
                               state_filter: Annotated[str | None, QueryParameter(name="state")] = None) -> Response:
    per_page = query_int(request, "limit", DEFAULT_LIMIT, maximum=MAX_LIMIT)
    return ok(return_requests.page(request.app.state.runtime, principal(request.scope).tenant_id,
                                   query_str(request, "state", choices=STATES), query_str(request, "cursor"), per_page))


ROUTES = [create_return_request, decide_return_request, list_return_requests]
