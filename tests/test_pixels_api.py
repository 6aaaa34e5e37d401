"""POST /api/v1/pixels/fire against fake Meta Conversions API and TikTok Events API servers on
loopback: request shapes, tokens, hashing, stable event ids, test event codes, refusals and
outages (HTTP 200, success false), test leads skipped, journey events, bad input, 404s."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bundles import standard_bundle
from tests.buyer_server import BuyerServer, Reply
from tests.conftest import Tenant, make_tenant

META_PATH = "/v99.0/{pixel}/events"
TIKTOK_PATH = "/open_api/v1.3/event/track/"
META_TOKEN, TIKTOK_TOKEN = "meta-secret-token-1", "tiktok-secret-token-2"
SECRETS = (META_TOKEN, TIKTOK_TOKEN, "pixel-secret-token-789")


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def fake() -> Iterator[BuyerServer]:
    with BuyerServer() as server:
        server.route(META_PATH.format(pixel="px-meta"), status=200,
                     body={"events_received": 1, "messages": [], "fbtrace_id": "AbC123"})
        server.route(TIKTOK_PATH, status=200, body={"code": 0, "message": "OK", "request_id": "req-1", "data": {}})
        yield server


@pytest.fixture
def config_file(tmp_path: Path, fake: BuyerServer, backend_toml: str) -> Path:
    path = tmp_path / "appliance.toml"
    path.write_text(
        f'[storage]\npath = "{tmp_path / "data"}"\n{backend_toml}[security]\nrate_limit_per_minute = 0\n'
        f'[plugins]\ndirs = []\n[plugins.meta_capi]\ntimeout_seconds = 1.5\n'
        f'[plugins.tiktok_events]\ntimeout_seconds = 1.5\n'
        f'[pixels.social]\nbase_url = "{fake.url("")}"\napi_version = "v99.0"\n'
        f'[pixels.video]\nbase_url = "{fake.url("")}"\n')
    return path


@pytest.fixture
def shop(runtime) -> Tenant:
    bundle = standard_bundle()
    bundle["pixels"] = [
        {"pixelId": "px-meta", "platform": "social", "accessToken": META_TOKEN},
        {"pixelId": "TT-CODE-1", "platform": "video", "accessToken": TIKTOK_TOKEN},
        {"pixelId": "px-no-token", "platform": "social"},
    ]
    return make_tenant(runtime, "Shop", bundle)


PERSON = {
    "firstName": "mary-ann", "lastName": "o'neil", "email": " Mary@Example.com", "phone": "(415) 555-2671",
    "dateOfBirth": "1985-07-04", "address": {"city": "San Francisco", "state": "California", "zip": "94105-1234"},
    "attribution": {"ipAddress": "203.0.113.7", "userAgent": "Mozilla/5.0 (iPhone)", "fbclid": "IwAR2abc",
                    "fbp": "fb.1.1700000000000.123", "ttclid": "E.C.P.xyz", "ttp": "ttp-cookie",
                    "captureUrl": "https://example.com/landing"},
}


def submit(client, tenant, campaign: str = "AC01", **extra) -> dict:
    response = client.post("/api/v1/leads/submit", headers=tenant.headers,
                           json={"campaignId": campaign, **PERSON, **extra})
    assert response.status_code == 201, response.text
    lead_id = response.json()["data"]["leadId"]
    return client.get(f"/api/v1/leads/{lead_id}", headers=tenant.headers).json()["data"]


def fire(client, tenant, body):
    return client.post("/api/v1/pixels/fire", headers=tenant.headers, json=body)


def fired(client, tenant, body) -> dict:
    response = fire(client, tenant, body)
    assert response.status_code == 200, response.text
    assert not any(secret in response.text for secret in SECRETS)
    return response.json()["data"]


def pixel_events(client, tenant, lead_id: str) -> list[dict]:
    text = client.get(f"/api/v1/leads/{lead_id}", headers=tenant.headers).text
    assert not any(secret in text for secret in SECRETS)
    lead = client.get(f"/api/v1/leads/{lead_id}", headers=tenant.headers).json()["data"]
    return [e for e in lead["submissions"][-1]["journeyEvents"] if e["type"] == "pixel_fire"]


def created_ms(lead: dict) -> int:
    from datetime import datetime
    return int(datetime.fromisoformat(lead["createdAt"].replace("Z", "+00:00")).timestamp() * 1000)


def test_meta_conversions_api_request(client, shop, fake):
    lead = submit(client, shop)
    before = int(time.time())
    data = fired(client, shop, {"leadId": lead["leadId"], "pixelId": "px-meta", "platform": "social",
                                "eventName": "Lead", "eventValue": 25.5, "currency": "USD",
                                "testEventCode": "TEST4242"})
    event_id = sha(f"{lead['leadId']}:Lead")
    assert data == {"success": True, "platform": "social", "eventName": "Lead", "pixelId": "px-meta",
                    "leadId": lead["leadId"], "eventId": event_id, "testEventCode": "TEST4242"}

    (request,) = fake.requests_to(META_PATH.format(pixel="px-meta"))
    assert request.method == "POST" and request.headers["content-type"] == "application/json"
    body = request.json()
    assert body["access_token"] == META_TOKEN and body["test_event_code"] == "TEST4242"
    (event,) = body["data"]
    assert before <= event["event_time"] <= int(time.time()) + 1
    assert (event["event_name"], event["event_id"], event["action_source"]) == ("Lead", event_id, "system_generated")
    assert event["event_source_url"] == "https://example.com/landing"
    assert event["custom_data"] == {"value": 25.5, "currency": "USD"}
    assert event["user_data"] == {
        "em": [sha("mary@example.com")], "ph": [sha("14155552671")], "fn": [sha("maryann")],
        "ln": [sha("oneil")], "db": [sha("19850704")], "ct": [sha("sanfrancisco")], "st": [sha("ca")],
        "zp": [sha("94105")], "country": [sha("us")], "external_id": [sha(lead["leadId"].lower())],
        "client_ip_address": "203.0.113.7", "client_user_agent": "Mozilla/5.0 (iPhone)",
        "fbc": f"fb.1.{created_ms(lead)}.IwAR2abc", "fbp": "fb.1.1700000000000.123",
    }

    (journey,) = pixel_events(client, shop, lead["leadId"])
    assert journey["reason"] is None
    assert journey["details"] == {
        "platform": "social", "pixelId": "px-meta", "eventName": "Lead", "eventId": event_id,
        "actionSource": "system_generated", "value": 25.5, "currency": "USD", "testEventCode": "TEST4242",
        "success": True, "response": {"statusCode": 200, "events_received": 1, "fbtrace_id": "AbC123",
                                      "messages": []}}


def test_event_id_is_stable_and_stored_fbc_wins(client, shop, fake):
    lead = submit(client, shop, attribution={**PERSON["attribution"], "fbc": "fb.1.1554763741205.Stored"})
    body = {"leadId": lead["leadId"], "pixelId": "px-meta", "platform": "social", "eventName": "Purchase",
            "actionSource": "website"}
    first, second = fired(client, shop, body), fired(client, shop, body)
    assert first["eventId"] == second["eventId"] == sha(f"{lead['leadId']}:Purchase")
    requests = fake.requests_to(META_PATH.format(pixel="px-meta"))
    assert [r.json()["data"][0]["event_id"] for r in requests] == [first["eventId"]] * 2
    event = requests[0].json()["data"][0]
    assert event["action_source"] == "website" and event["user_data"]["fbc"] == "fb.1.1554763741205.Stored"
    assert "custom_data" not in event and "test_event_code" not in requests[0].json()
    assert len(pixel_events(client, shop, lead["leadId"])) == 2


def test_tiktok_events_api_request(client, shop, fake):
    lead = submit(client, shop)
    data = fired(client, shop, {"leadId": lead["leadId"], "pixelId": "TT-CODE-1", "platform": "video",
                                "eventName": "CompleteRegistration", "eventValue": 10, "currency": "EUR",
                                "testEventCode": "TEST777"})
    assert data["success"] is True and data["platform"] == "video" and data["pixelId"] == "TT-CODE-1"
    (request,) = fake.requests_to(TIKTOK_PATH)
    assert request.headers["access-token"] == TIKTOK_TOKEN and request.headers["content-type"] == "application/json"
    body = request.json()
    assert (body["event_source"], body["event_source_id"], body["test_event_code"]) == ("web", "TT-CODE-1",
                                                                                        "TEST777")
    assert TIKTOK_TOKEN not in request.body.decode()
    (event,) = body["data"]
    assert (event["event"], event["event_id"]) == ("CompleteRegistration",
                                                   sha(f"{lead['leadId']}:CompleteRegistration"))
    assert isinstance(event["event_time"], int)
    assert event["user"] == {"email": sha("mary@example.com"), "phone": sha("+14155552671"),
                             "external_id": sha(lead["leadId"].lower()), "ttclid": "E.C.P.xyz", "ttp": "ttp-cookie",
                             "ip": "203.0.113.7", "user_agent": "Mozilla/5.0 (iPhone)"}
    assert event["properties"] == {"value": 10, "currency": "EUR"}
    assert event["page"] == {"url": "https://example.com/landing"}
    (journey,) = pixel_events(client, shop, lead["leadId"])
    assert journey["details"]["success"] is True and journey["details"]["response"] == {
        "statusCode": 200, "code": 0, "request_id": "req-1"}


def test_tiktok_refusal_is_code_not_zero(client, shop, fake):
    fake.route(TIKTOK_PATH, status=200, body={"code": 40001, "message": "Invalid access token", "request_id": "r2"})
    lead = submit(client, shop)
    data = fired(client, shop, {"leadId": lead["leadId"], "pixelId": "TT-CODE-1", "platform": "video",
                                "eventName": "SubmitForm"})
    assert data["success"] is False
    assert data["reason"] == "tiktok answered HTTP 200: Invalid access token (code 40001)"
    (journey,) = pixel_events(client, shop, lead["leadId"])
    assert journey["reason"] == data["reason"] and journey["details"]["success"] is False


def test_meta_refusal_is_200_with_the_platforms_reason(client, shop, fake):
    fake.route(META_PATH.format(pixel="px-meta"), status=400, body={"error": {
        "message": "Invalid parameter", "type": "OAuthException", "code": 100, "error_subcode": 2804003,
        "error_user_title": "Event Timestamp Too Old", "error_user_msg": "The timestamp is too old.",
        "fbtrace_id": "Tr4ce"}})
    lead = submit(client, shop)
    data = fired(client, shop, {"leadId": lead["leadId"], "pixelId": "px-meta", "platform": "social",
                                "eventName": "Lead"})
    assert data["success"] is False
    assert data["reason"] == ("meta answered HTTP 400: Invalid parameter - Event Timestamp Too Old"
                              " - The timestamp is too old. (code 100/2804003)")
    (journey,) = pixel_events(client, shop, lead["leadId"])
    assert journey["details"]["response"] == {"statusCode": 400, "fbtrace_id": "Tr4ce"}


@pytest.mark.parametrize("reply, reason", [
    (Reply(status=500, body="oops"), "meta answered HTTP 500: oops"),
    (Reply(status=200, delay=2, body={"events_received": 1}), "meta did not answer within 1.5 s"),
    (Reply(close=True), "meta closed the connection without a complete answer"),
    (Reply(status=200, body={"events_received": 0}), "meta answered HTTP 200: {\"events_received\": 0}"),
    (Reply(status=400, body={"error": {"message": f"bad token {META_TOKEN}"}}),
     "meta answered HTTP 400: bad token ***"),
])
def test_meta_outages_are_200_with_success_false(client, shop, fake, reply, reason):
    fake.route(META_PATH.format(pixel="px-meta"), reply)
    lead = submit(client, shop)
    data = fired(client, shop, {"leadId": lead["leadId"], "pixelId": "px-meta", "platform": "social",
                                "eventName": "Lead"})
    assert data["success"] is False and data["reason"] == reason
    assert pixel_events(client, shop, lead["leadId"])[0]["reason"] == reason


def test_pixel_without_a_token_is_not_sent(client, shop, fake):
    lead = submit(client, shop)
    data = fired(client, shop, {"leadId": lead["leadId"], "pixelId": "px-no-token", "platform": "social",
                                "eventName": "Lead"})
    assert data["success"] is False and data["reason"] == "meta: no access token configured for this pixel"
    assert fake.requests == []


def test_test_leads_are_not_fired(client, shop, fake):
    lead = submit(client, shop, isTest=True)
    data = fired(client, shop, {"leadId": lead["leadId"], "pixelId": "px-meta", "platform": "social",
                                "eventName": "Lead"})
    assert data == {"success": False, "skipped": "test_lead", "platform": "social", "eventName": "Lead",
                    "pixelId": "px-meta", "leadId": lead["leadId"], "eventId": sha(f"{lead['leadId']}:Lead")}
    assert fake.requests == []
    (journey,) = pixel_events(client, shop, lead["leadId"])
    assert journey["details"]["skipped"] == "test_lead" and journey["details"]["success"] is False


def test_every_bad_field_is_named(client, shop, fake):
    lead = submit(client, shop)
    base = {"leadId": lead["leadId"], "pixelId": "px-meta", "platform": "social", "eventName": "Lead"}
    cases = [
        ({"platform": "radio"}, "platform: must be one of social, video"),
        ({"platform": "video"}, "platform: pixel px-meta is a social pixel"),
        ({"eventName": ""}, "eventName: must not be empty"),
        ({"eventName": "x" * 101}, "eventName: must be at most 100 characters"),
        ({"eventValue": -1}, "eventValue: must be at least 0"),
        ({"eventValue": "12"}, "eventValue: expected float, got str"),
        ({"currency": "usd"}, "currency: must be a three-letter currency code in capitals, such as USD"),
        ({"currency": "DOLLARS"}, "currency: must be a three-letter currency code in capitals, such as USD"),
        ({"actionSource": "email"}, "actionSource: must be one of website, phone_call, chat, system_generated"),
        ({"testEventCode": ""}, "testEventCode: must not be empty"),
        ({"leadId": ""}, "leadId: must not be empty"),
        ({"pixelId": 5}, "pixelId: expected str, got int"),
        ({"userData": {}}, "userData: unknown field"),
    ]
    for change, detail in cases:
        response = fire(client, shop, {**base, **change})
        assert response.status_code == 400, (change, response.text)
        error = response.json()["error"]
        assert error["code"] == "VALIDATION_ERROR" and error["details"] == [detail], change
    for missing in ("leadId", "pixelId", "platform", "eventName"):
        body = dict(base)
        del body[missing]
        assert fire(client, shop, body).json()["error"]["details"] == [f"{missing}: required field missing"]
    for source in ("website", "phone_call", "chat", "system_generated"):
        assert fired(client, shop, {**base, "actionSource": source})["success"] is True
    assert [r.json()["data"][0]["action_source"] for r in fake.requests] == [
        "website", "phone_call", "chat", "system_generated"]


def test_unknown_or_other_tenants_lead_and_pixel_are_404(client, shop, other_tenant, fake):
    mine = submit(client, shop)
    theirs = submit(client, other_tenant, "OC01")
    for lead_id, pixel_id in ((theirs["leadId"], "px-meta"), ("lead_01JD0000000000000000000000", "px-meta"),
                              (mine["leadId"], "O-px"), (mine["leadId"], "nope")):
        response = fire(client, shop, {"leadId": lead_id, "pixelId": pixel_id, "platform": "social",
                                       "eventName": "Lead"})
        assert response.status_code == 404, response.text
        assert response.json()["error"] == {"code": "NOT_FOUND", "message": "Resource not found"}
    assert fake.requests == []
    assert client.post("/api/v1/pixels/fire", json={"leadId": mine["leadId"], "pixelId": "px-meta",
                                                    "platform": "social", "eventName": "Lead"}).status_code == 401
