"""/api/v1/clients: the tenant's clients (buyers) as records (services/clients.py)."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, get, patch, post
from litestar.params import PathParameter, QueryParameter

from appliance.api.auth import principal
from appliance.api.io import ok, query_int, query_str, read_json
from appliance.api.leads import DEFAULT_LIMIT, MAX_LIMIT
from appliance.api.audit import DAY_OR_INSTANT, date_range
from appliance.domain.balance import BalanceLine, Statement
from appliance.domain.client import ClientRecord
from appliance.services import balances, clients

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


@post("/api/v1/clients/{clientId:str}/credits", operation_id="createClientCredit", summary="Add funds to a client",
      tags=TAGS,
      description=("Adds `amount` (more than 0, in the client's currency) to the client's balance: 201 with the "
                   "statement line, `balance` the balance after it. Leads waiting because the client could not cover "
                   "them are tried again at once. 400 names a missing, negative or non-numeric amount."),
      status_code=201, opt={"body": balances.CreditBody, "data": BalanceLine, "status": 201,
                            "errors": ["VALIDATION_ERROR", "NOT_FOUND"]})
async def create_credit(request: Request, client_id: ClientId) -> Response:
    who = principal(request.scope)
    body = await read_json(request, balances.CreditBody)
    state = request.app.state
    return ok(await balances.credit(state.runtime, state.settings.get(who.tenant_id, who.config_rev), who.tenant_id,
                                    who.actor, client_id, body), status=201)


@get("/api/v1/clients/{clientId:str}/statement", operation_id="getClientStatement",
     summary="A client's statement", tags=TAGS,
     description=("The client's balance entries between `startDate` and `endDate` (inclusive; a date means its whole "
                  "UTC day; by default the last 30 days), oldest first: `sale` (a negative amount), `return` and "
                  "`credit`, each with the balance after it, between the opening and the closing balance."),
     opt={"data": Statement, "errors": ["VALIDATION_ERROR", "NOT_FOUND"],
          "query": {"startDate": {**DAY_OR_INSTANT, "description": "Inclusive."},
                    "endDate": {**DAY_OR_INSTANT, "description": "Inclusive: a date means through its end (UTC)."}}})
async def get_statement(request: Request, client_id: ClientId,
                        start_date: Annotated[str | None, QueryParameter(name="startDate")] = None,
                        end_date: Annotated[str | None, QueryParameter(name="endDate")] = None) -> Response:
    start, end = date_range(request)
    return ok(balances.statement(request.app.state.runtime, principal(request.scope).tenant_id, client_id, start, end))


ROUTES = [list_clients, create_client, get_client, update_client, create_credit, get_statement]
