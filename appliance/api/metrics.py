"""GET /metrics: the Prometheus text format (appliance/metrics.py). No API key: scrapers are not
tenants; `[metrics] token` asks for a bearer token instead, and `[metrics] enabled = false`
leaves the route out (404)."""

from __future__ import annotations

import hmac

from litestar import Request, Response, get

from appliance.errors import Unauthorized
from appliance.metrics import StoredReadings, exposition

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@get("/metrics", operation_id="metrics", include_in_schema=False, sync_to_thread=False, opt={"public": True})
def metrics(request: Request) -> Response:
    state = request.app.state
    token = state.runtime.config.metrics.token
    if token and not hmac.compare_digest(request.headers.get("authorization", "").encode(),
                                         f"Bearer {token}".encode()):
        raise Unauthorized(challenge='Bearer realm="appliance"')  # a token, not an API key (RFC 6750)
    return Response(state.render_metrics(), media_type=CONTENT_TYPE)


def routes(enabled: bool) -> list:
    return [metrics] if enabled else []


def renderer(runtime) -> object:
    """The app's render function (its own prometheus-client registry)."""
    def read() -> StoredReadings:
        with runtime.store.reader() as tx:
            return StoredReadings(queue=tx.jobs.open_jobs_by_kind_and_state(), backlog=tx.webhooks.backlog(),
                                  paused_endpoints=tx.endpoints.paused_count())

    return exposition(runtime.metrics, read)
