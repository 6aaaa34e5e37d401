"""Liveness for load balancers and the smoke test; no key needed."""

from __future__ import annotations

from litestar import Request, Response, get

from appliance import __version__
from appliance.api.io import ok
from appliance.api.schemas import Health

TAGS = ["Health"]  # this module's group in the OpenAPI document


@get("/healthz", operation_id="health",
     summary="Check that the service is up", tags=TAGS,
     description=("Answers 200 with the version when the service and its database answer, and 503 "
                  "SERVICE_UNAVAILABLE with Retry-After while the database does not. Needs no key."),
     sync_to_thread=False,
     opt={"public": True, "data": Health})
def healthz(request: Request) -> Response:
    runtime = request.app.state.runtime
    runtime.store.ping()
    return ok({"status": "ok", "version": __version__})


ROUTES = [healthz]
