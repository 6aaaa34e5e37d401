"""Suppression lists: GET|POST /api/v1/suppression-lists, GET /api/v1/suppression-lists/{listId},
POST /api/v1/suppression-lists/{listId}/entries (add and remove emails and phones)."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, get, post
from litestar.params import PathParameter, QueryParameter

from appliance.api.auth import principal
from appliance.api.io import ok, query_int, query_str, read_json
from appliance.services import suppression
from appliance.services.suppression import (
    EntryChange, EntryChangeResult, SuppressionList, SuppressionListCreate, SuppressionListPage,
)

DEFAULT_LIMIT, MAX_LIMIT = 25, 100
Query = Annotated[str | None, QueryParameter()]
ListId = Annotated[str, PathParameter(name="listId")]
TAGS = ["Suppression lists"]  # this module's group in the OpenAPI document


@get("/api/v1/suppression-lists", operation_id="listSuppressionLists",
     summary="List suppression lists", tags=TAGS,
     description="The tenant's suppression lists with their entry counts, in listId order, a page at a time.",
     opt={"data": SuppressionListPage, "errors": ["VALIDATION_ERROR"]})
async def list_lists(request: Request, cursor: Query = None, limit: Query = None) -> Response:
    """Lists in listId order; `cursor` is the last listId of the previous page."""
    tenant_id = principal(request.scope).tenant_id
    per_page = query_int(request, "limit", DEFAULT_LIMIT, maximum=MAX_LIMIT)
    return ok(suppression.page(request.app.state.runtime, tenant_id, query_str(request, "cursor"), per_page))


@post("/api/v1/suppression-lists", operation_id="createSuppressionList",
      summary="Create a suppression list", tags=TAGS,
      description=("Makes an empty list with the name given; campaigns name it in "
                   "`qualification.suppressionListIds`."),
      status_code=201,
      opt={"body": SuppressionListCreate, "data": SuppressionList, "status": 201, "errors": ["VALIDATION_ERROR"]})
async def create_list(request: Request) -> Response:
    who = principal(request.scope)
    body = await read_json(request, SuppressionListCreate)
    return ok(await suppression.create(request.app.state.runtime, who.tenant_id, who.actor, body), status=201)


@get("/api/v1/suppression-lists/{listId:str}", operation_id="getSuppressionList",
     summary="Get a suppression list", tags=TAGS,
     description="One list with its entry count; 404 NOT_FOUND when it is not the tenant's.",
     opt={"data": SuppressionList, "errors": ["NOT_FOUND"]})
async def get_list(request: Request, list_id: ListId) -> Response:
    return ok(suppression.get(request.app.state.runtime, principal(request.scope).tenant_id, list_id))


@post("/api/v1/suppression-lists/{listId:str}/entries", operation_id="changeSuppressionEntries",
      summary="Add and remove entries", tags=TAGS,
      description=("Adds and removes emails and phone numbers, normalized and kept as digests only; an empty list "
                   "changes nothing. 400 names each value that is neither an email nor a phone; 404 NOT_FOUND when "
                   "the list is not the tenant's."),
      status_code=200,
      opt={"body": EntryChange, "data": EntryChangeResult, "errors": ["VALIDATION_ERROR", "NOT_FOUND"]})
async def change_entries(request: Request, list_id: ListId) -> Response:
    """Emails and phones are normalized as a lead's are and kept as SHA-256 digests only."""
    who = principal(request.scope)
    body = await read_json(request, EntryChange)
    return ok(await suppression.change_entries(request.app.state.runtime, who.tenant_id, who.actor, list_id, body))


ROUTES = [list_lists, create_list, get_list, change_entries]
