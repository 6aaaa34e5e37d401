"""Peers that echo the credentials they were sent: a buyer, Twilio, Telnyx, Meta, TikTok and a
plugin delivery adapter each put what they received (raw, base64, URL-encoded, as user:password)
into their answers. None of it may come out in a response, the stored records, the database file
or the log, in any of those forms."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, quote_plus

import httpx
import pytest

from appliance.config import load_config
from appliance.runtime import create_runtime
from tests.bundles import campaign
from tests.buyer_server import BuyerServer, Received, Reply, wait_until
from tests.conftest import make_tenant
from tests.engine import stored_bytes
from tests.servers import live_server, person

BUYER_USER, BUYER_PASS = "buyer-user", "url-pass-7Hq2"
API_KEY = "query-key-9Zt4/+x"
HEADER_TOKEN, MARKED = "header-token-3Kd8", "marked-value-5Wp1"
AUTH_TOKEN = "auth-header-token-2Lm6"
TWILIO_SID, TWILIO_TOKEN = "AC77", "twilio-token-8Rf3"
TELNYX_KEY = "telnyx-key-4Vb9"
META_TOKEN, TIKTOK_TOKEN = "meta-token-6Ns2", "tiktok-token-1Qa7"
PLUGIN_TOKEN = "plugin-token-0Xe5"
SECRETS = [BUYER_PASS, API_KEY, HEADER_TOKEN, MARKED, AUTH_TOKEN, TWILIO_TOKEN, TELNYX_KEY, META_TOKEN, TIKTOK_TOKEN,
           PLUGIN_TOKEN]

ECHO_PLUGIN = '''
import base64
from appliance.sdk import DeliveryAdapter, DeliveryResult, hookimpl

class Echo(DeliveryAdapter):
    name = "echo"

    async def deliver(self, request, http):
        token = request.secrets["auth.token"]
        return DeliveryResult(outcome="failure", status_code=401,
                              reason="refused " + base64.b64encode(("me:" + token).encode()).decode(),
                              message="sent Bearer " + token, client_lead_id=token.upper().lower(),
                              response_fields={"seen": "token=" + token})

@hookimpl
def appliance_delivery_adapters(settings):
    return [Echo()]
'''


def forms(secret: str) -> set[str]:
    """What a careless peer sends back: the value and its encodings, alone and as user:secret."""
    found = {secret, quote(secret, safe=""), quote(secret), quote_plus(secret),
             base64.b64encode(secret.encode()).decode()}
    for user in (BUYER_USER, TWILIO_SID, "me", ""):
        found.add(base64.b64encode(f"{user}:{secret}".encode()).decode())
    return found


def buyer_echo(request: Received) -> Reply:
    return Reply(status=401, body={"id": request.headers.get("authorization"),
                                   "message": f"token {request.headers.get('x-buyer-token')} "
                                              f"{request.headers.get('x-marked')} {request.headers.get('x-auth')} "
                                              f"at {request.path}?{request.query}"})


def twilio_echo(request: Received) -> Reply:
    return Reply(status=401, body={"message": f"Authenticate {request.headers['authorization']}", "code": 20003})


def telnyx_echo(request: Received) -> Reply:
    return Reply(status=401, body={"errors": [{"title": "Unauthorized",
                                               "detail": f"key {request.headers['authorization']}"}]})


def meta_echo(request: Received) -> Reply:
    token = request.json()["access_token"]
    return Reply(status=400, body={"error": {"message": f"token {quote(token)} b64 "
                                                        f"{base64.b64encode(token.encode()).decode()}"}})


def tiktok_echo(request: Received) -> Reply:
    return Reply(status=401, body={"code": 40001, "message": f"Access-Token {request.headers['access-token']}"})


@pytest.fixture
def peer() -> Iterator[BuyerServer]:
    with BuyerServer() as server:
        server.route("/in", buyer_echo)
        server.route(f"/2010-04-01/Accounts/{TWILIO_SID}/Messages.json", twilio_echo)
        server.route("/v2/messages", telnyx_echo)
        server.route("/v99.0/px-meta/events", meta_echo)
        server.route("/open_api/v1.3/event/track/", tiktok_echo)
        yield server


def test_echoed_credentials_never_come_out(tmp_path: Path, peer: BuyerServer, caplog, backend_toml):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "echo_adapter.py").write_text(ECHO_PLUGIN)
    config_path = tmp_path / "appliance.toml"
    config_path.write_text(
        f'[storage]\npath = "{tmp_path / "data"}"\n{backend_toml}[security]\nrate_limit_per_minute = 0\n'
        f'[plugins]\ndirs = ["{plugins}"]\n[delivery]\nallow_private_addresses = true\n'
        f'[pixels.social]\nbase_url = "{peer.url("")}"\napi_version = "v99.0"\n'
        f'[pixels.video]\nbase_url = "{peer.url("")}"\n')
    url = peer.url("/in").replace("http://", f"http://{BUYER_USER}:{BUYER_PASS}@") + f"?list=7&api_key={quote(API_KEY)}"
    bundle = {
        "deliveryEndpoints": [
            {"deliveryEndpointId": "ep", "url": url, "retry": {"maxAttempts": 1},
             "headers": {"X-Buyer-Token": HEADER_TOKEN, "X-Marked": MARKED, "X-Plain": "plain"},
             "secretHeaders": ["X-Marked"], "auth": {"type": "header", "headerName": "X-Auth", "token": AUTH_TOKEN},
             "responseRules": {"clientLeadIdPath": "id", "messagePath": "message"}},
            {"deliveryEndpointId": "ep-plugin", "adapter": "echo", "url": "https://buyer.example.com/in",
             "retry": {"maxAttempts": 1}, "auth": {"type": "bearer", "token": PLUGIN_TOKEN}},
        ],
        "campaigns": [campaign("ECH", "Echo", delivery={"deliveryEndpointId": "ep"}),
                      campaign("PLG", "Plugin", delivery={"deliveryEndpointId": "ep-plugin"})],
        "sms": {"providers": [
            {"providerId": "tw", "type": "twilio", "accountSid": TWILIO_SID, "authToken": TWILIO_TOKEN,
             "baseUrl": peer.url("")},
            {"providerId": "tx", "type": "telnyx", "apiKey": TELNYX_KEY, "baseUrl": peer.url("")}],
            "numbers": [{"number": "+14155550100", "smsCapable": True, "campaignIds": ["ECH", "PLG"]}],
            "campaignProviders": {"ECH": "tw", "PLG": "tx"}},
        "pixels": [{"pixelId": "px-meta", "platform": "social", "accessToken": META_TOKEN},
                   {"pixelId": "TT-1", "platform": "video", "accessToken": TIKTOK_TOKEN}],
    }
    caplog.set_level(logging.DEBUG)
    runtime = create_runtime(load_config(config_path))
    shown: list[str] = []
    try:
        tenant = make_tenant(runtime, "Echo", bundle)
        with live_server(runtime, log_level="debug") as base, \
                httpx.Client(base_url=base, headers=tenant.headers, timeout=20) as http:
            leads = []
            for n, code in enumerate(("ECH", "PLG")):
                answer = http.post("/api/v1/leads/submit", json={"campaignId": code, **person(900 + n)})
                assert answer.status_code == 201, answer.text
                leads.append(answer.json()["data"]["leadId"])

            def lead(lead_id: str) -> dict:
                return http.get(f"/api/v1/leads/{lead_id}").json()["data"]

            assert wait_until(lambda: all(lead(i)["status"] == "failed" for i in leads), timeout=15), \
                [lead(i)["status"] for i in leads]
            for lead_id in leads:  # ECH sends through Twilio, PLG through Telnyx
                answer = http.post("/api/v1/sms/send", json={"leadId": lead_id, "message": "hi"})
                assert answer.status_code == 502, answer.text
                shown.append(answer.text)
            for pixel, platform in (("px-meta", "social"), ("TT-1", "video")):
                answer = http.post("/api/v1/pixels/fire", json={"leadId": leads[0], "pixelId": pixel,
                                                                "platform": platform, "eventName": "Lead"})
                assert answer.status_code == 200 and answer.json()["data"]["success"] is False, answer.text
                shown.append(answer.text)
            for lead_id in leads:
                shown.append(http.get(f"/api/v1/leads/{lead_id}").text)
        stored = stored_bytes(runtime.config).decode("latin-1")
    finally:
        runtime.close()

    # the peers did receive the real credentials (so the echoes above carried them)
    (buyer_request,) = peer.requests_to("/in")
    assert buyer_request.headers["x-buyer-token"] == HEADER_TOKEN and buyer_request.headers["x-marked"] == MARKED
    assert buyer_request.headers["x-auth"] == AUTH_TOKEN and buyer_request.headers["x-plain"] == "plain"
    assert buyer_request.params()["api_key"] == API_KEY
    assert buyer_request.headers["authorization"] == "Basic " + base64.b64encode(
        f"{BUYER_USER}:{BUYER_PASS}".encode()).decode()
    # the buyer's refusal is still there to read, masked
    record = "\n".join(shown)
    assert "***" in record and "at /in?list=7&api_key=***" in record
    logged = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    for secret in SECRETS:
        for form in forms(secret):
            assert form not in record, (secret, form)
            assert form not in stored, (secret, form)
            assert form not in logged, (secret, form)


LONG_PLUGIN = '''
from appliance.sdk import DeliveryAdapter, DeliveryResult, hookimpl

class Long(DeliveryAdapter):
    name = "long"

    async def deliver(self, request, http):
        # 64 KB a scheme-like run of characters: a backtracking scrubber would take minutes on it
        return DeliveryResult(outcome="failure", status_code=400, reason="a." * 32000 + "@",
                              message="secret " + request.secrets["auth.token"].upper())

@hookimpl
def appliance_delivery_adapters(settings):
    return [Long()]
'''


def test_a_credential_cut_short_by_the_message_limit_is_masked_and_long_texts_are_quick(tmp_path, peer, backend_toml):
    token = "tok_live_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    peer.route("/cut", Reply(status=401, body={"error": "x" * 470 + " key: " + token}))
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "long_adapter.py").write_text(LONG_PLUGIN)
    config_path = tmp_path / "appliance.toml"
    config_path.write_text(f'[storage]\npath = "{tmp_path / "data"}"\n{backend_toml}[security]\nrate_limit_per_minute = 0\n'
                           f'[plugins]\ndirs = ["{plugins}"]\n[delivery]\nallow_private_addresses = true\n')
    bundle = {
        "deliveryEndpoints": [
            {"deliveryEndpointId": "cut", "url": peer.url("/cut"), "retry": {"maxAttempts": 1},
             "headers": {"X-Api-Key": token}, "responseRules": {"messagePath": "error"}},
            {"deliveryEndpointId": "long", "adapter": "long", "retry": {"maxAttempts": 1},
             "auth": {"type": "bearer", "token": "long-plugin-token-1"}}],
        "campaigns": [campaign("CUT", "Cut", delivery={"deliveryEndpointId": "cut"}),
                      campaign("LNG", "Long", delivery={"deliveryEndpointId": "long"})],
    }
    runtime = create_runtime(load_config(config_path))
    try:
        tenant = make_tenant(runtime, "Cut", bundle)
        with live_server(runtime) as base, httpx.Client(base_url=base, headers=tenant.headers, timeout=20) as http:
            leads = [http.post("/api/v1/leads/submit", json={"campaignId": code, **person(950 + n)}).json()["data"]
                     for n, code in enumerate(("CUT", "LNG"))]
            assert wait_until(lambda: all(http.get(f"/api/v1/leads/{d['leadId']}").json()["data"]["status"] == "failed"
                                          for d in leads), timeout=10)
            records = [http.get(f"/api/v1/leads/{d['leadId']}").text for d in leads]
    finally:
        runtime.close()
    cut = json.loads(records[0])["data"]["submissions"][-1]["delivery"]["responseMessage"]
    assert cut.endswith("key: ***"), cut[-40:]
    pieces = {token[i:i + 6] for i in range(len(token) - 5)}
    assert not [p for p in pieces if p in records[0]]
