"""Return requests (CONTRACT 9.4, issue 36 item 3): filed on a delivered lead and checked against
its client's return policy (age, share of its recent sales, auto-approval), decided by a manager,
approving being the return itself (the lead `returned`, its revenue reversed); the console lists
the pending ones. Refusals change nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from litestar.testing import TestClient

from appliance.runtime import Runtime
from appliance.services import tenancy
from tests.conftest import make_tenant
from tests.people import add_person, sign_in_as
from tests.submit_support import FakeClock, clock  # noqa: F401 (the clock fixture)
from tests.test_returns_api import delivered, entries, selling
from tests.worker_helpers import endpoint, lead_body, lead_of, live_app, status_is, submit, wait_for

REQUESTS = "/api/v1/return-requests"


@pytest.fixture
def live(runtime: Runtime, clock: FakeClock, tmp_path) -> Iterator[TestClient]:
    with live_app(runtime, tmp_path) as client:
        yield client


def with_client(runtime, policy: dict, **billing) -> object:
    """A tenant selling DL1 (10 USD) for client cli-1 whose return policy is `policy`."""
    tenant = make_tenant(runtime, "T", {**selling(), "clients": [
        {"clientId": "cli-1", "name": "Smith Law", "returnPolicy": policy, **({"billing": billing} if billing else {})},
        {"clientId": "cli-2", "name": "Two"}]})
    return tenant


def ask(live, tenant, lead_id: str, expect: int = 201, **body) -> dict:
    answer = live.post(f"/api/v1/leads/{lead_id}/return-requests", json={"reason": "wrong number", **body},
                       headers=tenant.headers)
    assert answer.status_code == expect, answer.text
    return answer.json()["data"] if expect == 201 else answer.json()["error"]


def decide(live, tenant, request_id: str, decision: str, expect: int = 200, headers=None) -> dict:
    answer = live.post(f"{REQUESTS}/{request_id}/decision", json={"decision": decision, "note": "checked"},
                       headers=headers or tenant.headers)
    assert answer.status_code == expect, answer.text
    return answer.json()["data"] if expect == 200 else answer.json()["error"]


def test_a_request_within_the_policy_waits_for_a_manager_who_approves_it(live, runtime, clock):
    tenant = with_client(runtime, {"maxAgeDays": 7, "maxPercent": 100})
    lead = delivered(live, tenant)["leadId"]
    clock.advance(days=2)
    made = ask(live, tenant, lead, note="called twice")
    assert made["requestId"].startswith("rtr_") and made["state"] == "pending"
    assert (made["leadId"], made["clientId"], made["reason"], made["note"]) == (lead, "cli-1", "wrong number",
                                                                                 "called twice")
    assert made["requestedBy"] == f"key:{tenant.key_id}" and made["decidedBy"] is None
    assert lead_of(live, tenant, lead)["status"] == "delivered"  # nothing returned yet
    assert ask(live, tenant, lead, expect=409)["details"] == ["leadId: a return request of this lead is pending already"]
    listed = live.get(REQUESTS, params={"state": "pending"}, headers=tenant.headers).json()["data"]["items"]
    assert [r["requestId"] for r in listed] == [made["requestId"]]
    done = decide(live, tenant, made["requestId"], "approve")
    assert (done["state"], done["decidedBy"], done["decisionNote"]) == ("approved", f"key:{tenant.key_id}", "checked")
    assert lead_of(live, tenant, lead)["status"] == "returned"
    assert [e["amount"] for e in entries(live, tenant, f"?leadId={lead}&kind=return")] == [-10.0]
    again = decide(live, tenant, made["requestId"], "reject", expect=409)
    assert again["details"] == ["state: the request is approved already"]


def test_a_rejected_request_changes_nothing_but_itself(live, runtime, clock):
    tenant = with_client(runtime, {"maxPercent": 100})
    lead = delivered(live, tenant)["leadId"]
    made = ask(live, tenant, lead)
    done = decide(live, tenant, made["requestId"], "reject")
    assert done["state"] == "rejected" and lead_of(live, tenant, lead)["status"] == "delivered"
    assert entries(live, tenant, f"?leadId={lead}&kind=return") == []
    assert ask(live, tenant, lead)["state"] == "pending"  # it may be asked again


def test_an_auto_approving_policy_returns_the_lead_at_once(live, runtime, clock):
    tenant = with_client(runtime, {"maxPercent": 100, "autoApprove": True})
    lead = delivered(live, tenant)["leadId"]
    made = ask(live, tenant, lead)
    assert made["state"] == "approved" and made["decidedBy"] == f"key:{tenant.key_id}"
    assert lead_of(live, tenant, lead)["status"] == "returned"


@pytest.mark.parametrize("policy, days, says", [
    ({"maxAgeDays": 0}, 0, "returnPolicy.maxAgeDays: this client's return requests are not taken"),
    ({"maxAgeDays": 3}, 4, "returnPolicy.maxAgeDays: the lead was delivered 4 days ago"),
])
def test_requests_past_the_policys_age_are_refused(live, runtime, clock, policy, days, says):
    tenant = with_client(runtime, {**policy, "autoApprove": True})
    lead = delivered(live, tenant)["leadId"]
    clock.advance(days=days)
    error = ask(live, tenant, lead, expect=409)
    assert error["code"] == "INVALID_STATE" and error["details"][0].startswith(says), error
    assert live.get(REQUESTS, headers=tenant.headers).json()["data"]["items"] == []
    assert lead_of(live, tenant, lead)["status"] == "delivered"


def test_a_client_cannot_return_more_than_its_share_of_recent_sales(live, runtime, clock):
    tenant = with_client(runtime, {"maxPercent": 25})
    leads = [delivered(live, tenant)["leadId"] for _ in range(4)]
    ask(live, tenant, leads[0])  # 1 of 4: 25 %
    error = ask(live, tenant, leads[1], expect=409)
    assert error["details"] == ["returnPolicy.maxPercent: 2 of its 4 deliveries of the last 30 days would be "
                                "returned, over this client's 25 %"]


def test_only_delivered_leads_of_the_tenant_can_be_asked_for(live, runtime, clock):
    tenant = with_client(runtime, {"maxPercent": 100})
    failed = submit(live, tenant, lead_body("DL1", "failure"))["leadId"]
    wait_for(live, tenant, failed, status_is("failed"))
    assert ask(live, tenant, failed, expect=409)["details"] == [
        "status: the lead is failed; only a delivered lead can be returned"]
    other = make_tenant(runtime, "Other", selling())
    theirs = delivered(live, other)["leadId"]
    assert ask(live, tenant, theirs, expect=404)["code"] == "NOT_FOUND"
    returned = delivered(live, tenant)["leadId"]
    live.post(f"/api/v1/leads/{returned}/return", json={"reason": "x"}, headers=tenant.headers)
    error = ask(live, tenant, returned, expect=409)
    assert error["details"] == ["status: the lead is returned already"]
    bad = live.post(f"/api/v1/leads/{returned}/return-requests", json={"reason": " "}, headers=tenant.headers)
    assert bad.status_code == 400 and bad.json()["error"]["details"][0].startswith("reason")
    assert decide(live, tenant, "rtr_nope", "approve", expect=404)["code"] == "NOT_FOUND"
    bad = live.post(f"{REQUESTS}/rtr_nope/decision", json={"decision": "maybe"}, headers=tenant.headers)
    assert bad.status_code == 400 and bad.json()["error"]["details"][0].startswith("decision")


def test_the_endpoints_client_is_the_one_asked_of(live, runtime, clock):
    bundle = selling(endpoint("ep", clientId="cli-2"), endpoint("ep2"))
    tenant = make_tenant(runtime, "T", {**bundle, "clients": [
        {"clientId": "cli-1", "name": "One", "returnPolicy": {"maxAgeDays": 0}},
        {"clientId": "cli-2", "name": "Two", "returnPolicy": {"maxPercent": 100}}]})
    lead = delivered(live, tenant)["leadId"]  # DL1's client is cli-1, but its endpoint bills cli-2
    assert ask(live, tenant, lead)["clientId"] == "cli-2"


def test_roles_and_the_console_page(live, runtime, clock):
    tenant = with_client(runtime, {"maxPercent": 100})
    lead = delivered(live, tenant)["leadId"]
    reviewer = {"X-API-Key": tenancy.create_key(runtime, tenant.tenant_id, role="reviewer").key}
    made = live.post(f"/api/v1/leads/{lead}/return-requests", json={"reason": "duplicate"}, headers=reviewer)
    assert made.status_code == 201
    refused = decide(live, tenant, made.json()["data"]["requestId"], "approve", expect=403, headers=reviewer)
    assert "manager" in refused["message"]
    token = sign_in_as(live, add_person(live, tenant, "viewer"))
    page = live.get("/admin/returns")
    assert page.status_code == 200 and lead in page.text and "Approve" not in page.text
    live.cookies.clear()
    token = sign_in_as(live, add_person(live, tenant, "manager"))
    page = live.get("/admin/returns")
    assert f"Approve {made.json()['data']['requestId']}" in page.text
    done = live.post(f"/admin/returns/{made.json()['data']['requestId']}", data={"csrf": token, "decision": "approve"},
                     follow_redirects=False)
    assert done.status_code == 303 and lead_of(live, tenant, lead)["status"] == "returned"
    audited = live.get("/api/v1/audit", params={"action": "return_request.approve"}, headers=tenant.headers).json()
    assert audited["data"]["items"][0]["actor"].startswith("user:")
    assert json.dumps(live.get(REQUESTS, params={"state": "approved"}, headers=tenant.headers).json()).count(lead) == 1
