"""The delivery worker end to end: submit over HTTP, the job loop delivers through an adapter
dropped into the plugin folder (scripted by the lead's customFields.script), outcomes and
statuses land on the lead and its submission. Time is moved with a fake clock."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from litestar.testing import TestClient

from appliance.app import create_app
from appliance.runtime import Runtime
from tests.bundles import campaign
from tests.conftest import make_tenant
from tests.submit_support import START, clock, FakeClock  # noqa: F401 (the clock fixture)
from tests.worker_helpers import live_app, endpoint, lead_body, status_is, submit, wait_for
from tests.engine import engine



@pytest.fixture
def live(runtime: Runtime, clock: FakeClock, tmp_path) -> Iterator[TestClient]:
    with live_app(runtime, tmp_path) as client:
        yield client


def jobs(runtime, submission_id) -> list[tuple]:
    return runtime.store.reader().jobs.jobs_of(submission_id)


def test_qualified_lead_is_delivered_with_outcome_and_revenue(live, runtime):
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint()], "campaigns": [campaign(
        "DL1", "Deliver", delivery={"deliveryEndpointId": "ep", "revenueMilestones": [
            {"leadStatus": "delivered", "amount": 40, "currency": "USD"}]})]})
    data = submit(live, tenant, lead_body("DL1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered"))
    submission = lead["submissions"][0]
    assert submission["status"] == "delivered"
    assert submission["delivery"]["success"] is True and submission["delivery"]["statusCode"] == 200
    assert submission["posting"]["success"] is True and submission["clientLeadId"] == "buyer-1"
    assert submission["responseFields"] == {"echo": "ep"}
    assert submission["journeyEvents"][-1]["type"] == "delivered"
    assert jobs(runtime, data["submissionId"]) == [("deliver", "done", jobs(runtime, data["submissionId"])[0][2])]
    assert runtime.store.reader().ledger.entries_of(tenant.tenant_id, data["leadId"]) == [
        ("revenue", "delivered", 40.0, "USD", "DL1", None)]


def test_an_attempt_carries_the_workers_time(live, runtime, clock):
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint()], "campaigns": [
        campaign("DL1", "Deliver", delivery={"deliveryEndpointId": "ep"})]})
    clock.advance(days=40)
    data = submit(live, tenant, lead_body("DL1", "clock"))
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered"))
    assert lead["submissions"][0]["delivery"]["responseMessage"] == (START + timedelta(days=40)).isoformat()


def test_buyer_refusal_fails_without_retry(live, runtime):
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint()], "campaigns": [
        campaign("DL1", "Deliver", delivery={"deliveryEndpointId": "ep"})]})
    for script in ("failure", "duplicate"):
        data = submit(live, tenant, lead_body("DL1", script))
        lead = wait_for(live, tenant, data["leadId"], status_is("failed"))
        assert lead["submissions"][0]["delivery"]["success"] is False
        assert [state for _, state, _ in jobs(runtime, data["submissionId"])] == ["done"]
        assert runtime.store.reader().ledger.entries_of(tenant.tenant_id, data["leadId"]) == []


def test_errors_retry_on_the_backoff_then_deliver(live, runtime, clock):
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint()], "campaigns": [
        campaign("DL1", "Deliver", delivery={"deliveryEndpointId": "ep"})]})
    data = submit(live, tenant, lead_body("DL1", "error,raise,success"))
    lead = wait_for(live, tenant, data["leadId"],
                    lambda l: l["submissions"][0]["journeyEvents"][-1]["type"] == "delivery_error")
    assert lead["status"] == "qualified"
    (kind, state, due), = jobs(runtime, data["submissionId"])
    assert (state, due) == ("ready", "2026-03-10T15:00:10.000Z")  # first backoff: 10 s
    clock.advance(seconds=11)
    # the adapter raising is an error too, retried after the second backoff step (60 s)
    wait_for(live, tenant, data["leadId"], lambda l: jobs(runtime, data["submissionId"])[0][2] == "2026-03-10T15:01:11.000Z")
    clock.advance(seconds=61)
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered"))
    assert lead["submissions"][0]["clientLeadId"] == "buyer-3"


def test_errors_exhaust_retries_then_fail(live, runtime, clock):
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint(retry={"maxAttempts": 2, "backoffSeconds": [5]})],
                                        "campaigns": [campaign("DL1", "Deliver", delivery={"deliveryEndpointId": "ep"})]})
    data = submit(live, tenant, lead_body("DL1", "error"))
    wait_for(live, tenant, data["leadId"], lambda l: jobs(runtime, data["submissionId"])[0][1] == "ready"
             and l["submissions"][0]["journeyEvents"][-1]["type"] == "delivery_error")
    clock.advance(seconds=6)
    lead = wait_for(live, tenant, data["leadId"], status_is("failed"))
    assert "retries exhausted after 2 attempts" in lead["submissions"][0]["result"]
    assert [state for _, state, _ in jobs(runtime, data["submissionId"])] == ["dead"]


def test_daily_delivery_limit_queues_until_the_next_local_day(live, runtime, clock):
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint()], "campaigns": [campaign(
        "DL1", "Deliver", delivery={"deliveryEndpointId": "ep", "deliveryLimits": [{"cap": 1, "type": "daily"}],
                                    "deliverySchedule": {"timezone": "America/New_York"}})]})
    first = submit(live, tenant, lead_body("DL1"))
    wait_for(live, tenant, first["leadId"], status_is("delivered"))
    second = submit(live, tenant, lead_body("DL1"))
    lead = wait_for(live, tenant, second["leadId"], status_is("queued"))
    assert "daily delivery limit of 1 reached" in lead["submissions"][0]["result"]
    # New York midnight after 2026-03-10 is 04:00 UTC on the 11th (daylight time)
    assert jobs(runtime, second["submissionId"])[0][1:] == ("ready", "2026-03-11T04:00:00.000Z")
    clock.set(datetime(2026, 3, 11, 4, 0, 1, tzinfo=UTC))
    wait_for(live, tenant, second["leadId"], status_is("delivered"))


def test_schedule_queues_outside_the_window_and_releases_in_order(live, runtime, clock):
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint()], "campaigns": [campaign(
        "DL1", "Deliver", delivery={"deliveryEndpointId": "ep", "deliverySchedule": {
            "timezone": "America/New_York",
            "specificDays": [{"day": "Tuesday", "startTime": "12:00", "endTime": "13:00"}]}})]})
    ids = [submit(live, tenant, lead_body("DL1"))["leadId"] for _ in range(3)]
    for lead_id in ids:
        wait_for(live, tenant, lead_id, status_is("queued"))
    clock.set(datetime(2026, 3, 10, 16, 0, 0, tzinfo=UTC))  # 12:00 in New York: the window opens
    delivered = [wait_for(live, tenant, lead_id, status_is("delivered")) for lead_id in ids]
    times = [lead["submissions"][0]["delivery"]["deliveredAt"] for lead in delivered]
    assert times == sorted(times)


def test_a_lead_that_cannot_be_read_holds_up_none_of_the_leads_claimed_with_it(live, runtime, clock, caplog):
    # Queued until the window opens, then claimed together: the worker reads a claim's leads in
    # one read transaction, and one it cannot read must not keep the others from their buyer.
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint()], "campaigns": [campaign(
        "DL1", "Deliver", delivery={"deliveryEndpointId": "ep", "deliverySchedule": {
            "timezone": "America/New_York",
            "specificDays": [{"day": "Tuesday", "startTime": "12:00", "endTime": "13:00"}]}})]})
    made = [submit(live, tenant, lead_body("DL1")) for _ in range(3)]
    for data in made:
        wait_for(live, tenant, data["leadId"], status_is("queued"))
    unreadable = made[1]
    engine(runtime.store).write_sync(lambda conn: conn.execute(
        "UPDATE leads SET doc = ? WHERE lead_id = ?", (b"\x00not a lead record", unreadable["leadId"])))
    clock.set(datetime(2026, 3, 10, 16, 0, 0, tzinfo=UTC))  # 12:00 in New York: the window opens
    for data in (made[0], made[2]):
        wait_for(live, tenant, data["leadId"], status_is("delivered"))
    deadline = time.monotonic() + 15
    while "internal error" not in caplog.text:
        assert time.monotonic() < deadline, caplog.text
        time.sleep(0.05)
    (job,) = jobs(runtime, unreadable["submissionId"])
    assert job[1] == "ready" and job[2] > "2026-03-10T16:00:00.000Z"  # tried again later, not lost


def test_next_priority_sends_to_a_fallback_campaign_with_room(live, runtime):
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint(), endpoint("ep2")], "campaigns": [
        campaign("DL1", "Full", qualification={"fallbackCampaigns": ["DL2"]},
                 delivery={"deliveryEndpointId": "ep",
                           "deliveryLimits": [{"cap": 0, "type": "daily", "action": "next_priority"}]}),
        campaign("DL2", "Spare", delivery={"deliveryEndpointId": "ep2"})]})
    data = submit(live, tenant, lead_body("DL1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered"))
    assert lead["campaignId"] == "DL2"
    submission = lead["submissions"][0]
    assert submission["campaign"]["campaignId"] == "DL2"
    assert submission["responseFields"] == {"echo": "ep2"}
    assert any(e["type"] == "rerouted_for_delivery" for e in submission["journeyEvents"])
    # the list filters see the lead under the campaign and status its delivery recorded
    for query, found in (("campaignIds=DL2&status=delivered", True), ("campaignIds=DL1", False),
                         ("status=qualified", False)):
        listed = live.get(f"/api/v1/leads?{query}", headers=tenant.headers).json()["data"]["leads"]
        assert ([x["leadId"] for x in listed] == [data["leadId"]]) is found, query


def test_route_action_sends_to_the_named_campaign(live, runtime):
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint(), endpoint("ep3")], "campaigns": [
        campaign("DL1", "Closed", delivery={"deliveryEndpointId": "ep", "deliverySchedule": {
            "timezone": "UTC", "action": "route", "routeToCampaignId": "DL3",
            "specificDays": [{"day": "Sunday", "startTime": "00:00", "endTime": "01:00"}]}}),
        campaign("DL3", "Open", delivery={"deliveryEndpointId": "ep3"})]})
    data = submit(live, tenant, lead_body("DL1"))
    assert wait_for(live, tenant, data["leadId"], status_is("delivered"))["campaignId"] == "DL3"


def test_delivery_time_rules_and_tcpa_policy_disqualify_before_sending(live, runtime):
    no_gmail = {"name": "No gmail at delivery", "appliesAt": "delivery", "subRules": [{"conditions": [
        {"field": "email", "operator": "ends_with", "value": ["@gmail.com"]}]}]}
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint()], "campaigns": [
        campaign("DL1", "Rules", qualification={"rules": [no_gmail]}, delivery={"deliveryEndpointId": "ep"}),
        campaign("DL2", "Tcpa", qualification={"tcpaPolicy": {"deliveryPolicy": {"required": True}}},
                 delivery={"deliveryEndpointId": "ep"})]})
    gmail = submit(live, tenant, lead_body("DL1", email="someone@gmail.com"))
    assert gmail["status"] == "qualified"  # delivery rules do not run at intake
    lead = wait_for(live, tenant, gmail["leadId"], status_is("disqualified"))
    assert "No gmail at delivery" in lead["submissions"][0]["result"]
    no_consent = submit(live, tenant, lead_body("DL2"))
    lead = wait_for(live, tenant, no_consent["leadId"], status_is("disqualified"))
    assert "TCPA" in lead["submissions"][0]["result"]
    consent = submit(live, tenant, lead_body("DL2", compliance={"tcpaConsent": True,
                                                                 "consentTimestamp": "2026-03-10T14:00:00Z"}))
    wait_for(live, tenant, consent["leadId"], status_is("delivered"))


def test_unknown_adapter_and_missing_endpoint(live, runtime, clock):
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint(adapter="nope", retry={"maxAttempts": 1})],
                                        "campaigns": [campaign("DL1", "Bad adapter", delivery={"deliveryEndpointId": "ep"}),
                                                      campaign("DL2", "No endpoint")]})
    bad = submit(live, tenant, lead_body("DL1"))
    lead = wait_for(live, tenant, bad["leadId"], status_is("failed"))
    assert "no delivery adapter named 'nope'" in lead["submissions"][0]["result"]
    none = submit(live, tenant, lead_body("DL2"))
    lead = wait_for(live, tenant, none["leadId"], status_is("failed"))
    assert "no delivery endpoint" in lead["submissions"][0]["result"]


@pytest.mark.parametrize("script", ["mistyped", "not-a-result"])
def test_an_adapter_answer_of_the_wrong_shape_is_a_delivery_error(live, runtime, script):
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint(retry={"maxAttempts": 1})],
                                        "campaigns": [campaign("DL1", "Deliver", delivery={"deliveryEndpointId": "ep"})]})
    data = submit(live, tenant, lead_body("DL1", script))
    lead = wait_for(live, tenant, data["leadId"], status_is("failed"))
    submission = lead["submissions"][0]
    assert "adapter 'scripted' returned an invalid result" in submission["result"]
    assert submission["delivery"]["success"] is False and submission["responseFields"] == {}
    response = live.get(f"/api/v1/submissions/{data['submissionId']}", headers=tenant.headers)
    assert response.status_code == 200 and response.json()["data"] == submission


def test_short_circuited_submission_is_evaluated_by_the_job_loop(live, runtime):
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint()], "campaigns": [campaign(
        "DL1", "Quick", ingestion={"sources": [{"sourceId": "fast", "shortCircuitSyncEvaluation": True}]},
        delivery={"deliveryEndpointId": "ep"})]})
    from appliance.services import tenancy

    key = tenancy.create_key(runtime, tenant.tenant_id, source_id="fast").key
    response = live.post("/api/v1/leads/submit", json=lead_body("DL1"), headers={"X-API-Key": key})
    data = response.json()["data"]
    assert data["status"] == "pending"
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered"))
    assert lead["submissions"][0]["qualification"]["passed"] is True


def test_jobs_survive_a_restart_and_interrupted_ones_run_again(runtime, clock, tmp_path):
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint()], "campaigns": [
        campaign("DL1", "Deliver", delivery={"deliveryEndpointId": "ep"})]})
    with TestClient(create_app(runtime, background=False)) as offline:
        waiting = submit(offline, tenant, lead_body("DL1"))
        interrupted = submit(offline, tenant, lead_body("DL1"))
    engine(runtime.store).write_sync(lambda conn: conn.execute(
        "UPDATE jobs SET state = 'running' WHERE submission_id = ?", (interrupted["submissionId"],)))
    with live_app(runtime, tmp_path) as client:
        for data in (waiting, interrupted):
            wait_for(client, tenant, data["leadId"], status_is("delivered"))


def test_a_delivery_answered_after_an_operator_changed_the_lead_keeps_the_operators_status(live, runtime):
    """The buyer answers after the lead's submission was set to failed by hand: the answer is
    noted in the journey (`delivered_after_cancel`), the operator's status stays, the job stays
    cancelled."""
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint()], "campaigns": [campaign(
        "DL1", "Deliver", delivery={"deliveryEndpointId": "ep"})]})
    data = submit(live, tenant, lead_body("DL1", "sleep:0.6"))
    deadline = time.monotonic() + 15
    while [state for _, state, _ in jobs(runtime, data["submissionId"])] != ["running"]:
        assert time.monotonic() < deadline, jobs(runtime, data["submissionId"])
        time.sleep(0.01)
    changed = live.patch(f"/api/v1/submissions/{data['submissionId']}", headers=tenant.headers,
                         json={"status": "failed"})
    assert changed.status_code == 200, changed.text
    lead = wait_for(live, tenant, data["leadId"], lambda found: any(
        e["type"] == "delivered_after_cancel" for e in found["submissions"][0]["journeyEvents"]))
    assert lead["status"] == "failed" and lead["submissions"][0]["status"] == "failed"
    assert [state for _, state, _ in jobs(runtime, data["submissionId"])] == ["cancelled"]
