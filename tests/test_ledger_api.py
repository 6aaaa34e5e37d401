"""The ledger: milestones fire on every path that changes a status, once per (milestone,
submission), a buyer's price is the delivery's revenue, and GET /api/v1/ledger pages and filters
the entries."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from litestar.testing import TestClient

from appliance.runtime import Runtime
from tests.bundles import campaign
from tests.conftest import make_tenant
from tests.submit_support import FakeClock
from tests.worker_helpers import live_app, endpoint, lead_body, status_is, submit, wait_for

START = datetime(2026, 3, 10, 15, 0, tzinfo=UTC)


@pytest.fixture
def live(runtime: Runtime, tmp_path) -> Iterator[TestClient]:
    runtime.clock = FakeClock(START)
    with live_app(runtime, tmp_path) as client:
        yield client


def ledger(client, tenant, query: str = "", status: int = 200) -> dict:
    response = client.get(f"/api/v1/ledger{query}", headers=tenant.headers)
    assert response.status_code == status, response.text
    return response.json()["data"] if status == 200 else response.json()["error"]


def revenue_on(*statuses: str, amount: int = 10) -> list[dict]:
    return [{"leadStatus": s, "amount": amount + i, "currency": "USD"} for i, s in enumerate(statuses)]


def test_a_buyers_price_is_the_revenue_of_the_delivery(live, runtime):
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint()], "campaigns": [campaign(
        "DL1", "Deliver", delivery={"deliveryEndpointId": "ep", "revenueMilestones": revenue_on("delivered")})]})
    # One after the other: entries list newest first, and two deliveries under way at once may
    # record in either order (on PostgreSQL their units commit in parallel).
    priced = submit(live, tenant, lead_body("DL1", "price:55.5"))
    wait_for(live, tenant, priced["leadId"], status_is("delivered"))
    plain = submit(live, tenant, lead_body("DL1"))
    wait_for(live, tenant, plain["leadId"], status_is("delivered"))
    items = ledger(live, tenant)["items"]
    assert [(i["leadId"], i["kind"], i["amount"]) for i in items] == [
        (plain["leadId"], "revenue", 10.0), (priced["leadId"], "revenue", 55.5)]
    entry = items[1]
    assert entry["entryId"].startswith("led_") and entry["submissionId"] == priced["submissionId"]
    assert (entry["campaignId"], entry["clientId"], entry["deliveryEndpointId"], entry["currency"],
            entry["leadStatus"]) == ("DL1", "cli-1", "ep", "USD", "delivered")


def test_milestones_fire_on_submit_bulk_update_and_patch_once_per_submission(live, runtime):
    tenant = make_tenant(runtime, "T", {"campaigns": [campaign(
        "LG1", "No buyer", delivery={"revenueMilestones": revenue_on(
            "qualified", "rejected", "error")})]})
    data = submit(live, tenant, lead_body("LG1"))
    assert data["status"] == "qualified"  # no endpoint: the lead waits qualified
    bulk = {"leadIds": [data["leadId"]], "updates": {"status": "rejected"}}
    for status in ("rejected", "qualified", "rejected"):  # back and forth: each milestone pays once
        bulk["updates"]["status"] = status
        assert live.patch("/api/v1/leads/bulk", json=bulk, headers=tenant.headers).status_code == 200
    assert live.patch(f"/api/v1/submissions/{data['submissionId']}", json={"status": "error"},
                      headers=tenant.headers).status_code == 200
    entries = [(i["leadStatus"], i["amount"]) for i in ledger(live, tenant, f"?leadId={data['leadId']}")["items"]]
    assert sorted(entries) == [("error", 12.0), ("qualified", 10.0), ("rejected", 11.0)]


def test_ledger_pages_and_filters(live, runtime):
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint()], "campaigns": [
        campaign("LA1", "A", delivery={"deliveryEndpointId": "ep", "revenueMilestones": revenue_on("delivered")}),
        campaign("LB1", "B", client=("cli-2", "Two"),
                 delivery={"deliveryEndpointId": "ep", "revenueMilestones": revenue_on("delivered")})]})
    made = [submit(live, tenant, lead_body(code)) for code in ("LA1", "LB1", "LA1")]
    for lead in made:
        wait_for(live, tenant, lead["leadId"], status_is("delivered"))
    first = ledger(live, tenant, "?limit=2")
    assert first["hasMore"] is True and len(first["items"]) == 2
    rest = ledger(live, tenant, f"?limit=2&cursor={first['nextCursor']}")
    assert rest["hasMore"] is False and rest["nextCursor"] is None
    every = [i["entryId"] for i in first["items"] + rest["items"]]
    assert len(set(every)) == 3 and every == sorted(every, reverse=True)
    assert {i["campaignId"] for i in ledger(live, tenant, "?campaignIds=LB1")["items"]} == {"LB1"}
    assert len(ledger(live, tenant, "?clientIds=cli-1&kind=revenue")["items"]) == 2
    assert ledger(live, tenant, "?kind=cost")["items"] == []
    assert ledger(live, tenant, "?startDate=2000-01-01&endDate=2000-01-02")["items"] == []
    other = make_tenant(runtime, "Other", {"campaigns": []})
    assert ledger(live, other)["items"] == []


@pytest.mark.parametrize(("query", "says"), [
    ("?kind=refund", "kind: must be one of cost, revenue, return"),
    ("?cursor=lead_01", "cursor: not a ledger entry id"),
    ("?limit=0", "limit"),
    ("?startDate=yesterday", "startDate: must be an ISO 8601 date or timestamp"),
    ("?startDate=2026-02-01&endDate=2026-01-01", "endDate: must not be before startDate"),
])
def test_bad_ledger_queries_are_validation_errors(live, runtime, query, says):
    tenant = make_tenant(runtime, "T", {"campaigns": []})
    error = ledger(live, tenant, query, status=400)
    assert error["code"] == "VALIDATION_ERROR" and any(says in d for d in error["details"]), error
