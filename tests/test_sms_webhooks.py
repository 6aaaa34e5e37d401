"""Two-way SMS through `POST /hooks/sms/{provider}/{tenantId}`, with fake Twilio and Telnyx APIs on
loopback: replies join the conversation of the tenant's latest lead with that phone (else are kept
as orphan messages), delivery reports move outbound statuses forward only, STOP / START / HELP
keywords, sends to opted-out phones refused, `sms-opt-outs` as a suppression list, and every
refusal (missing, wrong or replayed signature, another tenant's path, install-wide credentials
for a number not of the tenant, unknown tenant or provider, unreadable body) stores nothing and
logs neither the text nor the phone. Plugin providers take webhooks through the plugin folder.

The signatures are computed here from the providers' documented algorithms (Twilio: HMAC-SHA1
over the URL and the sorted form; Telnyx: Ed25519 over `<timestamp>|<body>`), never by the
appliance's own adapters, so the tests are an oracle for them."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import itertools
import json
import logging
import shutil
import textwrap
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlencode

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from litestar.testing import TestClient

from appliance.adapters import twilio as twilio_adapter
from appliance.adapters.telnyx import TelnyxProvider
from appliance.adapters.twilio import TwilioProvider
from appliance.app import create_app
from appliance.config import ConfigError, load_config
from appliance.jobs.ticker import settle_interrupted_sms
from appliance.sdk import SmsWebhook
from appliance.services import sms_webhooks, tenancy
from tests.bundles import campaign, standard_bundle
from tests.buyer_server import BuyerServer, Reply, wait_until
from tests.conftest import Tenant, make_tenant
from tests.engine import engine
from tests.submit_support import FakeClock
from tests.worker_helpers import endpoint, live_app, status_is, wait_for

ROOT = Path(__file__).resolve().parent.parent
BASE = "http://testserver.local"  # the TestClient's address: the URL a webhook reaches without public_url
PUBLIC = "https://leads.example.com"

TOKEN = "sms-secret-token-456"            # the standard tenant's Twilio authToken
OTHER_TOKEN = "other-agency-token-789"    # the other tenant's
INSTALL_TOKEN = "install-token-000"       # [sms.twilio] auth_token
TWILIO_PATH = "/2010-04-01/Accounts/{sid}/Messages.json"
TELNYX_PATH = "/v2/messages"
EXAMPLE_PATH = "/example/messages"

NUMBER = "+14155552671"        # the standard tenant's number (campaign AC01)
SECOND_NUMBER = "+14155550188"  # another number of the standard tenant
OTHER_NUMBER = "+14155550300"  # the other tenant's number
TELNYX_NUMBER = "+14155550400"
LEAD_PHONE = "+14155550123"
STRANGER = "+14155550177"      # no lead has it

HELP_TEXT = 'Acme & Sons <legal>: "Msg & data rates may apply". Reply STOP to opt out.'


def _raw_public(key: Ed25519PrivateKey) -> str:
    return base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


TELNYX_KEY = Ed25519PrivateKey.generate()      # the Telnyx tenant's signing key
OTHER_TELNYX_KEY = Ed25519PrivateKey.generate()
INSTALL_TELNYX_KEY = Ed25519PrivateKey.generate()  # [sms.telnyx] public_key
STRANGE_KEY = Ed25519PrivateKey.generate()     # nobody's


# ---- the fake providers and the install ---------------------------------------------------------

def _numbered(make):
    counter = itertools.count(1)
    return lambda request: make(next(counter), request)


@pytest.fixture
def fake() -> Iterator[BuyerServer]:
    """Twilio and Telnyx APIs (and the example plugin's) that accept every message, each with an id
    of its own."""
    with BuyerServer() as server:
        for sid in ("AC123", "ACOTHER", "ACINSTALL"):
            server.route(TWILIO_PATH.format(sid=sid), _numbered(lambda n, r, sid=sid: Reply(
                status=201, body={"sid": f"SM{sid}{n:04d}", "status": "queued"})))
        server.route(TELNYX_PATH, _numbered(lambda n, r: Reply(status=200, body={"data": {
            "id": f"tx-{n:04d}", "to": [{"phone_number": r.json()["to"], "status": "queued"}]}})))
        server.route(EXAMPLE_PATH, _numbered(lambda n, r: Reply(status=200, body={"id": f"ex-{n:04d}"})))
        yield server


@pytest.fixture
def config_extra() -> str:
    """More TOML for the install (tests parametrize it: `[server] public_url`, ...)."""
    return ""


@pytest.fixture
def config_file(tmp_path: Path, fake: BuyerServer, backend_toml: str, config_extra: str) -> Path:
    (tmp_path / "plugins").mkdir(exist_ok=True)
    base = fake.url("")
    path = tmp_path / "appliance.toml"
    path.write_text(
        f'[storage]\npath = "{tmp_path / "data"}"\n{backend_toml}'
        f'[security]\nrate_limit_per_minute = 0\n'
        f'[plugins]\ndirs = ["{tmp_path / "plugins"}"]\n'
        f'[plugins.twilio]\ntimeout_seconds = 1.5\n[plugins.telnyx]\ntimeout_seconds = 1.5\n'
        f'[sms.twilio]\nbase_url = "{base}"\naccount_sid = "ACINSTALL"\nauth_token = "{INSTALL_TOKEN}"\n'
        f'[sms.telnyx]\nbase_url = "{base}"\napi_key = "install-telnyx-key"\n'
        f'public_key = "{_raw_public(INSTALL_TELNYX_KEY)}"\n{config_extra}')
    return path


def twilio_bundle(prefix: str = "A", *, token: str = TOKEN, sid: str = "AC123", number: str = NUMBER,
                  help_text: str | None = HELP_TEXT, **campaign_extra) -> dict:
    bundle = standard_bundle(prefix)
    sms = bundle["sms"]
    sms["providers"][0].update(accountSid=sid, authToken=token)
    sms["numbers"] = [{"number": number, "campaignIds": [f"{prefix}C01"]}, {"number": SECOND_NUMBER}] \
        if prefix == "A" else [{"number": number, "campaignIds": [f"{prefix}C01"]}]
    if help_text is not None:
        sms["helpText"] = help_text
    bundle["campaigns"][0].update(campaign_extra)
    return bundle


@pytest.fixture
def tenant(runtime) -> Tenant:
    """Twilio provider "tw" (AC123, TOKEN), numbers NUMBER (campaign AC01) and SECOND_NUMBER, a HELP text."""
    return make_tenant(runtime, "Acme Leads", twilio_bundle())


@pytest.fixture
def other_tenant(runtime) -> Tenant:
    """Its own Twilio account and token, number OTHER_NUMBER, no HELP text."""
    return make_tenant(runtime, "Other Agency", twilio_bundle("O", token=OTHER_TOKEN, sid="ACOTHER",
                                                              number=OTHER_NUMBER, help_text=None))


def telnyx_bundle(key: Ed25519PrivateKey | None = TELNYX_KEY, number: str = TELNYX_NUMBER,
                  help_text: str | None = HELP_TEXT, code: str = "TC01") -> dict:
    provider = {"providerId": "tx", "type": "telnyx", "apiKey": "tenant-telnyx-key-1"}
    if key is not None:
        provider["publicKey"] = _raw_public(key)
    sms = {"providers": [provider], "numbers": [{"number": number, "campaignIds": [code]}], "defaultProviderId": "tx"}
    if help_text is not None:
        sms["helpText"] = help_text
    return {"sms": sms, "campaigns": [campaign(code, "Telnyx texts")]}


@pytest.fixture
def telnyx_tenant(runtime) -> Tenant:
    return make_tenant(runtime, "Telnyx Leads", telnyx_bundle())


def install_bundle(number: str, code: str, help_text: str | None = None) -> dict:
    """A tenant with numbers but no provider of its own: the install-wide credentials serve it."""
    sms: dict = {"numbers": [{"number": number, "campaignIds": [code]}]}
    if help_text is not None:
        sms["helpText"] = help_text
    return {"sms": sms, "campaigns": [campaign(code, "Install credentials")]}


@contextmanager
def app_client(runtime) -> Iterator[TestClient]:
    """A client of an app made now (plugins are loaded when the app is made)."""
    with TestClient(create_app(runtime, background=False), raise_server_exceptions=False) as client:
        yield client


# ---- signing, as the providers document it --------------------------------------------------------

def twilio_signature(token: str, url: str, params: dict[str, str] | list[tuple[str, str]]) -> str:
    """Twilio: base64(HMAC-SHA1(auth token, URL + each POST parameter's name and value, sorted by
    name)); a name given more than once adds each of its distinct values in order (Twilio's own
    validators, e.g. twilio-python's RequestValidator.compute_signature)."""
    pairs = list(params.items()) if isinstance(params, dict) else params
    names = sorted({name for name, _ in pairs})
    data = url + "".join(name + value for name in names for value in sorted({v for n, v in pairs if n == name}))
    return base64.b64encode(hmac.new(token.encode(), data.encode("utf-8"), hashlib.sha1).digest()).decode()


def hook_path(provider: str, tenant_id: str) -> str:
    return f"/hooks/sms/{provider}/{tenant_id}"


def twilio_hook(client, tenant_id: str, params: dict[str, str], *, token: str = TOKEN, url: str | None = None,
                path: str | None = None, signature: str | None = None, query: str = ""):
    """Posts a form as Twilio does, signed over `url` (default: the URL the request reaches)."""
    path = path or hook_path("twilio", tenant_id)
    target = path + (f"?{query}" if query else "")
    signed = twilio_signature(token, url if url is not None else BASE + target, params)
    headers = {"Content-Type": "application/x-www-form-urlencoded", "I-Twilio-Idempotency-Token": str(uuid.uuid4())}
    if signature != "":
        headers["X-Twilio-Signature"] = signature if signature is not None else signed
    return client.post(target, content=urlencode(params).encode(), headers=headers)


_sids = itertools.count(1)


def twilio_inbound(text: str, sender: str = LEAD_PHONE, to: str = NUMBER, sid: str | None = None,
                   account: str = "AC123") -> dict[str, str]:
    """The form Twilio posts for an incoming text (the fields it documents, as it sends them)."""
    sid = sid or f"SMin{next(_sids):028d}"
    return {"ToCountry": "US", "ToState": "CA", "SmsMessageSid": sid, "NumMedia": "0", "ToCity": "SAN FRANCISCO",
            "FromZip": "94105", "SmsSid": sid, "FromState": "CA", "SmsStatus": "received", "FromCity": "SAN FRANCISCO",
            "Body": text, "FromCountry": "US", "To": to, "MessagingServiceSid": "MG0000", "ToZip": "94105",
            "NumSegments": "1", "MessageSid": sid, "AccountSid": account, "From": sender, "ApiVersion": "2010-04-01"}


def twilio_status(sid: str, status: str, error_code: str | None = None, to: str = LEAD_PHONE) -> dict[str, str]:
    """The form of Twilio's status callback."""
    form = {"SmsSid": sid, "SmsStatus": status, "MessageStatus": status, "To": to, "MessageSid": sid,
            "AccountSid": "AC123", "From": NUMBER, "ApiVersion": "2010-04-01"}
    if error_code is not None:
        form["ErrorCode"] = error_code
    return form


def telnyx_hook(client, tenant_id: str, payload: dict | bytes, *, key: Ed25519PrivateKey = TELNYX_KEY,
                timestamp: int | str | None = None, headers: dict | None = None, path: str | None = None):
    """Posts a Telnyx event, signed with Ed25519 over `<timestamp>|<body>`."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    stamp = str(timestamp if timestamp is not None else int(datetime.now(UTC).timestamp()))
    signature = base64.b64encode(key.sign(stamp.encode() + b"|" + body)).decode()
    sent = {"Content-Type": "application/json", "telnyx-timestamp": stamp, "telnyx-signature-ed25519": signature}
    if headers is not None:
        sent = {k: v for k, v in {**sent, **headers}.items() if v is not None}
    return client.post(path or hook_path("telnyx", tenant_id), content=body, headers=sent)


def telnyx_inbound(text: str, sender: str = LEAD_PHONE, to: str = TELNYX_NUMBER,
                   message_id: str | None = None) -> dict:
    message_id = message_id or str(uuid.uuid4())
    return {"data": {"event_type": "message.received", "id": str(uuid.uuid4()), "occurred_at": "2026-03-10T15:00:00Z",
                     "record_type": "event",
                     "payload": {"id": message_id, "direction": "inbound", "type": "SMS", "record_type": "message",
                                 "from": {"phone_number": sender, "carrier": "T-Mobile USA", "line_type": "Wireless"},
                                 "to": [{"phone_number": to, "status": "webhook_delivered"}],
                                 "text": text, "encoding": "GSM-7", "parts": 1, "media": [], "errors": []}},
            "meta": {"attempt": 1, "delivered_to": "https://leads.example.com/hooks/sms/telnyx"}}


def telnyx_status(message_id: str, status: str, event_type: str = "message.finalized",
                  errors: list | None = None) -> dict:
    return {"data": {"event_type": event_type, "id": str(uuid.uuid4()), "record_type": "event",
                     "payload": {"id": message_id, "direction": "outbound", "type": "SMS",
                                 "from": {"phone_number": TELNYX_NUMBER},
                                 "to": [{"phone_number": LEAD_PHONE, "status": status}],
                                 "text": "hello", "errors": errors or []}},
            "meta": {"attempt": 1}}


# ---- reading what the appliance kept --------------------------------------------------------------

_emails = itertools.count(1)


def submit(client, tenant: Tenant, phone: str = LEAD_PHONE, campaign_id: str = "AC01") -> dict:
    response = client.post("/api/v1/leads/submit", headers=tenant.headers, json={
        "campaignId": campaign_id, "firstName": "Jan", "lastName": "Doe",
        "email": f"jan{next(_emails)}@example.com", "phone": phone})
    assert response.status_code == 201, response.text
    return response.json()["data"]


def send(client, tenant: Tenant, lead_id: str, text: str = "Hi Jan", **extra):
    return client.post("/api/v1/sms/send", headers=tenant.headers, json={"leadId": lead_id, "message": text, **extra})


def sent(client, tenant: Tenant, lead_id: str, text: str = "Hi Jan", **extra) -> dict:
    response = send(client, tenant, lead_id, text, **extra)
    assert response.status_code == 201, response.text
    return response.json()["data"]


def messages(client, tenant: Tenant, lead_id: str) -> list[dict]:
    response = client.get(f"/api/v1/leads/{lead_id}/messages", headers=tenant.headers, params={"limit": 100})
    assert response.status_code == 200, response.text
    return response.json()["data"]["items"]


def orphans(client, tenant: Tenant) -> list[dict]:
    response = client.get("/api/v1/sms/orphan-messages", headers=tenant.headers, params={"limit": 100})
    assert response.status_code == 200, response.text
    return response.json()["data"]["items"]


def opt_out(client, tenant: Tenant, phone: str) -> dict:
    response = client.get("/api/v1/sms/opt-outs/check", headers=tenant.headers, params={"phone": phone})
    assert response.status_code == 200, response.text
    return response.json()["data"]


TABLES = ("sms_messages", "sms_conversations", "sms_orphan_messages", "sms_opt_outs")


def stored(runtime) -> dict[str, list[tuple]]:
    """Every row of the two-way SMS tables (for "nothing stored" and "nothing changed")."""
    db = engine(runtime.store)
    return {table: sorted(tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
                          for row in db.reader().execute(f"SELECT * FROM {table}"))
            for table in TABLES}


def refused(response, status: int = 403, code: str = "FORBIDDEN") -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    error = response.json()["error"]
    assert error["code"] == code, error
    return error


def twiml(response) -> ET.Element:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/xml")
    root = ET.fromstring(response.content)
    assert root.tag == "Response"
    return root


def received(response) -> None:
    assert response.status_code == 200, response.text
    assert response.json() == {"success": True, "data": {"received": True}}


# ---- Twilio: replies join the conversation of the latest lead with that phone ----------------------

# The vectors of Twilio's own request validators (twilio-python, twilio-php, twilio-csharp tests).
TWILIO_VECTOR_URL = "https://mycompany.com/myapp.php?foo=1&bar=2"
TWILIO_VECTORS = [
    ({"CallSid": "CA1234567890ABCDE", "Caller": "+14158675309", "Digits": "1234", "From": "+14158675309",
      "To": "+18005551212"}, "RSOYDt4T1cUTdK1PDd93/VVr8B8="),
    ([("Sid", "CA123"), ("SidAccount", "AC123"), ("Digits", "5678"), ("Digits", "1234"), ("Digits", "1234")],
     "IK+Dwps556ElfBT0I3Rgjkr1wJU="),
]


@pytest.mark.parametrize("params, expected", TWILIO_VECTORS)
def test_twilio_signatures_match_twilios_published_vectors(params, expected):
    assert twilio_signature("12345", TWILIO_VECTOR_URL, params) == expected  # the oracle
    pairs = list(params.items()) if isinstance(params, dict) else params
    assert twilio_adapter.signature("12345", TWILIO_VECTOR_URL, pairs) == expected
    body = urlencode(pairs).encode()
    for url in (TWILIO_VECTOR_URL, "https://mycompany.com:443/myapp.php?foo=1&bar=2"):
        webhook = SmsWebhook(url=url, headers={"x-twilio-signature": expected}, body=body,
                             credentials=[{"authToken": "12345"}], settings={}, now=datetime.now(UTC))
        assert TwilioProvider().verify_webhook(webhook)
    wrong = SmsWebhook(url=TWILIO_VECTOR_URL + "&x=1", headers={"x-twilio-signature": expected}, body=body,
                       credentials=[{"authToken": "12345"}], settings={}, now=datetime.now(UTC))
    assert not TwilioProvider().verify_webhook(wrong)


def test_a_form_with_a_repeated_parameter(client, tenant):
    lead_id = submit(client, tenant)["leadId"]
    path = hook_path("twilio", tenant.tenant_id)
    pairs = [*twilio_inbound("repeated").items(), ("AddOns", "x"), ("AddOns", "x"), ("AddOns", "a")]
    answer = client.post(path, content=urlencode(pairs).encode(),
                         headers={"Content-Type": "application/x-www-form-urlencoded",
                                  "X-Twilio-Signature": twilio_signature(TOKEN, BASE + path, pairs)})
    assert answer.status_code == 200, answer.text
    assert [m["body"] for m in messages(client, tenant, lead_id)] == ["repeated"]


def test_a_reply_joins_the_latest_lead_with_that_phone(client, tenant, runtime):
    earlier = submit(client, tenant)["leadId"]
    first_send = sent(client, tenant, earlier, "Hi from Acme")
    later = submit(client, tenant)["leadId"]  # the same phone, submitted later
    assert earlier != later
    later_send = sent(client, tenant, later, "Hi again")
    assert later_send["interactionId"] != first_send["interactionId"]

    answer = twilio_hook(client, tenant.tenant_id, twilio_inbound("Yes, please call me", sid="SMreply1"))
    assert list(twiml(answer)) == []  # an empty <Response/>: nothing to answer
    listed = messages(client, tenant, later)
    assert [(m["direction"], m["status"], m["body"]) for m in listed] == [
        ("inbound", "received", "Yes, please call me"), ("outbound", "sent", "Hi again")]
    reply = listed[0]
    assert reply["interactionId"] == later_send["interactionId"]  # its open conversation from NUMBER
    assert (reply["from"], reply["to"], reply["provider"], reply["providerId"], reply["providerMessageId"]) == \
        (LEAD_PHONE, NUMBER, "twilio", "tw", "SMreply1")
    assert (reply["segments"], reply["encoding"]) == (1, "GSM-7")
    assert [m["body"] for m in messages(client, tenant, earlier)] == ["Hi from Acme"]  # never the earlier lead
    assert orphans(client, tenant) == []

    # written to another number of the tenant: a new conversation, then reused
    other = twilio_hook(client, tenant.tenant_id, twilio_inbound("Wrong number?", to=SECOND_NUMBER))
    again = twilio_hook(client, tenant.tenant_id, twilio_inbound("Hello?", to=SECOND_NUMBER))
    assert other.status_code == again.status_code == 200
    newest, previous = messages(client, tenant, later)[:2]
    assert newest["interactionId"] == previous["interactionId"]
    assert newest["interactionId"] not in (later_send["interactionId"], first_send["interactionId"])
    assert (newest["to"], newest["body"], previous["body"]) == (SECOND_NUMBER, "Hello?", "Wrong number?")
    conversation = runtime.store.reader().messages.get_conversation(tenant.tenant_id, newest["interactionId"])
    assert (conversation.lead_id, conversation.sender, conversation.recipient, conversation.message_count) == \
        (later, SECOND_NUMBER, LEAD_PHONE, 2)


def test_a_reply_from_a_lead_never_texted_opens_a_conversation(client, tenant):
    lead_id = submit(client, tenant, "+14155550124")["leadId"]
    for text in ("Hi, I filled in your form", "Anyone there?"):
        assert twilio_hook(client, tenant.tenant_id, twilio_inbound(text, sender="+14155550124")).status_code == 200
    listed = messages(client, tenant, lead_id)
    assert [m["body"] for m in listed] == ["Anyone there?", "Hi, I filled in your form"]
    assert listed[0]["interactionId"] == listed[1]["interactionId"] and listed[0]["interactionId"].startswith("int_")
    assert {m["direction"] for m in listed} == {"inbound"}
    # sending to the lead now continues that conversation
    assert sent(client, tenant, lead_id, "We will call you")["interactionId"] == listed[0]["interactionId"]


def test_a_reply_from_a_phone_no_lead_has_is_an_orphan(client, tenant, other_tenant):
    submit(client, other_tenant, STRANGER, "OC01")  # another tenant's lead: not this tenant's
    mine = submit(client, tenant)["leadId"]
    answer = twilio_hook(client, tenant.tenant_id, twilio_inbound("Who is this?", sender=STRANGER, sid="SMorphan1"))
    assert answer.status_code == 200
    (orphan,) = orphans(client, tenant)
    assert orphan["messageId"].startswith("msg_")
    assert {k: v for k, v in orphan.items() if k not in ("messageId", "createdAt")} == {
        "direction": "inbound", "from": STRANGER, "to": NUMBER, "body": "Who is this?", "status": "received",
        "provider": "twilio", "providerId": "tw", "providerMessageId": "SMorphan1"}
    assert messages(client, tenant, mine) == []  # never attached to some other lead
    assert orphans(client, other_tenant) == []
    # once a lead has the phone, its texts join it
    lead_id = submit(client, tenant, STRANGER)["leadId"]
    twilio_hook(client, tenant.tenant_id, twilio_inbound("It's me again", sender=STRANGER))
    assert [m["body"] for m in messages(client, tenant, lead_id)] == ["It's me again"]
    assert len(orphans(client, tenant)) == 1


def test_a_providers_retry_stores_nothing_new(client, tenant, runtime):
    lead_id = submit(client, tenant)["leadId"]
    form = twilio_inbound("Call me after 5", sid="SMretry1")
    orphan_form = twilio_inbound("Hi", sender=STRANGER, sid="SMretry2")
    for _ in range(3):
        assert twilio_hook(client, tenant.tenant_id, form).status_code == 200
        assert twilio_hook(client, tenant.tenant_id, orphan_form).status_code == 200
    assert [m["body"] for m in messages(client, tenant, lead_id)] == ["Call me after 5"]
    assert [m["body"] for m in orphans(client, tenant)] == ["Hi"]
    before = stored(runtime)
    # STOP, START, then the STOP again (a retry): the phone stays opted in
    stop = twilio_inbound("STOP", sid="SMretry3")
    twilio_hook(client, tenant.tenant_id, stop)
    assert opt_out(client, tenant, LEAD_PHONE)["optedOut"] is True
    twilio_hook(client, tenant.tenant_id, twilio_inbound("START", sid="SMretry4"))
    twilio_hook(client, tenant.tenant_id, stop)
    assert opt_out(client, tenant, LEAD_PHONE) == {"optedOut": False, "since": None}
    assert len(stored(runtime)["sms_messages"]) == len(before["sms_messages"]) + 2


# ---- Twilio: delivery reports -------------------------------------------------------------------------

@pytest.mark.parametrize("reported, status", [
    ("accepted", "queued"), ("scheduled", "queued"), ("queued", "queued"), ("sending", "sent"), ("sent", "sent"),
    ("delivered", "delivered"), ("read", "delivered"), ("undelivered", "undelivered"), ("failed", "failed"),
    ("canceled", "failed"),
])
def test_twilio_statuses_map_to_the_appliances(reported, status):
    webhook = SmsWebhook(url="https://x", headers={}, body=urlencode(twilio_status("SM1", reported, "30003")).encode(),
                         credentials=[], settings={}, now=datetime.now(UTC))
    (event,) = TwilioProvider().read_webhook(webhook)
    assert (event.kind, event.provider_message_id, event.status, event.provider_status) == \
        ("status", "SM1", status, reported)
    assert event.reason == ("twilio error 30003" if status in ("undelivered", "failed") else None)


def _status_of(client, tenant, lead_id: str, message_id: str) -> dict:
    return next(m for m in messages(client, tenant, lead_id) if m["messageId"] == message_id)


def test_twilio_delivery_reports_move_statuses_forward_only(client, tenant, runtime):
    lead_id = submit(client, tenant)["leadId"]
    texts = [sent(client, tenant, lead_id, f"text {n}") for n in range(5)]
    sids = [t["providerMessageId"] for t in texts]
    assert len(set(sids)) == 5 and all(t["status"] == "sent" for t in texts)

    def report(sid: str, status: str, code: str | None = None) -> None:
        answer = twilio_hook(client, tenant.tenant_id, twilio_status(sid, status, code))
        assert list(twiml(answer)) == []

    def state(n: int) -> tuple:
        found = _status_of(client, tenant, lead_id, texts[n]["messageId"])
        return found["status"], found["providerStatus"], found["reason"]

    report(sids[0], "delivered")
    assert state(0) == ("delivered", "delivered", None)
    for late in ("sent", "queued", "sending", "undelivered", "failed"):  # late or contradictory: never back
        report(sids[0], late, "30003")
    assert state(0) == ("delivered", "delivered", None)

    report(sids[1], "undelivered", "30003")
    assert state(1) == ("undelivered", "undelivered", "twilio error 30003")
    report(sids[2], "failed", "30008")
    assert state(2) == ("failed", "failed", "twilio error 30008")
    report(sids[3], "queued")  # the send was already accepted (`sent`): a queued report is behind it
    report(sids[3], "sent")
    assert state(3) == ("sent", "queued", None)

    # a report that arrives while the message is still `sending`: queued, then on
    engine(runtime.store).write_sync(lambda conn: conn.execute(
        "UPDATE sms_messages SET status = 'sending' WHERE message_id = ?", (texts[4]["messageId"],)))
    report(sids[4], "queued")
    assert state(4) == ("queued", "queued", None)
    report(sids[4], "sent")
    assert state(4) == ("sent", "sent", None)
    report(sids[4], "queued")
    assert state(4) == ("sent", "sent", None)

    # a report for a message id the tenant does not have, or of an inbound text, changes nothing
    twilio_hook(client, tenant.tenant_id, twilio_inbound("Thanks", sid="SMinbound-x"))
    before = stored(runtime)
    report("SMunknown000", "delivered")
    report("SMinbound-x", "failed", "30003")
    assert stored(runtime) == before


def test_a_report_on_another_tenants_path_changes_nothing(client, tenant, other_tenant, runtime):
    lead_id = submit(client, tenant)["leadId"]
    text = sent(client, tenant, lead_id)
    before = stored(runtime)
    answer = twilio_hook(client, other_tenant.tenant_id, twilio_status(text["providerMessageId"], "delivered"),
                         token=OTHER_TOKEN)  # properly signed for the other tenant: its own reports only
    assert answer.status_code == 200
    assert stored(runtime) == before
    assert _status_of(client, tenant, lead_id, text["messageId"])["status"] == "sent"


# ---- Twilio: the URL signed ---------------------------------------------------------------------------

def test_the_signature_covers_the_url_reached_with_or_without_its_port(client, tenant):
    lead_id = submit(client, tenant)["leadId"]
    path = hook_path("twilio", tenant.tenant_id)
    for url in (BASE + path, "http://testserver.local:80" + path):
        assert twilio_hook(client, tenant.tenant_id, twilio_inbound(url), url=url).status_code == 200
    refused(twilio_hook(client, tenant.tenant_id, twilio_inbound("https"), url="https://testserver.local" + path))
    refused(twilio_hook(client, tenant.tenant_id, twilio_inbound("public"), url=PUBLIC + path))
    # the query string is part of what Twilio signs
    assert twilio_hook(client, tenant.tenant_id, twilio_inbound("query"), query="source=tw&x=1").status_code == 200
    refused(twilio_hook(client, tenant.tenant_id, twilio_inbound("no query"), url=BASE + path, query="source=tw"))
    assert [m["body"] for m in messages(client, tenant, lead_id)] == ["query", "http://testserver.local:80" + path,
                                                                      BASE + path]


@pytest.mark.parametrize("config_extra", [f'[server]\npublic_url = "{PUBLIC}"\n'])
def test_with_public_url_the_signature_covers_the_public_address(client, tenant, telnyx_tenant, runtime, fake):
    lead_id = submit(client, tenant)["leadId"]
    path = hook_path("twilio", tenant.tenant_id)
    for url in (PUBLIC + path, "https://leads.example.com:443" + path):
        assert twilio_hook(client, tenant.tenant_id, twilio_inbound(url), url=url).status_code == 200
    before = stored(runtime)
    for url in (BASE + path, "http://leads.example.com" + path, PUBLIC + "/hooks/sms/twilio/other"):
        refused(twilio_hook(client, tenant.tenant_id, twilio_inbound("refused"), url=url))
    assert stored(runtime) == before
    assert twilio_hook(client, tenant.tenant_id, twilio_inbound("q"), url=PUBLIC + path + "?a=1",
                       query="a=1").status_code == 200
    assert len(messages(client, tenant, lead_id)) == 3

    # every text sent asks the provider to report its delivery to the same address
    sent(client, tenant, lead_id, "with a callback")
    (request,) = fake.requests_to(TWILIO_PATH.format(sid="AC123"))
    assert request.form()["StatusCallback"] == f"{PUBLIC}/hooks/sms/twilio/{tenant.tenant_id}"
    telnyx_lead = submit(client, telnyx_tenant, campaign_id="TC01")["leadId"]
    sent(client, telnyx_tenant, telnyx_lead)
    (request,) = fake.requests_to(TELNYX_PATH)
    assert request.json()["webhook_url"] == f"{PUBLIC}/hooks/sms/telnyx/{telnyx_tenant.tenant_id}"


@pytest.mark.parametrize("config_extra", ['[server]\npublic_url = "https://proxy.example.com:8443/appliance/"\n'])
def test_a_public_url_with_a_port_and_a_path(client, tenant):
    lead_id = submit(client, tenant)["leadId"]
    path = hook_path("twilio", tenant.tenant_id)
    url = "https://proxy.example.com:8443/appliance" + path
    assert twilio_hook(client, tenant.tenant_id, twilio_inbound("ok"), url=url).status_code == 200
    for wrong in ("https://proxy.example.com/appliance" + path, "https://proxy.example.com:8443" + path):
        refused(twilio_hook(client, tenant.tenant_id, twilio_inbound("no"), url=wrong))
    assert [m["body"] for m in messages(client, tenant, lead_id)] == ["ok"]


def test_no_public_url_no_status_callback(client, tenant, fake):
    sent(client, tenant, submit(client, tenant)["leadId"])
    (request,) = fake.requests_to(TWILIO_PATH.format(sid="AC123"))
    assert "StatusCallback" not in request.form()


# ---- Twilio: refusals ------------------------------------------------------------------------------------

def test_a_missing_or_wrong_twilio_signature_is_refused_and_nothing_stored(client, tenant, other_tenant, runtime):
    lead_id = submit(client, tenant)["leadId"]
    before = stored(runtime)
    form = twilio_inbound("STOP")  # were it taken, it would opt the phone out
    path = hook_path("twilio", tenant.tenant_id)
    good = twilio_signature(TOKEN, BASE + path, form)
    attempts = [
        twilio_hook(client, tenant.tenant_id, form, signature=""),                      # no header
        twilio_hook(client, tenant.tenant_id, form, signature="not a signature"),
        twilio_hook(client, tenant.tenant_id, form, signature=good.lower()),
        twilio_hook(client, tenant.tenant_id, form, token="a-guessed-token"),
        twilio_hook(client, tenant.tenant_id, form, token=OTHER_TOKEN),                 # another tenant's token
        twilio_hook(client, tenant.tenant_id, {**form, "Body": "HELP"}, signature=good),  # the text changed
        twilio_hook(client, tenant.tenant_id, {**form, "From": STRANGER}, signature=good),
        twilio_hook(client, tenant.tenant_id, {k: v for k, v in form.items() if k != "NumMedia"}, signature=good),
        twilio_hook(client, tenant.tenant_id, form, url=BASE + hook_path("twilio", other_tenant.tenant_id)),
    ]
    for answer in attempts:
        assert refused(answer)["message"] == "The webhook's signature could not be verified"
    assert stored(runtime) == before
    assert opt_out(client, tenant, LEAD_PHONE)["optedOut"] is False
    assert messages(client, tenant, lead_id) == []


def test_another_tenants_path_is_refused(client, tenant, other_tenant, runtime):
    submit(client, tenant)
    submit(client, other_tenant, campaign_id="OC01")
    before = stored(runtime)
    form = twilio_inbound("Hello", to=NUMBER)
    # what Twilio signed for this tenant's path, posted on the other's
    signed_for_mine = twilio_signature(TOKEN, BASE + hook_path("twilio", tenant.tenant_id), form)
    refused(twilio_hook(client, other_tenant.tenant_id, form, signature=signed_for_mine))
    # signed with this tenant's token over the other's URL: not the other tenant's token
    refused(twilio_hook(client, other_tenant.tenant_id, form, token=TOKEN))
    assert stored(runtime) == before
    assert orphans(client, other_tenant) == [] and orphans(client, tenant) == []


def test_install_wide_credentials_only_for_the_tenants_own_numbers(client, runtime, fake):
    first = make_tenant(runtime, "First", install_bundle("+14155550101", "IA1"))
    second = make_tenant(runtime, "Second", install_bundle("+14155550102", "IB1"))
    mine = submit(client, first, campaign_id="IA1")["leadId"]
    submit(client, second, campaign_id="IB1")
    form = twilio_inbound("Hello", to="+14155550101", account="ACINSTALL")
    before = stored(runtime)
    # Twilio signs the URL it calls: A's path; posted on B's path it does not verify
    signed_for_first = twilio_signature(INSTALL_TOKEN, BASE + hook_path("twilio", first.tenant_id), form)
    refused(twilio_hook(client, second.tenant_id, form, signature=signed_for_first))
    # re-signed with the install token for B's path: a text to A's number is not B's
    answer = twilio_hook(client, second.tenant_id, form, token=INSTALL_TOKEN)
    assert refused(answer)["message"] == "The message is not addressed to a number of this tenant"
    refused(twilio_hook(client, second.tenant_id, twilio_inbound("x", to="+14155550199"), token=INSTALL_TOKEN))
    assert stored(runtime) == before
    # on A's own path: taken
    assert twilio_hook(client, first.tenant_id, form, token=INSTALL_TOKEN).status_code == 200
    assert [m["body"] for m in messages(client, first, mine)] == ["Hello"]

    # a number the tenant has texted from counts as its own
    refused(twilio_hook(client, second.tenant_id, twilio_inbound("x", to="+14155550155"), token=INSTALL_TOKEN))
    lead_b = submit(client, second, "+14155550125", campaign_id="IB1")["leadId"]
    assert sent(client, second, lead_b, "from elsewhere", **{"from": "+14155550155"})["provider"] == "twilio"
    answer = twilio_hook(client, second.tenant_id, twilio_inbound("Reply", sender="+14155550125", to="+14155550155"),
                         token=INSTALL_TOKEN)
    assert answer.status_code == 200
    assert [m["body"] for m in messages(client, second, lead_b)] == ["Reply", "from elsewhere"]
    # a delivery report signed with the install token is taken (it can only name the tenant's own messages)
    sid = messages(client, second, lead_b)[1]["providerMessageId"]
    assert twilio_hook(client, second.tenant_id, twilio_status(sid, "delivered"), token=INSTALL_TOKEN).status_code == 200
    assert messages(client, second, lead_b)[1]["status"] == "delivered"


def test_each_provider_of_the_tenant_verifies_with_its_own_token(client, runtime):
    bundle = twilio_bundle()
    bundle["sms"]["providers"].append({"providerId": "tw2", "type": "twilio", "accountSid": "AC999",
                                       "authToken": "second-account-token-321"})
    tenant = make_tenant(runtime, "Two accounts", bundle)
    lead_id = submit(client, tenant)["leadId"]
    assert twilio_hook(client, tenant.tenant_id, twilio_inbound("first")).status_code == 200
    assert twilio_hook(client, tenant.tenant_id, twilio_inbound("second", account="AC999"),
                       token="second-account-token-321").status_code == 200
    # the install's token too, for a number of the tenant (its provider then is the built-in one)
    assert twilio_hook(client, tenant.tenant_id, twilio_inbound("install", account="ACINSTALL"),
                       token=INSTALL_TOKEN).status_code == 200
    (message,) = twiml(twilio_hook(client, tenant.tenant_id, twilio_inbound("HELP", account="AC999"),
                                   token="second-account-token-321"))
    assert message.text == HELP_TEXT
    listed = messages(client, tenant, lead_id)
    assert [(m["body"], m["direction"], m["providerId"]) for m in listed] == [
        (HELP_TEXT, "outbound", "tw2"), ("HELP", "inbound", "tw2"), ("install", "inbound", None),
        ("second", "inbound", "tw2"), ("first", "inbound", "tw")]


def test_unknown_tenant_provider_and_unreadable_bodies(client, tenant, runtime):
    submit(client, tenant)
    before = stored(runtime)
    form = twilio_inbound("Hello")
    for tenant_id in ("ten_doesnotexist", "x" * 64):
        answer = twilio_hook(client, tenant_id, form)
        assert answer.status_code in (403, 404), answer.text
    answer = twilio_hook(client, tenant.tenant_id, form, path=hook_path("nexmo", tenant.tenant_id),
                         url=BASE + hook_path("nexmo", tenant.tenant_id))
    refused(answer, 404, "NOT_FOUND")
    # signed, but not a message Twilio sends
    for unreadable in ({"Foo": "bar"}, {"Body": "no sid", "From": LEAD_PHONE}, {}):
        details = refused(twilio_hook(client, tenant.tenant_id, unreadable), 400, "VALIDATION_ERROR")["details"]
        assert details == ["body: not a twilio webhook this appliance can read"]
    # a body that is no form at all cannot even be checked
    path = hook_path("twilio", tenant.tenant_id)
    refused(client.post(path, content=b"\xff\xfe\x00garbage",
                        headers={"X-Twilio-Signature": twilio_signature(TOKEN, BASE + path, {})}))
    # a status Twilio reports of inbound texts (receiving / received) is no delivery report
    assert twilio_hook(client, tenant.tenant_id, twilio_status("SMx", "received")).status_code == 200
    assert stored(runtime) == before


# ---- Telnyx ---------------------------------------------------------------------------------------------

def test_telnyx_reply_and_help_sent_through_its_api(client, telnyx_tenant, fake):
    lead_id = submit(client, telnyx_tenant, campaign_id="TC01")["leadId"]
    received(telnyx_hook(client, telnyx_tenant.tenant_id, telnyx_inbound("Hello there", message_id="tx-in-1")))
    (reply,) = messages(client, telnyx_tenant, lead_id)
    assert (reply["direction"], reply["status"], reply["from"], reply["to"], reply["body"], reply["provider"],
            reply["providerId"], reply["providerMessageId"]) == \
        ("inbound", "received", LEAD_PHONE, TELNYX_NUMBER, "Hello there", "telnyx", "tx", "tx-in-1")
    assert fake.requests_to(TELNYX_PATH) == []

    received(telnyx_hook(client, telnyx_tenant.tenant_id, telnyx_inbound(" Help ")))
    assert wait_until(lambda: len(fake.requests_to(TELNYX_PATH)) == 1, 5)
    (request,) = fake.requests_to(TELNYX_PATH)
    assert request.headers["authorization"] == "Bearer tenant-telnyx-key-1"
    assert request.json() == {"from": TELNYX_NUMBER, "to": LEAD_PHONE, "text": HELP_TEXT}
    assert wait_until(lambda: messages(client, telnyx_tenant, lead_id)[0]["status"] == "sent", 5)
    answer, question, first = messages(client, telnyx_tenant, lead_id)
    assert (answer["direction"], answer["body"], answer["from"], answer["to"], answer["providerMessageId"]) == \
        ("outbound", HELP_TEXT, TELNYX_NUMBER, LEAD_PHONE, "tx-0001")
    assert (question["direction"], question["body"]) == ("inbound", " Help ")
    assert answer["interactionId"] == question["interactionId"] == first["interactionId"]

    # HELP from a phone no lead has: both kept as orphans, the answer sent all the same
    received(telnyx_hook(client, telnyx_tenant.tenant_id, telnyx_inbound("info", sender=STRANGER)))
    assert wait_until(lambda: len(fake.requests_to(TELNYX_PATH)) == 2, 5)
    assert fake.requests_to(TELNYX_PATH)[1].json() == {"from": TELNYX_NUMBER, "to": STRANGER, "text": HELP_TEXT}
    assert wait_until(lambda: orphans(client, telnyx_tenant)[0]["status"] == "sent", 5)
    answer, question = orphans(client, telnyx_tenant)
    assert (answer["direction"], answer["from"], answer["to"], answer["body"], answer["providerMessageId"]) == \
        ("outbound", TELNYX_NUMBER, STRANGER, HELP_TEXT, "tx-0002")
    assert (question["direction"], question["from"], question["body"]) == ("inbound", STRANGER, "info")


def test_telnyx_help_the_provider_refuses_is_kept_failed(client, telnyx_tenant, fake):
    fake.route(TELNYX_PATH, status=422, body={"errors": [{"code": "40310", "title": "Invalid 'to' address"}]})
    lead_id = submit(client, telnyx_tenant, campaign_id="TC01")["leadId"]
    received(telnyx_hook(client, telnyx_tenant.tenant_id, telnyx_inbound("HELP")))
    assert wait_until(lambda: messages(client, telnyx_tenant, lead_id)[0]["status"] != "sending", 5)
    answer = messages(client, telnyx_tenant, lead_id)[0]
    assert (answer["direction"], answer["status"], answer["providerMessageId"]) == ("outbound", "failed", None)


@pytest.mark.parametrize("reported, status", [
    ("queued", "queued"), ("sending", "queued"), ("sent", "sent"), ("delivery_unconfirmed", "sent"),
    ("delivered", "delivered"), ("delivery_failed", "undelivered"), ("expired", "undelivered"),
    ("sending_failed", "failed"),
])
def test_telnyx_statuses_map_to_the_appliances(reported, status):
    errors = [{"code": "40002", "title": "Blocked as spam", "detail": "The message was flagged."}]
    body = json.dumps(telnyx_status("m-1", reported, errors=errors)).encode()
    webhook = SmsWebhook(url="https://x", headers={}, body=body, credentials=[], settings={}, now=datetime.now(UTC))
    (event,) = TelnyxProvider().read_webhook(webhook)
    assert (event.kind, event.provider_message_id, event.status, event.provider_status) == \
        ("status", "m-1", status, reported)
    expected = "Blocked as spam - The message was flagged. (code 40002)"
    assert event.reason == (expected if status in ("undelivered", "failed") else None)


def test_telnyx_delivery_reports(client, telnyx_tenant, runtime):
    lead_id = submit(client, telnyx_tenant, campaign_id="TC01")["leadId"]
    texts = [sent(client, telnyx_tenant, lead_id, f"text {n}") for n in range(4)]
    ids = [t["providerMessageId"] for t in texts]
    assert ids == ["tx-0001", "tx-0002", "tx-0003", "tx-0004"]

    def report(message_id: str, status: str, event_type: str = "message.finalized", errors=None) -> None:
        received(telnyx_hook(client, telnyx_tenant.tenant_id, telnyx_status(message_id, status, event_type, errors)))

    def state(n: int) -> tuple:
        found = _status_of(client, telnyx_tenant, lead_id, texts[n]["messageId"])
        return found["status"], found["providerStatus"], found["reason"]

    report(ids[0], "sent", "message.sent")
    assert state(0) == ("sent", "queued", None)  # already `sent` when Telnyx took it
    report(ids[0], "delivered")
    report(ids[0], "sent", "message.sent")  # late
    assert state(0) == ("delivered", "delivered", None)
    report(ids[1], "delivery_failed", errors=[{"code": "40300", "title": "Blocked by carrier"}])
    assert state(1) == ("undelivered", "delivery_failed", "Blocked by carrier (code 40300)")
    report(ids[2], "sending_failed", errors=[{"code": "40008", "title": "Undeliverable", "detail": "Landline"}])
    assert state(2) == ("failed", "sending_failed", "Undeliverable - Landline (code 40008)")
    report(ids[3], "delivery_unconfirmed")
    assert state(3) == ("sent", "queued", None)
    report(ids[3], "expired")
    assert state(3) == ("undelivered", "expired", None)

    before = stored(runtime)
    report("tx-unknown", "delivered")
    report(ids[0], "some_future_status")
    # other events Telnyx sends are taken and kept nowhere
    other = {"data": {"event_type": "number_order.complete", "id": "e", "payload": {"id": "order-1"}}}
    received(telnyx_hook(client, telnyx_tenant.tenant_id, other))
    assert stored(runtime) == before


def test_telnyx_replay_window(client, telnyx_tenant, runtime):
    lead_id = submit(client, telnyx_tenant, campaign_id="TC01")["leadId"]
    now = datetime(2026, 3, 10, 15, 0, tzinfo=UTC)
    runtime.clock = FakeClock(now)
    stamp = int(now.timestamp())
    before = stored(runtime)
    for offset in (-360, -301, 301, 360, -86400):
        answer = telnyx_hook(client, telnyx_tenant.tenant_id, telnyx_inbound(f"at {offset}"), timestamp=stamp + offset)
        refused(answer)
    assert stored(runtime) == before
    for offset in (-300, -240, 0, 240, 300):
        received(telnyx_hook(client, telnyx_tenant.tenant_id, telnyx_inbound(f"at {offset}"), timestamp=stamp + offset))
    assert [m["body"] for m in messages(client, telnyx_tenant, lead_id)] == [
        "at 300", "at 240", "at 0", "at -240", "at -300"]

    # the same signed call again: within the window a retry (nothing new), later a replay (403)
    payload = telnyx_inbound("once", message_id="tx-once")
    for _ in range(2):
        received(telnyx_hook(client, telnyx_tenant.tenant_id, payload, timestamp=stamp))
    runtime.clock.advance(minutes=6)
    refused(telnyx_hook(client, telnyx_tenant.tenant_id, payload, timestamp=stamp))
    assert [m["body"] for m in messages(client, telnyx_tenant, lead_id)].count("once") == 1


def test_telnyx_bad_signatures_are_refused(client, runtime, telnyx_tenant):
    other = make_tenant(runtime, "Other Telnyx", telnyx_bundle(OTHER_TELNYX_KEY, number="+14155550401", code="TO1"))
    submit(client, telnyx_tenant, campaign_id="TC01")
    before = stored(runtime)
    payload = telnyx_inbound("STOP")
    body = json.dumps(payload).encode()
    stamp = str(int(datetime.now(UTC).timestamp()))
    signature = base64.b64encode(TELNYX_KEY.sign(stamp.encode() + b"|" + body)).decode()
    tenant_id = telnyx_tenant.tenant_id
    attempts = [
        telnyx_hook(client, tenant_id, payload, headers={"telnyx-signature-ed25519": None}),
        telnyx_hook(client, tenant_id, payload, headers={"telnyx-timestamp": None}),
        telnyx_hook(client, tenant_id, payload, headers={"telnyx-signature-ed25519": "", "telnyx-timestamp": ""}),
        telnyx_hook(client, tenant_id, payload, headers={"telnyx-signature-ed25519": "not base64!"}),
        telnyx_hook(client, tenant_id, payload, headers={"telnyx-timestamp": "soon"}),
        telnyx_hook(client, tenant_id, payload, headers={"telnyx-timestamp": str(int(stamp) + 1)}),  # not what was signed
        telnyx_hook(client, tenant_id, payload, key=STRANGE_KEY),                 # a key nobody configured
        telnyx_hook(client, tenant_id, payload, key=OTHER_TELNYX_KEY),           # another tenant's
        # the body changed after signing
        client.post(hook_path("telnyx", tenant_id), content=body.replace(b"STOP", b"HELP"),
                    headers={"telnyx-timestamp": stamp, "telnyx-signature-ed25519": signature}),
        # signed for this tenant, posted on the other's path (its own key) and an unknown tenant's
        telnyx_hook(client, other.tenant_id, payload),
        telnyx_hook(client, "ten_doesnotexist", payload),
    ]
    for answer in attempts:
        refused(answer)
    assert stored(runtime) == before
    assert opt_out(client, telnyx_tenant, LEAD_PHONE)["optedOut"] is False
    # unreadable, but properly signed: 400
    for unreadable in (b"not json", b"[]", json.dumps({"data": {"event_type": "message.received",
                                                                "payload": {"text": "no id"}}}).encode()):
        refused(telnyx_hook(client, tenant_id, unreadable), 400, "VALIDATION_ERROR")
    assert stored(runtime) == before


def test_install_wide_telnyx_public_key(client, runtime, fake):
    first = make_tenant(runtime, "First", install_bundle("+14155550101", "IA1", help_text="Acme help"))
    second = make_tenant(runtime, "Second", install_bundle("+14155550102", "IB1"))
    lead_id = submit(client, first, campaign_id="IA1")["leadId"]
    submit(client, second, campaign_id="IB1")
    before = stored(runtime)
    to_first = telnyx_inbound("Hi", to="+14155550101")
    answer = telnyx_hook(client, second.tenant_id, to_first, key=INSTALL_TELNYX_KEY)
    assert refused(answer)["message"] == "The message is not addressed to a number of this tenant"
    refused(telnyx_hook(client, second.tenant_id, telnyx_inbound("Hi", to="+14155550999"), key=INSTALL_TELNYX_KEY))
    refused(telnyx_hook(client, first.tenant_id, to_first, key=TELNYX_KEY))  # a tenant key of no tenant here
    assert stored(runtime) == before
    received(telnyx_hook(client, first.tenant_id, to_first, key=INSTALL_TELNYX_KEY))
    assert [m["body"] for m in messages(client, first, lead_id)] == ["Hi"]
    # HELP answered through Telnyx with the install's API key
    received(telnyx_hook(client, first.tenant_id, telnyx_inbound("HELP", to="+14155550101"), key=INSTALL_TELNYX_KEY))
    assert wait_until(lambda: len(fake.requests_to(TELNYX_PATH)) == 1, 5)
    (request,) = fake.requests_to(TELNYX_PATH)
    assert request.headers["authorization"] == "Bearer install-telnyx-key"
    assert request.json() == {"from": "+14155550101", "to": LEAD_PHONE, "text": "Acme help"}
    assert wait_until(lambda: messages(client, first, lead_id)[0]["status"] == "sent", 5)
    assert messages(client, first, lead_id)[0]["providerId"] is None


# ---- keywords -----------------------------------------------------------------------------------------------

STOP_WORDS = ("STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT", "REVOKE", "OPTOUT")


def _mixed(word: str) -> str:
    return "".join(c.lower() if i % 2 else c for i, c in enumerate(word))


def test_every_stop_word_opts_the_phone_out(client, tenant, other_tenant, runtime):
    now = datetime(2026, 3, 10, 15, 0, tzinfo=UTC)
    runtime.clock = FakeClock(now)
    lead_id = submit(client, tenant)["leadId"]
    phones = [f"+1415555{n:04d}" for n in range(201, 201 + 2 * len(STOP_WORDS))]
    variants = [text for word in STOP_WORDS for text in (f"  {_mixed(word)} ", f"\t{word.lower()}\n")]
    for phone, text in zip(phones, variants, strict=True):
        assert opt_out(client, tenant, phone) == {"optedOut": False, "since": None}
        assert list(twiml(twilio_hook(client, tenant.tenant_id, twilio_inbound(text, sender=phone)))) == []
        assert opt_out(client, tenant, phone) == {"optedOut": True, "since": "2026-03-10T15:00:00.000Z"}, text
        assert opt_out(client, other_tenant, phone)["optedOut"] is False  # the tenant's opt-out only
    # a lead's STOP is kept in its conversation like any text
    twilio_hook(client, tenant.tenant_id, twilio_inbound("Stop"))
    assert opt_out(client, tenant, LEAD_PHONE)["optedOut"] is True
    assert [m["body"] for m in messages(client, tenant, lead_id)] == ["Stop"]
    keywords = {row[0] for row in engine(runtime.store).reader().execute("SELECT keyword FROM sms_opt_outs")}
    assert keywords == set(STOP_WORDS)


def test_start_opts_back_in_and_a_second_stop_keeps_the_first_date(client, tenant, runtime):
    clock = FakeClock(datetime(2026, 3, 10, 15, 0, tzinfo=UTC))
    runtime.clock = clock
    for word in ("START", " unstop "):
        twilio_hook(client, tenant.tenant_id, twilio_inbound("STOP"))
        clock.advance(hours=1)
        twilio_hook(client, tenant.tenant_id, twilio_inbound("quit"))
        assert opt_out(client, tenant, LEAD_PHONE) == {"optedOut": True, "since": "2026-03-10T15:00:00.000Z"}
        twilio_hook(client, tenant.tenant_id, twilio_inbound(word))
        assert opt_out(client, tenant, LEAD_PHONE) == {"optedOut": False, "since": None}
        clock.set(datetime(2026, 3, 10, 15, 0, tzinfo=UTC))
    twilio_hook(client, tenant.tenant_id, twilio_inbound("start"))  # opted in already: nothing to undo
    clock.advance(days=2)
    twilio_hook(client, tenant.tenant_id, twilio_inbound("End"))
    assert opt_out(client, tenant, LEAD_PHONE) == {"optedOut": True, "since": "2026-03-12T15:00:00.000Z"}


def test_text_that_only_contains_a_keyword_is_no_keyword(client, tenant, runtime):
    lead_id = submit(client, tenant)["leadId"]
    texts = ["Please stop texting me", "stop it", "STOP NOW", "unstoppable", "S T O P", "STOP STOP",
             "helpful, thanks", "I need help", "information please", ""]
    for text in texts:
        answer = twilio_hook(client, tenant.tenant_id, twilio_inbound(text))
        assert list(twiml(answer)) == [], text  # no HELP answer either
    assert opt_out(client, tenant, LEAD_PHONE)["optedOut"] is False
    assert stored(runtime)["sms_opt_outs"] == []
    listed = messages(client, tenant, lead_id)
    assert sorted(m["body"] for m in listed) == sorted(texts) and {m["direction"] for m in listed} == {"inbound"}


def test_help_is_answered_in_twiml_and_kept_as_sent(client, tenant, fake):
    lead_id = submit(client, tenant)["leadId"]
    for n, word in enumerate(("HELP", " info ", "Help")):
        answer = twilio_hook(client, tenant.tenant_id, twilio_inbound(word))
        (message,) = twiml(answer)
        assert (message.tag, message.text) == ("Message", HELP_TEXT)
        assert b"Acme &amp; Sons &lt;legal&gt;:" in answer.content  # escaped in the XML
        listed = messages(client, tenant, lead_id)
        assert len(listed) == 2 * (n + 1)
        reply, question = listed[:2]
        assert (question["direction"], question["body"]) == ("inbound", word)
        assert (reply["direction"], reply["status"], reply["body"], reply["from"], reply["to"], reply["provider"],
                reply["providerId"], reply["providerMessageId"]) == \
            ("outbound", "sent", HELP_TEXT, NUMBER, LEAD_PHONE, "twilio", "tw", None)
        assert reply["interactionId"] == question["interactionId"]
    assert fake.requests == []  # Twilio sends the TwiML answer itself
    # from a phone no lead has: kept as orphans
    (message,) = twiml(twilio_hook(client, tenant.tenant_id, twilio_inbound("HELP", sender=STRANGER)))
    assert message.text == HELP_TEXT
    assert [(o["direction"], o["status"], o["body"]) for o in orphans(client, tenant)] == [
        ("outbound", "sent", HELP_TEXT), ("inbound", "received", "HELP")]


def test_help_without_a_help_text_answers_nothing(client, other_tenant, runtime, fake):
    lead_id = submit(client, other_tenant, campaign_id="OC01")["leadId"]
    answer = twilio_hook(client, other_tenant.tenant_id, twilio_inbound("HELP", to=OTHER_NUMBER), token=OTHER_TOKEN)
    assert list(twiml(answer)) == []
    assert answer.content.decode().endswith("<Response></Response>")
    assert [(m["direction"], m["body"]) for m in messages(client, other_tenant, lead_id)] == [("inbound", "HELP")]
    assert fake.requests == []


def test_texts_to_an_opted_out_phone_are_refused(client, tenant, other_tenant, runtime, fake):
    lead_id = submit(client, tenant)["leadId"]
    other_lead = submit(client, tenant, "+14155550126")["leadId"]
    their_lead = submit(client, other_tenant, campaign_id="OC01")["leadId"]
    first = sent(client, tenant, lead_id, "Hi")
    twilio_hook(client, tenant.tenant_id, twilio_inbound("STOP"))
    before, calls = stored(runtime), len(fake.requests)
    for attempt in (send(client, tenant, lead_id, "Are you sure?"),
                    send(client, tenant, lead_id, "x", interactionId=first["interactionId"]),
                    send(client, tenant, other_lead, "x", to=LEAD_PHONE)):
        error = refused(attempt, 409, "INVALID_STATE")
        assert error["message"] == "recipient opted out"
    assert stored(runtime) == before and len(fake.requests) == calls
    # another lead, another phone, another tenant: sent
    assert sent(client, tenant, other_lead)["to"] == "+14155550126"
    assert sent(client, other_tenant, their_lead)["to"] == LEAD_PHONE
    # START: texts go again
    twilio_hook(client, tenant.tenant_id, twilio_inbound("START"))
    assert sent(client, tenant, lead_id, "Welcome back")["status"] == "sent"


def test_opt_outs_are_kept_hashed(client, tenant, runtime, config):
    twilio_hook(client, tenant.tenant_id, twilio_inbound("STOP", sender="+14155550127"))
    rows = stored(runtime)["sms_opt_outs"]
    assert len(rows) == 1
    (tenant_id, digest, keyword, since) = rows[0]
    assert tenant_id == tenant.tenant_id and keyword == "STOP" and since.endswith("Z")
    assert digest == hashlib.sha256(b"phone:+14155550127").digest()
    assert not any(part in str(rows) for part in ("4155550127", "555-0127", "5550127"))
    assert opt_out(client, tenant, "+14155550127")["optedOut"] is True


def test_opt_out_check_reads_national_numbers_and_names_a_bad_phone(client, tenant):
    twilio_hook(client, tenant.tenant_id, twilio_inbound("STOP"))
    for phone in (LEAD_PHONE, "(415) 555-0123", "415.555.0123", "+1 415 555 0123", "4155550123"):
        assert opt_out(client, tenant, phone)["optedOut"] is True, phone
    assert opt_out(client, tenant, "(415) 555-0124") == {"optedOut": False, "since": None}
    for params in ({"phone": "not a phone"}, {"phone": "12"}, {"phone": "+1 415"}, {"phone": ""}, {}):
        answer = client.get("/api/v1/sms/opt-outs/check", headers=tenant.headers, params=params)
        details = refused(answer, 400, "VALIDATION_ERROR")["details"]
        assert details and all(d.startswith("phone: ") for d in details), details
    assert client.get("/api/v1/sms/opt-outs/check", params={"phone": LEAD_PHONE}).status_code == 401


# ---- sms-opt-outs as a suppression list ------------------------------------------------------------------

def test_sms_opt_outs_suppress_leads_of_a_campaign_naming_the_list(client, runtime, cli, tmp_path):
    bundle = twilio_bundle(qualification={"suppressionListIds": ["sms-opt-outs"]})
    tenant = make_tenant(runtime, "Suppressing", bundle)
    other = make_tenant(runtime, "Other", twilio_bundle("O", token=OTHER_TOKEN, sid="ACOTHER", number=OTHER_NUMBER,
                                                         qualification={"suppressionListIds": ["sms-opt-outs"]}))
    twilio_hook(client, tenant.tenant_id, twilio_inbound("STOP", sender=STRANGER))
    suppressed = submit(client, tenant, "(415) 555-0177")
    assert suppressed["status"] == "suppressed"
    lead = client.get(f"/api/v1/leads/{suppressed['leadId']}", headers=tenant.headers).json()["data"]
    assert lead["status"] == "suppressed"
    assert lead["submissions"][-1]["result"].lower().replace("-", " ") == "suppressed by list sms opt outs"
    assert "0177" not in json.dumps(lead["submissions"][-1]["journeyEvents"])
    # only STOP and START change it: the suppression lists API does not
    added = client.post("/api/v1/suppression-lists/sms-opt-outs/entries", json={"add": ["+14155550128"]},
                        headers=tenant.headers)
    assert added.status_code >= 400, added.text
    assert submit(client, tenant, "+14155550128")["status"] != "suppressed"
    assert submit(client, other, STRANGER, "OC01")["status"] != "suppressed"  # the other tenant's STOPs only
    twilio_hook(client, tenant.tenant_id, twilio_inbound("UNSTOP", sender=STRANGER))
    assert submit(client, tenant, STRANGER)["status"] != "suppressed"

    # a list that does not exist is still refused, beside sms-opt-outs
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(twilio_bundle(qualification={"suppressionListIds": ["sms-opt-outs", "sup_nope"]})))
    result = cli("import", "--tenant", tenant.tenant_id, str(path), expect=1)
    assert result.stderr.strip() == "error: campaigns[0].qualification.suppressionListIds[1]: unknown suppression list"
    with pytest.raises(tenancy.BundleError) as problem:
        tenancy.import_bundle(runtime, tenant.tenant_id, msgspec.json.encode(
            twilio_bundle(qualification={"suppressionListIds": ["sup_nope"]})), "json")
    assert problem.value.problems == ["campaigns[0].qualification.suppressionListIds[0]: unknown suppression list"]


def test_a_stop_after_the_submit_suppresses_the_lead_at_delivery(runtime, tmp_path):
    bundle = {"sms": {"providers": [{"providerId": "tw", "type": "twilio", "accountSid": "AC123", "authToken": TOKEN}],
                      "numbers": [{"number": NUMBER, "campaignIds": ["SD1"]}], "defaultProviderId": "tw"},
              "deliveryEndpoints": [endpoint()],
              "campaigns": [campaign("SD1", "Delivered", delivery={"deliveryEndpointId": "ep"},
                                     qualification={"suppressionListIds": ["sms-opt-outs"]})]}
    tenant = make_tenant(runtime, "Late STOP", bundle)
    with app_client(runtime) as quiet:
        lead = submit(quiet, tenant, campaign_id="SD1")
        assert lead["status"] == "qualified"
        assert twilio_hook(quiet, tenant.tenant_id, twilio_inbound("STOP")).status_code == 200
    with live_app(runtime, tmp_path) as live:
        done = wait_for(live, tenant, lead["leadId"], status_is("suppressed", "delivered", "failed"))
    assert done["status"] == "suppressed"


def test_bad_public_keys_and_help_texts_are_refused(runtime, tmp_path, config_file):
    tenant_id = tenancy.create_tenant(runtime, "Bad keys")
    short_key = base64.b64encode(b"x" * 31).decode()
    for provider_change, sms_change, field in (
            ({"publicKey": "not base64!"}, {}, "sms.providers[0].publicKey"),
            ({"publicKey": short_key}, {}, "sms.providers[0].publicKey"),
            ({}, {"helpText": ""}, "sms.helpText"),
            ({}, {"helpText": "x" * 1601}, "sms.helpText")):
        bundle = telnyx_bundle()
        bundle["sms"]["providers"][0].update(provider_change)
        bundle["sms"].update(sms_change)
        with pytest.raises(tenancy.BundleError) as problem:
            tenancy.import_bundle(runtime, tenant_id, msgspec.json.encode(bundle), "json")
        assert any(p.startswith(f"{field}: ") for p in problem.value.problems), problem.value.problems
    bad = tmp_path / "bad.toml"
    bad.write_text(config_file.read_text().replace(_raw_public(INSTALL_TELNYX_KEY), short_key))
    with pytest.raises(ConfigError) as error:
        load_config(bad)
    assert "public_key" in str(error.value)


# ---- logs ---------------------------------------------------------------------------------------------------

def test_refusals_log_a_warning_without_the_text_or_the_phone(client, tenant, telnyx_tenant, runtime, caplog):
    secret_text = "my confidential injury details"
    caplog.set_level(logging.DEBUG)
    form = twilio_inbound(secret_text, sender="+14155550129")
    twilio_hook(client, tenant.tenant_id, form, signature="")
    twilio_hook(client, tenant.tenant_id, form, token="wrong")
    twilio_hook(client, "ten_unknown", form)
    twilio_hook(client, tenant.tenant_id, {"Body": secret_text, "From": "+14155550129"})  # unreadable
    telnyx_hook(client, telnyx_tenant.tenant_id, telnyx_inbound(secret_text, sender="+14155550129"), key=STRANGE_KEY)
    first = make_tenant(runtime, "First", install_bundle("+14155550101", "IA1"))
    twilio_hook(client, first.tenant_id, twilio_inbound(secret_text, sender="+14155550129", to="+14155550199"),
                token=INSTALL_TOKEN)
    warnings = [r for r in caplog.records if r.name.startswith("appliance") and r.levelno == logging.WARNING
                and "SMS webhook" in r.getMessage()]
    assert len(warnings) == 6, [r.getMessage() for r in caplog.records]
    assert all("refused" in r.getMessage() for r in warnings)
    assert any(tenant.tenant_id in r.getMessage() for r in warnings)
    everything = caplog.text + "".join(r.getMessage() for r in caplog.records)
    for leak in (secret_text, "4155550129", "confidential", TOKEN, INSTALL_TOKEN):
        assert leak not in everything, leak
    assert stored(runtime)["sms_messages"] == []
    # nor does reading an opt-out log the phone asked about
    assert opt_out(client, tenant, "+14155550129")["optedOut"] is False
    assert "4155550129" not in caplog.text


# ---- plugin providers ------------------------------------------------------------------------------------

BAD_PLUGINS = '''
from appliance.sdk import SmsEvent, SmsProvider, SmsResult, hookimpl


class Base(SmsProvider):
    async def send(self, message, http):
        return SmsResult(accepted=False, status="failed", reason="not sending")


class Raising(Base):
    name = "raising_sms"

    def verify_webhook(self, webhook):
        raise RuntimeError("verify blew up with " + webhook.credentials[0]["apiKey"])


class Garbage(Base):
    name = "garbage_sms"

    def verify_webhook(self, webhook):
        return webhook.headers.get("x-secret") == webhook.credentials[0].get("apiKey")

    def read_webhook(self, webhook):
        kind = webhook.body.decode()
        if kind == "string":
            return "garbage"
        if kind == "dicts":
            return [{"kind": "inbound"}]
        if kind == "untyped":
            return [SmsEvent(kind="inbound", provider_message_id=42, sender="+14155550123")]
        if kind == "bad-status":
            return [SmsEvent(kind="status", provider_message_id="m", status="teleported")]
        if kind == "objects":
            return [object()]
        if kind == "help":
            return [SmsEvent(kind="inbound", provider_message_id="h1", sender="+14155550123", to="+14155552671",
                             body="HELP")]
        raise ValueError("read blew up")

    def webhook_answer(self, reply):
        raise RuntimeError("answer blew up")


class Legacy(Base):
    name = "legacy_sms"  # written before API revision 4: takes no webhooks


@hookimpl
def appliance_sms_providers():
    return [Raising(), Garbage(), Legacy()]
'''

EXAMPLE_SECRET = "example-shared-secret-0042"


def plugin_bundle(base_url: str) -> dict:
    return {"sms": {"providers": [
        {"providerId": "ex", "type": "example_sms", "apiKey": EXAMPLE_SECRET, "baseUrl": base_url},
        {"providerId": "raise", "type": "raising_sms", "apiKey": "raising-secret-0042"},
        {"providerId": "junk", "type": "garbage_sms", "apiKey": "junk-secret"},
        {"providerId": "old", "type": "legacy_sms", "apiKey": "o"}],
        "numbers": [{"number": NUMBER, "campaignIds": ["PL1"]}], "defaultProviderId": "ex", "helpText": HELP_TEXT},
        "campaigns": [campaign("PL1", "Plugin texts")]}


def example(client, tenant_id: str, body: dict | bytes, secret: str | None = EXAMPLE_SECRET):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} | ({"X-Example-Secret": secret} if secret is not None else {})
    return client.post(hook_path("example_sms", tenant_id), content=content, headers=headers)


@pytest.mark.parametrize("config_extra", ["[delivery]\nallow_private_addresses = true\n"])
def test_a_plugin_provider_takes_webhooks(runtime, tmp_path, fake, cli):
    shutil.copy(ROOT / "plugins" / "example_sms_webhook.py", tmp_path / "plugins")
    (tmp_path / "plugins" / "bad_sms.py").write_text(textwrap.dedent(BAD_PLUGINS))
    report = cli.json("plugins")
    assert report["errors"] == []
    assert {("sms", "example_sms"), ("sms", "raising_sms"), ("sms", "garbage_sms")} <= \
        {(a["kind"], a["name"]) for a in report["adapters"]}
    tenant = make_tenant(runtime, "Plugged", plugin_bundle(fake.url("/example")))
    with app_client(runtime) as client:
        lead_id = submit(client, tenant, campaign_id="PL1")["leadId"]
        text = sent(client, tenant, lead_id, "Hello from a plugin")
        assert (text["provider"], text["providerMessageId"]) == ("example_sms", "ex-0001")

        before = stored(runtime)
        for secret in (None, "", "wrong-secret", EXAMPLE_SECRET.upper()):
            refused(example(client, tenant.tenant_id, {"id": "p1", "from": LEAD_PHONE, "to": NUMBER, "text": "x"},
                            secret))
        refused(example(client, "ten_unknown", {"id": "p1", "from": LEAD_PHONE, "to": NUMBER, "text": "x"}))
        refused(example(client, tenant.tenant_id, b"not json"), 400, "VALIDATION_ERROR")
        assert stored(runtime) == before

        received(example(client, tenant.tenant_id, {"id": "p1", "from": LEAD_PHONE, "to": NUMBER, "text": "Hi back"}))
        received(example(client, tenant.tenant_id, {"id": "p1", "from": LEAD_PHONE, "to": NUMBER, "text": "Hi back"}))
        received(example(client, tenant.tenant_id, {"id": "ex-0001", "status": "delivered"}))
        received(example(client, tenant.tenant_id, {"id": "ex-0001", "status": "sent"}))  # late
        listed = messages(client, tenant, lead_id)
        assert [(m["direction"], m["status"], m["body"]) for m in listed] == [
            ("inbound", "received", "Hi back"), ("outbound", "delivered", "Hello from a plugin")]
        assert listed[0]["interactionId"] == listed[1]["interactionId"]
        assert (listed[0]["provider"], listed[0]["providerId"]) == ("example_sms", "ex")

        # keywords apply to plugin providers; HELP is sent through the plugin's `send`
        received(example(client, tenant.tenant_id, {"id": "p2", "from": LEAD_PHONE, "to": NUMBER, "text": "stop"}))
        assert opt_out(client, tenant, LEAD_PHONE)["optedOut"] is True
        received(example(client, tenant.tenant_id, {"id": "p3", "from": LEAD_PHONE, "to": NUMBER, "text": "HELP"}))
        assert wait_until(lambda: len(fake.requests_to(EXAMPLE_PATH)) == 2, 5)
        help_request = fake.requests_to(EXAMPLE_PATH)[1]
        assert help_request.headers["authorization"] == f"Bearer {EXAMPLE_SECRET}"
        assert help_request.json() == {"from": NUMBER, "to": LEAD_PHONE, "text": HELP_TEXT}
        assert wait_until(lambda: messages(client, tenant, lead_id)[0]["status"] == "sent", 5)
        assert messages(client, tenant, lead_id)[0]["providerMessageId"] == "ex-0002"


@pytest.mark.parametrize("config_extra", ["[delivery]\nallow_private_addresses = true\n"])
def test_broken_plugin_providers_are_refused_and_logged(runtime, tmp_path, fake, caplog):
    (tmp_path / "plugins" / "bad_sms.py").write_text(textwrap.dedent(BAD_PLUGINS))
    tenant = make_tenant(runtime, "Plugged", plugin_bundle(fake.url("/example")))
    caplog.set_level(logging.WARNING)
    with app_client(runtime) as client:
        lead_id = submit(client, tenant, campaign_id="PL1")["leadId"]
        before = stored(runtime)
        # verify_webhook raises: unverified
        refused(client.post(hook_path("raising_sms", tenant.tenant_id), content=b"{}"))
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any("'raising_sms'" in e and "'bad_sms'" in e and "verify_webhook raised" in e and
                   "verify blew up with ***" in e for e in errors), errors  # the plugin named, the secret masked
        assert "raising-secret-0042" not in caplog.text
        # a provider without verify_webhook refuses every webhook
        refused(client.post(hook_path("legacy_sms", tenant.tenant_id), content=b"{}"))
        # read_webhook returns what is no list of SmsEvent, or raises: unreadable
        for body in (b"string", b"dicts", b"untyped", b"bad-status", b"objects", b"raise"):
            answer = client.post(hook_path("garbage_sms", tenant.tenant_id), content=body,
                                 headers={"X-Secret": "junk-secret"})
            refused(answer, 400, "VALIDATION_ERROR")
        assert any("garbage_sms" in r.getMessage() and "read blew up" in r.getMessage() for r in caplog.records)
        refused(client.post(hook_path("garbage_sms", tenant.tenant_id), content=b"string",
                            headers={"X-Secret": "nope"}))
        assert stored(runtime) == before
        # webhook_answer raises: the default answer, and the HELP text sent through the provider's send
        received(client.post(hook_path("garbage_sms", tenant.tenant_id), content=b"help",
                             headers={"X-Secret": "junk-secret"}))
        assert any("garbage_sms" in r.getMessage() and "webhook_answer raised" in r.getMessage()
                   for r in caplog.records)
        assert wait_until(lambda: messages(client, tenant, lead_id)[0]["status"] != "sending", 5)
        answer, question = messages(client, tenant, lead_id)
        assert (question["direction"], question["body"], question["providerId"]) == ("inbound", "HELP", "junk")
        assert (answer["direction"], answer["body"], answer["status"]) == ("outbound", HELP_TEXT, "failed")


# ---- orphan messages: pages, cursors, roles -------------------------------------------------------------

def test_orphan_messages_page_by_cursor(client, tenant, other_tenant, runtime):
    for n in range(5):
        twilio_hook(client, tenant.tenant_id, twilio_inbound(f"orphan {n}", sender=f"+1415555{n + 301:04d}"))
    pages, cursor = [], None
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        answer = client.get("/api/v1/sms/orphan-messages", headers=tenant.headers, params=params)
        assert answer.status_code == 200, answer.text
        page = answer.json()["data"]
        pages.append([item["body"] for item in page["items"]])
        assert page["hasMore"] == (page["nextCursor"] is not None)
        if not page["hasMore"]:
            break
        assert page["nextCursor"] == page["items"][-1]["messageId"]
        cursor = page["nextCursor"]
    assert pages == [["orphan 4", "orphan 3"], ["orphan 2", "orphan 1"], ["orphan 0"]]
    for bad in ("abc", "lead_01ZZZZZZZZZZZZZZZZZZZZZZZZ"):
        answer = client.get("/api/v1/sms/orphan-messages", headers=tenant.headers, params={"cursor": bad})
        assert refused(answer, 400, "VALIDATION_ERROR")["details"][0].startswith("cursor: ")
    refused(client.get("/api/v1/sms/orphan-messages", headers=tenant.headers, params={"limit": 0}), 400,
            "VALIDATION_ERROR")
    assert orphans(client, other_tenant) == []
    assert client.get("/api/v1/sms/orphan-messages").status_code == 401

    viewer = {"X-API-Key": tenancy.create_key(runtime, tenant.tenant_id, name="v", role="viewer").key}
    assert len(client.get("/api/v1/sms/orphan-messages", headers=viewer).json()["data"]["items"]) == 5
    assert client.get("/api/v1/sms/opt-outs/check", headers=viewer, params={"phone": LEAD_PHONE}).status_code == 200
    lead_id = submit(client, tenant)["leadId"]
    assert client.get(f"/api/v1/leads/{lead_id}/messages", headers=viewer).status_code == 200
    assert client.post("/api/v1/sms/send", headers=viewer, json={"leadId": lead_id, "message": "x"}).status_code == 403
    assert client.get(f"/api/v1/leads/{lead_id}/messages", headers=other_tenant.headers).status_code == 404


def test_lead_messages_page_by_cursor(client, tenant):
    lead_id = submit(client, tenant)["leadId"]
    for n in range(3):
        twilio_hook(client, tenant.tenant_id, twilio_inbound(f"in {n}"))
        sent(client, tenant, lead_id, f"out {n}")
    first = client.get(f"/api/v1/leads/{lead_id}/messages", headers=tenant.headers, params={"limit": 4}).json()["data"]
    assert [(m["direction"], m["body"]) for m in first["items"]] == [
        ("outbound", "out 2"), ("inbound", "in 2"), ("outbound", "out 1"), ("inbound", "in 1")]
    rest = client.get(f"/api/v1/leads/{lead_id}/messages", headers=tenant.headers,
                      params={"limit": 4, "cursor": first["nextCursor"]}).json()["data"]
    assert [m["body"] for m in rest["items"]] == ["out 0", "in 0"] and rest["hasMore"] is False


# ---- odd input: never a 500, never a plugin blamed; what a stopped process leaves -------------------

def _no_errors(caplog) -> None:
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("host, url_made", [("testserver.local:abc", False), ("testserver.local:99999", False),
                                            ("[::1", True)])
def test_an_odd_host_header_is_never_a_500(client, tenant, telnyx_tenant, host, url_made, caplog):
    caplog.set_level(logging.WARNING)
    lead_id = submit(client, tenant)["leadId"]
    telnyx_lead = submit(client, telnyx_tenant, campaign_id="TC01")["leadId"]
    path = hook_path("twilio", tenant.tenant_id)
    form = twilio_inbound("odd host")
    answer = client.post(path, content=urlencode(form).encode(), headers={
        "Content-Type": "application/x-www-form-urlencoded", "Host": host,
        "X-Twilio-Signature": twilio_signature(TOKEN, f"http://{host}{path}", form)})
    if url_made:  # the URL as reached is what was signed (not tried with another port)
        assert answer.status_code == 200, answer.text
    else:  # a port that is no port: no URL was reached that a signature could cover
        refused(answer)
    # Telnyx signs no URL: its webhook is taken whatever the Host
    received(telnyx_hook(client, telnyx_tenant.tenant_id, telnyx_inbound("any host"), headers={"Host": host}))
    assert [m["body"] for m in messages(client, tenant, lead_id)] == (["odd host"] if url_made else [])
    assert [m["body"] for m in messages(client, telnyx_tenant, telnyx_lead)] == ["any host"]
    _no_errors(caplog)


@pytest.mark.parametrize("config_extra", [f'[server]\npublic_url = "{PUBLIC}"\n'])
def test_with_public_url_the_host_header_does_not_matter(client, tenant, caplog):
    lead_id = submit(client, tenant)["leadId"]
    path = hook_path("twilio", tenant.tenant_id)
    form = twilio_inbound("behind a proxy")
    answer = client.post(path, content=urlencode(form).encode(), headers={
        "Content-Type": "application/x-www-form-urlencoded", "Host": "testserver.local:abc",
        "X-Twilio-Signature": twilio_signature(TOKEN, PUBLIC + path, form)})
    assert answer.status_code == 200, answer.text
    assert [m["body"] for m in messages(client, tenant, lead_id)] == ["behind a proxy"]
    _no_errors(caplog)


def test_telnyx_timestamps_and_bodies_past_any_limit_are_refused_quietly(client, telnyx_tenant, runtime, caplog):
    caplog.set_level(logging.WARNING)
    submit(client, telnyx_tenant, campaign_id="TC01")
    before = stored(runtime)
    refused(telnyx_hook(client, telnyx_tenant.tenant_id, telnyx_inbound("STOP"), timestamp="1" + "0" * 400))
    refused(telnyx_hook(client, telnyx_tenant.tenant_id, b"[" * 50_000), 400, "VALIDATION_ERROR")  # signed
    assert stored(runtime) == before
    _no_errors(caplog)  # the built-in adapter is not logged as a broken plugin


def test_characters_no_database_holds_are_replaced_never_a_500(client, tenant, telnyx_tenant):
    lead_id = submit(client, tenant)["leadId"]
    telnyx_lead = submit(client, telnyx_tenant, campaign_id="TC01")["leadId"]
    nul = twilio_inbound("a\x00b", sid="SMnul\x00")
    assert twilio_hook(client, tenant.tenant_id, nul).status_code == 200  # PostgreSQL's text holds no NUL
    received(telnyx_hook(client, telnyx_tenant.tenant_id, telnyx_inbound("half an emoji \ud83d")))  # lone surrogate
    received(telnyx_hook(client, telnyx_tenant.tenant_id, telnyx_inbound("hi", sender="+1415555\udc00")))
    (text,) = messages(client, tenant, lead_id)
    assert (text["body"], text["providerMessageId"]) == ("a\ufffdb", "SMnul\ufffd")
    assert [m["body"] for m in messages(client, telnyx_tenant, telnyx_lead)] == ["half an emoji \ufffd"]
    assert [o["from"] for o in orphans(client, telnyx_tenant)] == ["+1415555\ufffd"]
    assert twilio_hook(client, tenant.tenant_id, nul).status_code == 200  # a retry is still known
    assert len(messages(client, tenant, lead_id)) == 1


def test_a_help_answer_a_stopped_process_never_sent_is_settled_as_error(client, telnyx_tenant, runtime, monkeypatch):
    clock = FakeClock(datetime(2026, 3, 10, 15, 0, tzinfo=UTC))
    runtime.clock = clock
    lead_id = submit(client, telnyx_tenant, campaign_id="TC01")["leadId"]

    async def stopped(*args) -> None:  # the process stops between the webhook's answer and the send
        return None

    monkeypatch.setattr(sms_webhooks, "send_reply", stopped)
    stamp = int(clock.now().timestamp())
    received(telnyx_hook(client, telnyx_tenant.tenant_id, telnyx_inbound("HELP"), timestamp=stamp))
    received(telnyx_hook(client, telnyx_tenant.tenant_id, telnyx_inbound("HELP", sender=STRANGER), timestamp=stamp))
    assert messages(client, telnyx_tenant, lead_id)[0]["status"] == orphans(client, telnyx_tenant)[0]["status"] \
        == "sending"
    clock.advance(minutes=11)
    assert asyncio.run(settle_interrupted_sms(runtime)) == 2
    answer, orphan_answer = messages(client, telnyx_tenant, lead_id)[0], orphans(client, telnyx_tenant)[0]
    assert (answer["direction"], answer["status"]) == (orphan_answer["direction"], orphan_answer["status"]) == \
        ("outbound", "error")


NAIVE_PLUGIN = '''
import hmac

from appliance.sdk import SmsEvent, SmsProvider, SmsResult, hookimpl


class Naive(SmsProvider):
    name = "naive_sms"

    async def send(self, message, http):
        return SmsResult(accepted=False, status="failed", reason="not sending")

    def verify_webhook(self, webhook):  # compares with the apiKey, "" when there is none
        given = webhook.headers.get("x-secret", "").encode()
        return any(hmac.compare_digest(given, c.get("apiKey", "").encode()) for c in webhook.credentials)

    def read_webhook(self, webhook):
        return [SmsEvent(kind="inbound", provider_message_id="n1", sender="+14155550123", to="+14155552671",
                         body="STOP")]


@hookimpl
def appliance_sms_providers():
    return [Naive()]
'''


def test_a_provider_with_no_credentials_verifies_nothing(runtime, tmp_path):
    (tmp_path / "plugins" / "naive_sms.py").write_text(NAIVE_PLUGIN)
    tenant = make_tenant(runtime, "No credentials", {
        "sms": {"providers": [{"providerId": "nv", "type": "naive_sms"}],
                "numbers": [{"number": NUMBER, "campaignIds": ["NV1"]}], "defaultProviderId": "nv"},
        "campaigns": [campaign("NV1", "Naive")]})
    with app_client(runtime) as client:
        before = stored(runtime)
        refused(client.post(hook_path("naive_sms", tenant.tenant_id), content=b"{}"))  # no X-Secret either
        assert stored(runtime) == before


def test_bodies_no_provider_sends_are_refused_before_any_signature_is_computed(client, tenant, telnyx_tenant, runtime,
                                                                              monkeypatch):
    computed = []
    real = twilio_adapter.signature
    monkeypatch.setattr(twilio_adapter, "signature", lambda *args: computed.append(1) or real(*args))
    lead_id = submit(client, tenant)["leadId"]
    before = stored(runtime)
    path = hook_path("twilio", tenant.tenant_id)
    # thousands of tiny parameters: each was HMAC input for every token and URL tried (a 1 MiB
    # unsigned body held the event loop for over a second)
    crowded = [*twilio_inbound("crowded").items(), *((f"X{i}", "") for i in range(5000))]
    refused(client.post(path, content=urlencode(crowded).encode(), headers={
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Twilio-Signature": twilio_signature(TOKEN, BASE + path, crowded)}))
    for answer in (twilio_hook(client, tenant.tenant_id, twilio_inbound("x" * 70_000)),
                   telnyx_hook(client, telnyx_tenant.tenant_id, telnyx_inbound("x" * 70_000))):
        assert refused(answer, 413, "PAYLOAD_TOO_LARGE")["message"] == "An SMS webhook's body is at most 64 KiB"
    assert computed == [] and stored(runtime) == before
    # the longest text there is still fits: 1600 characters, each percent-encoded from four bytes
    assert twilio_hook(client, tenant.tenant_id, twilio_inbound("\U0001F600" * 1600)).status_code == 200
    assert messages(client, tenant, lead_id)[0]["body"] == "\U0001F600" * 1600


ASYNC_PLUGIN = '''
from appliance.sdk import SmsEvent, SmsProvider, SmsResult, hookimpl


class Eager(SmsProvider):
    name = "eager_sms"

    async def send(self, message, http):
        return SmsResult(accepted=False, status="failed", reason="not sending")

    async def verify_webhook(self, webhook):  # written like `send`: a coroutine, never awaited
        return False

    def read_webhook(self, webhook):
        return [SmsEvent(kind="inbound", provider_message_id="e1", sender="+14155550123", to="+14155552671",
                         body="STOP")]


@hookimpl
def appliance_sms_providers():
    return [Eager()]
'''


def test_a_verify_webhook_written_async_verifies_nothing(runtime, tmp_path, caplog):
    (tmp_path / "plugins" / "eager_sms.py").write_text(ASYNC_PLUGIN)
    tenant = make_tenant(runtime, "Async plugin", {
        "sms": {"providers": [{"providerId": "eg", "type": "eager_sms", "apiKey": "eager-secret"}],
                "numbers": [{"number": NUMBER, "campaignIds": ["EG1"]}], "defaultProviderId": "eg"},
        "campaigns": [campaign("EG1", "Eager")]})
    with app_client(runtime) as client:
        before = stored(runtime)
        refused(client.post(hook_path("eager_sms", tenant.tenant_id), content=b"{}"))
        assert stored(runtime) == before
        assert opt_out(client, tenant, "+14155550123")["optedOut"] is False
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("'eager_sms'" in e and "verify_webhook" in e for e in errors), errors


def test_a_plugin_providers_national_numbers_are_read_in_the_install_region(runtime, tmp_path):
    shutil.copy(ROOT / "plugins" / "example_sms_webhook.py", tmp_path / "plugins")
    tenant = make_tenant(runtime, "National", {
        "sms": {"providers": [{"providerId": "ex", "type": "example_sms", "apiKey": EXAMPLE_SECRET}],
                "numbers": [{"number": NUMBER, "campaignIds": ["PL1"]}], "defaultProviderId": "ex"},
        "campaigns": [campaign("PL1", "Plugin texts")]})
    with app_client(runtime) as client:
        lead_id = submit(client, tenant, campaign_id="PL1")["leadId"]
        national = {"id": "n1", "from": "(415) 555-0123", "to": NUMBER, "text": "Stop"}
        received(example(client, tenant.tenant_id, national))
        assert opt_out(client, tenant, LEAD_PHONE)["optedOut"] is True  # the STOP is honoured
        assert [m["body"] for m in messages(client, tenant, lead_id)] == ["Stop"]  # and joins its lead
        assert orphans(client, tenant) == []
