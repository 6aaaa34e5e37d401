"""POST /api/v1/leads/{leadId}/return: a delivered lead sent back inside its endpoint's return
window becomes `returned`, a `return` entry reverses its delivery's revenue, `returned`
milestones fire, and a returned lead can be reposted (resold) and returned again, each delivery
once."""

from __future__ import annotations

from collections.abc import Iterator

from types import SimpleNamespace

import pytest
from litestar.testing import TestClient

from appliance.runtime import Runtime
from tests.api_helpers import validation_error
from tests.bundles import campaign
from tests.conftest import make_tenant
from tests.submit_support import START, clock, FakeClock, source_key  # noqa: F401 (the clock fixture)
from tests.worker_helpers import live_app, endpoint, lead_body, lead_of, status_is, submit, wait_for



@pytest.fixture
def live(runtime: Runtime, clock: FakeClock, tmp_path) -> Iterator[TestClient]:
    with live_app(runtime, tmp_path) as client:
        yield client


def selling(*endpoints: dict, returned_cost: bool = False, revenue: bool = True) -> dict:
    """Campaign DL1 sells through `ep` for 10 USD, DL2 through `ep2` for 20 USD."""
    sources = [{"sourceId": "web", "costMilestones": [{"leadStatus": "returned", "amount": 1.5}]}] \
        if returned_cost else []
    return {"deliveryEndpoints": list(endpoints or (endpoint("ep"), endpoint("ep2"))), "campaigns": [
        campaign("DL1", "Sells", ingestion={"sources": sources}, delivery={
            "deliveryEndpointId": "ep",
            "revenueMilestones": [{"leadStatus": "delivered", "amount": 10, "currency": "USD"}] if revenue else []}),
        campaign("DL2", "Resells", client=("cli-2", "Two"), delivery={
            "deliveryEndpointId": "ep2",
            "revenueMilestones": [{"leadStatus": "delivered", "amount": 20, "currency": "USD"}]}),
        campaign("NB1", "No buyer")]}


def delivered(live, tenant, code: str = "DL1", script: str = "success", who=None) -> dict:
    data = submit(live, who or tenant, lead_body(code, script))
    wait_for(live, tenant, data["leadId"], status_is("delivered"))
    return data


def send_back(live, tenant, lead_id: str, body: dict | None = None, expect: int = 200) -> dict:
    response = live.post(f"/api/v1/leads/{lead_id}/return", json={"reason": "wrong number"} if body is None else body,
                         headers=tenant.headers)
    assert response.status_code == expect, response.text
    return response.json()["data"] if expect == 200 else response.json()["error"]


def entries(live, tenant, query: str) -> list[dict]:
    response = live.get(f"/api/v1/ledger{query}", headers=tenant.headers)
    assert response.status_code == 200, response.text
    return response.json()["data"]["items"]


def refused(live, tenant, lead_id: str, says: str, body: dict | None = None) -> None:
    error = send_back(live, tenant, lead_id, body, expect=409)
    assert error["code"] == "INVALID_STATE" and any(says in d for d in error["details"]), error


def test_a_delivered_lead_is_returned_and_its_revenue_reversed(live, runtime, clock):
    tenant = make_tenant(runtime, "T", selling())
    data = delivered(live, tenant)
    clock.advance(days=5)
    answer = send_back(live, tenant, data["leadId"], {"reason": "wrong number", "note": "buyer called twice"})
    entry = answer["entry"]
    assert (answer["leadId"], answer["status"]) == (data["leadId"], "returned")
    assert (entry["kind"], entry["amount"], entry["currency"], entry["leadStatus"], entry["submissionId"]) == (
        "return", -10.0, "USD", "returned", data["submissionId"])
    assert (entry["campaignId"], entry["clientId"], entry["deliveryEndpointId"], entry["createdAt"]) == (
        "DL1", "cli-1", "ep", "2026-03-15T15:00:00.000Z")
    revenue = entries(live, tenant, f"?leadId={data['leadId']}&kind=revenue")
    assert [e["amount"] for e in revenue] == [10.0] and entry["amount"] == -revenue[0]["amount"]
    assert entries(live, tenant, "?kind=return") == [entry]

    lead = lead_of(live, tenant, data["leadId"])
    assert lead["status"] == "returned" and lead["submissions"][-1]["status"] == "returned"
    returned = [e for e in lead["submissions"][-1]["journeyEvents"] if e["type"] == "returned"]
    assert len(returned) == 1 and returned[0]["reason"] == "wrong number"
    assert returned[0]["timestamp"] == "2026-03-15T15:00:00.000Z"
    assert returned[0]["details"]["note"] == "buyer called twice"
    assert returned[0]["details"]["returnedBy"] == f"key:{tenant.key_id}"
    listed = live.get("/api/v1/leads?status=returned", headers=tenant.headers).json()["data"]["leads"]
    assert [item["leadId"] for item in listed] == [data["leadId"]]


