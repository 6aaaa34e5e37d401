"""Webhooks from SMS providers: no API key; the provider adapter checks each signature (Twilio's
X-Twilio-Signature, Telnyx's Ed25519). The rules are in appliance/services/sms_webhooks.py."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, post
from litestar.background_tasks import BackgroundTask
from litestar.params import PathParameter

from appliance.model import Model
from appliance.services import sms_webhooks

Provider = Annotated[str, PathParameter(name="provider", max_length=64)]
TenantId = Annotated[str, PathParameter(name="tenantId", max_length=64)]
TAGS = ["SMS"]  # this module's group in the OpenAPI document


class WebhookReceived(Model):
    received: bool


def _reached_url(request: Request) -> str:
    """The URL the provider called, as it signed it: `[server] public_url` names the address
    providers are given (behind a proxy the server's own differs). Built from the request's path
    and query, not `request.url`, which raises on a Host header with a bad port or a query that
    is not UTF-8; without public_url such a request reached no URL a signature can cover ("")."""
    public = request.app.state.runtime.config.server.public_url
    if not public:
        try:
            return str(request.url)
        except (ValueError, UnicodeDecodeError):
            return ""
    query = request.scope.get("query_string", b"").decode("latin-1")
    return public.rstrip("/") + request.scope["path"] + (f"?{query}" if query else "")


@post("/hooks/sms/{provider:str}/{tenantId:str}", operation_id="receiveSmsWebhook",
      summary="Receive an SMS provider's webhook (replies and delivery reports)", tags=TAGS,
      description=("Where an SMS provider posts the texts leads send back and the delivery reports of the texts "
                   "sent to them; give providers this address as both the inbound (messaging) webhook and the "
                   "status callback. Needs no API key: the signature is checked as the provider defines it "
                   "(Twilio: `X-Twilio-Signature` with the auth token; Telnyx: `telnyx-signature-ed25519` "
                   "with the `publicKey`, within five minutes of `telnyx-timestamp`). 403 for a missing, wrong "
                   "or replayed signature, an unknown tenant, or a text to a number not of this tenant; 404 for "
                   "a provider type nothing provides; 413 for a body over 64 KiB; 400 for a body the provider's "
                   "adapter cannot read. "
                   "Nothing is stored then. A reply joins the conversation of the tenant's latest lead with "
                   "the sender's phone, else is kept as an orphan message; STOP, START and HELP keywords are "
                   "applied. Twilio gets TwiML (with the HELP text as a `<Message>`), other providers "
                   "`{\"received\": true}`."),
      status_code=200,
      opt={"public": True, "data": WebhookReceived,
           "errors": ["FORBIDDEN", "NOT_FOUND", "PAYLOAD_TOO_LARGE", "VALIDATION_ERROR"]})
async def receive_sms_webhook(request: Request, provider: Provider, tenant_id: TenantId) -> Response:
    body = await request.body()
    headers = {name.lower(): value for name, value in request.headers.items()}
    state = request.app.state
    answer, reply = await sms_webhooks.receive(state.runtime, state.registry, provider, tenant_id,
                                               _reached_url(request), headers, body)
    background = None if reply is None else BackgroundTask(sms_webhooks.send_reply, state.runtime, state.registry,
                                                           reply)
    return Response(answer.body, status_code=200, media_type=answer.content_type, background=background)


ROUTES = [receive_sms_webhook]
