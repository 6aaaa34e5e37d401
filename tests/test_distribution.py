"""Several buyers per campaign (delivery.distribution), end to end: leads submitted over HTTP,
the job loop choosing the endpoint (priority waterfall, round robin, weighted rotation kept
across a restart), each endpoint's filter, limits and pause, and every attempt its own journey
record naming its endpoint. Endpoints answer through the scripted adapter of the plugin folder:
an endpoint's `config.answers` speaks for every lead sent to it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import msgspec
import pytest
from litestar.testing import TestClient

from appliance.domain.campaign import Distribution
from appliance.domain.distribution import rotate
from appliance.runtime import Runtime
from appliance.services import tenancy
from tests.bundles import campaign
from tests.conftest import make_tenant
from tests.submit_support import FakeClock, clock  # noqa: F401 (the clock fixture)
from tests.worker_helpers import endpoint, lead_body, live_app, status_is, submit, wait_for


@pytest.fixture
def live(runtime: Runtime, clock: FakeClock, tmp_path) -> Iterator[TestClient]:
    with live_app(runtime, tmp_path) as client:
        yield client


def buyer(endpoint_id: str, answers: str = "success", **extra) -> dict:
    return endpoint(endpoint_id, config={"answers": answers}, **extra)


def tenant_with(runtime, buyers: list[dict], distribution: dict, **delivery):
    return make_tenant(runtime, "T", {"deliveryEndpoints": buyers, "campaigns": [campaign(
        "DS1", "Distributed", delivery={"distribution": distribution, **delivery})]})


def attempts(lead: dict) -> list[tuple[str, str]]:
    """(event type, deliveryEndpointId) of each delivery attempt in the latest submission."""
    return [(e["type"], e["details"]["deliveryEndpointId"]) for e in lead["submissions"][-1]["journeyEvents"]
            if (e.get("details") or {}).get("deliveryEndpointId") and e["type"] != "repost"]


def delivered_to(lead: dict) -> str:
    return lead["submissions"][-1]["responseFields"]["echo"]


def test_priority_waterfall_moves_past_a_refusal_and_a_duplicate(live, runtime):
    tenant = tenant_with(runtime, [buyer("a", "failure"), buyer("b", "duplicate"), buyer("c")], {
        "method": "priority", "endpoints": [{"deliveryEndpointId": "c", "priority": 3},
                                            {"deliveryEndpointId": "a", "priority": 1},
                                            {"deliveryEndpointId": "b", "priority": 2}]},
        revenueMilestones=[{"leadStatus": "delivered", "amount": 25}])
    data = submit(live, tenant, lead_body("DS1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered"))
    assert attempts(lead) == [("delivery_failure", "a"), ("delivery_duplicate", "b"), ("delivered", "c")]
    assert delivered_to(lead) == "c"
    jobs = runtime.store.reader().jobs.jobs_of(data["submissionId"])
    assert [state for _, state, _ in jobs] == ["done", "done", "done"]  # each attempt its own job
    ledger = live.get(f"/api/v1/ledger?leadId={data['leadId']}", headers=tenant.headers).json()["data"]["items"]
    assert [(e["kind"], e["deliveryEndpointId"]) for e in ledger] == [("revenue", "c")]


def test_the_lead_fails_when_every_endpoint_refused_it(live, runtime):
    tenant = tenant_with(runtime, [buyer("a", "failure"), buyer("b", "duplicate")], {
        "endpoints": [{"deliveryEndpointId": "a"}, {"deliveryEndpointId": "b"}]})
    data = submit(live, tenant, lead_body("DS1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("failed"))
    assert attempts(lead) == [("delivery_failure", "a"), ("delivery_duplicate", "b")]
    assert lead["submissions"][-1]["result"] == "duplicate"  # the last answer decides


def test_errors_are_retried_on_the_same_endpoint_then_the_lead_moves_on(live, runtime, clock):
    tenant = tenant_with(runtime, [buyer("a", "error", retry={"maxAttempts": 2, "backoffSeconds": [30]}),
                                   buyer("b")], {"endpoints": [{"deliveryEndpointId": "a"},
                                                               {"deliveryEndpointId": "b"}]})
    data = submit(live, tenant, lead_body("DS1"))
    wait_for(live, tenant, data["leadId"], lambda l: attempts(l) == [("delivery_error", "a")])
    clock.advance(seconds=31)
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered"))
    assert attempts(lead) == [("delivery_error", "a"), ("delivery_error", "a"), ("delivered", "b")]


def test_round_robin_takes_turns(live, runtime):
    tenant = tenant_with(runtime, [buyer("a"), buyer("b"), buyer("c")], {
        "method": "round_robin", "endpoints": [{"deliveryEndpointId": x} for x in "abc"]})
    chosen = []
    for _ in range(6):  # one at a time: the order of the turns is the order of the leads
        data = submit(live, tenant, lead_body("DS1"))
        chosen.append(delivered_to(wait_for(live, tenant, data["leadId"], status_is("delivered"))))
    assert chosen == ["a", "b", "c", "a", "b", "c"]


def test_weighted_shares_are_exact_across_a_restart(runtime, clock, tmp_path):
    tenant = tenant_with(runtime, [buyer("a"), buyer("b"), buyer("c")], {
        "method": "weighted", "endpoints": [{"deliveryEndpointId": "a", "weight": 5},
                                            {"deliveryEndpointId": "b", "weight": 3},
                                            {"deliveryEndpointId": "c", "weight": 2}]})
    leads = []
    for half in range(2):  # the second half runs in a new app: the rotation state is stored
        with live_app(runtime, tmp_path) as client:
            batch = [submit(client, tenant, lead_body("DS1"))["leadId"] for _ in range(25 if half == 0 else 35)]
            leads += [delivered_to(wait_for(client, tenant, lead_id, status_is("delivered"))) for lead_id in batch]
    assert Counter(leads) == {"a": 30, "b": 18, "c": 12}


def test_weights_hold_within_two_percent_over_ten_thousand_leads():
    distribution = msgspec.convert({"method": "weighted", "endpoints": [
        {"deliveryEndpointId": "a", "weight": 0.7}, {"deliveryEndpointId": "b", "weight": 0.2},
        {"deliveryEndpointId": "c", "weight": 0.1}]}, Distribution)
    running: dict[str, float] = {}
    counts: Counter[str] = Counter()
    for _ in range(10_000):
        chosen, running = rotate(distribution, ["a", "b", "c"], msgspec.json.decode(msgspec.json.encode(running)))
        counts[chosen] += 1
    for eid, share in (("a", 0.7), ("b", 0.2), ("c", 0.1)):
        assert abs(counts[eid] / 10_000 - share) < 0.02 * share, counts
    assert counts == {"a": 7000, "b": 2000, "c": 1000}  # smooth rotation: exact to the lead


def test_an_endpoints_filter_skips_leads_it_does_not_want(live, runtime):
    tenant = tenant_with(runtime, [buyer("ca_only"), buyer("anyone")], {"endpoints": [
        {"deliveryEndpointId": "ca_only", "conditions": {"subRules": [{"conditions": [
            {"field": "address.state", "operator": "equals", "value": ["CA"]}]}]}},
        {"deliveryEndpointId": "anyone"}]})
    texan = submit(live, tenant, lead_body("DS1", address={"state": "TX"}))
    californian = submit(live, tenant, lead_body("DS1", address={"state": "CA"}))
    assert delivered_to(wait_for(live, tenant, texan["leadId"], status_is("delivered"))) == "anyone"
    assert delivered_to(wait_for(live, tenant, californian["leadId"], status_is("delivered"))) == "ca_only"


def test_an_endpoints_own_limit_moves_leads_on_then_queues_them(live, runtime, clock):
    tenant = tenant_with(runtime, [buyer("a"), buyer("b")], {"endpoints": [
        {"deliveryEndpointId": "a", "deliveryLimits": [{"cap": 1, "type": "daily"}]},
        {"deliveryEndpointId": "b", "deliveryLimits": [{"cap": 1, "type": "daily"}]}]})
    # One after the other: leads delivered at once take the room in whichever order their units
    # commit (on PostgreSQL, in parallel).
    first = submit(live, tenant, lead_body("DS1"))
    assert delivered_to(wait_for(live, tenant, first["leadId"], status_is("delivered"))) == "a"
    second = submit(live, tenant, lead_body("DS1"))
    assert delivered_to(wait_for(live, tenant, second["leadId"], status_is("delivered"))) == "b"
    third = submit(live, tenant, lead_body("DS1"))
    queued = wait_for(live, tenant, third["leadId"], status_is("queued"))
    assert "daily delivery limit of 1 reached" in queued["submissions"][-1]["result"]
    clock.advance(days=1)
    assert delivered_to(wait_for(live, tenant, third["leadId"], status_is("delivered"))) == "a"


def test_an_inactive_endpoint_gets_nothing(live, runtime):
    tenant = tenant_with(runtime, [buyer("a"), buyer("b")], {"method": "round_robin", "endpoints": [
        {"deliveryEndpointId": "a", "active": False}, {"deliveryEndpointId": "b"}]})
    for _ in range(3):
        data = submit(live, tenant, lead_body("DS1"))
        assert delivered_to(wait_for(live, tenant, data["leadId"], status_is("delivered"))) == "b"


def test_a_repost_naming_an_endpoint_goes_there_alone(live, runtime):
    tenant = tenant_with(runtime, [buyer("a", "failure"), buyer("b", "failure"), buyer("c", "failure")], {
        "endpoints": [{"deliveryEndpointId": "a"}, {"deliveryEndpointId": "b"}]})
    data = submit(live, tenant, lead_body("DS1"))
    wait_for(live, tenant, data["leadId"], status_is("failed"))
    response = live.post(f"/api/v1/leads/{data['leadId']}/repost", headers=tenant.headers,
                         json={"deliveryInfo": {"deliveryEndpointId": "c"}})
    assert response.status_code == 201, response.text
    lead = wait_for(live, tenant, data["leadId"], lambda l: l["status"] == "failed" and len(l["submissions"]) == 2)
    assert attempts(lead) == [("delivery_failure", "c")]  # no waterfall past a named endpoint


def test_a_stop_mid_send_resends_to_the_same_endpoint_only(runtime, clock, tmp_path):
    """The choice is kept on the job before the call: an attempt cut off by a stop (or a crash)
    runs again to the same buyer, and the rotation does not move on for it."""
    tenant = tenant_with(runtime, [buyer("a", "sleep:30"), buyer("b")], {
        "method": "round_robin", "endpoints": [{"deliveryEndpointId": "a"}, {"deliveryEndpointId": "b"}]})
    with live_app(runtime, tmp_path) as client:
        client.app_state.worker.grace_seconds = 0.1
        data = submit(client, tenant, lead_body("DS1"))
        wait_for(client, tenant, data["leadId"],
                 lambda l: runtime.store.reader().jobs.jobs_of(data["submissionId"])[0][1] == "running")
    (kind, state, _), = runtime.store.reader().jobs.jobs_of(data["submissionId"])
    assert state == "running"  # cut off: requeued at the next start
    rotation = runtime.store.reader().endpoints.rotation(tenant.tenant_id, "DS1")
    quick = {"deliveryEndpoints": [buyer("a"), buyer("b")], "campaigns": [campaign("DS1", "Distributed", delivery={
        "distribution": {"method": "round_robin", "endpoints": [{"deliveryEndpointId": "a"},
                                                                 {"deliveryEndpointId": "b"}]}})]}
    tenancy.import_bundle(runtime, tenant.tenant_id, msgspec.json.encode(quick), "json")  # "a" answers at once now
    with live_app(runtime, tmp_path) as client:
        lead = wait_for(client, tenant, data["leadId"], status_is("delivered"))
        assert attempts(lead) == [("delivered", "a")]
        assert runtime.store.reader().endpoints.rotation(tenant.tenant_id, "DS1") == rotation
        assert delivered_to(wait_for(client, tenant, submit(client, tenant, lead_body("DS1"))["leadId"],
                                     status_is("delivered"))) == "b"  # the rotation's next turn


def test_a_return_counts_against_the_buyer_that_took_the_lead(live, runtime):
    tenant = tenant_with(runtime, [buyer("a", "failure"), buyer("b"), buyer("strict", returnWindowDays=0)], {
        "endpoints": [{"deliveryEndpointId": "a"}, {"deliveryEndpointId": "b"}]},
        revenueMilestones=[{"leadStatus": "delivered", "amount": 25}])
    data = submit(live, tenant, lead_body("DS1"))
    wait_for(live, tenant, data["leadId"], status_is("delivered"))
    response = live.post(f"/api/v1/leads/{data['leadId']}/return", json={"reason": "bad number"},
                         headers=tenant.headers)
    assert response.status_code == 200, response.text
    assert (response.json()["data"]["entry"]["deliveryEndpointId"], response.json()["data"]["entry"]["amount"]) == \
        ("b", -25)


def test_the_rotation_follows_the_distribution_as_it_changes():
    def convert(endpoints: list[dict]) -> Distribution:
        return msgspec.convert({"method": "weighted", "endpoints": endpoints}, Distribution)

    two = convert([{"deliveryEndpointId": "a", "weight": 2}, {"deliveryEndpointId": "b", "weight": 1}])
    running: dict[str, float] = {}
    picks = []
    for _ in range(3):
        chosen, running = rotate(two, ["a", "b"], running)
        picks.append(chosen)
    assert sorted(picks) == ["a", "a", "b"]
    # b closed (full, paused or off hours) for a turn: it keeps its running weight, a takes the turn
    kept = running["b"]
    chosen, running = rotate(two, ["a"], running)
    assert (chosen, running["b"]) == ("a", kept)
    # b removed and c added: b's weight is dropped, c starts from nothing and gets its share
    three = convert([{"deliveryEndpointId": "a", "weight": 1}, {"deliveryEndpointId": "c", "weight": 1}])
    counts: Counter[str] = Counter()
    for _ in range(100):
        chosen, running = rotate(three, ["a", "c"], running)
        counts[chosen] += 1
    assert "b" not in running and abs(counts["a"] - counts["c"]) <= 2