def test_a_buyers_price_is_what_is_reversed(live, runtime):
    tenant = make_tenant(runtime, "T", selling())
    data = delivered(live, tenant, script="price:55.5")
    assert send_back(live, tenant, data["leadId"])["entry"]["amount"] == -55.5


def test_a_delivery_without_revenue_is_returned_with_no_entry(live, runtime):
    tenant = make_tenant(runtime, "T", selling(revenue=False))
    data = delivered(live, tenant)
    assert send_back(live, tenant, data["leadId"]) == {"leadId": data["leadId"], "status": "returned", "entry": None}
    assert entries(live, tenant, "?kind=return") == []
    assert lead_of(live, tenant, data["leadId"])["status"] == "returned"


@pytest.mark.parametrize(("extra", "days", "says"), [
    ({}, 30.01, "the return window of 30 days closed at 2026-04-09T15:00:00.000Z"),
    ({"returnWindowDays": 2}, 2.5, "the return window of 2 days closed"),
    ({"returnWindowDays": 0}, 0, "the delivery endpoint takes no returns"),
], ids=["default-30", "two-days", "no-returns"])
def test_outside_the_window_is_invalid_state_and_writes_nothing(live, runtime, clock, extra, days, says):
    tenant = make_tenant(runtime, "T", selling(endpoint("ep", **extra), endpoint("ep2")))
    data = delivered(live, tenant)
    clock.advance(days=days)
    refused(live, tenant, data["leadId"], says)
    lead = lead_of(live, tenant, data["leadId"])
    assert lead["status"] == "delivered" and lead["submissions"][-1]["status"] == "delivered"
    assert entries(live, tenant, "?kind=return") == []


def test_the_last_day_of_the_window_still_takes_a_return(live, runtime, clock):
    tenant = make_tenant(runtime, "T", selling(endpoint("ep", returnWindowDays=2), endpoint("ep2")))
    data = delivered(live, tenant)
    clock.advance(days=2)
    assert send_back(live, tenant, data["leadId"])["status"] == "returned"


def test_a_lead_not_delivered_is_invalid_state(live, runtime):
    tenant = make_tenant(runtime, "T", selling())
    failed = submit(live, tenant, lead_body("DL1", "failure"))
    wait_for(live, tenant, failed["leadId"], status_is("failed"))
    refused(live, tenant, failed["leadId"], "status: the lead is failed; only a delivered lead can be returned")
    # A lead whose buyer is paused waits at `queued` for as long as the pause lasts. (A lead left
    # `qualified` would not do: the worker takes it at once, and without a buyer it fails.)
    pause = live.post("/api/v1/endpoints/ep/pause", json={"reason": "buyer asked"}, headers=tenant.headers)
    assert pause.status_code == 200, pause.text
    waiting = submit(live, tenant, lead_body("DL1"))
    wait_for(live, tenant, waiting["leadId"], status_is("queued"))
    refused(live, tenant, waiting["leadId"], "status: the lead is queued")
    assert entries(live, tenant, "?kind=return") == []


def test_a_second_return_is_invalid_state_and_reverses_nothing_more(live, runtime):
    tenant = make_tenant(runtime, "T", selling())
    data = delivered(live, tenant)
    send_back(live, tenant, data["leadId"])
    refused(live, tenant, data["leadId"], "status: the lead is returned already")
    assert [e["amount"] for e in entries(live, tenant, "?kind=return")] == [-10.0]
    events = lead_of(live, tenant, data["leadId"])["submissions"][-1]["journeyEvents"]
    assert [e["type"] for e in events].count("returned") == 1


def test_another_tenants_lead_is_not_found_and_untouched(live, runtime):
    tenant = make_tenant(runtime, "T", selling())
    other = make_tenant(runtime, "Other", selling())
    theirs = delivered(live, other)
    error = send_back(live, tenant, theirs["leadId"], expect=404)
    assert error["code"] == "NOT_FOUND"
    assert send_back(live, tenant, "lead_01JDNOTALEADATALL0000000000", expect=404)["code"] == "NOT_FOUND"
    assert lead_of(live, other, theirs["leadId"])["status"] == "delivered"
    assert entries(live, other, "?kind=return") == []


