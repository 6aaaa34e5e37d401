"""The audit log (CONTRACT 9.3): every change names its actor and is appended in the change's own
transaction, GET /api/v1/audit filters it, admins alone read it, no secret ever shows in it,
and the ticker purges it after `[retention] audit_days`."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from litestar.testing import TestClient

from appliance.runtime import Runtime
from appliance.services import tenancy
from tests.api_helpers import validation_error
from tests.bundles import campaign
from tests.conftest import Tenant, make_tenant
from tests.submit_support import FakeClock, clock  # noqa: F401 (the clock fixture)
from tests.worker_helpers import endpoint, lead_body, live_app, status_is, submit, wait_for

AUDIT = "/api/v1/audit"


def desk() -> dict:
    """DL1 sells through `ep` (a lead's script says what the buyer answers); HR1 holds for review."""
    return {"deliveryEndpoints": [endpoint("ep")], "campaigns": [
        campaign("DL1", "Sells", delivery={
            "deliveryEndpointId": "ep",
            "revenueMilestones": [{"leadStatus": "delivered", "amount": 10, "currency": "USD"}]}),
        campaign("HR1", "Held", delivery={"deliveryEndpointId": "ep"},
                 firstIntakeAction={"enabled": True, "action": "human_review", "humanReview": {"reason": "check"}}),
    ]}


@pytest.fixture
def tenant(runtime: Runtime, clock: FakeClock) -> Tenant:
    return make_tenant(runtime, "Audited", desk())


@pytest.fixture
def live(runtime: Runtime, clock: FakeClock, tmp_path: Path) -> Iterator[TestClient]:
    with live_app(runtime, tmp_path) as client:
        yield client


def listed(client: TestClient, who: Tenant | dict, query: str = "") -> dict:
    headers = who.headers if isinstance(who, Tenant) else who
    response = client.get(AUDIT + query, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def every(client: TestClient, who: Tenant | dict, query: str = "") -> list[dict]:
    """Every entry matching `query`, newest first, page by page."""
    found, cursor = [], None
    while True:
        page = listed(client, who, query + ("&" if query else "?") + "limit=100"
                      + (f"&cursor={cursor}" if cursor else ""))
        found += page["items"]
        if not page["hasMore"]:
            return found
        cursor = page["nextCursor"]


def one(client: TestClient, who: Tenant, action: str, target: str) -> dict:
    found = [e for e in every(client, who, f"?action={action}") if e["target"] == target]
    assert len(found) == 1, found
    return found[0]


def call(client: TestClient, who: Tenant, method: str, path: str, body: dict | None = None, expect: int = 200):
    response = client.request(method, path, headers=who.headers, **({"json": body} if body is not None else {}))
    assert response.status_code == expect, response.text
    return response


def held(client: TestClient, tenant: Tenant) -> str:
    data = submit(client, tenant, lead_body("HR1"))
    assert data["status"] == "pending_action"
    return data["leadId"]


# ---- what is recorded ----------------------------------------------------------------------------

def test_each_change_names_its_actor_target_address_and_request(live, tenant):
    actor = f"key:{tenant.key_id}"
    approved, rejected = held(live, tenant), held(live, tenant)
    answer = call(live, tenant, "POST", f"/api/v1/leads/{approved}/approve", {"status": "approved", "reason": "ok"})
    call(live, tenant, "POST", f"/api/v1/leads/{rejected}/approve", {"status": "rejected", "reason": "fake"})
    sold = submit(live, tenant, lead_body("DL1"))["leadId"]
    failed, failed_again = (submit(live, tenant, lead_body("DL1", "failure"))["leadId"] for _ in range(2))
    for lead_id, status in ((sold, "delivered"), (failed, "failed"), (failed_again, "failed")):
        wait_for(live, tenant, lead_id, status_is(status))
    call(live, tenant, "POST", f"/api/v1/leads/{sold}/return", {"reason": "wrong number"})
    call(live, tenant, "POST", f"/api/v1/leads/{failed}/repost", expect=201)
    assert call(live, tenant, "POST", "/api/v1/leads/redeliver",
                {"status": "failed", "leadIds": [failed_again]}).json()["data"]["reposted"] == 1
    call(live, tenant, "PATCH", f"/api/v1/leads/{sold}", {"notes": "called back"})
    submission = submit(live, tenant, lead_body("HR1"))["submissionId"]
    call(live, tenant, "PATCH", f"/api/v1/submissions/{submission}", {"result": "called the lead"})
    call(live, tenant, "POST", "/api/v1/endpoints/ep/pause", {"reason": "buyer asked"})
    call(live, tenant, "POST", "/api/v1/endpoints/ep/resume")
    call(live, tenant, "POST", "/api/v1/webhooks", {"url": "https://hooks.example.com/in", "webhookId": "h1",
                                                    "active": False}, expect=201)
    call(live, tenant, "PATCH", "/api/v1/webhooks/h1", {"description": "CRM"})
    call(live, tenant, "DELETE", "/api/v1/webhooks/h1")
    list_id = call(live, tenant, "POST", "/api/v1/suppression-lists", {"name": "Do not call"},
                   expect=201).json()["data"]["listId"]
    call(live, tenant, "POST", f"/api/v1/suppression-lists/{list_id}/entries",
         {"add": ["opted.out@example.com", "+1 415 555 0199"]})

    expected = [("lead.approve", approved), ("lead.reject", rejected), ("lead.return", sold),
                ("lead.repost", failed), ("lead.redeliver", failed_again), ("lead.update", sold),
                ("endpoint.pause", "ep"), ("endpoint.resume", "ep"), ("webhook.create", "h1"),
                ("webhook.update", "h1"), ("webhook.delete", "h1"), ("suppression.list_create", list_id),
                ("suppression.entries_change", list_id), ("submission.update", submission)]
    for action, target in expected:
        entry = one(live, tenant, action, target)
        assert (entry["actor"], entry["ip"]) == (actor, "testclient"), entry
        assert entry["auditId"].startswith("aud_") and entry["requestId"] and entry["at"].endswith("Z")

    approval = one(live, tenant, "lead.approve", approved)
    assert approval["requestId"] == answer.headers["x-request-id"]
    assert approval["before"] == {"status": "pending_action", "approval": "pending"}
    assert approval["after"] == {"status": "qualified", "approval": "approved", "reason": "ok"}
    assert one(live, tenant, "lead.return", sold)["before"] == {"status": "delivered"}
    assert one(live, tenant, "lead.update", sold)["after"] == {"notes": "called back"}
    patched = one(live, tenant, "submission.update", submission)
    assert (patched["before"], patched["after"]) == ({"result": None}, {"result": "called the lead"})
    assert one(live, tenant, "endpoint.pause", "ep")["after"] == {"state": "paused", "pausedReason": "buyer asked"}
    created = one(live, tenant, "webhook.create", "h1")["after"]
    assert created["url"] == "https://hooks.example.com/in" and created["secret"] == "********"
    updated = one(live, tenant, "webhook.update", "h1")
    assert (updated["before"]["description"], updated["after"]["description"]) == (None, "CRM")
    assert one(live, tenant, "suppression.entries_change", list_id)["after"] == {"added": 2, "removed": 0, "count": 2}
    text = json.dumps(every(live, tenant))
    assert "opted.out@example.com" not in text and "0199" not in text  # suppression values stay digests


def test_a_refused_change_leaves_no_entry(client, tenant):
    lead_id = held(client, tenant)
    call(client, tenant, "POST", f"/api/v1/leads/{lead_id}/approve", {"status": "approved"})
    call(client, tenant, "POST", f"/api/v1/leads/{lead_id}/approve", {"status": "rejected"}, expect=409)
    call(client, tenant, "POST", "/api/v1/leads/lead_01ARZ3NDEKTSV4RRFFQ69G5FAV/approve", {"status": "approved"},
         expect=404)
    call(client, tenant, "POST", "/api/v1/endpoints/nope/pause", expect=404)
    call(client, tenant, "POST", "/api/v1/endpoints/ep/resume")  # not paused: nothing changes
    actions = [e["action"] for e in every(client, tenant, f"?actor=key:{tenant.key_id}")]
    assert actions == ["lead.approve"]


def test_the_command_line_is_the_actor_of_its_changes(cli, runtime, client):
    tenant_id = cli.json("tenant", "create", "Ops")["tenantId"]
    admin = cli.json("key", "create", "--tenant", tenant_id, "--name", "ops")
    manager = cli.json("key", "create", "--tenant", tenant_id, "--name", "desk", "--role", "manager")
    cli("key", "revoke", manager["keyId"])
    headers = {"X-API-Key": admin["key"]}
    made = one_of(every(client, headers, "?action=key.create"), manager["keyId"])
    assert made["after"] == {"name": "desk", "kind": "tenant", "role": "manager", "sourceId": None,
                             "prefix": manager["prefix"]}
    revoked = one_of(every(client, headers, "?action=key.revoke"), manager["keyId"])
    for entry in (made, revoked):
        assert (entry["actor"], entry["ip"], entry["requestId"]) == ("cli", None, None)
    assert manager["key"] not in json.dumps(every(client, headers))


def one_of(entries: list[dict], target: str) -> dict:
    found = [e for e in entries if e["target"] == target]
    assert len(found) == 1, entries
    return found[0]


# ---- bundle imports: item by item, never a secret ------------------------------------------------

SECRETS = {
    "password": "Audit-Pa55word-7Q2X",
    "token": "audit-bearer-token-K9ZP",
    "header": "audit-header-key-M3VW",
    "userinfo": "audit-url-pass-R8TN",
    "query": "audit-query-token-H4JD",
    "webhook": "whsec_" + base64.b64encode(b"audit-webhook-secret-bytes-5FJQ").decode(),
    "sms": "audit-sms-token-B6LC",
    "smsKey": "audit-sms-key-T1GA",
    "pixel": "audit-pixel-token-W2YE",
    "source": "audit-source-key-0123456789-N7PU",
}


def secret_bundle(secrets: dict[str, str], name: str = "Accidents") -> dict:
    return {
        "deliveryEndpoints": [
            {"deliveryEndpointId": "basic", "url": "https://buyer.example.com/in",
             "auth": {"type": "basic", "username": "audit-user", "password": secrets["password"]}},
            {"deliveryEndpointId": "bearer",
             "url": f"https://someone:{secrets['userinfo']}@buyer.example.com/in?token={secrets['query']}&list=7",
             "headers": {"X-Api-Key": secrets["header"]}, "auth": {"type": "bearer", "token": secrets["token"]}},
        ],
        "sms": {"providers": [{"providerId": "tw", "type": "twilio", "accountSid": "AC123",
                               "authToken": secrets["sms"], "apiKey": secrets["smsKey"]}],
                "numbers": [{"number": "+14155552671", "campaignIds": ["AC1"]}], "defaultProviderId": "tw"},
        "pixels": [{"pixelId": "px", "platform": "social", "accessToken": secrets["pixel"]}],
        "webhooks": [{"webhookId": "crm", "url": "https://hooks.example.com/crm", "secret": secrets["webhook"],
                      "active": False}],
        "campaigns": [campaign("AC1", name, delivery={"deliveryEndpointId": "basic"},
                               ingestion={"sources": [{"sourceId": "web", "apiKey": secrets["source"]}]})],
    }


def test_a_bundle_import_is_recorded_item_by_item_and_never_shows_a_secret(cli, runtime, client, tmp_path):
    tenant_id = cli.json("tenant", "create", "Imports")["tenantId"]
    headers = {"X-API-Key": cli.json("key", "create", "--tenant", tenant_id)["key"]}
    file = tmp_path / "bundle.json"
    file.write_text(json.dumps(secret_bundle(SECRETS)))
    cli("import", "--tenant", tenant_id, str(file))
    first = every(client, headers)
    created = {(e["action"], e["target"]) for e in first}
    assert {("bundle.deliveryEndpoint.create", "basic"), ("bundle.deliveryEndpoint.create", "bearer"),
            ("bundle.campaign.create", "AC1"), ("bundle.sms.create", "sms"), ("bundle.pixel.create", "px"),
            ("bundle.webhook.create", "crm"), ("bundle.secret.create", "endpoint:basic:auth.password"),
            ("bundle.secret.create", "webhook:crm:secret")} <= created
    assert all(e["actor"] == "cli" for e in first)
    basic = one_of([e for e in first if e["action"] == "bundle.deliveryEndpoint.create"], "basic")
    assert basic["before"] is None and basic["after"]["auth"]["username"] == "audit-user"
    assert basic["after"]["auth"]["type"] == "basic" and basic["after"]["auth"].get("password") in (None, "********")

    # Again, with one campaign renamed and two credentials changed: only those are recorded.
    changed = {**SECRETS, "password": "Audit-Pa55word-NEW-8K", "webhook": "whsec_" + base64.b64encode(
        b"audit-webhook-secret-bytes-NEW9").decode()}
    file.write_text(json.dumps(secret_bundle(changed, name="Accidents West")))
    cli("import", "--tenant", tenant_id, str(file))
    now = every(client, headers)
    second = now[:len(now) - len(first)]  # newest first
    assert sorted((e["action"], e["target"]) for e in second) == [
        ("bundle.campaign.update", "AC1"), ("bundle.secret.update", "endpoint:basic:auth.password"),
        ("bundle.secret.update", "webhook:crm:secret")]
    renamed = one_of(second, "AC1")
    assert (renamed["before"]["name"], renamed["after"]["name"]) == ("Accidents", "Accidents West")

    shown = json.dumps(now)
    for value in [*SECRETS.values(), *changed.values()]:
        assert value not in shown, value


# ---- reading it ----------------------------------------------------------------------------------

def test_filters_by_actor_action_and_dates_and_pages_newest_first(client, runtime, tenant, clock):
    other_key = tenancy.create_key(runtime, tenant.tenant_id, name="second")
    second = {"X-API-Key": other_key.key}
    first_lead = held(client, tenant)
    call(client, tenant, "POST", f"/api/v1/leads/{first_lead}/approve", {"status": "approved"})
    clock.advance(days=2)
    client.post("/api/v1/endpoints/ep/pause", headers=second).raise_for_status()
    clock.advance(days=2)
    client.post("/api/v1/endpoints/ep/resume", headers=second).raise_for_status()

    mine = every(client, tenant, f"?actor=key:{tenant.key_id}")
    assert [e["action"] for e in mine] == ["lead.approve"]
    assert [e["action"] for e in every(client, tenant, f"?actor=key:{other_key.key_id}")] == [
        "endpoint.resume", "endpoint.pause"]
    assert every(client, tenant, "?actor=user:usr_nobody") == []
    assert [e["target"] for e in every(client, tenant, "?action=endpoint.pause")] == ["ep"]
    assert [e["action"] for e in every(client, tenant, "?startDate=2026-03-11")] == [
        "endpoint.resume", "endpoint.pause"]
    assert [e["action"] for e in every(client, tenant, "?startDate=2026-03-11&endDate=2026-03-12")] == [
        "endpoint.pause"]
    assert [e["action"] for e in every(client, tenant, "?startDate=2026-03-12T15:00:00.000Z&endDate=2026-03-14")] \
        == ["endpoint.resume", "endpoint.pause"]
    assert every(client, tenant, "?endDate=2026-03-09") == []

    everything = every(client, tenant)
    assert len(everything) > 3 and [e["at"] for e in everything] == sorted((e["at"] for e in everything), reverse=True)
    paged, cursor = [], None
    while True:
        page = listed(client, tenant, "?limit=2" + (f"&cursor={cursor}" if cursor else ""))
        assert len(page["items"]) <= 2
        paged += page["items"]
        if not page["hasMore"]:
            assert page["nextCursor"] is None
            break
        cursor = page["nextCursor"]
    assert paged == everything


@pytest.mark.parametrize(("query", "field"), [
    ("?actor=bob", "actor"),
    ("?actor=key:", "actor"),
    ("?action=DROP%20TABLE", "action"),
    ("?action=approve", "action"),
    ("?startDate=yesterday", "startDate"),
    ("?endDate=2026-13-01", "endDate"),
    ("?startDate=2026-03-10&endDate=2026-03-01", "endDate"),
    ("?cursor=aud_1", "cursor"),
    ("?limit=0", "limit"),
])
def test_a_bad_filter_is_a_validation_error_naming_it(client, tenant, query, field):
    validation_error(client.get(AUDIT + query, headers=tenant.headers), field)


def test_another_tenant_sees_none_of_it(client, tenant, other_tenant):
    lead_id = held(client, tenant)
    call(client, tenant, "POST", f"/api/v1/leads/{lead_id}/approve", {"status": "approved"})
    theirs = every(client, other_tenant)
    assert theirs and all(e["actor"] == "cli" for e in theirs)  # its own import and key only
    assert lead_id not in json.dumps(theirs)
    assert every(client, other_tenant, f"?actor=key:{tenant.key_id}") == []


def test_only_admins_and_owners_read_it(client, runtime, tenant):
    manager = tenancy.create_key(runtime, tenant.tenant_id, name="desk", role="manager")
    admin = tenancy.create_key(runtime, tenant.tenant_id, name="boss", role="admin")
    refused = client.get(AUDIT, headers={"X-API-Key": manager.key})
    assert refused.status_code == 403, refused.text
    error = refused.json()["error"]
    assert error["code"] == "FORBIDDEN" and any("admin" in d for d in error["details"]), error
    assert client.get(AUDIT, headers={"X-API-Key": admin.key}).status_code == 200


# ---- retention -----------------------------------------------------------------------------------

def test_entries_older_than_audit_days_are_purged_by_the_ticker(live, runtime, tenant, clock):
    lead_id = held(live, tenant)
    call(live, tenant, "POST", f"/api/v1/leads/{lead_id}/approve", {"status": "rejected"})
    assert runtime.config.retention.audit_days == 365
    clock.advance(days=365)
    call(live, tenant, "POST", "/api/v1/endpoints/ep/pause")  # a year on: kept
    clock.advance(days=1, seconds=1)  # the first entries are now more than 365 days old
    deadline = time.monotonic() + 15
    while any(e["action"] != "endpoint.pause" for e in every(live, tenant)):
        assert time.monotonic() < deadline, every(live, tenant)
        time.sleep(0.05)
    assert [e["action"] for e in every(live, tenant)] == ["endpoint.pause"]
