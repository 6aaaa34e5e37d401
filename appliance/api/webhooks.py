"""Webhook subscriptions: GET|POST /api/v1/webhooks, GET|PATCH|DELETE /api/v1/webhooks/{id},
GET /api/v1/webhooks/{id}/deliveries (what each attempt to send an event did)."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, delete, get, patch, post
from litestar.params import PathParameter, QueryParameter

from appliance.api.auth import principal
from appliance.api.io import ok, query_int, query_str, read_json
from appliance.services import webhooks
from appliance.services.webhooks import (
    AttemptPage, CreatedWebhook, DeletedWebhook, WebhookChange, WebhookCreate, WebhookPage,
)
from appliance.domain.webhooks import Webhook

DEFAULT_LIMIT, MAX_LIMIT = 25, 100
Query = Annotated[str | None, QueryParameter()]
WebhookId = Annotated[str, PathParameter(name="webhookId")]
TAGS = ["Webhooks"]  # this module's group in the OpenAPI document


@get("/api/v1/webhooks", operation_id="listWebhooks",
     summary="List webhook subscriptions", tags=TAGS,
     description="The tenant's subscriptions in webhookId order, a page at a time; secrets are never shown.",
     opt={"data": WebhookPage, "errors": ["VALIDATION_ERROR"]})
async def list_webhooks(request: Request, cursor: Query = None, limit: Query = None) -> Response:
    """Subscriptions in webhookId order; `cursor` is the last webhookId of the previous page."""
    tenant_id = principal(request.scope).tenant_id
    per_page = query_int(request, "limit", DEFAULT_LIMIT, maximum=MAX_LIMIT)
    return ok(webhooks.page(request.app.state.runtime, tenant_id, query_str(request, "cursor"), per_page))


@post("/api/v1/webhooks", operation_id="createWebhook",
      summary="Create a webhook subscription", tags=TAGS,
      description=("Subscribes an HTTPS URL to lead events. The answer holds the signing secret, the only time it "
                   "is shown; 400 names an unknown event, a URL that may not receive events or an id already in "
                   "use."),
      status_code=201,
      opt={"body": WebhookCreate, "data": CreatedWebhook, "status": 201, "errors": ["VALIDATION_ERROR"]})
async def create_webhook(request: Request) -> Response:
    """The answer carries the signing secret; it is never shown again."""
    who = principal(request.scope)
    body = await read_json(request, WebhookCreate)
    return ok(await webhooks.create(request.app.state.runtime, who.tenant_id, who.actor, body), status=201)


@get("/api/v1/webhooks/{webhookId:str}", operation_id="getWebhook",
     summary="Get a webhook subscription", tags=TAGS,
     description="One subscription, without its secret; 404 NOT_FOUND when it is not the tenant's.",
     opt={"data": Webhook, "errors": ["NOT_FOUND"]})
async def get_webhook(request: Request, webhook_id: WebhookId) -> Response:
    return ok(webhooks.get(request.app.state.runtime, principal(request.scope).tenant_id, webhook_id))


@patch("/api/v1/webhooks/{webhookId:str}", operation_id="updateWebhook",
       summary="Change a webhook subscription", tags=TAGS,
       description=("Changes its URL, events, description, secret or active flag; while inactive it gets no new "
                    "events. 404 NOT_FOUND when it is not the tenant's."),
       opt={"body": WebhookChange, "data": Webhook, "errors": ["VALIDATION_ERROR", "NOT_FOUND"]})
async def update_webhook(request: Request, webhook_id: WebhookId) -> Response:
    who = principal(request.scope)
    body = await read_json(request, WebhookChange)
    return ok(await webhooks.change(request.app.state.runtime, who.tenant_id, who.actor, webhook_id, body))


@delete("/api/v1/webhooks/{webhookId:str}", operation_id="deleteWebhook",
        summary="Delete a webhook subscription", tags=TAGS,
        description=("Removes the subscription, its secret and its events still waiting, and says how many events "
                     "were dropped. 404 NOT_FOUND when it is not the tenant's."),
        status_code=200,
        opt={"data": DeletedWebhook, "errors": ["NOT_FOUND"]})
async def delete_webhook(request: Request, webhook_id: WebhookId) -> Response:
    who = principal(request.scope)
    return ok(await webhooks.delete(request.app.state.runtime, who.tenant_id, who.actor, webhook_id))


@get("/api/v1/webhooks/{webhookId:str}/deliveries", operation_id="listWebhookDeliveries",
     summary="List a subscription's delivery attempts", tags=TAGS,
     description=("What each attempt to send an event did, newest first: the receiver's status code or error and "
                  "whether it was delivered, will be retried or was given up. 404 NOT_FOUND for an unknown "
                  "subscription."),
     opt={"data": AttemptPage, "errors": ["VALIDATION_ERROR", "NOT_FOUND"]})
async def list_deliveries(request: Request, webhook_id: WebhookId, cursor: Query = None,
                          limit: Query = None) -> Response:
    """Attempts newest first; `cursor` is the attemptId of the previous page's last item."""
    tenant_id = principal(request.scope).tenant_id
    per_page = query_int(request, "limit", DEFAULT_LIMIT, maximum=MAX_LIMIT)
    return ok(webhooks.attempts(request.app.state.runtime, tenant_id, webhook_id, query_str(request, "cursor"),
                                per_page))


ROUTES = [list_webhooks, create_webhook, get_webhook, update_webhook, delete_webhook, list_deliveries]
