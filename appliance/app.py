"""The Litestar application: routes, error mapping, the request edge (request id, activity log)
and the lifespan that runs the background loops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from litestar import Litestar
from litestar.routes import HTTPRoute
from litestar.types import Message, Receive, Scope, Send

from appliance import __version__, logs
from appliance.api import (
    activity, auctions, audit, campaigns, catalog, clients, endpoints, esign_hooks, files, health, imports, leads, ledger,
    metrics, openapi, pings, pixels, reports, return_requests, sms, sms_hooks, sources, submissions, suppression, users, webhooks,
)
from appliance.api.auth import SUBMIT_PATH, KeyCache, RateLimiter, auth_middleware
from appliance.api.io import MAX_BODY, nul_in_url
from appliance.api.submit_edge import answer_submit
from appliance.clock import iso
from appliance.console import routes as console
from appliance.console.session import HEADERS as CONSOLE_HEADERS, TLS_HEADERS as CONSOLE_TLS_HEADERS
from appliance.portal import routes as portal
from appliance.ids import request_id
from appliance.errors import EXCEPTION_HANDLERS, ValidationFailed, error_body
from appliance.jobs.delivery import DeliveryWorker
from appliance.jobs.imports import ImportRunner
from appliance.jobs.ticker import flush_activity, run_ticker
from appliance.jobs.webhooks import WebhookSender
from appliance.processes import DeliveryProcess
from appliance.plugins import Registry, load_plugins
from appliance.runtime import Runtime
from appliance.services.tenant_settings import SettingsCache
from appliance.storage import StorageUnavailable



class ApplianceApp(Litestar):
    """Adds the request edge around everything Litestar answers, 404s and errors included."""

    _allow: dict[str, bytes] | None = None

    def allow_header(self, path_template: str) -> bytes | None:
        """Every method of the route at `path_template`. Litestar's automatic OPTIONS answer lists
        only the methods of the first handler registered on a path (GET, not the PATCH added by
        a second handler on the same path), so the edge writes this one instead."""
        if self._allow is None:
            self._allow = {route.path_format: ", ".join(sorted(route.methods)).encode()
                           for route in self.routes if isinstance(route, HTTPRoute)}
        return self._allow.get(path_template)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # type: ignore[override]
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        started = time.perf_counter()
        rid = request_id()
        state = scope.setdefault("state", {})
        logs.bind_request(rid, state)
        state["request_id"] = rid
        state["client"] = scope.get("client")  # (address, port): the audit log's `ip`
        header = (b"x-request-id", rid.encode())
        status_seen = 500
        # Every answer under /admin and /portal carries the console's headers, also a 404 or 405
        # of a path no console or portal route matched.
        console_headers = ()
        if scope["path"].startswith(("/admin", "/portal")):
            console_headers = CONSOLE_TLS_HEADERS if scope.get("scheme") == "https" else CONSOLE_HEADERS

        async def send_with_id(message: Message) -> None:
            nonlocal status_seen
            if message["type"] == "http.response.start":
                status_seen = message["status"]
                headers = [*message.get("headers", ()), header]
                if console_headers:
                    names = {name for name, _ in console_headers}
                    headers = [h for h in headers if h[0].lower() not in names] + list(console_headers)
                if scope["method"] == "OPTIONS" and status_seen == 204:
                    allow = self.allow_header(scope.get("path_template", ""))
                    if allow is not None:
                        headers = [(k, v) for k, v in headers if k.lower() != b"allow"] + [(b"allow", allow)]
                message["headers"] = headers
            await send(message)

        try:
            refused = nul_in_url(scope["path"], scope.get("query_string", b""))
            if refused is not None:
                status_seen = 400
                body = error_body("VALIDATION_ERROR", ValidationFailed.message, [refused])
                await send_with_id({"type": "http.response.start", "status": 400, "headers": [
                    (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
                await send_with_id({"type": "http.response.body", "body": body})
            elif scope["path"] == SUBMIT_PATH and scope["method"] == "POST":
                # Sent here rather than through send_with_id: the hot path's two messages need
                # only the request id header (not under /admin, not OPTIONS).
                answer = await answer_submit(self.state, scope, receive)
                if answer is not None:
                    status_seen, headers, body = answer
                    headers.append(header)
                    await send({"type": "http.response.start", "status": status_seen, "headers": headers})
                    await send({"type": "http.response.body", "body": body})
            else:
                await super().__call__(scope, receive, send_with_id)
        finally:
            principal = state.get("principal")
            runtime: Runtime = self.state["runtime"]  # an item: cheaper than State's attributes
            route, seconds = scope.get("path_template") or "(unmatched)", time.perf_counter() - started
            runtime.metrics.observe_request(scope["method"], route, seconds)
            runtime.activity.append((
                iso(runtime.clock.now()),
                principal.tenant_id if principal else None,
                principal.id if principal else None,
                scope["method"],
                route,
                status_seen,
                round(seconds * 1000, 3),
                rid,
            ))


def create_app(runtime: Runtime, *, background: bool = True, registry: Registry | None = None,
               delivery_process: DeliveryProcess | None = None) -> ApplianceApp:
    """`background=False` runs neither the ticker nor the delivery worker (jobs stay queued).
    `delivery_process`: delivery runs in that process of its own (appliance/processes.py), not
    in this one."""
    logs.quiet_libraries()
    registry = registry if registry is not None else load_plugins(runtime.config)
    settings = SettingsCache(runtime.store, plugins_listen=registry.listens_to_lead_events)
    worker: DeliveryWorker | DeliveryProcess = delivery_process or DeliveryWorker(
        runtime, settings, registry, concurrency=max(runtime.config.delivery.concurrency, 1))
    sender = WebhookSender(runtime, registry)
    import_runner = ImportRunner(runtime)
    ping_desk = pings.PingDesk(runtime)

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        stop = asyncio.Event()
        await import_runner.begin()
        tasks = [asyncio.create_task(run_ticker(runtime, stop))] if background else []
        if background and runtime.config.delivery.concurrency > 0:
            tasks.append(asyncio.create_task(worker.run(stop)))
        if background and (runtime.config.webhooks.concurrency > 0 or registry.listens_to_lead_events):
            tasks.append(asyncio.create_task(sender.run(stop)))
        try:
            yield
        finally:
            await import_runner.stop()
            await ping_desk.aclose()
            stop.set()
            worker.wake()
            sender.wake()
            for task in tasks:
                await task
            try:
                await flush_activity(runtime)
            except StorageUnavailable:
                logging.getLogger("appliance.ticker").error(
                    "%d activity rows lost at stop: the database does not answer", len(runtime.activity))

    app = ApplianceApp(
        route_handlers=[*health.ROUTES, *campaigns.ROUTES, *catalog.ROUTES, *leads.ROUTES, *submissions.ROUTES,
                        *files.ROUTES, *sms.ROUTES, *pixels.ROUTES, *ledger.ROUTES, *reports.ROUTES, *webhooks.ROUTES,
                        *suppression.ROUTES, *endpoints.ROUTES, *activity.ROUTES, *audit.ROUTES, *imports.ROUTES,
                        *auctions.ROUTES, *pings.ROUTES, *esign_hooks.ROUTES, *sms_hooks.ROUTES, *users.ROUTES, *clients.ROUTES, *return_requests.ROUTES, *sources.ROUTES,
                        *metrics.routes(runtime.config.metrics.enabled), console.router(),
                        portal.router()],
        middleware=[auth_middleware],
        exception_handlers=EXCEPTION_HANDLERS,  # type: ignore[arg-type]
        request_max_body_size=MAX_BODY,
        lifespan=[lifespan],
        openapi_config=openapi.openapi_config("Lead appliance", __version__),
        template_config=portal.template_config(),  # the console's and the portal's templates
        debug=False,
        logging_config=None,  # logging is configured once for the process (appliance/logs.py)
    )
    app.state.runtime = runtime
    app.state.limiter = RateLimiter(runtime.config.security.rate_limit_per_minute)
    app.state.key_cache = KeyCache(runtime.store)
    app.state.settings = settings
    if runtime.config.metrics.enabled:
        app.state.render_metrics = metrics.renderer(runtime)
    app.state.campaign_pages = campaigns.PageCache()
    app.state.registry = registry
    app.state.worker = worker
    app.state.webhook_sender = sender
    app.state.imports = import_runner
    app.state.ping_desk = ping_desk
    return app
