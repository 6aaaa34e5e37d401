"""POST /api/v1/sms/send; the rules are in appliance/services/sms.py."""

from __future__ import annotations

from litestar import Request, Response, post

from appliance.services import sms
from appliance.api.auth import principal
from appliance.api.io import ok, read_json


@post("/api/v1/sms/send", operation_id="sendSms", status_code=201,
      opt={"body": sms.SmsSendBody, "data": sms.SmsSendResult, "status": 201,
           "errors": ["NOT_FOUND", "PROVIDER_ERROR"]})
async def send_sms(request: Request) -> Response:
    who = principal(request.scope)
    body = await read_json(request, sms.SmsSendBody)
    state = request.app.state
    return ok(await sms.send(state.runtime, state.registry, who.tenant_id, body), 201)


ROUTES = [send_sms]
