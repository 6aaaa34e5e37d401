"""Shared pieces of the submit and approve API tests (this module holds no tests itself).

A controllable clock replaces `runtime.clock` before the app is created, bodies are built with
unique contact data so dedupe never fires by accident, and stored leads are read back through
GET /api/v1/leads/{leadId} when that route exists, else straight from storage."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from pathlib import Path
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from litestar.testing import TestClient

from appliance.services import tenancy
from appliance.app import create_app
from appliance.config import load_config
from appliance.runtime import Runtime, create_runtime
from tests.bundles import campaign
from tests.conftest import Tenant, make_tenant
from tests.engine import engine

SUBMIT = "/api/v1/leads/submit"
# A Tuesday, 15:00 UTC (11:00 in New York, which is on daylight time since 8 March 2026).
START = datetime(2026, 3, 10, 15, 0, tzinfo=UTC)


class FakeClock:
    """Stands in for appliance.clock.Clock: now() is whatever the test set."""

    def __init__(self, moment: datetime) -> None:
        self.moment = moment

    def now(self) -> datetime:
        return self.moment

    def monotonic(self) -> float:
        return self.moment.timestamp()

    def set(self, moment: datetime) -> None:
        self.moment = moment

    def advance(self, **delta: float) -> None:
        self.moment += timedelta(**delta)


@pytest.fixture
def clock(runtime: Runtime) -> FakeClock:
    fake = FakeClock(START)
    runtime.clock = fake  # before the app exists: every "now" of the service comes from here
    return fake


@pytest.fixture
def api(runtime: Runtime, clock: FakeClock) -> Iterator[TestClient]:
    with TestClient(create_app(runtime, background=False), raise_server_exceptions=False) as test_client:
        yield test_client


@contextlib.contextmanager
def configured(tmp_path: Path, extra_toml: str, backend: str = "") -> Iterator[tuple[Runtime, TestClient, FakeClock]]:
    """A runtime and app of their own, for tests that need other config values than conftest's
    (`backend`: the test's `[storage]` backend lines, fixture `backend_toml`)."""
    config_file = tmp_path / "custom.toml"
    config_file.write_text(f'[storage]\npath = "{tmp_path / "custom-data"}"\n{backend}\n[security]\nrate_limit_per_minute = 0\n\n'
                           f'[plugins]\ndirs = ["{tmp_path / "plugins"}"]\n\n{extra_toml}\n')
    runtime = create_runtime(load_config(config_file))
    fake = FakeClock(START)
    runtime.clock = fake
    try:
        with TestClient(create_app(runtime, background=False), raise_server_exceptions=False) as client:
            yield runtime, client, fake
    finally:
        runtime.close()


_serial = itertools.count(1000)


def person(campaign_id: str = "SC1", **fields: Any) -> dict[str, Any]:
    """A valid new-lead body with an email and phone no other call of this helper returns."""
    n = next(_serial)
    body = {"campaignId": campaign_id, "firstName": "Ada", "lastName": "Lovelace",
            "email": f"ada.{n}@example.com", "phone": f"+1 415 555 {n:04d}"}
    body.update(fields)
    return {k: v for k, v in body.items() if v is not ...}


def submit(api: TestClient, who: Tenant | str, body: Any, *, expect: int | None = 201, **kwargs):
    headers = who.headers if isinstance(who, Tenant) else {"X-API-Key": who}
    response = api.post(SUBMIT, json=body, headers=headers, **kwargs)
    if expect is not None:
        assert response.status_code == expect, response.text
    return response


def accepted(api: TestClient, who: Tenant | str, body: Any) -> dict[str, Any]:
    """Submit and return `data` ({leadId, submissionId, status})."""
    return submit(api, who, body).json()["data"]


def lead_count(runtime: Runtime) -> int:
    return engine(runtime.store).reader().execute("SELECT count(*) FROM leads").fetchone()[0]


def table_count(runtime: Runtime, table: str) -> int:
    return engine(runtime.store).reader().execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # noqa: S608


def _has_get_lead_route(api: TestClient) -> bool:
    for route in api.app.routes:
        parts = route.path.strip("/").split("/")
        if (len(parts) == 4 and parts[:3] == ["api", "v1", "leads"] and parts[3].startswith("{")
                and "GET" in getattr(route, "methods", ())):
            return True
    return False


def read_lead(api: TestClient, runtime: Runtime, tenant: Tenant, lead_id: str) -> dict[str, Any]:
    """The lead record with its `submissions`, in the API's wire shape (camelCase)."""
    if _has_get_lead_route(api):
        response = api.get(f"/api/v1/leads/{lead_id}", headers=tenant.headers)
        assert response.status_code == 200, response.text
        return response.json()["data"]
    tx = runtime.store.reader()
    lead = tx.leads.get_lead(tenant.tenant_id, lead_id)
    assert lead is not None, f"lead {lead_id} is not stored"
    record = msgspec.to_builtins(lead)
    record["submissions"] = [msgspec.to_builtins(s) for s in tx.leads.submissions_of(tenant.tenant_id, lead_id)]
    return record


def last_submission(api: TestClient, runtime: Runtime, tenant: Tenant, lead_id: str) -> dict[str, Any]:
    return read_lead(api, runtime, tenant, lead_id)["submissions"][-1]


def jobs(runtime: Runtime, submission_id: str) -> list[tuple[str, str]]:
    """(kind, state) of every job of the submission, oldest first."""
    return [(kind, state) for kind, state, _due in runtime.store.reader().jobs.jobs_of(submission_id)]


def ledger(runtime: Runtime, tenant: Tenant, lead_id: str) -> list[tuple]:
    return runtime.store.reader().ledger.entries_of(tenant.tenant_id, lead_id)


def event_types(submission: dict[str, Any]) -> list[str]:
    return [e["type"] for e in submission["journeyEvents"]]


def events_of(submission: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in submission["journeyEvents"] if e["type"] == kind]


def source_key(runtime: Runtime, tenant: Tenant, source_id: str) -> str:
    return tenancy.create_key(runtime, tenant.tenant_id, name=f"src {source_id}", source_id=source_id).key


def condition(field: str, operator: str, value: list | None = None, **extra: Any) -> dict[str, Any]:
    cond: dict[str, Any] = {"field": field, "operator": operator, **extra}
    if value is not None:
        cond["value"] = value
    return cond


def rule_set(*conditions: dict[str, Any], name: str | None = None, logic: str = "AND", **extra: Any) -> dict:
    """One rule set with one sub-rule holding `conditions` combined by `logic`."""
    rules: dict[str, Any] = {"logicalOperator": "AND",
                             "subRules": [{"logicalOperator": logic, "conditions": list(conditions)}], **extra}
    if name is not None:
        rules["name"] = name
    return rules


def disqualify_when(*conditions: dict[str, Any], name: str = "block", logic: str = "AND") -> dict:
    return {"rules": [rule_set(*conditions, name=name, logic=logic)]}


def bundle_of(*campaigns: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"campaigns": list(campaigns), **extra}


def plain(code: str = "SC1", name: str | None = None, *, client: tuple[str, str] | None = None,
          offer: tuple[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    """A campaign with client and offer, nothing else unless given."""
    return campaign(code, name or f"Campaign {code}", client=client or (f"cli-{code}", f"Client {code}"),
                    offer=offer or (f"off-{code}", f"Offer {code}"), **extra)


def setup_tenant(runtime: Runtime, *campaigns: dict[str, Any], name: str = "Submit Tests", **extra: Any) -> Tenant:
    return make_tenant(runtime, name, bundle_of(*campaigns, **extra))
