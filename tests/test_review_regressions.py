"""Regression tests of review findings: each test reproduces, through the public surface (HTTP
API, the job loop, the Database API), a correctness bug a review found, since fixed. They pass
now, and fail if the bug comes back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from litestar.testing import TestClient

from appliance.services import tenancy
from appliance.app import create_app
from appliance.runtime import Runtime
from tests.bundles import campaign
from tests.conftest import make_tenant
from tests.engine import engine
from tests.submit_support import FakeClock

START = datetime(2026, 3, 10, 15, 0, tzinfo=UTC)

# An adapter whose attempt N waits for the file <gate>/go-N (after writing <gate>/started-N), then
# answers with step N of customFields.script. Lets a test act while a delivery is running.
GATED = '''
import asyncio, os
from appliance.sdk import DeliveryAdapter, DeliveryResult, hookimpl

class Gated(DeliveryAdapter):
    name = "gated"

    async def deliver(self, request, http):
        fields = request.lead.get("customFields") or {}
        gate = fields.get("gate")
        if gate:
            open(os.path.join(gate, f"started-{request.attempt}"), "w").close()
            for _ in range(2000):
                if os.path.exists(os.path.join(gate, f"go-{request.attempt}")):
                    break
                await asyncio.sleep(0.01)
        script = fields.get("script", "success").split(",")
        step = script[min(request.attempt - 1, len(script) - 1)]
        return DeliveryResult(outcome=step, status_code={"success": 200, "failure": 400}.get(step, 503),
                              message=step)

@hookimpl
def appliance_delivery_adapters(settings):
    return [Gated()]
'''


def endpoint(endpoint_id: str = "ep", **extra) -> dict:
    return {"deliveryEndpointId": endpoint_id, "adapter": "gated", "url": "https://buyer.example.com/in",
            "timeoutSeconds": 30, "retry": {"maxAttempts": 3, "backoffSeconds": [10, 60]}, **extra}


@pytest.fixture
def clock(runtime: Runtime, tmp_path: Path) -> FakeClock:
    (tmp_path / "plugins").mkdir(exist_ok=True)
    (tmp_path / "plugins" / "gated.py").write_text(GATED)
    fake = FakeClock(START)
    runtime.clock = fake
    return fake


def start_app(runtime: Runtime) -> TestClient:
    app = create_app(runtime)
    app.state.worker.poll_seconds = 0.05
    app.state.worker.grace_seconds = 0.2
    client = TestClient(app, raise_server_exceptions=False)
    client.app_state = app.state
    return client


@pytest.fixture
def live(runtime: Runtime, clock: FakeClock) -> Iterator[TestClient]:
    with start_app(runtime) as client:
        yield client


_n = iter(range(20_000, 99_999))


def body(code: str, script: str = "success", gate: Path | None = None, **extra) -> dict:
    n = next(_n)
    fields = {"script": script}
    if gate is not None:
        fields["gate"] = str(gate)
    return {"campaignId": code, "firstName": "Ann", "lastName": f"Lee{n}", "email": f"ann{n}@example.com",
            "phone": f"+1415555{n % 10_000:04d}", "customFields": fields, **extra}


def post(client: TestClient, headers: dict, payload: dict) -> dict:
    response = client.post("/api/v1/leads/submit", json=payload, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()["data"]


def lead_of(client: TestClient, tenant, lead_id: str) -> dict:
    return client.get(f"/api/v1/leads/{lead_id}", headers=tenant.headers).json()["data"]


def wait_until(client: TestClient, predicate, timeout: float = 8.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        client.app_state.worker.wake()
        time.sleep(0.02)


def job_states(runtime: Runtime, submission_id: str) -> list[str]:
    return [state for _, state, _ in runtime.store.reader().jobs.jobs_of(submission_id)]


def nothing_ready_or_running(runtime: Runtime, submission_id: str) -> bool:
    """No job of the submission can send anything any more (finished, or held for a decision)."""
    return not {"ready", "running"} & set(job_states(runtime, submission_id))


# ---- 1. a status set by hand while a delivery attempt runs was undone by the worker ------------

def test_bulk_status_change_during_running_delivery_is_not_undone(live, runtime, clock, tmp_path):
    gate = tmp_path / "gate1"
    gate.mkdir()
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint()], "campaigns": [
        campaign("DL1", "Deliver", delivery={"deliveryEndpointId": "ep"})]})
    data = post(live, tenant.headers, body("DL1", "error,success", gate))
    wait_until(live, lambda: (gate / "started-1").exists())
    response = live.patch("/api/v1/leads/bulk", headers=tenant.headers,
                          json={"leadIds": [data["leadId"]], "updates": {"status": "rejected"}})
    assert response.status_code == 200, response.text
    (gate / "go-1").touch()
    wait_until(live, lambda: job_states(runtime, data["submissionId"]) != ["running"])
    clock.advance(seconds=11)  # past the first backoff: a retry, had one been kept, is due
    (gate / "go-2").touch()
    wait_until(live, lambda: nothing_ready_or_running(runtime, data["submissionId"]))
    # The operator marked the lead rejected: it must not be (re)sent afterwards.
    assert lead_of(live, tenant, data["leadId"])["status"] == "rejected"
    assert not (gate / "started-2").exists()


# ---- 2. a delivery-limit slot reserved by an attempt cut short at shutdown was never given back --

def test_limit_slot_is_given_back_when_attempt_is_interrupted(runtime, clock, tmp_path):
    gate = tmp_path / "gate2"
    gate.mkdir()
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint()], "campaigns": [campaign(
        "DL1", "Deliver", delivery={"deliveryEndpointId": "ep", "deliveryLimits": [{"cap": 1, "type": "daily"}],
                                    "deliverySchedule": {"timezone": "UTC"}})]})
    with start_app(runtime) as client:
        data = post(client, tenant.headers, body("DL1", "success", gate))
        wait_until(client, lambda: (gate / "started-1").exists())
    # stopped mid-attempt: the job is left `running` and is requeued at the next start (allowed)
    assert job_states(runtime, data["submissionId"]) == ["running"]
    (gate / "go-2").touch()
    with start_app(runtime) as client:
        wait_until(client, lambda: lead_of(client, tenant, data["leadId"])["status"] in ("delivered", "queued"))
        # Only one lead was ever delivered today: the cap of 1 has room for it.
        assert lead_of(client, tenant, data["leadId"])["status"] == "delivered"


# ---- 3. deferred evaluation let a resubmission slip past a rejected approval -------------------

def test_short_circuit_resubmission_respects_rejected_approval(live, runtime, clock):
    review = {"name": "CA review", "subRules": [{"conditions": [
        {"field": "address.state", "operator": "equals", "value": ["CA"], "maxSeverity": "review"}]}]}
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint()], "campaigns": [campaign(
        "DL1", "Quick", qualification={"rules": [review]},
        ingestion={"sources": [{"sourceId": "fast", "shortCircuitSyncEvaluation": True}]},
        delivery={"deliveryEndpointId": "ep"})]})
    key = {"X-API-Key": tenancy.create_key(runtime, tenant.tenant_id, source_id="fast").key}
    first = body("DL1", address={"state": "CA"})
    data = post(live, key, first)
    assert data["status"] == "pending"
    wait_until(live, lambda: lead_of(live, tenant, data["leadId"])["status"] == "pending_action")
    response = live.post(f"/api/v1/leads/{data['leadId']}/approve", headers=tenant.headers,
                         json={"status": "rejected", "reason": "no"})
    assert response.status_code == 200, response.text
    again = {**first, "leadId": data["leadId"], "address": {"state": "NY"}}
    second = post(live, key, again)
    wait_until(live, lambda: lead_of(live, tenant, data["leadId"])["submissions"][-1]["status"] != "pending")
    # A delivery the evaluation scheduled would be in the job table by now: let it run out.
    wait_until(live, lambda: nothing_ready_or_running(runtime, second["submissionId"]))
    # The synchronous path answers `rejected` (held_by_approval); the deferred one must agree.
    assert lead_of(live, tenant, data["leadId"])["status"] == "rejected"
    assert job_states(runtime, second["submissionId"]) in ([], ["done"]) and \
        lead_of(live, tenant, data["leadId"])["status"] != "delivered"


# ---- 4. a unit that ended the transaction killed the writer thread ------------------------------

def test_writer_survives_a_unit_whose_error_rolled_back_the_transaction(runtime):
    def bad(conn):
        conn.execute("ROLLBACK")  # what SQLite itself does on e.g. SQLITE_FULL / IOERR
        raise RuntimeError("unit failed")

    outcome: dict = {}

    def call(name, fn):
        try:
            outcome[name] = engine(runtime.store).write_sync(fn)
        except BaseException as exc:  # noqa: BLE001
            outcome[name] = exc

    first = threading.Thread(target=call, args=("bad", bad), daemon=True)
    first.start()
    first.join(10)
    second = threading.Thread(target=call, args=("good", lambda conn: 42), daemon=True)
    second.start()
    second.join(10)
    assert isinstance(outcome.get("bad"), RuntimeError)
    assert outcome.get("good") == 42  # before the fix no answer came: the writer thread was gone


# ---- 5. a resubmission left the previous submission's queued delivery armed ---------------------

def test_resubmission_cancels_the_previous_queued_delivery(live, runtime, clock):
    closed = {"timezone": "UTC", "specificDays": [{"day": "Sunday", "startTime": "00:00", "endTime": "01:00"}]}
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint(), endpoint("ep2")], "campaigns": [
        campaign("DL1", "Closed now", delivery={"deliveryEndpointId": "ep", "deliverySchedule": closed}),
        campaign("DL2", "Open", delivery={"deliveryEndpointId": "ep2"})]})
    first = body("DL1")
    data = post(live, tenant.headers, first)
    wait_until(live, lambda: lead_of(live, tenant, data["leadId"])["status"] == "queued")
    second = post(live, tenant.headers, {**first, "campaignId": "DL2", "leadId": data["leadId"]})
    wait_until(live, lambda: lead_of(live, tenant, data["leadId"])["status"] == "delivered")
    assert job_states(runtime, second["submissionId"]) == ["done"]
    # The lead now belongs to DL2 and was delivered there; DL1's queued job must not fire on Sunday.
    assert job_states(runtime, data["submissionId"]) != ["ready"]


def test_resubmission_merged_into_a_stale_copy_is_refused(runtime, clock, monkeypatch):
    """A change committed between the resubmission's read and its write must not be undone."""
    import msgspec

    from appliance.storage.leads import Leads

    tenant = make_tenant(runtime, "T", {"campaigns": [campaign("RS1", "Resubmit")]})
    with TestClient(create_app(runtime, background=False)) as client:
        first = client.post("/api/v1/leads/submit", headers=tenant.headers, json={
            "campaignId": "RS1", "firstName": "Ann", "lastName": "Lee", "email": "ann.stale@example.com",
            "phone": "+14155550199"}).json()["data"]
        stale = runtime.store.reader().leads.get_lead(tenant.tenant_id, first["leadId"])
        clock.advance(seconds=1)
        assert client.patch("/api/v1/leads/bulk", headers=tenant.headers, json={
            "leadIds": [first["leadId"]], "updates": {"notes": "called back"}}).status_code == 200
        real_get = Leads.get_lead
        calls = iter([msgspec.structs.replace(stale)])

        def first_read_is_stale(leads, tenant_id, lead_id):
            return next(calls, None) or real_get(leads, tenant_id, lead_id)

        monkeypatch.setattr(Leads, "get_lead", first_read_is_stale)  # the repository itself
        response = client.post("/api/v1/leads/submit", headers=tenant.headers,
                               json={"leadId": first["leadId"], "campaignId": "RS1", "notes": "resubmitted"})
        monkeypatch.setattr(Leads, "get_lead", real_get)
        assert response.status_code == 409
        assert response.json()["error"]["code"] == "INVALID_STATE"
        lead = client.get(f"/api/v1/leads/{first['leadId']}", headers=tenant.headers).json()["data"]
        assert lead["notes"] == "called back" and lead["submissionCount"] == 1
