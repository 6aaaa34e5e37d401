"""Buyer health, end to end: errors (or failures) in a row pause an endpoint by its
healthPolicy, its leads wait at `queued` instead of failing, `endpoint.paused` / `resumed` go to
webhooks, GET /api/v1/endpoints shows it all, and pause and resume work through the API and
`appliance endpoint`. Endpoints answer through the scripted adapter of the plugin folder."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from litestar.testing import TestClient
from standardwebhooks.webhooks import Webhook as Verifier

from appliance.jobs.ticker import purge_old_activity
from appliance.runtime import Runtime
from appliance.services import tenancy
from tests.api_helpers import samples
from tests.buyer_server import BuyerServer, wait_until
from tests.bundles import campaign
from tests.conftest import make_tenant
from tests.submit_support import FakeClock, clock  # noqa: F401 (the clock fixture)
from tests.worker_helpers import endpoint, lead_body, lead_of, live_app, status_is, submit, wait_for
from tests.engine import engine


@pytest.fixture
def config_file(config_file: Path) -> Path:
    with config_file.open("a") as f:  # the webhook receiver is on loopback
        f.write("\n[delivery]\nallow_private_addresses = true\n")
    return config_file


@pytest.fixture
def live(runtime: Runtime, clock: FakeClock, tmp_path) -> Iterator[TestClient]:
    with live_app(runtime, tmp_path) as client:
        yield client


def tenant_with(runtime, *buyers: dict, name: str = "T", delivery: dict | None = None):
    return make_tenant(runtime, name, {"deliveryEndpoints": list(buyers), "campaigns": [campaign(
        "HL1", "Health", delivery=delivery or {"deliveryEndpointId": buyers[0]["deliveryEndpointId"]})]})


def endpoints_of(client, tenant) -> dict[str, dict]:
    response = client.get("/api/v1/endpoints", headers=tenant.headers)
    assert response.status_code == 200, response.text
    return {item["deliveryEndpointId"]: item for item in response.json()["data"]["items"]}


def post(client, tenant, path: str, body: dict | None = None, status: int = 200) -> dict:
    response = client.post(path, json=body, headers=tenant.headers) if body is not None else \
        client.post(path, headers=tenant.headers)
    assert response.status_code == status, response.text
    return response.json()["data"] if status < 300 else response.json()["error"]


def jobs(runtime, submission_id: str) -> list[str]:
    return [state for _, state, _ in runtime.store.reader().jobs.jobs_of(submission_id)]


def test_errors_in_a_row_pause_the_endpoint_and_its_leads_wait_until_it_resumes(live, runtime, clock, caplog):
    caplog.set_level(logging.WARNING, logger="appliance.delivery")
    tenant = tenant_with(runtime, endpoint("ep", healthPolicy={"pauseAfterConsecutiveErrors": 3},
                                           retry={"maxAttempts": 2, "backoffSeconds": [600]}))
    erring = []
    for _ in range(3):  # one at a time: each errors once, the third pauses the endpoint
        data = submit(live, tenant, lead_body("HL1", "error,success"))
        wait_for(live, tenant, data["leadId"], lambda l: any(
            e["type"] == "delivery_error" for e in l["submissions"][-1]["journeyEvents"]))
        erring.append(data)
    item = endpoints_of(live, tenant)["ep"]
    assert item["state"] == "paused" and item["consecutiveErrors"] == 3
    assert item["pausedReason"].startswith("paused by its health policy after 3 errors in a row")
    assert item["last24h"] == {"delivered": 0, "failed": 0, "error": 3}
    assert item["lastErrorAt"] == "2026-03-10T15:00:00.000Z" and item["lastSuccessAt"] is None
    assert any("delivery endpoint ep paused" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    # The third lead waits for the endpoint although its retries are used up; so does a new lead.
    assert wait_for(live, tenant, erring[2]["leadId"], status_is("queued"))["submissions"][-1]["result"].endswith(
        "delivery endpoint ep is paused; the lead waits for it")
    fresh = submit(live, tenant, lead_body("HL1", "success"))
    wait_for(live, tenant, fresh["leadId"], status_is("queued"))
    clock.advance(seconds=601)  # the first two leads' retries come due, and wait too
    for data in erring[:2]:
        wait_for(live, tenant, data["leadId"], status_is("queued"))
    assert endpoints_of(live, tenant)["ep"]["waiting"] == 4
    assert all(jobs(runtime, d["submissionId"]) == ["paused"] for d in [*erring, fresh])

    resumed = post(live, tenant, "/api/v1/endpoints/ep/resume", {"reason": "buyer fixed their server"})
    assert (resumed["state"], resumed["pausedReason"], resumed["consecutiveErrors"], resumed["waiting"]) == \
        ("active", None, 0, 0)
    for data in [*erring, fresh]:
        lead = wait_for(live, tenant, data["leadId"], status_is("delivered"))
        assert lead["submissions"][-1]["journeyEvents"][-1]["details"]["deliveryEndpointId"] == "ep"
    assert endpoints_of(live, tenant)["ep"]["last24h"] == {"delivered": 4, "failed": 0, "error": 3}


def test_failures_in_a_row_pause_when_the_policy_says_so_and_duplicates_do_not_count(live, runtime):
    tenant = tenant_with(runtime, endpoint("ep", healthPolicy={"pauseAfterConsecutiveFailures": 2}))
    for script in ("failure", "duplicate", "failure"):
        data = submit(live, tenant, lead_body("HL1", script))
        wait_for(live, tenant, data["leadId"], status_is("failed"))
    assert endpoints_of(live, tenant)["ep"]["state"] == "active"  # the duplicate broke the run
    data = submit(live, tenant, lead_body("HL1", "failure"))
    wait_for(live, tenant, data["leadId"], status_is("failed"))
    item = endpoints_of(live, tenant)["ep"]
    assert (item["state"], item["consecutiveFailures"]) == ("paused", 2)
    assert "2 failures in a row" in item["pausedReason"]


def test_by_default_twenty_errors_pause_and_failures_never_do(live, runtime):
    tenant = tenant_with(runtime, endpoint("ep", retry={"maxAttempts": 1}))
    for _ in range(5):
        wait_for(live, tenant, submit(live, tenant, lead_body("HL1", "failure"))["leadId"], status_is("failed"))
    leads = [submit(live, tenant, lead_body("HL1", "error"))["leadId"] for _ in range(20)]
    for lead_id in leads[:19]:
        wait_for(live, tenant, lead_id, status_is("failed", "queued"))
    assert wait_until(lambda: endpoints_of(live, tenant)["ep"]["state"] == "paused", 15), endpoints_of(live, tenant)
    item = endpoints_of(live, tenant)["ep"]
    assert item["consecutiveErrors"] == 20 and item["last24h"] == {"delivered": 0, "failed": 5, "error": 20}


def test_a_pause_by_hand_holds_new_leads_and_a_resume_sends_them(live, runtime):
    tenant = tenant_with(runtime, endpoint("ep"), endpoint("other"))
    paused = post(live, tenant, "/api/v1/endpoints/ep/pause", {"reason": "invoice unpaid"})
    assert (paused["state"], paused["pausedReason"]) == ("paused", "invoice unpaid")
    assert samples(live.get("/metrics").text)[("appliance_endpoints_paused", ())] == 1  # an operator's alert
    again = post(live, tenant, "/api/v1/endpoints/ep/pause")  # no body: a pause of a paused endpoint changes nothing
    assert again["pausedReason"] == "invoice unpaid"
    assert endpoints_of(live, tenant)["other"]["state"] == "active"
    data = submit(live, tenant, lead_body("HL1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("queued"))
    assert lead["submissions"][-1]["journeyEvents"][-1]["type"] == "endpoint_paused"
    assert jobs(runtime, data["submissionId"]) == ["paused"]
    post(live, tenant, "/api/v1/endpoints/ep/resume", {})
    wait_for(live, tenant, data["leadId"], status_is("delivered"))
    assert samples(live.get("/metrics").text)[("appliance_endpoints_paused", ())] == 0


def test_a_distribution_skips_a_paused_endpoint_and_waits_when_all_are_paused(live, runtime):
    tenant = tenant_with(runtime, endpoint("a"), endpoint("b"), delivery={"distribution": {
        "method": "round_robin", "endpoints": [{"deliveryEndpointId": "a"}, {"deliveryEndpointId": "b"}]}})
    post(live, tenant, "/api/v1/endpoints/a/pause", {})
    for _ in range(2):
        data = submit(live, tenant, lead_body("HL1"))
        assert wait_for(live, tenant, data["leadId"], status_is("delivered"))["submissions"][-1][
            "responseFields"]["echo"] == "b"
    post(live, tenant, "/api/v1/endpoints/b/pause", {})
    data = submit(live, tenant, lead_body("HL1"))
    wait_for(live, tenant, data["leadId"], status_is("queued"))
    post(live, tenant, "/api/v1/endpoints/a/resume", {})
    assert wait_for(live, tenant, data["leadId"], status_is("delivered"))["submissions"][-1][
        "responseFields"]["echo"] == "a"


def test_pause_and_resume_are_sent_to_webhooks_signed(live, runtime):
    tenant = tenant_with(runtime, endpoint("ep", url="https://user:pw@buyer.example.com/in?apiKey=k1",
                                           healthPolicy={"pauseAfterConsecutiveErrors": 1},
                                           retry={"maxAttempts": 3, "backoffSeconds": [600]}))
    with BuyerServer() as receiver:
        receiver.route("/hooks", status=204)
        hook = post(live, tenant, "/api/v1/webhooks", {"url": receiver.url("/hooks"),
                                                      "events": ["endpoint.paused", "endpoint.resumed"]}, status=201)
        data = submit(live, tenant, lead_body("HL1", "error,success"))
        wait_for(live, tenant, data["leadId"], status_is("queued"))
        post(live, tenant, "/api/v1/endpoints/ep/resume", {})
        wait_for(live, tenant, data["leadId"], status_is("delivered"))
        assert wait_until(lambda: len(receiver.requests_to("/hooks")) >= 2, 10)
        events = [Verifier(hook["secret"]).verify(r.body, dict(r.headers)) for r in receiver.requests_to("/hooks")]
    assert [e["type"] for e in events] == ["endpoint.paused", "endpoint.resumed"]
    paused = events[0]["data"]
    assert (paused["deliveryEndpointId"], paused["state"], paused["host"]) == ("ep", "paused", "buyer.example.com")
    assert "after 1 error in a row" in paused["pausedReason"]
    assert events[1]["data"]["state"] == "active"
    assert "pw" not in str(events) and "k1" not in str(events)


def test_another_tenants_or_an_unknown_endpoint_is_not_found_and_nothing_changes(live, runtime):
    tenant = tenant_with(runtime, endpoint("ep"))
    other = tenant_with(runtime, endpoint("theirs"), name="Other")
    for path in ("/api/v1/endpoints/theirs/pause", "/api/v1/endpoints/theirs/resume", "/api/v1/endpoints/nope/pause"):
        assert post(live, tenant, path, {}, status=404)["code"] == "NOT_FOUND"
    assert endpoints_of(live, other)["theirs"]["state"] == "active"
    assert list(endpoints_of(live, tenant)) == ["ep"]


def test_a_bad_pause_body_is_refused_naming_the_field(live, runtime):
    tenant = tenant_with(runtime, endpoint("ep"))
    error = post(live, tenant, "/api/v1/endpoints/ep/pause", {"reason": "x" * 501}, status=400)
    assert error["code"] == "VALIDATION_ERROR" and error["details"][0].startswith("reason")
    error = post(live, tenant, "/api/v1/endpoints/ep/pause", {"why": "no"}, status=400)
    assert error["details"] == ["why: unknown field"]
    assert endpoints_of(live, tenant)["ep"]["state"] == "active"


def test_a_bad_health_policy_is_refused_at_import(cli, tmp_path):
    tenant_id = cli.json("tenant", "create", "T")["tenantId"]
    bundle = tmp_path / "b.json"
    bundle.write_text('{"deliveryEndpoints": [{"deliveryEndpointId": "ep", "url": "https://b.example.com/",'
                      ' "healthPolicy": {"pauseAfterConsecutiveErrors": -1}}]}')
    result = cli("import", "--tenant", tenant_id, str(bundle), expect=1)
    assert "deliveryEndpoints[0].healthPolicy.pauseAfterConsecutiveErrors: must be between 0" in result.stderr


def test_the_cli_lists_pauses_and_resumes_endpoints(cli, tmp_path):
    tenant_id = cli.json("tenant", "create", "T")["tenantId"]
    bundle = tmp_path / "b.json"
    bundle.write_text('{"deliveryEndpoints": [{"deliveryEndpointId": "ep", "url": "https://b.example.com/x"},'
                      ' {"deliveryEndpointId": "zz", "url": "https://z.example.com/"}]}')
    cli("import", "--tenant", tenant_id, str(bundle))
    listed = cli.json("endpoint", "list", "--tenant", tenant_id)
    assert [(i["deliveryEndpointId"], i["state"], i["host"]) for i in listed] == [
        ("ep", "active", "b.example.com"), ("zz", "active", "z.example.com")]
    paused = cli.json("endpoint", "pause", "--tenant", tenant_id, "ep", "--reason", "maintenance")
    assert (paused["state"], paused["pausedReason"]) == ("paused", "maintenance")
    text = cli("endpoint", "list", "--tenant", tenant_id).stdout
    assert "ep\tpaused\tb.example.com" in text and "(maintenance)" in text
    assert "resumed; 0 waiting deliveries released" in cli("endpoint", "resume", "--tenant", tenant_id, "ep").stdout
    assert "was not paused" in cli("endpoint", "resume", "--tenant", tenant_id, "ep").stdout
    result = cli("endpoint", "pause", "--tenant", tenant_id, "nope", expect=1)
    assert result.stderr.strip() == f"error: no delivery endpoint nope in tenant {tenant_id}"
    result = cli("endpoint", "list", "--tenant", "tnt_missing", expect=1)
    assert result.stderr.strip() == "error: tenant tnt_missing does not exist"


def test_a_resume_from_the_cli_reaches_a_running_server(cli, runtime, tmp_path):
    """The CLI works on the data folder while the server runs (both on the real clock here):
    the server takes the released deliveries on its next poll."""
    tenant = tenant_with(runtime, endpoint("ep"))
    with live_app(runtime, tmp_path) as client:
        post(client, tenant, "/api/v1/endpoints/ep/pause", {})
        data = submit(client, tenant, lead_body("HL1"))
        wait_for(client, tenant, data["leadId"], status_is("queued"))
        cli("endpoint", "resume", "--tenant", tenant.tenant_id, "ep")
        wait_for(client, tenant, data["leadId"], status_is("delivered"))


def test_answers_per_hour_are_kept_as_long_as_the_activity_log(live, runtime, clock):
    tenant = tenant_with(runtime, endpoint("ep"))
    wait_for(live, tenant, submit(live, tenant, lead_body("HL1"))["leadId"], status_is("delivered"))
    assert runtime.store.reader().endpoints.answers_since(tenant.tenant_id, "2026") == {"ep": (1, 0, 0)}
    clock.advance(days=runtime.config.storage.activity_log_days, hours=2)
    assert endpoints_of(live, tenant)["ep"]["last24h"] == {"delivered": 0, "failed": 0, "error": 0}
    asyncio.run(purge_old_activity(runtime))
    assert runtime.store.reader().endpoints.answers_since(tenant.tenant_id, "2026") == {}
    assert endpoints_of(live, tenant)["ep"]["lastSuccessAt"] == "2026-03-10T15:00:00.000Z"  # health stays


def distributed(runtime, *buyers: dict, **limits):
    return tenant_with(runtime, *buyers, delivery={"distribution": {
        "endpoints": [{"deliveryEndpointId": b["deliveryEndpointId"]} for b in buyers]}, **limits})


def echo(lead: dict) -> str:
    return lead["submissions"][-1]["responseFields"]["echo"]


def test_when_every_buyer_is_paused_the_first_resumed_takes_the_lead(live, runtime):
    tenant = distributed(runtime, endpoint("a"), endpoint("b"))
    for buyer_id in "ab":
        post(live, tenant, f"/api/v1/endpoints/{buyer_id}/pause", {})
    data = submit(live, tenant, lead_body("HL1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("queued"))
    assert "every delivery endpoint left for the lead is paused" in lead["submissions"][-1]["result"]
    post(live, tenant, "/api/v1/endpoints/b/resume", {})
    assert echo(wait_for(live, tenant, data["leadId"], status_is("delivered"))) == "b"


def test_a_buyer_paused_by_an_error_hands_the_lead_to_the_next_one(live, runtime):
    tenant = distributed(runtime, endpoint("a", healthPolicy={"pauseAfterConsecutiveErrors": 1},
                                           config={"answers": "error"}), endpoint("b"))
    data = submit(live, tenant, lead_body("HL1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered"))
    assert echo(lead) == "b"
    assert [(e["type"], e["details"]["deliveryEndpointId"]) for e in lead["submissions"][-1]["journeyEvents"]
            if e["type"] in ("delivery_error", "delivered")] == [("delivery_error", "a"), ("delivered", "b")]
    assert endpoints_of(live, tenant)["a"]["state"] == "paused"


def test_a_retry_whose_buyer_was_paused_meanwhile_goes_to_the_next_one(live, runtime, clock):
    tenant = distributed(runtime, endpoint("a", config={"answers": "error"}, retry={"maxAttempts": 3,
                                                                                  "backoffSeconds": [60]}),
                         endpoint("b"))
    data = submit(live, tenant, lead_body("HL1"))
    wait_for(live, tenant, data["leadId"], lambda l: l["submissions"][-1]["journeyEvents"][-1]["type"]
             == "delivery_error")
    post(live, tenant, "/api/v1/endpoints/a/pause", {})
    clock.advance(seconds=61)
    assert echo(wait_for(live, tenant, data["leadId"], status_is("delivered"))) == "b"


def test_an_import_lets_a_waiting_lead_go_where_its_campaign_now_sends(live, runtime):
    tenant = tenant_with(runtime, endpoint("x"), endpoint("y"))
    post(live, tenant, "/api/v1/endpoints/x/pause", {})
    data = submit(live, tenant, lead_body("HL1"))
    wait_for(live, tenant, data["leadId"], status_is("queued"))
    tenancy.import_bundle(runtime, tenant.tenant_id, json.dumps({"campaigns": [campaign(
        "HL1", "Health", delivery={"deliveryEndpointId": "y"})]}).encode(), "json")
    assert echo(wait_for(live, tenant, data["leadId"], status_is("delivered"))) == "y"


def test_redeliver_of_queued_leads_looks_again_at_a_waiting_one(live, runtime):
    tenant = tenant_with(runtime, endpoint("x"))
    post(live, tenant, "/api/v1/endpoints/x/pause", {})
    data = submit(live, tenant, lead_body("HL1"))
    wait_for(live, tenant, data["leadId"], status_is("queued"))
    answer = post(live, tenant, "/api/v1/leads/redeliver", {"status": "queued"})
    assert (answer["matched"], answer["reposted"]) == (1, 1)
    wait_for(live, tenant, data["leadId"], lambda l: jobs(runtime, data["submissionId"]) == ["paused"])  # parked again
    post(live, tenant, "/api/v1/endpoints/x/resume", {})
    wait_for(live, tenant, data["leadId"], status_is("delivered"))


def test_a_waiting_lead_holds_no_delivery_limit_slot(live, runtime):
    tenant = tenant_with(runtime, endpoint("x"), delivery={"deliveryEndpointId": "x", "deliveryLimits": [
        {"cap": 1, "type": "daily"}]})
    post(live, tenant, "/api/v1/endpoints/x/pause", {})
    first, second = (submit(live, tenant, lead_body("HL1")) for _ in range(2))
    for data in (first, second):
        wait_for(live, tenant, data["leadId"], status_is("queued"))
    counted = engine(runtime.store).reader().execute("SELECT coalesce(sum(count), 0) FROM cap_counters").fetchone()[0]
    assert counted == 0  # each took the slot, then gave it back when it was parked
    post(live, tenant, "/api/v1/endpoints/x/resume", {})
    wait_for(live, tenant, first["leadId"], status_is("delivered"))
    second_lead = wait_for(live, tenant, second["leadId"], lambda l: "limit" in l["submissions"][-1]["result"])
    assert second_lead["status"] == "queued"  # the limit of 1 holds
    assert "daily delivery limit of 1 reached" in second_lead["submissions"][-1]["result"]


def test_a_lead_changed_by_an_operator_while_it_waits_stays_as_they_left_it(live, runtime):
    tenant = tenant_with(runtime, endpoint("x"))
    post(live, tenant, "/api/v1/endpoints/x/pause", {})
    data = submit(live, tenant, lead_body("HL1"))
    wait_for(live, tenant, data["leadId"], status_is("queued"))
    response = live.patch(f"/api/v1/submissions/{data['submissionId']}", json={"status": "disqualified"},
                          headers=tenant.headers)
    assert response.status_code == 200, response.text
    assert jobs(runtime, data["submissionId"]) == ["cancelled"]
    post(live, tenant, "/api/v1/endpoints/x/resume", {})
    assert endpoints_of(live, tenant)["x"]["last24h"]["delivered"] == 0
    assert lead_of(live, tenant, data["leadId"])["status"] == "disqualified"
