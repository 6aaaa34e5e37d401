"""POST /api/v1/sms/send against fake Twilio and Telnyx servers on loopback: request shapes and
auth, sender / provider / conversation resolution for every branch, segments, provider 4xx, 5xx,
timeouts and unreachable hosts (502 with the message stored), every bad field, 404s."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import msgspec
import pytest
from litestar.testing import TestClient

from appliance.app import create_app
from appliance.config import load_config
from appliance.domain.sms_rules import count_segments, is_e164, sender_problem
from appliance.runtime import Runtime, create_runtime
from tests.bundles import campaign
from tests.buyer_server import BuyerServer, Reply, free_port
from tests.conftest import Tenant, make_tenant
from tests.engine import engine

TWILIO_PATH = "/2010-04-01/Accounts/{sid}/Messages.json"
TELNYX_PATH = "/v2/messages"
SECRETS = ("sms-secret-token-456", "tenant-telnyx-key-1", "install-token-000", "install-telnyx-key")


def twilio_ok(sid: str = "SM0001") -> Reply:
    return Reply(status=201, body={"sid": sid, "status": "queued", "to": "+14155550000"})


def telnyx_ok(message_id: str = "tx-msg-1") -> Reply:
    return Reply(status=200, body={"data": {"id": message_id, "to": [{"phone_number": "+1", "status": "queued"}]}})


@pytest.fixture
def fake() -> Iterator[BuyerServer]:
    with BuyerServer() as server:
        server.route(TWILIO_PATH.format(sid="AC123"), twilio_ok())
        server.route(TWILIO_PATH.format(sid="ACINSTALL"), twilio_ok("SMINSTALL"))
        server.route(TELNYX_PATH, telnyx_ok())
        yield server


def config_text(tmp_path: Path, base: str, extra: str = "", backend: str = "") -> str:
    return (f'[storage]\npath = "{tmp_path / "data"}"\n{backend}[security]\nrate_limit_per_minute = 0\n'
            f'[plugins]\ndirs = []\n[plugins.twilio]\ntimeout_seconds = 1.5\n[plugins.telnyx]\ntimeout_seconds = 1.5\n'
            f'[sms.twilio]\nbase_url = "{base}"\naccount_sid = "ACINSTALL"\nauth_token = "install-token-000"\n'
            f'[sms.telnyx]\nbase_url = "{base}"\napi_key = "install-telnyx-key"\n{extra}')


@pytest.fixture
def config_file(tmp_path: Path, fake: BuyerServer, backend_toml: str) -> Path:
    path = tmp_path / "appliance.toml"
    path.write_text(config_text(tmp_path, fake.url(""), backend=backend_toml))
    return path


def submit(client, tenant, campaign_id: str = "AC01", n: int = 2671, **extra) -> str:
    response = client.post("/api/v1/leads/submit", headers=tenant.headers, json={
        "campaignId": campaign_id, "firstName": "Jan", "lastName": "Doe", "email": f"jan{n}@example.com",
        "phone": f"(415) 555-{n:04d}", **extra})
    assert response.status_code == 201, response.text
    return response.json()["data"]["leadId"]


def send(client, tenant, body):
    return client.post("/api/v1/sms/send", headers=tenant.headers, json=body)


def sent(client, tenant, body) -> dict:
    response = send(client, tenant, body)
    assert response.status_code == 201, response.text
    assert not any(secret in response.text for secret in SECRETS)
    return response.json()["data"]


def details_of(response, code: str = "VALIDATION_ERROR", status: int = 400) -> list[str]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    assert not any(secret in response.text for secret in SECRETS)
    return error.get("details") or []


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# ---- the standard tenant: Twilio provider "tw" (default), +14155552671 assigned to AC01 ----------

def test_send_through_twilio(client, tenant, fake, runtime):
    lead_id = submit(client, tenant)
    data = sent(client, tenant, {"leadId": lead_id, "message": "Hi Jan, thanks for reaching out."})
    assert data["messageId"].startswith("msg_") and data["interactionId"].startswith("int_")
    assert data["status"] == "sent" and data["leadId"] == lead_id
    assert (data["from"], data["to"]) == ("+14155552671", "+14155552671")  # lead phone normalized to E.164
    assert (data["provider"], data["providerId"], data["providerMessageId"]) == ("twilio", "tw", "SM0001")
    assert (data["segments"], data["encoding"]) == (1, "GSM-7")

    (request,) = fake.requests_to(TWILIO_PATH.format(sid="AC123"))
    assert request.method == "POST"
    assert request.headers["content-type"] == "application/x-www-form-urlencoded"
    assert request.headers["authorization"] == basic("AC123", "sms-secret-token-456")
    assert request.form() == {"To": "+14155552671", "From": "+14155552671", "Body": "Hi Jan, thanks for reaching out."}

    stored = runtime.store.reader().messages.get_message(tenant.tenant_id, data["messageId"])
    assert (stored.status, stored.provider_status, stored.segments, stored.encoding) == ("sent", "queued", 1, "GSM-7")
    assert stored.provider_message_id == "SM0001" and stored.interaction_id == data["interactionId"]


def test_conversations(client, tenant, fake, runtime):
    lead_id = submit(client, tenant)
    other_lead = submit(client, tenant, n=2672)
    first = sent(client, tenant, {"leadId": lead_id, "message": "one"})
    # no interactionId: the open conversation of this lead and sender
    second = sent(client, tenant, {"leadId": lead_id, "message": "two"})
    assert second["interactionId"] == first["interactionId"]
    # interactionId: appended to it
    third = sent(client, tenant, {"leadId": lead_id, "message": "three", "interactionId": first["interactionId"]})
    assert third["interactionId"] == first["interactionId"]
    # another sender opens another conversation
    other_sender = sent(client, tenant, {"leadId": lead_id, "message": "four", "from": "+14155550199"})
    assert other_sender["interactionId"] != first["interactionId"] and other_sender["from"] == "+14155550199"
    # another lead has its own conversation
    theirs = sent(client, tenant, {"leadId": other_lead, "message": "hello"})
    assert theirs["interactionId"] not in (first["interactionId"], other_sender["interactionId"])

    tx = runtime.store.reader()
    messages = tx.messages.messages_of(tenant.tenant_id, first["interactionId"])
    assert [m.body for m in messages] == ["one", "two", "three"]
    assert tx.messages.get_conversation(tenant.tenant_id, first["interactionId"]).message_count == 3

    assert details_of(send(client, tenant, {"leadId": lead_id, "message": "x", "interactionId": "int_nope"})) == \
        ["interactionId: unknown conversation"]
    assert details_of(send(client, tenant, {"leadId": other_lead, "message": "x",
                                            "interactionId": first["interactionId"]})) == \
        ["interactionId: the conversation belongs to another lead"]


def test_segments_are_counted_and_stored(client, tenant, runtime):
    lead_id = submit(client, tenant)
    long_gsm = sent(client, tenant, {"leadId": lead_id, "message": "a" * 161})
    assert (long_gsm["segments"], long_gsm["encoding"]) == (2, "GSM-7")
    emoji = sent(client, tenant, {"leadId": lead_id, "message": "Thanks 👍"})
    assert (emoji["segments"], emoji["encoding"]) == (1, "UCS-2")
    longest = sent(client, tenant, {"leadId": lead_id, "message": "€" * 1600})
    assert (longest["segments"], longest["encoding"]) == (22, "GSM-7")  # 76 two-septet characters per segment
    stored = runtime.store.reader().messages.get_message(tenant.tenant_id, longest["messageId"])
    assert (stored.segments, len(stored.body)) == (22, 1600)


@pytest.mark.parametrize("text, encoding, segments, units", [
    ("", "GSM-7", 0, 0),
    ("a" * 160, "GSM-7", 1, 160),
    ("a" * 161, "GSM-7", 2, 161),
    ("a" * 306, "GSM-7", 2, 306),
    ("a" * 307, "GSM-7", 3, 307),
    ("{" * 80, "GSM-7", 1, 160),                # extension characters cost two septets
    ("{" * 81, "GSM-7", 2, 162),                # 76 per segment: an escape pair is never split
    ("a" + "{" * 76 + "b" * 77, "GSM-7", 2, 230),
    ("a" * 152 + "{" + "a" * 152, "GSM-7", 3, 306),  # the pair moves to the next segment: 3, not 306 / 153
    ("Ünïcödé ñ àç", "UCS-2", 1, 12),           # ï, ö, é and ç are not in GSM-7
    ("Ä" * 200, "GSM-7", 2, 200),               # ä, ö, ñ, ü, à are
    ("ж" * 70, "UCS-2", 1, 70),
    ("ж" * 71, "UCS-2", 2, 71),
    ("ж" * 134, "UCS-2", 2, 134),
    ("ж" * 135, "UCS-2", 3, 135),
    ("😀" * 35, "UCS-2", 1, 70),                # astral characters are two UTF-16 units
    ("😀" * 36, "UCS-2", 2, 72),                # 33 per segment: a surrogate pair is never split
    ("😀" * 67, "UCS-2", 3, 134),
])
def test_segment_counting(text, encoding, segments, units):
    found = count_segments(text)
    assert (found.encoding, found.count, found.units) == (encoding, segments, units)


def test_e164_and_sender_rules():
    assert is_e164("+14155552671") and is_e164("+442071838750")
    for bad in ("14155552671", "+1 415 555 2671", "+1-415-555-2671", "(415) 555-2671", "+1415555267", "+", ""):
        assert not is_e164(bad), bad
    for good in ("+14155552671", "12345", "ACME Law", "Acme1"):
        assert sender_problem(good) is None, good
    for bad in ("12", "123456789", "Acme Law Firm LLC", "acme!", "4155552671xy", "1234 5"):
        assert sender_problem(bad) is not None, bad


# ---- resolution branches -------------------------------------------------------------------------

RESOLUTION = {
    "sms": {
        "providers": [
            {"providerId": "tw", "type": "twilio", "accountSid": "AC123", "authToken": "sms-secret-token-456"},
            {"providerId": "tx", "type": "telnyx", "apiKey": "tenant-telnyx-key-1"},
            {"providerId": "tw-install", "type": "twilio"},  # no credentials of its own
        ],
        "numbers": [
            {"number": "+14155550101", "smsCapable": False, "campaignIds": ["RS4"]},
            {"number": "+14155550103", "smsCapable": False},
            {"number": "+14155550104"},
            {"number": "+14155550102", "campaignIds": ["RS1"]},
            {"number": "+14155550105", "campaignIds": ["RS1"]},
        ],
        "agents": [{"agentId": "agent-a", "number": "+14155550201"},
                   {"agentId": "agent-off", "number": "+14155550103"}],
        "defaultProviderId": "tw",
        "campaignProviders": {"RS2": "tx", "RS5": "tw-install"},
    },
    "campaigns": [
        campaign("RS1", "Assigned number", campaignAiAgents={"rep": {"agentId": "agent-a"}}),
        campaign("RS2", "Agent number", campaignAiAgents={"rep": {"agentId": "agent-a"}}),
        campaign("RS3", "First capable"),
        campaign("RS4", "Assigned but not capable", campaignAiAgents={"rep": {"agentId": "agent-off"}}),
        campaign("RS5", "Install credentials"),
    ],
}


@pytest.fixture
def resolving(runtime) -> Tenant:
    return make_tenant(runtime, "Resolution", RESOLUTION)


@pytest.mark.parametrize("campaign_id, sender", [
    ("RS1", "+14155550102"),   # 1. the campaign's assigned (SMS-capable) number, the first one listed
    ("RS2", "+14155550201"),   # 2. no assigned number: the SMS agent's number
    ("RS3", "+14155550104"),   # 3. neither: the first SMS-capable number
    ("RS4", "+14155550104"),   # assigned number and agent number not SMS-capable: skipped
])
def test_sender_resolution(client, resolving, campaign_id, sender):
    lead_id = submit(client, resolving, campaign_id)
    assert sent(client, resolving, {"leadId": lead_id, "message": "hi"})["from"] == sender


def test_campaign_id_overrides_the_leads_campaign_and_from_overrides_all(client, resolving, fake):
    lead_id = submit(client, resolving, "RS3")
    assert sent(client, resolving, {"leadId": lead_id, "message": "hi", "campaignId": "RS1"})["from"] == "+14155550102"
    data = sent(client, resolving, {"leadId": lead_id, "message": "hi", "campaignId": "RS2", "from": "ACME"})
    assert data["from"] == "ACME" and data["provider"] == "telnyx"  # from: sender only; provider still by campaign
    assert fake.requests_to(TELNYX_PATH)[-1].json()["from"] == "ACME"


def test_provider_resolution(client, resolving, fake):
    # campaign override -> Telnyx with the tenant's key
    data = sent(client, resolving, {"leadId": submit(client, resolving, "RS2"), "message": "via telnyx"})
    assert (data["provider"], data["providerId"], data["providerMessageId"]) == ("telnyx", "tx", "tx-msg-1")
    (request,) = fake.requests_to(TELNYX_PATH)
    assert request.method == "POST" and request.headers["content-type"] == "application/json"
    assert request.headers["authorization"] == "Bearer tenant-telnyx-key-1"
    assert request.json() == {"from": "+14155550201", "to": "+14155552671", "text": "via telnyx"}
    # no override -> the tenant default
    data = sent(client, resolving, {"leadId": submit(client, resolving, "RS1", n=2672), "message": "x"})
    assert (data["provider"], data["providerId"]) == ("twilio", "tw")
    assert fake.requests_to(TWILIO_PATH.format(sid="AC123"))[-1].headers["authorization"] == \
        basic("AC123", "sms-secret-token-456")
    # a tenant provider without credentials uses the install-wide ones
    data = sent(client, resolving, {"leadId": submit(client, resolving, "RS5", n=2673), "message": "x"})
    assert (data["provider"], data["providerId"], data["providerMessageId"]) == ("twilio", "tw-install", "SMINSTALL")
    assert fake.requests_to(TWILIO_PATH.format(sid="ACINSTALL"))[-1].headers["authorization"] == \
        basic("ACINSTALL", "install-token-000")


def test_builtin_default_provider(client, runtime, fake):
    bundle = {"sms": {"numbers": [{"number": "+14155550104"}]}, "campaigns": [campaign("BL1", "Builtin")]}
    tenant = make_tenant(runtime, "No providers", bundle)
    data = sent(client, tenant, {"leadId": submit(client, tenant, "BL1"), "message": "x"})
    assert (data["provider"], data["providerId"]) == ("twilio", None)
    (request,) = fake.requests_to(TWILIO_PATH.format(sid="ACINSTALL"))
    assert request.headers["authorization"] == basic("ACINSTALL", "install-token-000")


def test_builtin_default_provider_from_config(tmp_path, fake, backend_toml):
    path = tmp_path / "telnyx.toml"
    path.write_text(config_text(tmp_path, fake.url(""), '[sms]\ndefault_provider = "telnyx"\n', backend_toml))
    runtime = create_runtime(load_config(path))
    try:
        bundle = {"sms": {"numbers": [{"number": "+14155550104"}]}, "campaigns": [campaign("BL1", "Builtin")]}
        tenant = make_tenant(runtime, "Telnyx default", bundle)
        with TestClient(create_app(runtime, background=False), raise_server_exceptions=False) as client:
            data = sent(client, tenant, {"leadId": submit(client, tenant, "BL1"), "message": "x"})
        assert (data["provider"], data["providerId"]) == ("telnyx", None)
        assert fake.requests_to(TELNYX_PATH)[-1].headers["authorization"] == "Bearer install-telnyx-key"
    finally:
        runtime.close()


def test_no_sender_or_no_phone(client, runtime):
    tenant = make_tenant(runtime, "No numbers", {"campaigns": [campaign("NO1", "No numbers")]})
    lead_id = submit(client, tenant, "NO1")
    assert details_of(send(client, tenant, {"leadId": lead_id, "message": "x"})) == \
        ["from: required: no SMS-capable number is configured for this tenant or campaign"]
    assert sent(client, tenant, {"leadId": lead_id, "message": "x", "from": "+14155550104"})["provider"] == "twilio"


# ---- provider failures: 502 with the provider's reason, message stored either way -----------------

def stored_status(runtime, tenant, response) -> tuple[str, str]:
    details = details_of(response, "PROVIDER_ERROR", 502)
    assert response.json()["error"]["message"] == "The provider refused or could not be reached"
    message_id = details[1].split()[1]
    stored = runtime.store.reader().messages.get_message(tenant.tenant_id, message_id)
    return stored.status, details[0]


def test_provider_refusal_4xx(client, tenant, fake, runtime):
    fake.route(TWILIO_PATH.format(sid="AC123"), status=400, body={
        "code": 21211, "message": "The 'To' number +14155552671 is not a valid phone number.",
        "more_info": "https://www.twilio.com/docs/errors/21211", "status": 400})
    response = send(client, tenant, {"leadId": submit(client, tenant), "message": "x"})
    status, reason = stored_status(runtime, tenant, response)
    assert status == "failed"
    assert reason == "twilio answered HTTP 400: The 'To' number +14155552671 is not a valid phone number. (code 21211)"


def test_telnyx_refusal_names_its_error(client, resolving, fake, runtime):
    fake.route(TELNYX_PATH, status=422, body={"errors": [
        {"code": "40310", "title": "Invalid 'to' address", "detail": "The 'to' address is not a valid number."}]})
    response = send(client, resolving, {"leadId": submit(client, resolving, "RS2"), "message": "x"})
    status, reason = stored_status(runtime, resolving, response)
    assert status == "failed"
    assert reason == ("telnyx answered HTTP 422: Invalid 'to' address - The 'to' address is not a valid number."
                      " (code 40310)")


def test_provider_outage_5xx(client, tenant, fake, runtime):
    fake.route(TWILIO_PATH.format(sid="AC123"), status=503, body="upstream down")
    status, reason = stored_status(runtime, tenant, send(client, tenant, {"leadId": submit(client, tenant),
                                                                          "message": "x"}))
    assert status == "error" and reason == "twilio answered HTTP 503: upstream down"


def test_provider_timeout(client, tenant, fake, runtime):
    fake.route(TWILIO_PATH.format(sid="AC123"), delay=2, status=201, body={"sid": "late"})
    status, reason = stored_status(runtime, tenant, send(client, tenant, {"leadId": submit(client, tenant),
                                                                          "message": "x"}))
    assert status == "error" and reason == "twilio did not answer within 1.5 s"


def test_provider_echoing_a_secret_is_masked(client, tenant, fake, runtime):
    fake.route(TWILIO_PATH.format(sid="AC123"), status=401,
               body={"code": 20003, "message": "Authenticate: bad token sms-secret-token-456"})
    status, reason = stored_status(runtime, tenant, send(client, tenant, {"leadId": submit(client, tenant),
                                                                          "message": "x"}))
    assert status == "failed" and reason.endswith("bad token *** (code 20003)")


def test_tenant_base_url_unreachable_and_guarded(tmp_path, fake, module_backend_toml):
    bundle = {"sms": {"providers": [{"providerId": "tx", "type": "telnyx", "apiKey": "tenant-telnyx-key-1",
                                     "baseUrl": f"http://127.0.0.1:{free_port()}"}],
                      "numbers": [{"number": "+14155550104"}], "defaultProviderId": "tx"},
              "campaigns": [campaign("UN1", "Unreachable")]}
    for allow, expected_status, expected in (
            (True, "error", "telnyx could not be reached (connection failed)"),
            (False, "failed", "provider baseUrl refused: ")):
        folder = tmp_path / f"allow-{allow}"
        folder.mkdir()
        path = folder / "appliance.toml"
        path.write_text(config_text(folder, fake.url(""),
                                    f"[delivery]\nallow_private_addresses = {str(allow).lower()}\n",
                                    module_backend_toml()))
        runtime: Runtime = create_runtime(load_config(path))
        try:
            tenant = make_tenant(runtime, "Unreachable", bundle)
            with TestClient(create_app(runtime, background=False), raise_server_exceptions=False) as client:
                response = send(client, tenant, {"leadId": submit(client, tenant, "UN1"), "message": "x"})
                status, reason = stored_status(runtime, tenant, response)
            assert status == expected_status and reason.startswith(expected), reason
        finally:
            runtime.close()
    assert fake.requests_to(TELNYX_PATH) == []


# ---- bad input and other tenants ------------------------------------------------------------------

def test_every_bad_field_is_named(client, tenant, fake):
    lead_id = submit(client, tenant)
    cases = [
        ({"message": ""}, "message: must not be empty"),
        ({"message": "x" * 1601}, "message: must be at most 1600 characters"),
        ({"message": 5}, "message: expected str, got int"),
        ({"to": "4155552671"}, "to: must be an E.164 phone number, e.g. +14155552671"),
        ({"to": "+1 (415) 555-2671"}, "to: must be an E.164 phone number, e.g. +14155552671"),
        ({"to": "+1415555"}, "to: must be an E.164 phone number, e.g. +14155552671"),
        ({"to": ""}, "to: must not be empty"),
        ({"from": "not a sender!"}, "from: must be an E.164 phone number, a short code or an alphanumeric sender id"
                                    " (up to 11 characters)"),
        ({"campaignId": "ZZZ9"}, "campaignId: unknown campaign"),
        ({"campaignId": ""}, "campaignId: must not be empty"),
        ({"interactionId": 7}, "interactionId: expected str, got int"),
        ({"leadId": ""}, "leadId: must not be empty"),
        ({"channel": "sms"}, "channel: unknown field"),
    ]
    for change, detail in cases:
        assert details_of(send(client, tenant, {"leadId": lead_id, "message": "hi", **change})) == [detail], change
    for missing in ("leadId", "message"):
        body = {"leadId": lead_id, "message": "hi"}
        del body[missing]
        assert details_of(send(client, tenant, body)) == [f"{missing}: required field missing"]
    assert details_of(send(client, tenant, {"leadId": lead_id, "message": "hi", "to": "555", "from": "!"})) == [
        "to: must be an E.164 phone number, e.g. +14155552671",
        "from: must be an E.164 phone number, a short code or an alphanumeric sender id (up to 11 characters)"]
    assert sent(client, tenant, {"leadId": lead_id, "message": "x" * 1600, "to": "+442071838750"})["to"] == \
        "+442071838750"
    assert len(fake.requests) == 1


def test_unknown_and_other_tenants_lead_is_404(client, tenant, other_tenant, fake):
    theirs = submit(client, other_tenant, "OC01")
    for lead_id in (theirs, "lead_01JD0000000000000000000000"):
        response = send(client, tenant, {"leadId": lead_id, "message": "hi"})
        details_of(response, "NOT_FOUND", 404)
        assert response.json()["error"]["message"] == "Resource not found"
    mine = sent(client, tenant, {"leadId": submit(client, tenant), "message": "hi"})
    # another tenant's conversation is unknown to this one
    assert details_of(send(client, other_tenant, {"leadId": theirs, "message": "x",
                                                  "interactionId": mine["interactionId"]})) == \
        ["interactionId: unknown conversation"]
    assert client.post("/api/v1/sms/send", json={"leadId": theirs, "message": "x"}).status_code == 401


def test_openapi_documents_the_routes(client):
    doc = client.get("/schema/openapi.json").json()
    send_op = doc["paths"]["/api/v1/sms/send"]["post"]
    assert {"201", "400", "404", "502"} <= set(send_op["responses"])
    assert {"/api/v1/files", "/api/v1/files/{leadId}", "/api/v1/files/{leadId}/{fileKey}",
            "/api/v1/pixels/fire"} <= set(doc["paths"])


def test_message_left_sending_by_a_crash_is_settled_as_error(client, tenant, fake, runtime):
    from appliance.services import sms
    from appliance.jobs.ticker import settle_interrupted_sms
    from appliance.plugins import load_plugins
    from tests.submit_support import FakeClock

    fake.route(TWILIO_PATH.format(sid="AC123"), delay=2, status=201, body={"sid": "late"})
    body = msgspec.convert({"leadId": submit(client, tenant), "message": "x"}, sms.SmsSendBody)

    async def crash_during_the_provider_call() -> str:
        task = asyncio.create_task(sms.send(runtime, load_plugins(runtime.config), tenant.tenant_id, body))
        for _ in range(200):
            found = engine(runtime.store).row("SELECT message_id FROM sms_messages WHERE status = 'sending'")
            if found:
                task.cancel()  # the process dies: the final status is never written
                return found[0]
            await asyncio.sleep(0.01)
        raise AssertionError("the message was never stored as sending")

    message_id = asyncio.run(crash_during_the_provider_call())
    stored = runtime.store.reader().messages.get_message(tenant.tenant_id, message_id)
    clock = FakeClock(datetime.fromisoformat(stored.created_at))
    runtime.clock = clock
    clock.advance(minutes=9)
    assert asyncio.run(settle_interrupted_sms(runtime)) == 0  # a call could still be under way
    clock.advance(minutes=2)
    assert asyncio.run(settle_interrupted_sms(runtime)) == 1
    settled = runtime.store.reader().messages.get_message(tenant.tenant_id, message_id)
    assert settled.status == "error" and settled.reason.startswith("interrupted: ")
