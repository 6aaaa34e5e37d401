"""Webhooks: subscriptions through the API and the bundle, events written with the change that
caused them, signed so that the `standardwebhooks` package (not our code) accepts them, sent by
the job loop with retries, in order per lead, and every attempt readable through the API."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest
from litestar.testing import TestClient
from standardwebhooks.webhooks import Webhook as Verifier

from appliance.domain.webhooks import RETRY_SCHEDULE, lane_of
from appliance.jobs.ticker import purge_old_activity
from appliance.runtime import Runtime
from tests.api_helpers import samples
from tests.buyer_server import BuyerServer, wait_until
from tests.bundles import campaign
from tests.conftest import make_tenant
from tests.submit_support import FakeClock
from tests.worker_helpers import live_app, endpoint, lead_body, lead_of, status_is, submit, wait_for

START = datetime(2026, 3, 10, 15, 0, tzinfo=UTC)
BUNDLE = {"deliveryEndpoints": [endpoint()], "campaigns": [campaign("WH1", "Hooks", delivery={"deliveryEndpointId": "ep"})]}


@pytest.fixture
def config_file(config_file: Path) -> Path:
    with config_file.open("a") as f:  # the receiver is on loopback
        f.write("\n[delivery]\nallow_private_addresses = true\n")
    return config_file


@pytest.fixture
def receiver() -> Iterator[BuyerServer]:
    with BuyerServer() as server:
        server.route("/hooks", status=204)
        yield server


@pytest.fixture
def live(runtime: Runtime, tmp_path) -> Iterator[TestClient]:
    runtime.clock = FakeClock(START)
    with live_app(runtime, tmp_path) as client:
        yield client


def subscribe(client, tenant, url: str, status: int = 201, **fields) -> dict:
    response = client.post("/api/v1/webhooks", json={"url": url, **fields}, headers=tenant.headers)
    assert response.status_code == status, response.text
    return response.json()["data"] if status < 300 else response.json()["error"]


def received(receiver: BuyerServer, count: int, timeout: float = 10.0) -> list:
    assert wait_until(lambda: len(receiver.requests_to("/hooks")) >= count, timeout), \
        [r.json()["type"] for r in receiver.requests_to("/hooks")]
    return receiver.requests_to("/hooks")


def all_sent(runtime: Runtime) -> bool:
    """The outbox is empty: every event queued so far was sent or given up, its answer recorded.
    No send is on its way, so a receiver has all it will get until something else happens."""
    return runtime.store.reader().webhooks.backlog() == (0, 0)


def deliveries(client, tenant, webhook_id: str, query: str = "") -> list[dict]:
    response = client.get(f"/api/v1/webhooks/{webhook_id}/deliveries{query}", headers=tenant.headers)
    assert response.status_code == 200, response.text
    return response.json()["data"]["items"]


def test_events_are_signed_so_a_standard_webhooks_library_accepts_them(live, runtime, receiver):
    tenant = make_tenant(runtime, "T", BUNDLE)
    hook = subscribe(live, tenant, receiver.url("/hooks"))
    assert hook["secret"].startswith("whsec_") and hook["webhookId"].startswith("wh_")
    lead = submit(live, tenant, lead_body("WH1"))
    wait_for(live, tenant, lead["leadId"], status_is("delivered"))
    requests = received(receiver, 3)
    verifier = Verifier(hook["secret"])
    payloads = [verifier.verify(r.body, r.headers) for r in requests]
    assert [p["type"] for p in payloads] == ["lead.processed", "lead.qualified", "lead.delivered"]
    for payload, request in zip(payloads, requests):
        assert payload == json.loads(request.body)
        data = payload["data"]
        assert data["leadId"] == lead["leadId"] and data["submissionId"] == lead["submissionId"]
        assert "submissions" not in data and data["email"].endswith("@example.com")
        assert request.headers["content-type"] == "application/json"
    assert payloads[1]["data"]["status"] == "qualified" and payloads[1]["data"]["delivery"] is None
    assert payloads[2]["data"]["status"] == "delivered" and payloads[2]["data"]["delivery"]["success"] is True
    assert len({r.headers["webhook-id"] for r in requests}) == 3
    tampered = dict(requests[0].headers, **{"webhook-signature": "v1," + "A" * 44})
    with pytest.raises(Exception):
        verifier.verify(requests[0].body, tampered)
    # The sender records an attempt once the receiver has answered: the last one may still be on
    # its way when the receiver has seen all three.
    assert wait_until(lambda: len(deliveries(live, tenant, hook["webhookId"])) == 3, 10.0)
    attempts = deliveries(live, tenant, hook["webhookId"])
    assert [(a["type"], a["state"], a["statusCode"], a["attempt"]) for a in reversed(attempts)] == [
        ("lead.processed", "delivered", 204, 1), ("lead.qualified", "delivered", 204, 1),
        ("lead.delivered", "delivered", 204, 1)]
    assert {a["eventId"] for a in attempts} == {r.headers["webhook-id"] for r in requests}


def test_a_subscription_gets_only_the_events_it_names(live, runtime, receiver):
    tenant = make_tenant(runtime, "T", BUNDLE)
    subscribe(live, tenant, receiver.url("/hooks"), events=["lead.delivered", "lead.failed"])
    delivered = submit(live, tenant, lead_body("WH1"))
    failed = submit(live, tenant, lead_body("WH1", "failure"))
    wait_for(live, tenant, failed["leadId"], status_is("failed"))
    wait_for(live, tenant, delivered["leadId"], status_is("delivered"))
    types = sorted((r.json()["type"], r.json()["data"]["leadId"]) for r in received(receiver, 2))
    assert types == sorted([("lead.delivered", delivered["leadId"]), ("lead.failed", failed["leadId"])])
    assert wait_until(lambda: all_sent(runtime), 10)
    assert len(receiver.requests_to("/hooks")) == 2


def test_status_changes_by_hand_send_events_too(live, runtime, receiver):
    # Closed for delivery on the fake clock's Tuesday: the job loop leaves the lead to the operator.
    closed = {"deliverySchedule": {"specificDays": [{"day": "Monday", "startTime": "09:00", "endTime": "10:00"}]}}
    tenant = make_tenant(runtime, "T", {"campaigns": [campaign("NB1", "No buyer", delivery=closed)]})
    subscribe(live, tenant, receiver.url("/hooks"), events=["lead.disqualified", "lead.failed"])
    lead = submit(live, tenant, lead_body("NB1"))
    bulk = {"leadIds": [lead["leadId"]], "updates": {"status": "disqualified"}}
    assert live.patch("/api/v1/leads/bulk", json=bulk, headers=tenant.headers).status_code == 200
    assert live.patch(f"/api/v1/submissions/{lead['submissionId']}", json={"status": "failed"},
                      headers=tenant.headers).status_code == 200
    events = [(r.json()["type"], r.json()["data"]["status"]) for r in received(receiver, 2)]
    assert events == [("lead.disqualified", "disqualified"), ("lead.failed", "failed")]


def test_the_secret_is_shown_once_and_subscriptions_change_and_go(live, runtime, receiver):
    tenant = make_tenant(runtime, "T", BUNDLE)
    own_secret = "whsec_" + "QUJD" * 8
    hook = subscribe(live, tenant, receiver.url("/hooks"), webhookId="crm", secret=own_secret,
                     events=["lead.processed", "lead.processed"], description="our CRM")
    assert (hook["webhookId"], hook["secret"], hook["events"]) == ("crm", own_secret, ["lead.processed"])
    shown = live.get("/api/v1/webhooks/crm", headers=tenant.headers).json()["data"]
    listed = live.get("/api/v1/webhooks", headers=tenant.headers).json()["data"]
    assert "secret" not in shown and "secret" not in json.dumps(listed) and own_secret not in json.dumps(listed)
    assert [w["webhookId"] for w in listed["items"]] == ["crm"] and listed["hasMore"] is False

    changed = live.patch("/api/v1/webhooks/crm", json={"active": False}, headers=tenant.headers)
    assert changed.status_code == 200 and changed.json()["data"]["active"] is False
    submit(live, tenant, lead_body("WH1"))  # not sent, nor kept, for an inactive subscription
    new_secret = "whsec_" + "WFla" * 8
    live.patch("/api/v1/webhooks/crm", json={"active": True, "secret": new_secret}, headers=tenant.headers)
    lead = submit(live, tenant, lead_body("WH1"))
    received(receiver, 1)
    assert wait_until(lambda: all_sent(runtime), 10)
    (request,) = receiver.requests_to("/hooks")  # only the event of the lead submitted once active again
    assert Verifier(new_secret).verify(request.body, request.headers)["data"]["leadId"] == lead["leadId"]

    gone = live.delete("/api/v1/webhooks/crm", headers=tenant.headers)
    assert gone.status_code == 200 and gone.json()["data"]["deleted"] is True
    assert live.get("/api/v1/webhooks/crm", headers=tenant.headers).status_code == 404
    submit(live, tenant, lead_body("WH1"))
    assert wait_until(lambda: all_sent(runtime), 10)
    assert len(receiver.requests_to("/hooks")) == 1


def test_subscriptions_page(live, runtime):
    tenant = make_tenant(runtime, "T")
    for n in range(3):
        subscribe(live, tenant, f"https://hooks.example.com/{n}", webhookId=f"h{n}")
    first = live.get("/api/v1/webhooks?limit=2", headers=tenant.headers).json()["data"]
    assert [w["webhookId"] for w in first["items"]] == ["h0", "h1"] and first["nextCursor"] == "h1"
    rest = live.get(f"/api/v1/webhooks?limit=2&cursor={first['nextCursor']}", headers=tenant.headers).json()["data"]
    assert [w["webhookId"] for w in rest["items"]] == ["h2"] and rest["hasMore"] is False


@pytest.mark.parametrize(("body", "field"), [
    ({"url": "https://hooks.example.com/x", "events": ["lead.sold"]}, "events"),
    ({"url": "https://hooks.example.com/x", "events": []}, "events"),
    ({"events": ["*"]}, "url"),
    ({"url": "ftp://hooks.example.com/x"}, "url"),
    ({"url": "https://user:pw@hooks.example.com/x"}, "url"),
    ({"url": "https://hooks.example.com/x", "secret": "not-a-secret"}, "secret"),
    ({"url": "https://hooks.example.com/x", "secret": "whsec_c2hvcnQ="}, "secret"),
    ({"url": "https://hooks.example.com/x", "webhookId": "has space"}, "webhookId"),
    ({"url": "https://hooks.example.com/x", "colour": "red"}, "colour"),
    ({"url": "https://hooks.example.com/x", "active": "yes"}, "active"),
])
def test_bad_subscriptions_are_refused_naming_the_field(client, tenant, body, field):
    error = subscribe(client, tenant, "", status=400, **body) if "url" not in body else \
        subscribe(client, tenant, body.pop("url"), status=400, **body)
    assert error["code"] == "VALIDATION_ERROR" and any(d.startswith(field) for d in error["details"]), error
    assert client.get("/api/v1/webhooks", headers=tenant.headers).json()["data"]["items"] == []


def test_plain_http_and_private_receivers_need_the_private_addresses_setting(client, runtime, tenant):
    runtime.config = msgspec.structs.replace(
        runtime.config, delivery=msgspec.structs.replace(runtime.config.delivery, allow_private_addresses=False))
    for url in ("http://hooks.example.com/x", "https://10.0.0.7/x", "https://localhost/x", "https://[::1]/x"):
        error = subscribe(client, tenant, url, status=400)
        assert error["code"] == "VALIDATION_ERROR" and error["details"][0].startswith("url: "), error
    subscribe(client, tenant, "https://hooks.example.com/x")
    hook = client.get("/api/v1/webhooks", headers=tenant.headers).json()["data"]["items"][0]
    refused = client.patch(f"/api/v1/webhooks/{hook['webhookId']}", json={"url": "https://127.0.0.1/x"},
                           headers=tenant.headers)
    assert refused.status_code == 400 and refused.json()["error"]["details"][0].startswith("url: ")


def test_a_webhook_id_in_use_is_refused(client, tenant):
    subscribe(client, tenant, "https://hooks.example.com/x", webhookId="one")
    error = subscribe(client, tenant, "https://hooks.example.com/y", webhookId="one", status=400)
    assert error["details"] == ["webhookId: already in use by another subscription"]


def test_another_tenants_subscription_is_not_found(client, tenant, other_tenant):
    subscribe(client, tenant, "https://hooks.example.com/x", webhookId="mine")
    for method, path in (("GET", "/api/v1/webhooks/mine"), ("PATCH", "/api/v1/webhooks/mine"),
                         ("DELETE", "/api/v1/webhooks/mine"), ("GET", "/api/v1/webhooks/mine/deliveries")):
        response = client.request(method, path, headers=other_tenant.headers,
                                  json={"active": False} if method == "PATCH" else None)
        assert response.status_code == 404, (method, path, response.text)
    assert client.get("/api/v1/webhooks", headers=other_tenant.headers).json()["data"]["items"] == []
    assert client.get("/api/v1/webhooks/mine", headers=tenant.headers).json()["data"]["active"] is True


def test_a_receiver_down_for_an_hour_gets_every_event_afterwards_in_order_per_lead(live, runtime, receiver):
    receiver.route("/hooks", status=503)
    tenant = make_tenant(runtime, "T", BUNDLE)
    hook = subscribe(live, tenant, receiver.url("/hooks"))
    leads = [submit(live, tenant, lead_body("WH1"))["leadId"] for _ in range(6)]
    for lead_id in leads:
        wait_for(live, tenant, lead_id, status_is("delivered"))
    clock: FakeClock = runtime.clock

    def newest_attempts() -> dict[str, dict]:
        newest: dict[str, dict] = {}
        for attempt in deliveries(live, tenant, hook["webhookId"], "?limit=100"):  # newest first
            newest.setdefault(attempt["eventId"], attempt)
        return newest

    def heads_recorded() -> bool:
        # The receiver answers before the sender records the attempt: the next step is read only
        # once every lane's head has a recorded attempt since the clock last moved.
        newest = newest_attempts()
        return len(newest) == len({lane_of(lead_id) for lead_id in leads}) and all(
            a["nextAttemptAt"] and datetime.fromisoformat(a["nextAttemptAt"]) > clock.now() for a in newest.values())

    assert wait_until(heads_recorded, 15)
    down_for = 0.0
    while down_for < 3700:  # each lane's head is tried on the schedule, the rest of its lane waits
        waits = newest_attempts().values()
        step = (max(datetime.fromisoformat(a["nextAttemptAt"]) for a in waits) - clock.now()).total_seconds() + 1
        clock.advance(seconds=step)
        down_for += step
        assert wait_until(heads_recorded, 15)
    heads_tried = len(receiver.requests_to("/hooks"))
    assert heads_tried < 6 * 3 * 7  # not every event on every try: only lane heads
    backlog = samples(live.get("/metrics").text)
    waiting = {labels: n for (name, labels), n in backlog.items() if name == "appliance_webhook_backlog"}
    assert sum(waiting.values()) == 18 and waiting[(("state", "retrying"),)] > 0

    receiver.requests.clear()
    receiver.route("/hooks", status=200)
    clock.advance(hours=3)
    got = received(receiver, 18, timeout=15)
    assert len({r.headers["webhook-id"] for r in got}) == 18
    by_lead: dict[str, list[str]] = {}
    for request in got:
        body = request.json()
        by_lead.setdefault(body["data"]["leadId"], []).append(body["type"])
    assert by_lead == {lead_id: ["lead.processed", "lead.qualified", "lead.delivered"] for lead_id in leads}
    attempts = deliveries(live, tenant, hook["webhookId"], "?limit=100")
    assert {a["state"] for a in attempts} == {"retrying", "delivered"}
    assert all(a["statusCode"] == 503 and a["error"] == "answered 503" and a["nextAttemptAt"]
               for a in attempts if a["state"] == "retrying")


def test_an_event_is_given_up_after_its_last_retry(live, runtime, receiver):
    receiver.route("/hooks", status=410)
    tenant = make_tenant(runtime, "T", {"campaigns": [campaign("NB1", "No buyer")]})
    hook = subscribe(live, tenant, receiver.url("/hooks"), events=["lead.processed"])
    submit(live, tenant, lead_body("NB1"))
    clock: FakeClock = runtime.clock
    tries = len(RETRY_SCHEDULE) + 1
    waited = 0.0

    def latest_attempt() -> list[int]:
        return [a["attempt"] for a in deliveries(live, tenant, hook["webhookId"])[:1]]

    for n in range(1, tries + 1):
        assert wait_until(lambda: len(receiver.requests_to("/hooks")) >= n, 10), n
        # The receiver answers before the sender records the attempt: the step is read from
        # attempt n's own record, not from the one before it.
        assert wait_until(lambda: latest_attempt() == [n], 10), n
        if n < tries:
            step = (datetime.fromisoformat(deliveries(live, tenant, hook["webhookId"])[0]["nextAttemptAt"])
                    - clock.now()).total_seconds()
            waited += step
            clock.advance(seconds=step)
    assert wait_until(lambda: all_sent(runtime), 10)  # given up: no retry left waiting
    assert len(receiver.requests_to("/hooks")) == tries
    assert 36 * 3600 <= waited <= 48 * 3600  # a day and a half of trying
    attempts = deliveries(live, tenant, hook["webhookId"], "?limit=100")
    assert attempts[0]["state"] == "failed" and attempts[0]["attempt"] == tries and attempts[0]["nextAttemptAt"] is None
    assert [a["state"] for a in attempts[1:]] == ["retrying"] * (tries - 1)


def test_deliveries_page(live, runtime, receiver):
    tenant = make_tenant(runtime, "T", {"campaigns": [campaign("NB1", "No buyer")]})
    hook = subscribe(live, tenant, receiver.url("/hooks"), events=["lead.processed"])
    for _ in range(3):
        submit(live, tenant, lead_body("NB1"))
    received(receiver, 3)
    assert wait_until(lambda: len(deliveries(live, tenant, hook["webhookId"])) == 3, 10)  # recorded after the answer
    first = live.get(f"/api/v1/webhooks/{hook['webhookId']}/deliveries?limit=2", headers=tenant.headers).json()["data"]
    assert len(first["items"]) == 2 and first["hasMore"] is True
    rest = live.get(f"/api/v1/webhooks/{hook['webhookId']}/deliveries?limit=2&cursor={first['nextCursor']}",
                    headers=tenant.headers).json()["data"]
    assert len(rest["items"]) == 1 and rest["hasMore"] is False
    bad = live.get(f"/api/v1/webhooks/{hook['webhookId']}/deliveries?limit=abc", headers=tenant.headers)
    assert bad.status_code == 400 and bad.json()["error"]["details"][0].startswith("limit")
    runtime.clock.advance(days=runtime.config.storage.activity_log_days + 1)  # kept as long as the activity log
    asyncio.run(purge_old_activity(runtime))
    assert deliveries(live, tenant, hook["webhookId"]) == []


def test_webhooks_in_a_bundle_are_sealed_and_kept_across_an_export_and_import(cli, tmp_path, receiver):
    tenant_id = cli.json("tenant", "create", "Bundled")["tenantId"]
    given = "whsec_" + base64.b64encode(b"k" * 24).decode()
    bundle = {"webhooks": [{"webhookId": "given", "url": receiver.url("/hooks"), "secret": given},
                           {"webhookId": "made", "url": receiver.url("/hooks"), "events": ["lead.delivered"]}]}
    (tmp_path / "b.json").write_text(json.dumps(bundle))
    result = cli.json("import", "--tenant", tenant_id, str(tmp_path / "b.json"))
    assert result["imported"]["webhooks"] == 2 and list(result["webhookSecrets"]) == ["made"]
    assert result["webhookSecrets"]["made"].startswith("whsec_")
    exported = cli("export", "--tenant", tenant_id).stdout
    assert given not in exported and result["webhookSecrets"]["made"] not in exported
    (tmp_path / "again.json").write_text(exported)
    again = cli.json("import", "--tenant", tenant_id, str(tmp_path / "again.json"))
    assert "webhookSecrets" not in again  # the stored secrets are kept
    hooks = {w["webhookId"]: w for w in json.loads(exported)["webhooks"]}
    assert hooks["made"]["events"] == ["lead.delivered"] and hooks["made"].get("secret") is None


def test_bundle_webhooks_are_checked(cli, tmp_path):
    tenant_id = cli.json("tenant", "create", "Bundled")["tenantId"]
    bundle = {"webhooks": [{"webhookId": "a", "url": "https://hooks.example.com/a", "events": ["lead.nope"]},
                           {"webhookId": "a", "url": "http://hooks.example.com/b"}]}
    (tmp_path / "b.json").write_text(json.dumps(bundle))
    result = cli("import", "--tenant", tenant_id, str(tmp_path / "b.json"), expect=1)
    assert "webhooks[0].events: unknown event 'lead.nope'" in result.output


def test_a_return_sends_lead_returned(live, runtime, receiver):
    tenant = make_tenant(runtime, "T", BUNDLE)
    subscribe(live, tenant, receiver.url("/hooks"), events=["lead.returned"])
    lead = submit(live, tenant, lead_body("WH1"))
    wait_for(live, tenant, lead["leadId"], status_is("delivered"))
    answer = live.post(f"/api/v1/leads/{lead['leadId']}/return", json={"reason": "bad phone"}, headers=tenant.headers)
    assert answer.status_code == 200, answer.text
    (request,) = received(receiver, 1)
    body = request.json()
    assert (body["type"], body["data"]["leadId"], body["data"]["status"]) == ("lead.returned", lead["leadId"],
                                                                                "returned")


def test_a_receiver_name_that_resolves_to_a_private_address_is_refused_at_send(live, runtime, receiver, monkeypatch):
    from appliance.adapters import netguard
    from tests.http_helpers import fake_dns

    runtime.config = msgspec.structs.replace(
        runtime.config, delivery=msgspec.structs.replace(runtime.config.delivery, allow_private_addresses=False))
    netguard.forget_resolutions()
    fake_dns(monkeypatch, ["127.0.0.1"])  # a public-looking name pointing inside (DNS rebinding)
    tenant = make_tenant(runtime, "T", {"campaigns": [campaign("NB1", "No buyer")]})
    hook = subscribe(live, tenant, f"https://hooks.example.com:{receiver.port}/hooks", events=["lead.processed"])
    submit(live, tenant, lead_body("NB1"))
    assert wait_until(lambda: deliveries(live, tenant, hook["webhookId"]) != [], 10)
    (attempt,) = deliveries(live, tenant, hook["webhookId"])
    assert attempt["state"] == "retrying" and attempt["statusCode"] is None
    assert attempt["error"].startswith("destination refused: hooks.example.com resolves to a loopback address")
    assert receiver.requests_to("/hooks") == []
    netguard.forget_resolutions()


def test_a_patch_with_an_unknown_event_is_refused(client, tenant):
    subscribe(client, tenant, "https://hooks.example.com/x", webhookId="one")
    refused = client.patch("/api/v1/webhooks/one", json={"events": ["lead.sold"]}, headers=tenant.headers)
    assert refused.status_code == 400 and refused.json()["error"]["details"][0].startswith("events: unknown event")
    assert client.get("/api/v1/webhooks/one", headers=tenant.headers).json()["data"]["events"] == ["*"]


def test_deleting_a_subscription_while_its_event_is_in_flight_touches_no_other_event(live, runtime, receiver):
    receiver.route("/slow", delay=1.0)
    tenant = make_tenant(runtime, "T", {"campaigns": [campaign("NB1", "No buyer")]})
    slow = subscribe(live, tenant, receiver.url("/slow"), events=["lead.processed"])
    submit(live, tenant, lead_body("NB1"))
    assert wait_until(lambda: len(receiver.requests_to("/slow")) == 1, 5)  # in flight now
    gone = live.delete(f"/api/v1/webhooks/{slow['webhookId']}", headers=tenant.headers)
    assert gone.status_code == 200 and gone.json()["data"]["droppedEvents"] == 1
    subscribe(live, tenant, receiver.url("/hooks"), events=["lead.processed"])
    lead = submit(live, tenant, lead_body("NB1"))
    # The deleted subscription's send ends without a trace (its event was dropped: nothing is
    # recorded), so there is nothing to await but the receiver's 1 s delay; then the one left.
    time.sleep(1.5)
    assert wait_until(lambda: all_sent(runtime), 10)
    (request,) = receiver.requests_to("/hooks")
    assert request.json()["data"]["leadId"] == lead["leadId"]
    assert live.get(f"/api/v1/webhooks/{slow['webhookId']}/deliveries", headers=tenant.headers).status_code == 404


def test_a_new_url_or_a_pause_counts_for_events_already_queued(live, runtime, receiver):
    receiver.route("/old", status=503)
    tenant = make_tenant(runtime, "T", {"campaigns": [campaign("NB1", "No buyer")]})
    hook = subscribe(live, tenant, receiver.url("/old"), events=["lead.processed"])
    leads = [submit(live, tenant, lead_body("NB1"))["leadId"] for _ in range(3)]
    # Every lane's head tried at the old URL and recorded, waiting for its retry (leads may share a lane).
    heads = len({lane_of(lead_id) for lead_id in leads})
    assert wait_until(lambda: len(deliveries(live, tenant, hook["webhookId"])) == heads, 10)
    patch = {"url": receiver.url("/hooks"), "active": False}
    assert live.patch(f"/api/v1/webhooks/{hook['webhookId']}", json=patch, headers=tenant.headers).status_code == 200
    runtime.clock.advance(hours=1)
    # A witness: another subscription's event, sent once the paused ones are due too (the sender
    # looks at every lane's head in each pass); a pause not kept would have sent them by then.
    receiver.route("/witness", status=204)
    witness = subscribe(live, tenant, receiver.url("/witness"), events=["lead.processed"])
    submit(live, tenant, lead_body("NB1"))  # an inactive subscription gets no new events
    assert wait_until(lambda: [a["state"] for a in deliveries(live, tenant, witness["webhookId"])] == ["delivered"], 10)
    assert receiver.requests_to("/hooks") == []  # paused: the queued events wait
    assert live.patch(f"/api/v1/webhooks/{hook['webhookId']}", json={"active": True},
                      headers=tenant.headers).status_code == 200
    got = received(receiver, 3)
    assert sorted(r.json()["data"]["leadId"] for r in got) == sorted(leads)  # to the new URL, none lost


def test_a_slow_receiver_does_not_hold_up_another_tenants_events(live, runtime, receiver):
    receiver.route("/slow", delay=2.0)
    busy = make_tenant(runtime, "Busy", {"campaigns": [campaign("NB1", "No buyer")]})
    quiet = make_tenant(runtime, "Quiet", {"campaigns": [campaign("NB1", "No buyer")]})
    subscribe(live, busy, receiver.url("/slow"), events=["lead.processed"])
    subscribe(live, quiet, receiver.url("/hooks"), events=["lead.processed"])
    for _ in range(40):
        submit(live, busy, lead_body("NB1"))
    assert wait_until(lambda: len(receiver.requests_to("/slow")) >= 4, 10)
    started = time.monotonic()
    lead = submit(live, quiet, lead_body("NB1"))
    (request,) = received(receiver, 1, timeout=5)
    assert request.json()["data"]["leadId"] == lead["leadId"] and time.monotonic() - started < 1.5


def test_a_lead_queued_again_sends_lead_queued_once(live, runtime, receiver):
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint()], "campaigns": [campaign(
        "DL1", "Capped", delivery={"deliveryEndpointId": "ep", "deliveryLimits": [{"cap": 1, "type": "daily"}],
                                   "deliverySchedule": {"timezone": "UTC"}})]})
    subscribe(live, tenant, receiver.url("/hooks"), events=["lead.queued", "lead.delivered"])
    first = submit(live, tenant, lead_body("DL1"))
    wait_for(live, tenant, first["leadId"], status_is("delivered"))
    waiting = [submit(live, tenant, lead_body("DL1"))["leadId"] for _ in range(2)]
    for lead_id in waiting:
        wait_for(live, tenant, lead_id, status_is("queued"))
    runtime.clock.set(datetime(2026, 3, 11, 0, 0, 1, tzinfo=UTC))  # one slot again: one goes, one queues again
    assert wait_until(lambda: any(lead_of(live, tenant, lead_id)["status"] == "delivered" for lead_id in waiting), 10)
    received(receiver, 4)
    still_queued = next(lead_id for lead_id in waiting if lead_of(live, tenant, lead_id)["status"] == "queued")
    # Queued again on the new day (its second `queued` step): an event for that would be queued with it.
    assert wait_until(lambda: [e["type"] for e in lead_of(live, tenant, still_queued)["submissions"][-1]
                               ["journeyEvents"]].count("queued") == 2, 10)
    assert wait_until(lambda: all_sent(runtime), 10)
    events = [(r.json()["type"], r.json()["data"]["leadId"]) for r in receiver.requests_to("/hooks")]
    assert sorted(e for e in events if e[0] == "lead.queued") == sorted(("lead.queued", i) for i in waiting)
    assert len(events) == 4  # first delivered, two queued, one delivered: nothing for the lead queued again
