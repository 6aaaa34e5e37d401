"""/api/v1/users: the tenant's people (services/users.py). Admins manage everyone but owners;
owners everyone (domain/permissions.py)."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, delete, get, patch, post
from litestar.params import PathParameter, QueryParameter

from appliance.api.auth import principal
from appliance.api.io import ok, query_int, query_str, read_json
from appliance.api.leads import DEFAULT_LIMIT, MAX_LIMIT
from appliance.services import users

Query = Annotated[str | None, QueryParameter()]
UserId = Annotated[str, PathParameter(name="userId")]
TAGS = ["Users"]  # this module's group in the OpenAPI document


@get("/api/v1/users", operation_id="listUsers", summary="List users", tags=TAGS,
     description="The tenant's users in userId order, a page at a time; passwords and two-factor secrets are never "
                 "shown.",
     opt={"data": users.UserPage, "errors": ["VALIDATION_ERROR"]})
async def list_users(request: Request, cursor: Query = None, limit: Query = None) -> Response:
    per_page = query_int(request, "limit", DEFAULT_LIMIT, maximum=MAX_LIMIT)
    return ok(users.page(request.app.state.runtime, principal(request.scope).tenant_id, query_str(request, "cursor"),
                         per_page))


@post("/api/v1/users", operation_id="createUser", summary="Create a user", tags=TAGS,
      description=("A new user of the tenant with a role; the answer carries `setupUrl`, a one-time link (24 hours) "
                   "where the person chooses a password, shown only this once. A `buyer` needs `clientId`, a "
                   "`supplier` `supplierId`. 403 when an admin creates an owner."),
      status_code=201,
      opt={"body": users.NewUser, "data": users.CreatedUser, "status": 201,
           "errors": ["VALIDATION_ERROR", "FORBIDDEN"]})
async def create_user(request: Request) -> Response:
    who = principal(request.scope)
    body = await read_json(request, users.NewUser)
    return ok(await users.create(request.app.state.runtime, who.tenant_id, who.actor, who.role, body), status=201)


@get("/api/v1/users/{userId:str}", operation_id="getUser", summary="Get a user", tags=TAGS,
     description="One user of the tenant; 404 NOT_FOUND when it is not the tenant's.",
     opt={"data": users.User, "errors": ["NOT_FOUND"]})
async def get_user(request: Request, user_id: UserId) -> Response:
    return ok(users.get(request.app.state.runtime, principal(request.scope).tenant_id, user_id))


@patch("/api/v1/users/{userId:str}", operation_id="updateUser", summary="Change a user", tags=TAGS,
       description=("Changes a user's name, role or `active` flag; disabling it or changing its role ends its "
                    "sessions. 403 when an admin touches an owner or makes one; 409 INVALID_STATE when the change "
                    "would leave the tenant without an active owner."),
       opt={"body": users.UserChange, "data": users.User,
            "errors": ["VALIDATION_ERROR", "FORBIDDEN", "NOT_FOUND", "INVALID_STATE"]})
async def update_user(request: Request, user_id: UserId) -> Response:
    who = principal(request.scope)
    body = await read_json(request, users.UserChange)
    return ok(await users.change(request.app.state.runtime, who.tenant_id, who.actor, who.role, user_id, body))


@delete("/api/v1/users/{userId:str}", operation_id="disableUser", summary="Disable a user", tags=TAGS,
        description=("Takes the user's access away: it cannot sign in and its sessions end. The user stays on "
                     "record (the audit log names it) and may be enabled again with PATCH `active: true`. 403 and "
                     "409 as for PATCH."),
        status_code=200,
        opt={"data": users.User, "errors": ["FORBIDDEN", "NOT_FOUND", "INVALID_STATE"]})
async def disable_user(request: Request, user_id: UserId) -> Response:
    who = principal(request.scope)
    return ok(await users.disable(request.app.state.runtime, who.tenant_id, who.actor, who.role, user_id))


ROUTES = [list_users, create_user, get_user, update_user, disable_user]
