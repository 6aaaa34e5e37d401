"""Liveness for load balancers and the smoke test; no key needed."""

from __future__ import annotations

from litestar import Request, Response, get

from appliance import __version__
from appliance.api.io import ok
from appliance.api.schemas import Health


@get("/healthz", operation_id="health", sync_to_thread=False,
     opt={"public": True, "data": Health})
def healthz(request: Request) -> Response:
    runtime = request.app.state.runtime
    runtime.store.ping()
    return ok({"status": "ok", "version": __version__})


ROUTES = [healthz]
