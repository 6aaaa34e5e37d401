"""POST /api/v1/pixels/fire; the rules are in appliance/services/pixels.py."""

from __future__ import annotations

from litestar import Request, Response, post

from appliance.services import pixels
from appliance.api.auth import principal
from appliance.api.io import ok, read_json

TAGS = ["Pixels"]  # this module's group in the OpenAPI document


@post("/api/v1/pixels/fire", operation_id="firePixel",
      summary="Send a conversion event", tags=TAGS,
      description=("Sends a server-side conversion event for a lead to one of the tenant's ad platform pixels. "
                   "Answers 200 whether or not the platform took it (see `success` and `reason`); 404 NOT_FOUND for"
                   " an unknown lead or pixel."),
      status_code=200,
      opt={"body": pixels.FireBody, "data": pixels.FireResult, "errors": ["NOT_FOUND"]})
async def fire_pixel(request: Request) -> Response:
    """200 whether or not the platform accepted the event: see `success` and `reason`."""
    who = principal(request.scope)
    body = await read_json(request, pixels.FireBody)
    state = request.app.state
    return ok(await pixels.fire(state.runtime, state.registry, who.tenant_id, body))


ROUTES = [fire_pixel]
