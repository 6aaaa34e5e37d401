"""Callbacks from e-signature providers: no API key; the adapter verifies each (Documenso: the
`X-Documenso-Secret` header). The rules are in appliance/services/esign.py."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, post
from litestar.params import PathParameter

from appliance.api.io import ok
from appliance.services import esign

Adapter = Annotated[str, PathParameter(name="adapter", max_length=64)]
TenantId = Annotated[str, PathParameter(name="tenantId", max_length=64)]
TAGS = ["Documents"]  # this module's group in the OpenAPI document


@post("/hooks/esign/{adapter:str}/{tenantId:str}", operation_id="receiveEsignCallback",
      summary="Receive an e-signature provider's callback", tags=TAGS,
      description=("Where an e-signature provider reports a document's progress (viewed, in progress, signed, "
                   "declined, expired, failed). Needs no API key: the adapter verifies the call as its provider "
                   "defines (Documenso: the `X-Documenso-Secret` header equals `[plugins.documenso] "
                   "webhook_secret`). 401 when it is not verified, 404 for an unknown adapter, tenant or "
                   "document, 400 for a body the adapter cannot read; nothing changes then. A status never goes "
                   "back: a late `viewed` after `signed` answers 200 with `changed: false`."),
      status_code=200,
      opt={"public": True, "data": esign.CallbackAnswer, "errors": ["UNAUTHORIZED", "NOT_FOUND", "VALIDATION_ERROR"]})
async def receive_esign_callback(request: Request, adapter: Adapter, tenant_id: TenantId) -> Response:
    body = await request.body()
    headers = {name.lower(): value for name, value in request.headers.items()}
    answer, woken = await esign.receive_callback(request.app.state.runtime, request.app.state.registry, adapter,
                                                 tenant_id, headers, body)
    if woken:
        request.app.state.worker.wake()
    return ok(answer)


ROUTES = [receive_esign_callback]
