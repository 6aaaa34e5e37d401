"""/api/v1/clients: the tenant's clients (buyers) as records (services/clients.py)."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, get, patch, post
from litestar.params import PathParameter, QueryParameter

from appliance.api.auth import principal
from appliance.api.io import ok, query_int, query_str, read_json
from appliance.api.leads import DEFAULT_LIMIT, MAX_LIMIT
from appliance.domain.client import ClientRecord
from appliance.services import clients

Query = Annotated[str | None, QueryParameter()]
ClientId = Annotated[str, PathParameter(name="clientId")]
TAGS = ["Clients"]  # this module's group in the OpenAPI document


@get("/api/v1/clients", operation_id="listClients", summary="List clients", tags=TAGS,
     description="The tenant's clients (buyers) in clientId order, a page at a time.",
     opt={"data": clients.ClientPage, "errors": ["VALIDATION_ERROR"]})
async def list_clients(request: Request, cursor: Query = None, limit: Query = None) -> Response:
    per_page = query_int(request, "limit", DEFAULT_LIMIT, maximum=MAX_LIMIT)
    return ok(clients.page(request.app.state.runtime, principal(request.scope).tenant_id,
                           query_str(request, "cursor"), per_page))


@post("/api/v1/clients", operation_id="createClient", summary="Create a client", tags=TAGS,
      description=("A buyer as a record: its name, billing (`none`, `prepaid`, or `credit` with a `creditLimit`; a "
                   "`lowBalance` threshold) and return policy. 400 names a bad field or a clientId in use."),
      status_code=201, opt={"body": ClientRecord, "data": ClientRecord, "status": 201, "errors": ["VALIDATION_ERROR"]})
async def create_client(request: Request) -> Response:
    who = principal(request.scope)
    body = await read_json(request, ClientRecord)
    return ok(await clients.create(request.app.state.runtime, who.tenant_id, who.actor, body), status=201)


@get("/api/v1/clients/{clientId:str}", operation_id="getClient", summary="Get a client", tags=TAGS,
     description="One client; 404 NOT_FOUND when it is not the tenant's.",
     opt={"data": ClientRecord, "errors": ["NOT_FOUND"]})
async def get_client(request: Request, client_id: ClientId) -> Response:
    return ok(clients.get(request.app.state.runtime, principal(request.scope).tenant_id, client_id))


@patch("/api/v1/clients/{clientId:str}", operation_id="updateClient", summary="Change a client", tags=TAGS,
       description=("Changes its name, `active` flag, `billing` or `returnPolicy` (each object replaced whole); the "
                    "record is checked again as a whole."),
       opt={"body": clients.ClientChange, "data": ClientRecord, "errors": ["VALIDATION_ERROR", "NOT_FOUND"]})
async def update_client(request: Request, client_id: ClientId) -> Response:
    who = principal(request.scope)
    body = await read_json(request, clients.ClientChange)
    return ok(await clients.change(request.app.state.runtime, who.tenant_id, who.actor, client_id, body))


ROUTES = [list_clients, create_client, get_client, update_client]
