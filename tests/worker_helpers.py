"""What the delivery worker's tests share (this module holds no tests): a scripted delivery
adapter for the plugin folder, the app running with it, an endpoint that uses it, leads that tell
it what to answer, and waiting for a lead's status through the API."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from litestar.testing import TestClient

from appliance.app import create_app


SCRIPTED = '''
from appliance.sdk import DeliveryAdapter, DeliveryResult, hookimpl

CALLS = []

class Scripted(DeliveryAdapter):
    name = "scripted"

    async def deliver(self, request, http):
        CALLS.append((request.submission_id, request.attempt))
        # An endpoint's config.answers speaks for every lead sent to it; else the lead's script.
        answers = request.endpoint.config.get("answers") or (request.lead.get("customFields") or {}).get("script")
        script = (answers or "success").split(",")
        step = script[min(request.attempt - 1, len(script) - 1)]
        if step.startswith("sleep:"):  # a buyer that takes its time, then takes the lead
            import asyncio
            await asyncio.sleep(float(step[6:]))
            return DeliveryResult(outcome="success", status_code=200)
        if step == "raise":
            raise RuntimeError("adapter bug")
        if step == "mistyped":  # a struct is built without checks: a plugin can get a type wrong
            return DeliveryResult(outcome="success", status_code="200", response_fields={"n": 1})
        if step == "not-a-result":
            return None
        if step.startswith("price:"):  # the buyer's price for this lead
            return DeliveryResult(outcome="success", status_code=200, price=float(step[6:]))
        if step == "clock":  # the attempt's time, as the worker's clock has it
            return DeliveryResult(outcome="success", status_code=200, message=request.now.isoformat())
        return DeliveryResult(outcome=step, status_code={"success": 200, "failure": 400, "duplicate": 409}.get(step, 503),
                              client_lead_id="buyer-" + str(request.attempt) if step == "success" else None,
                              message="ok" if step == "success" else "no", response_fields={"echo": request.endpoint.delivery_endpoint_id})

    async def ping(self, request, http):
        # An endpoint's config.ping answers every ping: a bid ("12.5"), "none", "error", "raise",
        # "sleep:<s>" (never in time) or "late:<s>:<bid>" (a bid after s seconds).
        from appliance.sdk import PingResult
        PINGS.append((request.endpoint.delivery_endpoint_id, request.auction_id, dict(request.lead)))
        said = str(request.endpoint.config.get("ping", "none"))
        if said.startswith("sleep:") or said.startswith("late:"):
            import asyncio
            await asyncio.sleep(float(said.split(":")[1]))
            if said.startswith("sleep:"):
                return PingResult(outcome="no_bid")
            said = said.split(":")[2]
        if said == "none":
            return PingResult(outcome="no_bid", reason="not interested")
        if said == "error":
            return PingResult(outcome="error", reason="HTTP 503")
        if said == "raise":
            raise RuntimeError("ping bug")
        if said == "mistyped":
            return PingResult(outcome="bid", bid="$5")
        return PingResult(outcome="bid", bid=float(said), ping_token="tok-" + request.endpoint.delivery_endpoint_id)

PINGS = []

@hookimpl
def appliance_delivery_adapters(settings):
    return [Scripted()]
'''


@contextlib.contextmanager
def live_app(runtime, tmp_path: Path) -> Iterator[TestClient]:
    """The app with its background loops (polling every 50 ms) and the scripted adapter in the
    test's plugin folder; `wait_for` wakes its worker through `client.app_state`."""
    (tmp_path / "plugins").mkdir(exist_ok=True)
    (tmp_path / "plugins" / "scripted.py").write_text(SCRIPTED)
    app = create_app(runtime)
    app.state.worker.poll_seconds = 0.05
    app.state.webhook_sender.poll_seconds = 0.05
    with TestClient(app, raise_server_exceptions=False) as client:
        client.app_state = app.state
        yield client


def endpoint(endpoint_id: str = "ep", **extra) -> dict:
    return {"deliveryEndpointId": endpoint_id, "adapter": "scripted", "url": "https://buyer.example.com/in",
            "retry": {"maxAttempts": 3, "backoffSeconds": [10, 60]}, **extra}


_n = iter(range(10_000, 99_999))


def lead_body(code: str, script: str = "success", **extra) -> dict:
    n = next(_n)
    return {"campaignId": code, "firstName": "Ann", "lastName": f"Lee{n}", "email": f"ann{n}@example.com",
            "phone": f"+1415555{n % 10_000:04d}", "customFields": {"script": script}, **extra}


def submit(client: TestClient, tenant, body: dict) -> dict:
    response = client.post("/api/v1/leads/submit", json=body, headers=tenant.headers)
    assert response.status_code == 201, response.text
    return response.json()["data"]


def lead_of(client: TestClient, tenant, lead_id: str) -> dict:
    return client.get(f"/api/v1/leads/{lead_id}", headers=tenant.headers).json()["data"]


def wait_for(client: TestClient, tenant, lead_id: str, predicate: Callable[[dict], bool], timeout: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        lead = lead_of(client, tenant, lead_id)
        if predicate(lead):
            return lead
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; lead is {lead['status']}: {lead['submissions'][-1]['journeyEvents'][-3:]}")
        client.app_state.worker.wake()
        time.sleep(0.02)


def status_is(*statuses: str) -> Callable[[dict], bool]:
    return lambda lead: lead["status"] in statuses