@pytest.mark.parametrize(("body", "field"), [
    ({}, "reason"),
    ({"note": "no reason given"}, "reason"),
    ({"reason": ""}, "reason"),
    ({"reason": "   "}, "reason"),
    ({"reason": None}, "reason"),
    ({"reason": 5}, "reason"),
    ({"reason": "x" * 501}, "reason"),
    ({"reason": "ok", "note": "x" * 2001}, "note"),
    ({"reason": "ok", "note": 7}, "note"),
    ({"reason": "ok", "returnedBy": "someone"}, "returnedBy"),
], ids=["missing", "only-note", "empty", "blank", "null", "number", "long", "long-note", "note-type", "unknown"])
def test_a_bad_body_is_a_validation_error_and_writes_nothing(live, runtime, body, field):
    tenant = make_tenant(runtime, "T", selling())
    data = delivered(live, tenant)
    response = live.post(f"/api/v1/leads/{data['leadId']}/return", json=body, headers=tenant.headers)
    validation_error(response, field)
    assert lead_of(live, tenant, data["leadId"])["status"] == "delivered"
    assert entries(live, tenant, "?kind=return") == []


def test_return_needs_a_tenant_key(live, runtime):
    tenant = make_tenant(runtime, "T", selling(returned_cost=True))
    data = delivered(live, tenant)
    path = f"/api/v1/leads/{data['leadId']}/return"
    assert live.post(path, json={"reason": "x"}).status_code == 401
    web = source_key(runtime, tenant, "web")
    assert live.post(path, json={"reason": "x"}, headers={"X-API-Key": web}).status_code == 403
    assert lead_of(live, tenant, data["leadId"])["status"] == "delivered"


def test_a_returned_milestone_fires_once_per_submission(live, runtime):
    tenant = make_tenant(runtime, "T", selling(returned_cost=True))
    web = SimpleNamespace(headers={"X-API-Key": source_key(runtime, tenant, "web")})
    data = delivered(live, tenant, who=web)
    send_back(live, tenant, data["leadId"])
    refused(live, tenant, data["leadId"], "returned already")
    costs = entries(live, tenant, "?kind=cost")
    assert [(e["leadStatus"], e["amount"], e["sourceId"], e["submissionId"]) for e in costs] == [
        ("returned", 1.5, "web", data["submissionId"])]
    assert entries(live, tenant, "?kind=return")[0]["sourceId"] == "web"


def test_a_returned_lead_is_resold_by_a_repost_and_each_delivery_is_returned_once(live, runtime):
    tenant = make_tenant(runtime, "T", selling(returned_cost=True))
    web = SimpleNamespace(headers={"X-API-Key": source_key(runtime, tenant, "web")})
    data = delivered(live, tenant, who=web)
    send_back(live, tenant, data["leadId"])

    repost = live.post(f"/api/v1/leads/{data['leadId']}/repost", json={"campaignId": "DL2"}, headers=tenant.headers)
    assert repost.status_code == 201, repost.text
    resold = repost.json()["data"]["newSubmissionId"]
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered"))
    assert [s["status"] for s in lead["submissions"]] == ["returned", "delivered"]
    assert [(e["submissionId"], e["amount"]) for e in entries(live, tenant, "?kind=revenue")] == [
        (resold, 20.0), (data["submissionId"], 10.0)]

    second = send_back(live, tenant, data["leadId"])["entry"]
    assert (second["submissionId"], second["amount"], second["campaignId"], second["deliveryEndpointId"]) == (
        resold, -20.0, "DL2", "ep2")
    refused(live, tenant, data["leadId"], "returned already")
    assert sorted((e["submissionId"], e["amount"]) for e in entries(live, tenant, "?kind=return")) == sorted([
        (data["submissionId"], -10.0), (resold, -20.0)])
    # the returned cost milestone: once per submission, so once more for the resold one
    assert sorted(e["submissionId"] for e in entries(live, tenant, "?kind=cost")) == sorted(
        [data["submissionId"], resold])


def test_returned_is_not_set_by_hand(live, runtime):
    tenant = make_tenant(runtime, "T", selling())
    data = delivered(live, tenant)
    bulk = live.patch("/api/v1/leads/bulk", json={"leadIds": [data["leadId"]], "updates": {"status": "returned"}},
                      headers=tenant.headers)
    validation_error(bulk, "updates.status")
    patch = live.patch(f"/api/v1/submissions/{data['submissionId']}", json={"status": "returned"},
                       headers=tenant.headers)
    validation_error(patch, "status")
    assert lead_of(live, tenant, data["leadId"])["status"] == "delivered"
