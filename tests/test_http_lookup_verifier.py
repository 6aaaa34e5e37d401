"""The built-in `http_lookup` verifier against a real local HTTP server: the request it sends
(mapped fields as a JSON body or a query string, the origin's credentials and only there), how it
reads the answer by JSON paths, every way an answer comes to `unknown`, the SSRF guard and the
step's timeout; then through the HTTP API (rules reading its data, the cache) and the import."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from appliance import sdk
from appliance.adapters import netguard
from appliance.config import Config, PluginsConfig
from appliance.plugins import load_plugins
from tests.buyer_server import BuyerServer, Received, Reply, free_port
from tests.conftest import make_tenant
from tests.http_helpers import fake_dns
from tests.submit_support import configured

SECRET = "lookup-api-key-0123456789"
MAPPING = [{"clientKey": "phone", "leadField": "phoneE164", "required": True},
           {"clientKey": "zip", "leadField": "address.zip"},
           {"clientKey": "age", "leadField": "age", "type": "integer"},
           {"clientKey": "source", "value": "appliance"}]
LEAD = {"phoneE164": "+14155550123", "email": "pat@example.com", "address": {"zip": "94107"},
        "dateOfBirth": "1990-06-15"}
NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


@pytest.fixture
def service() -> Iterator[BuyerServer]:
    with BuyerServer() as server:
        yield server


def config(service: BuyerServer, **extra) -> dict:
    return {"url": service.url("/check"), "fieldMapping": MAPPING, "outcomePath": "result.status",
            "reasonPath": "result.message", "dataPath": "result.details", **extra}


def lookup(service: BuyerServer | None = None, *, credentials: dict | None = None):
    settings = {"credentials": credentials if credentials is not None else {service.url(""): {"X-Api-Key": SECRET}}}
    registry = load_plugins(Config(plugins=PluginsConfig(dirs=[], tables={"http_lookup": settings})))
    assert registry.errors == []
    return registry.verifier("http_lookup")


def verify(verifier, step_config: dict, *, lead: dict = LEAD, timeout: float = 2.0,
           allow_private: bool = True) -> sdk.VerificationResult:
    request = sdk.VerificationRequest(lead=lead, config=step_config, settings={}, timeout_seconds=timeout,
                                      allow_private_addresses=allow_private, now=NOW)

    async def run() -> sdk.VerificationResult:
        async with httpx.AsyncClient() as http:
            return await verifier.verify(request, http)

    return asyncio.run(run())


# ---- the request and the answer -------------------------------------------------------------------

def test_a_post_sends_the_mapped_fields_and_reads_outcome_reason_and_data(service):
    service.route("/check", status=200, body={"result": {"status": " PASS ", "message": "a mobile line",
                                                         "details": {"lineType": "mobile", "carrier": "Acme"}}})
    verifier = lookup(service)
    assert verify(verifier, config(service)) == sdk.VerificationResult(
        outcome="pass", reason="a mobile line", data={"lineType": "mobile", "carrier": "Acme"})
    (sent,) = service.requests
    assert (sent.method, sent.path) == ("POST", "/check")
    assert sent.json() == {"phone": "+14155550123", "zip": "94107", "age": 36, "source": "appliance"}
    assert sent.headers["content-type"] == "application/json" and sent.headers["accept"] == "application/json"
    assert sent.headers["x-api-key"] == SECRET  # the origin's credentials


def test_a_get_sends_the_mapped_fields_as_query_parameters(service):
    service.route("/check", status=200, body={"verdict": "fail", "items": [{"why": "disconnected"}],
                                              "score": 12})
    verifier = lookup(service)
    answered = verify(verifier, config(service, url=service.url("/check?v=2"), method="GET", outcomePath="verdict",
                                       reasonPath="items[0].why", dataPath="score"))
    assert answered == sdk.VerificationResult(outcome="fail", reason="disconnected", data={"value": 12})
    (sent,) = service.requests
    assert sent.method == "GET" and sent.body == b""
    assert sent.params() == {"v": "2", "phone": "+14155550123", "zip": "94107", "age": "36", "source": "appliance"}


def test_credentials_go_only_to_their_origin_and_never_come_back(service):
    service.route("/check", status=200, body={"result": {"status": "unknown", "message": f"bad key {SECRET}",
                                                         "details": {"echo": f"Bearer {SECRET}"}}})
    elsewhere = lookup(credentials={f"http://127.0.0.1:{free_port()}": {"X-Api-Key": SECRET}})
    assert verify(elsewhere, config(service)).outcome == "unknown"
    assert "x-api-key" not in service.requests[0].headers
    answered = verify(lookup(service), config(service))
    assert answered == sdk.VerificationResult(outcome="unknown", reason="bad key ***", data={"echo": "Bearer ***"})


@pytest.mark.parametrize(("reply", "step", "reason"), [
    ({"status": 503, "body": {"error": "busy"}}, {}, "the lookup service answered HTTP 503"),
    ({"status": 302, "headers": {"Location": "http://169.254.169.254/"}}, {},
     "the lookup service answered HTTP 302"),
    ({"status": 200, "body": "<html>ok</html>"}, {}, "the lookup service answered something other than JSON"),
    ({"status": 200, "body": {"result": {"status": "maybe"}}}, {},
     "the lookup service's answer has no pass, fail or unknown at result.status"),
    ({"status": 200, "body": {"result": {}}}, {},
     "the lookup service's answer has no pass, fail or unknown at result.status"),
    ({"status": 200, "body": {"result": {"status": "pass"}}, "delay": 1.0}, {},
     "the lookup service did not answer within 0.3 s"),
    ({"status": 200, "body": {"result": {"status": "pass"}}}, {"outcomePath": 7},
     "the config is not valid: config.outcomePath: expected str, got int"),
])
def test_what_an_answer_comes_to_when_it_says_nothing_usable(service, reply, step, reason):
    service.route("/check", **reply)
    answered = verify(lookup(service), config(service, **step), timeout=0.3)
    assert answered == sdk.VerificationResult(outcome="unknown", reason=reason)


def test_nothing_is_sent_without_a_required_value_or_to_a_refused_address(service):
    service.route("/check", status=200, body={"result": {"status": "pass"}})
    verifier = lookup(service)
    assert verify(verifier, config(service), lead={"email": "pat@example.com"}) == sdk.VerificationResult(
        outcome="unknown", reason="not sent: fieldMapping[0] phone: required value missing")
    assert verify(verifier, config(service), allow_private=False) == sdk.VerificationResult(
        outcome="unknown", reason="not sent: destination refused: 127.0.0.1 is a loopback address")
    assert service.requests == []
    closed = verify(verifier, config(service, url=f"http://127.0.0.1:{free_port()}/check"))
    assert closed == sdk.VerificationResult(outcome="unknown",
                                            reason="the lookup service could not be reached (connection failed)")


def test_the_lookup_connects_to_the_address_the_guard_checked(service, monkeypatch):
    # The name "resolves" (for the guard) to the service's address, deemed public: the request must
    # go to exactly that address, not to whatever a second lookup says (DNS rebinding), keeping
    # the name in the Host header and the origin's credentials.
    fake_dns(monkeypatch, ["127.0.0.1"])
    monkeypatch.setattr(netguard, "address_problem", lambda ip: None)
    netguard.forget_resolutions()
    try:
        service.route("/check", status=200, body={"result": {"status": "pass"}})
        url = f"http://lookup.test:{service.port}/check"
        verifier = lookup(credentials={f"http://lookup.test:{service.port}": {"X-Api-Key": SECRET}})
        assert verify(verifier, config(service, url=url), allow_private=False) == sdk.VerificationResult(
            outcome="pass")
        (sent,) = service.requests
        assert sent.headers["host"] == f"lookup.test:{service.port}" and sent.headers["x-api-key"] == SECRET
        assert sent.json()["phone"] == "+14155550123"
    finally:
        netguard.forget_resolutions()


def _nested(levels: int) -> dict:
    data: dict = {"line": "mobile"}
    for _ in range(levels):
        data = {"a": data}
    return data


@pytest.mark.parametrize(("details", "reason"), [
    ({"blob": "x" * 20_000}, "the lookup service's data at result.details is 20011 bytes, more than 16384"),
    (_nested(200), "the lookup service's data at result.details nests deeper than 32 levels"),
])
def test_data_too_large_or_too_deep_is_unknown(service, details, reason):
    # What a plugin's step may not keep on a lead, the built-in lookup may not either.
    service.route("/check", status=200, body={"result": {"status": "pass", "details": details}})
    assert verify(lookup(service), config(service)) == sdk.VerificationResult(outcome="unknown", reason=reason)


def test_a_reason_keeps_no_control_characters(service):
    service.route("/check", status=200, body={"result": {"status": "fail", "message": "line\r\nX-Forged: 1\u0000 gone",
                                                         "details": {}}})
    assert verify(lookup(service), config(service)) == sdk.VerificationResult(
        outcome="fail", reason="line X-Forged: 1 gone")


def test_the_cache_key_is_the_request_sent(service):
    verifier = lookup(service)

    def key(lead: dict) -> str | None:
        return verifier.cache_key(sdk.VerificationRequest(lead=lead, config=config(service), settings={},
                                                          timeout_seconds=1, now=NOW))

    assert key(LEAD) == key({**LEAD, "email": "someone@example.com"})  # not a mapped field
    assert key(LEAD) != key({**LEAD, "phoneE164": "+14155550124"})
    assert key({"email": "pat@example.com"}) is None  # nothing would be sent


def test_the_config_is_checked_field_by_field():
    verifier = lookup(credentials={})
    assert verifier.validate({"url": "ftp://lookup.example.com", "method": "PUT", "fieldMapping": [{"leadField": "x"}]}) == [
        "config.method: must be one of POST, GET", "config.fieldMapping[0].clientKey: required field missing",
        "config.outcomePath: required field missing"]
    good = {"fieldMapping": [{"clientKey": "phone", "leadField": "phoneE164"}], "outcomePath": "status"}
    assert verifier.validate({"url": "ftp://lookup.example.com", **good}) == [
        "config.url: must be an http or https URL with a host"]
    assert verifier.validate({"url": "https://u:p@lookup.example.com/", **good}) == [
        "config.url: must carry no credential: put it in [plugins.http_lookup] credentials (the config file), by origin"]
    assert verifier.validate({"url": "https://lookup.example.com/", **good, "headers": {"Authorization": "x"}}) == [
        "config.headers: Authorization looks like a credential: put it in [plugins.http_lookup] credentials (the"
        " config file), by origin"]
    assert verifier.validate({"url": "https://lookup.example.com/", **good, "fieldMapping": []}) == [
        "config.fieldMapping: must not be empty"]
    assert verifier.validate({"url": "https://lookup.example.com/", **good}) == []


def test_a_credentials_table_that_is_not_by_origin_fails_the_load():
    for credentials in ({"https://lookup.example.com/v1": {"X-Api-Key": "k"}}, {"lookup.example.com": {"X": "k"}}):
        with pytest.raises(ValueError, match="is not an origin"):
            PluginsConfig(tables={"http_lookup": {"credentials": credentials}})


# ---- through the API and the import ----------------------------------------------------------------

def test_a_campaign_step_through_the_api_with_rules_and_the_cache(service, tmp_path, backend_toml):
    def answer(received: Received) -> Reply:
        phone = received.json()["phone"]
        line = "voip" if phone.endswith("9") else "mobile"
        return Reply(status=200, body={"result": {"status": "pass", "details": {"lineType": line}}})

    service.route("/check", answer)
    extra = (f'[delivery]\nallow_private_addresses = true\n'
             f'[plugins.http_lookup.credentials."{service.url("")}"]\nX-Api-Key = "{SECRET}"\n')
    voip = {"name": "VoIP", "subRules": [{"conditions": [
        {"field": "verification.http_lookup.data.lineType", "operator": "equals", "value": ["voip"]}]}]}
    step = {"verifier": "http_lookup", "config": config(service, dataPath="result.details"), "cacheSeconds": 300}
    with configured(tmp_path, extra, backend_toml) as (runtime, client, _clock):
        tenant = make_tenant(runtime, "Lookups", {"campaigns": [{
            "campaignId": "HL1", "name": "Looked up", "qualification": {
                "verifications": [step], "rules": [voip], "dedupeOverride": {"enabled": False}}}]})

        def submit(n: int, phone: str) -> dict:
            body = {"campaignId": "HL1", "firstName": "Pat", "lastName": "Lee", "email": f"pat{n}@example.com",
                    "phone": phone}
            made = client.post("/api/v1/leads/submit", json=body, headers=tenant.headers)
            assert made.status_code == 201, made.text
            return client.get(f"/api/v1/leads/{made.json()['data']['leadId']}", headers=tenant.headers).json()["data"]

        mobile = submit(1, "+14155550123")
        assert mobile["status"] == "qualified"
        assert mobile["verification"] == {"http_lookup": {"outcome": "pass", "reason": None,
                                                          "data": {"lineType": "mobile"}}}
        voip_line = submit(2, "+14155550129")
        assert voip_line["status"] == "disqualified" and "VoIP" in voip_line["submissions"][0]["result"]
        again = submit(3, "+14155550123")  # the same request: the cached answer
        assert again["verification"] == mobile["verification"]
        steps = [e for e in again["submissions"][0]["journeyEvents"] if e["type"] == "verified"][0]["details"]["steps"]
        assert steps["http_lookup"]["cached"] is True
        campaigns = client.get("/api/v1/campaigns", headers=tenant.headers).text
    assert [r.json()["phone"] for r in service.requests] == ["+14155550123", "+14155550129"]
    assert all(r.headers["x-api-key"] == SECRET for r in service.requests)
    assert SECRET not in campaigns and "http_lookup" in campaigns


def test_without_private_addresses_allowed_a_local_lookup_is_refused(service, tmp_path, backend_toml):
    service.route("/check", status=200, body={"result": {"status": "pass"}})
    step = {"verifier": "http_lookup", "config": config(service), "onUnknown": "review"}
    with configured(tmp_path, "", backend_toml) as (runtime, client, _clock):
        tenant = make_tenant(runtime, "Lookups", {"campaigns": [{
            "campaignId": "HL2", "name": "Refused", "qualification": {"verifications": [step]}}]})
        body = {"campaignId": "HL2", "firstName": "Pat", "lastName": "Lee", "email": "pat@example.com",
                "phone": "+14155550123"}
        made = client.post("/api/v1/leads/submit", json=body, headers=tenant.headers)
        assert made.status_code == 201 and made.json()["data"]["status"] == "pending_action"
        lead = client.get(f"/api/v1/leads/{made.json()['data']['leadId']}", headers=tenant.headers).json()["data"]
    assert lead["verification"]["http_lookup"]["reason"] == \
        "not sent: destination refused: 127.0.0.1 is a loopback address"
    assert service.requests == []


def test_the_import_names_each_bad_config_field(cli, tmp_path: Path):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    path = tmp_path / "bundle.json"
    bad = {"url": "https://lookup.example.com/check?api_key=k", "method": "DELETE",
           "fieldMapping": [{"clientKey": "phone"}]}
    path.write_text(json.dumps({"campaigns": [{"campaignId": "HL3", "name": "Bad", "qualification": {
        "verifications": [{"verifier": "http_lookup", "config": bad}]}}]}))
    problems = cli("import", "--tenant", tenant_id, str(path), expect=1).stderr
    where = "campaigns[0].qualification.verifications[0].config"
    for problem in (f"{where}.method: must be one of POST, GET",
                    f"{where}.fieldMapping[0].leadField: exactly one of leadField or value is required",
                    f"{where}.outcomePath: required field missing"):
        assert problem in problems, problems
    bad = {"url": "https://lookup.example.com/check?api_key=k", "fieldMapping": [{"clientKey": "phone",
                                                                                 "leadField": "phoneE164"}],
           "outcomePath": "status"}
    path.write_text(json.dumps({"campaigns": [{"campaignId": "HL3", "name": "Bad", "qualification": {
        "verifications": [{"verifier": "http_lookup", "config": bad}]}}]}))
    assert f"{where}.url: must carry no credential" in cli("import", "--tenant", tenant_id, str(path), expect=1).stderr
    assert json.loads(cli("export", "--tenant", tenant_id).stdout)["campaigns"] == []
