"""The built-in http delivery adapter against a real local buyer server (tests/buyer_server.py):
request shape, field mapping, auth, idempotency key, response rules, faults, and the SSRF guard.
Tests that talk to the local buyer set allow_private_addresses=True; the SSRF tests do not, and
assert that the buyer received nothing."""

from __future__ import annotations

import asyncio
import base64
import gzip
import ipaddress
import ssl
import threading
import time
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from appliance.adapters import http_delivery, netguard
from appliance.adapters.http_delivery import HttpDelivery, display_url
from appliance.domain import delivery_mapping
from appliance.domain.delivery_mapping import (
    build_payload,
    encode_body,
    interpret,
    xml_name,
)
from appliance.domain.endpoint import DeliveryEndpoint, ResponseRules
from appliance.sdk import DeliveryRequest, DeliveryResult
from tests.buyer_server import BuyerServer, free_port
from tests.http_helpers import LEAD, fake_dns, make_endpoint, self_signed


MAPPING = [
    {"clientKey": "first_name", "leadField": "firstName"},
    {"clientKey": "last_name", "leadField": "lastName"},
    {"clientKey": "state", "leadField": "address.state", "required": True},
    {"clientKey": "debt", "leadField": "questionnaire.debt", "type": "integer"},
    {"clientKey": "owner", "leadField": "questionnaire.homeowner", "type": "boolean"},
    {"clientKey": "rate", "leadField": "questionnaire.rate", "type": "number"},
    {"clientKey": "age", "leadField": "age", "type": "string"},
    {"clientKey": "source", "value": "appliance"},
    {"clientKey": "vendor_id", "value": "42", "type": "integer"},
    {"clientKey": "unused", "leadField": "customFields.nothing"},
]

SECRET = "s3cr3t-Value-9f8e7d"


@pytest.fixture(autouse=True)
def fresh_dns() -> Iterator[None]:
    # netguard keeps lookups for 30 s; each test fakes its own answers for the same names.
    netguard.forget_resolutions()
    yield
    netguard.forget_resolutions()


@pytest.fixture
def buyer() -> Iterator[BuyerServer]:
    with BuyerServer() as server:
        yield server


def deliver(endpoint: DeliveryEndpoint, lead: dict[str, Any] | None = None, *, secrets: dict[str, str] | None = None,
            allow_private: bool = True, submission_id: str = "sub_123",
            ssl_context: ssl.SSLContext | None = None) -> DeliveryResult:
    request = DeliveryRequest(lead=LEAD if lead is None else lead, submission_id=submission_id, attempt=1,
                              endpoint=endpoint, secrets=secrets or {}, settings={},
                              allow_private_addresses=allow_private)

    async def run() -> DeliveryResult:
        adapter = HttpDelivery(ssl_context=ssl_context)
        try:
            async with httpx.AsyncClient() as http:  # part of the adapter interface; the http adapter has its own
                return await adapter.deliver(request, http)
        finally:
            await adapter.aclose()

    return asyncio.run(run())


def timed(fn, *args, **kwargs) -> tuple[Any, float]:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    result = fn(*args, **kwargs)
    return result, time.monotonic() - start


# ---- request shape ---------------------------------------------------------------------


def test_json_body_from_field_mapping(buyer: BuyerServer) -> None:
    buyer.route("/leads", status=201, body={"status": "ok"})
    result = deliver(make_endpoint(buyer.url("/leads"), fieldMapping=MAPPING))
    assert result.outcome == "success", result
    (received,) = buyer.requests
    assert received.method == "POST" and received.path == "/leads"
    assert received.headers["content-type"] == "application/json"
    assert received.headers["idempotency-key"] == "sub_123"
    body = received.json()
    assert body.pop("age").isdigit()
    assert body == {"first_name": "Ann", "last_name": "O'Neil & <Co>", "state": "CA", "debt": 25000,
                    "owner": True, "rate": 4.5, "source": "appliance", "vendor_id": 42}
    assert result.url == buyer.url("/leads") and result.method == "POST" and result.body_format == "json"
    assert result.status_code == 201


def test_form_body(buyer: BuyerServer) -> None:
    buyer.route("/form", status=200)
    result = deliver(make_endpoint(buyer.url("/form"), method="PUT", bodyFormat="form", fieldMapping=MAPPING))
    assert result.outcome == "success"
    (received,) = buyer.requests
    assert received.method == "PUT"
    assert received.headers["content-type"] == "application/x-www-form-urlencoded"
    form = received.form()
    assert form["last_name"] == "O'Neil & <Co>" and form["owner"] == "true" and form["debt"] == "25000"
    assert form["rate"] == "4.5" and "unused" not in form


def test_xml_body_is_valid_and_escaped(buyer: BuyerServer) -> None:
    buyer.route("/xml", status=200, body="<ok/>", headers={"Content-Type": "application/xml"})
    mapping = [*MAPPING, {"clientKey": "given name", "leadField": "firstName"},
               {"clientKey": "1st", "value": "a\x01b"}]
    result = deliver(make_endpoint(buyer.url("/xml"), bodyFormat="xml", fieldMapping=mapping))
    assert result.outcome == "success"
    (received,) = buyer.requests
    assert received.headers["content-type"].startswith("application/xml")
    root = ET.fromstring(received.body)
    assert root.tag == "lead"
    assert root.findtext("last_name") == "O'Neil & <Co>"
    assert root.findtext("owner") == "true" and root.findtext("debt") == "25000"
    assert root.findtext("given_name") == "Ann" and root.findtext("_1st") == "ab"


def test_whole_lead_without_mapping_in_every_format(buyer: BuyerServer) -> None:
    buyer.route("/all", status=200)
    assert deliver(make_endpoint(buyer.url("/all"))).outcome == "success"
    assert buyer.requests[0].json() == LEAD
    assert deliver(make_endpoint(buyer.url("/all"), bodyFormat="xml")).outcome == "success"
    root = ET.fromstring(buyer.requests[1].body)
    assert root.findtext("address/state") == "CA"
    assert [i.findtext("key") for i in root.findall("questionnaire/item")] == ["debt", "homeowner", "rate"]
    assert deliver(make_endpoint(buyer.url("/all"), bodyFormat="form")).outcome == "success"
    form = buyer.requests[2].form()
    assert form["email"] == "ann@example.com" and msgspec.json.decode(form["address"]) == LEAD["address"]


def test_get_sends_fields_as_query_parameters(buyer: BuyerServer) -> None:
    buyer.route("/get", status=200)
    result = deliver(make_endpoint(buyer.url("/get?campaign=7"), method="GET", fieldMapping=MAPPING[:3]))
    assert result.outcome == "success"
    (received,) = buyer.requests
    assert received.method == "GET" and received.body == b""
    assert received.params() == {"campaign": "7", "first_name": "Ann", "last_name": "O'Neil & <Co>", "state": "CA"}
    assert "Ann" not in (result.url or "")


def test_endpoint_headers_sent_and_idempotency_key_is_ours(buyer: BuyerServer) -> None:
    buyer.route("/h", status=200)
    endpoint = make_endpoint(buyer.url("/h"), headers={"X-Vendor": "v1", "Idempotency-Key": "theirs"})
    deliver(endpoint, submission_id="sub_A")
    deliver(endpoint, submission_id="sub_A")
    keys = [r.headers["idempotency-key"] for r in buyer.requests]
    assert keys == ["sub_A", "sub_A"]
    assert buyer.requests[0].headers["x-vendor"] == "v1"


# ---- field mapping ---------------------------------------------------------------------


def test_required_value_missing_sends_nothing(buyer: BuyerServer) -> None:
    buyer.route("/r", status=200)
    lead = {**LEAD, "address": {"state": "  "}}
    mapping = [{"clientKey": "email", "leadField": "email"},
               {"clientKey": "state", "leadField": "address.state", "required": True}]
    result = deliver(make_endpoint(buyer.url("/r"), fieldMapping=mapping), lead)
    assert result.outcome == "failure"
    assert result.reason == "fieldMapping[1] state: required value missing"
    assert buyer.requests == []


@pytest.mark.parametrize(("value", "kind", "expected"), [
    ("12", "integer", 12), ("12.0", "integer", 12), (3.0, "integer", 3), (" 7.25 ", "number", 7.25),
    ("no", "boolean", False), ("TRUE", "boolean", True), (1, "boolean", True), (5, "string", "5"),
    (True, "string", "true"), (2.5, "string", "2.5"), (["a", "b"], "string", "a, b"),
])
def test_type_coercion(value: Any, kind: str, expected: Any) -> None:
    endpoint = make_endpoint("https://buyer.example/", fieldMapping=[{"clientKey": "k", "leadField": "v", "type": kind}])
    payload, problems = build_payload(endpoint, {"v": value}, date(2024, 1, 1))
    assert problems == [] and payload == {"k": expected} and type(payload["k"]) is type(expected)


@pytest.mark.parametrize(("value", "kind"), [("12.5", "integer"), ("abc", "number"), (True, "number"),
                                              ("maybe", "boolean"), (7, "boolean")])
def test_impossible_coercion_is_a_problem(value: Any, kind: str) -> None:
    endpoint = make_endpoint("https://buyer.example/", fieldMapping=[{"clientKey": "k", "leadField": "v", "type": kind}])
    payload, problems = build_payload(endpoint, {"v": value}, date(2024, 1, 1))
    assert payload == {} and problems == [f"fieldMapping[0] k: value of v cannot be converted to {kind}"]
    assert str(value) not in problems[0]


def test_xml_names() -> None:
    assert xml_name("first name") == "first_name"
    assert xml_name("1st") == "_1st" and xml_name("") == "_" and xml_name("a:b<c>") == "a_b_c_"
    body, _ = encode_body({"a&b": "<&>", "x": None, "n": [1, {"y": 2}]}, "xml")
    root = ET.fromstring(body)
    assert root.findtext("a_b") == "<&>" and root.find("x") is not None
    assert [i.text for i in root.findall("n/item")] == ["1", None] and root.findtext("n/item/y") == "2"


# ---- auth --------------------------------------------------------------------------------


@pytest.mark.parametrize(("auth", "secrets", "header", "expected"), [
    ({"type": "basic", "username": "buyer"}, {"auth.password": SECRET}, "authorization",
     "Basic " + base64.b64encode(f"buyer:{SECRET}".encode()).decode()),
    ({"type": "bearer"}, {"auth.token": SECRET}, "authorization", f"Bearer {SECRET}"),
    ({"type": "header", "headerName": "X-Api-Key"}, {"auth.token": SECRET}, "x-api-key", SECRET),
])
def test_auth_credentials_arrive(buyer: BuyerServer, auth: dict, secrets: dict, header: str, expected: str) -> None:
    # That an echo of them never comes out is the worker's part, for every adapter alike
    # (tests/test_credential_echo.py).
    buyer.route("/auth", status=400, body={"error": "bad credential", "code": "E1"})
    endpoint = make_endpoint(buyer.url("/auth"), auth=auth, responseRules={"messagePath": "error"})
    result = deliver(endpoint, secrets=secrets)
    (received,) = buyer.requests
    assert received.headers[header] == expected
    assert result.outcome == "failure" and result.response_fields["code"] == "E1"


def test_missing_token_secret_sends_nothing(buyer: BuyerServer) -> None:
    buyer.route("/auth", status=200)
    result = deliver(make_endpoint(buyer.url("/auth"), auth={"type": "bearer"}))
    assert result.outcome == "failure" and "token" in (result.reason or "") and buyer.requests == []


def test_line_break_in_a_header_value_sends_nothing(buyer: BuyerServer) -> None:
    # Endpoint headers are checked when the endpoint is stored; an opened secret is not.
    buyer.route("/auth", status=200)
    result = deliver(make_endpoint(buyer.url("/auth"), auth={"type": "bearer"}),
                     secrets={"auth.token": f"{SECRET}\r\nX-Injected: 1"})
    assert result.outcome == "failure", result
    assert result.reason == "request refused: the value of header Authorization contains a line break"
    # A request written before deliver() gave up would be recorded by the buyer's own thread a
    # moment later, and nothing marks that moment: a short pause is all there is to wait for.
    time.sleep(0.05)
    assert buyer.requests == []


def test_credentials_in_the_url_are_sent_as_basic_auth(buyer: BuyerServer) -> None:
    buyer.route("/in", status=200)
    result = deliver(make_endpoint(buyer.url("/in").replace("http://", f"http://buyer:{SECRET}@")))
    assert result.outcome == "success", result
    (received,) = buyer.requests
    assert received.headers["authorization"] == "Basic " + base64.b64encode(f"buyer:{SECRET}".encode()).decode()
    assert SECRET not in msgspec.json.encode(result).decode()


def test_url_credentials_and_query_secrets_not_shown() -> None:
    assert display_url("https://user:pw@Buyer.example:8443/in?apiKey=abc&list=7#x") == \
        "https://buyer.example:8443/in?apiKey=***&list=7"


# ---- response rules --------------------------------------------------------------------------

RULES = {
    "success": {"jsonPath": "result.status", "values": ["accepted", "sold"]},
    "failure": {"jsonPath": "result.status", "values": ["rejected"]},
    "duplicate": {"bodyPattern": r"already\s+exists"},
    "clientLeadIdPath": "result.leads[0].id",
    "messagePath": "result.message",
}


@pytest.mark.parametrize(("status", "body", "outcome"), [
    (200, {"result": {"status": "Accepted"}}, "success"),
    (200, {"result": {"status": " SOLD "}}, "success"),
    (200, {"result": {"status": "rejected"}}, "failure"),
    (200, {"result": {"status": "rejected", "message": "lead already exists"}}, "duplicate"),
    (200, {"result": {"status": "pending"}}, "success"),          # no rule: 2xx
    (422, {"result": {"status": "accepted"}}, "success"),         # a rule beats the status default
    (503, "Lead already exists", "duplicate"),
])
def test_response_rules(status: int, body: Any, outcome: str) -> None:
    rules = msgspec.convert(RULES, ResponseRules)
    raw = body.encode() if isinstance(body, str) else msgspec.json.encode(body)
    assert interpret(rules, status, raw, "application/json").outcome == outcome


def test_matcher_needs_all_its_parts() -> None:
    rules = msgspec.convert({"failure": {"statusCodes": [200], "bodyPattern": "error"}}, ResponseRules)
    assert interpret(rules, 200, b'{"status": "error"}').outcome == "failure"
    assert interpret(rules, 200, b'{"status": "ok"}').outcome == "success"
    assert interpret(rules, 201, b'{"status": "error"}').outcome == "success"
    numbers = msgspec.convert({"success": {"jsonPath": "code", "values": [1]}}, ResponseRules)
    assert interpret(numbers, 400, b'{"code": "1.0"}').outcome == "success"
    assert interpret(numbers, 400, b'{"code": 2}').outcome == "failure"
    listed = msgspec.convert({"duplicate": {"statusCodes": [409]}}, ResponseRules)
    assert interpret(listed, 409, b"").outcome == "duplicate"


@pytest.mark.parametrize(("status", "outcome"), [
    (200, "success"), (204, "success"), (301, "error"), (400, "failure"), (404, "failure"), (409, "failure"),
    (408, "error"), (429, "error"), (500, "error"), (503, "error"), (101, "error"),
])
def test_default_outcomes(status: int, outcome: str) -> None:
    assert interpret(ResponseRules(), status, b"").outcome == outcome


def test_client_lead_id_message_and_fields(buyer: BuyerServer) -> None:
    body = {"result": {"status": "accepted", "message": "Thanks!", "leads": [{"id": 98765}]},
            "price": 12.5, "ok": True, "note": "x" * 600, "nothing": None, "list": [1]}
    buyer.route("/ok", status=200, body=body)
    result = deliver(make_endpoint(buyer.url("/ok"), responseRules=RULES))
    assert (result.outcome, result.client_lead_id, result.message) == ("success", "98765", "Thanks!")
    assert result.response_fields == {"price": "12.5", "ok": "true", "note": "x" * 500}


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize("encoding,pack", [("gzip", gzip.compress), ("deflate", zlib.compress),
                                           ("deflate", _raw_deflate)])
def test_compressed_answer_is_read_although_we_asked_for_identity(buyer: BuyerServer, encoding, pack) -> None:
    answer = msgspec.json.encode({"result": {"status": "accepted", "message": "Thanks!", "leads": [{"id": 55}]}})
    buyer.route("/z", status=200, body=pack(answer), headers={"Content-Type": "application/json",
                                                               "Content-Encoding": encoding})
    result = deliver(make_endpoint(buyer.url("/z"), responseRules=RULES))
    assert (result.outcome, result.client_lead_id, result.message) == ("success", "55", "Thanks!")
    assert buyer.requests[0].headers["accept-encoding"] == "identity"


@pytest.mark.parametrize("encoding,pack", [("gzip", gzip.compress), ("deflate", _raw_deflate)])
def test_compressed_answer_inflates_to_at_most_one_mib(buyer: BuyerServer, encoding, pack) -> None:
    bomb = pack(b"x" * (20 * 1024 * 1024))  # ~20 KB on the wire
    buyer.route("/bomb", status=200, body=bomb, headers={"Content-Encoding": encoding})
    result = deliver(make_endpoint(buyer.url("/bomb"), responseRules={"success": {"bodyPattern": "^x+$"}}))
    assert result.outcome == "success" and "truncated at 1 MiB" in (result.reason or "")


def test_answer_that_does_not_inflate_is_read_as_it_came(buyer: BuyerServer) -> None:
    buyer.route("/bad", status=200, body=b"accepted, not really gzip", headers={"Content-Encoding": "gzip"})
    result = deliver(make_endpoint(buyer.url("/bad"), responseRules={"success": {"bodyPattern": "^accepted"}}))
    assert result.outcome == "success"


def test_response_fields_are_bounded() -> None:
    body = msgspec.json.encode({f"k{i}": i for i in range(80)})
    assert len(interpret(ResponseRules(), 200, body).response_fields) == delivery_mapping.MAX_RESPONSE_FIELDS


@pytest.mark.parametrize("body", [b'{"status": "ok",', b"\xff\xfe{", b"[" * 100000, b"null", b"", b"<html>"])
def test_malformed_bodies_never_raise(body: bytes) -> None:
    rules = msgspec.convert(RULES, ResponseRules)
    result = interpret(rules, 200, body, "application/json; charset=bogus")
    assert result.outcome == "success" and result.client_lead_id is None and result.response_fields == {}


# ---- faults -------------------------------------------------------------------------------


def test_slow_answer_within_deadline(buyer: BuyerServer) -> None:
    buyer.route("/slow", status=200, delay=0.3)
    assert deliver(make_endpoint(buyer.url("/slow"), timeoutSeconds=3)).outcome == "success"


def test_answer_beyond_deadline(buyer: BuyerServer) -> None:
    buyer.route("/slow", status=200, delay=5)
    result, elapsed = timed(deliver, make_endpoint(buyer.url("/slow"), timeoutSeconds=0.5))
    assert result.outcome == "error" and "timed out" in (result.reason or "")
    assert elapsed < 1.2


def test_body_that_drips_forever_ends_at_the_deadline(buyer: BuyerServer) -> None:
    buyer.route("/drip", status=200, drip=True, drip_interval=0.02)
    result, elapsed = timed(deliver, make_endpoint(buyer.url("/drip"), timeoutSeconds=0.6))
    assert result.outcome == "error" and "timed out" in (result.reason or "")
    assert 0.5 < elapsed < 1.3


@pytest.mark.parametrize(("status", "outcome"), [(500, "error"), (503, "error"), (400, "failure"),
                                                 (422, "failure"), (408, "error"), (429, "error")])
def test_status_faults(buyer: BuyerServer, status: int, outcome: str) -> None:
    buyer.route("/s", status=status, body={"message": "nope"})
    result = deliver(make_endpoint(buyer.url("/s"), responseRules={"messagePath": "message"}))
    assert (result.outcome, result.status_code, result.message) == (outcome, status, "nope")


def test_connection_refused() -> None:
    result, elapsed = timed(deliver, make_endpoint(f"http://127.0.0.1:{free_port()}/x", timeoutSeconds=5))
    assert result.outcome == "error" and "connection failed" in (result.reason or "")
    assert elapsed < 2


def test_connection_closed_without_response(buyer: BuyerServer) -> None:
    buyer.route("/bye", close=True)
    result = deliver(make_endpoint(buyer.url("/bye")))
    assert result.outcome == "error" and result.status_code is None
    assert len(buyer.requests) == 1


def test_malformed_json_with_200_is_success(buyer: BuyerServer) -> None:
    buyer.route("/bad", status=200, body='{"status": "accepted", ', headers={"Content-Type": "application/json"})
    result = deliver(make_endpoint(buyer.url("/bad"), responseRules=RULES))
    assert result.outcome == "success" and result.response_fields == {} and result.client_lead_id is None


def test_huge_body_is_capped(buyer: BuyerServer) -> None:
    buyer.route("/huge", status=200, size=5 * 1024 * 1024)
    result, elapsed = timed(deliver, make_endpoint(buyer.url("/huge"), timeoutSeconds=10,
                                                   responseRules={"success": {"bodyPattern": "^x+$"}}))
    assert result.outcome == "success" and "truncated at 1 MiB" in (result.reason or "")
    assert elapsed < 3


def test_capped_read_keeps_exactly_one_mib(buyer: BuyerServer) -> None:
    """The response rules see the first MiB of a 5 MiB answer: all of it and not a byte more."""
    buyer.route("/huge", status=200, size=5 * 1024 * 1024)
    one_mib = rf"\Ax{{{http_delivery.MAX_RESPONSE_BYTES}}}\Z"
    result = deliver(make_endpoint(buyer.url("/huge"), responseRules={"failure": {"bodyPattern": one_mib}}))
    assert result.outcome == "failure"
    past_it = rf"\Ax{{{http_delivery.MAX_RESPONSE_BYTES + 1}}}"
    result = deliver(make_endpoint(buyer.url("/huge"), responseRules={"failure": {"bodyPattern": past_it}}))
    assert result.outcome == "success"


@pytest.mark.parametrize("target", ["http://169.254.169.254/latest/meta-data/", "LOCAL"])
def test_redirect_is_not_followed(buyer: BuyerServer, target: str) -> None:
    location = buyer.url("/internal") if target == "LOCAL" else target
    buyer.route("/moved", status=302, headers={"Location": location})
    buyer.route("/internal", status=200)
    result = deliver(make_endpoint(buyer.url("/moved")))
    assert result.outcome == "error" and "redirect not followed" in (result.reason or "")
    assert [r.path for r in buyer.requests] == ["/moved"]


# ---- SSRF guard ---------------------------------------------------------------------------

REFUSED_HOSTS = ["127.0.0.1", "localhost", "[::1]", "169.254.169.254", "2130706433", "0x7f000001", "127.1",
                 "10.0.0.1", "[::ffff:127.0.0.1]", "172.16.0.1", "192.168.1.1", "100.64.0.1", "[fc00::1]",
                 "[fe80::1]", "0.0.0.0", "224.0.0.1", "0177.0.0.1"]


@pytest.mark.parametrize("host", REFUSED_HOSTS)
def test_private_destinations_are_refused(buyer: BuyerServer, host: str) -> None:
    buyer.route("/leads", status=200)
    url = f"http://{host}:{buyer.port}/leads" if host != "0177.0.0.1" else f"http://{host}/leads"
    result, elapsed = timed(deliver, make_endpoint(url), allow_private=False)
    assert result.outcome == "failure", result
    # 0177.0.0.1 (octal) is not even a URL httpx accepts; the guard refuses it too (below).
    assert (result.reason or "").startswith("destination refused" if host != "0177.0.0.1" else "url:")
    assert elapsed < 2
    time.sleep(0.05)  # as in test_line_break_in_a_header_value_sends_nothing: no moment to await
    assert buyer.requests == []


@pytest.mark.parametrize("url", ["http://127.0.0.1/", "http://localhost./", "http://[::1]/", "http://2130706433/",
                                 "http://0x7f000001/", "http://127.1/", "http://[::ffff:127.0.0.1]/",
                                 "http://[2002:7f00:1::]/", "http://[64:ff9b::a00:1]/", "ftp://8.8.8.8/",
                                 "file:///etc/passwd", "http://a.localhost/", "http://0177.0.0.1/"])
def test_check_destination_refuses(url: str) -> None:
    assert netguard.check_destination(url, allow_private=False)


def test_public_literal_is_allowed_and_pinned() -> None:
    assert netguard.check_destination("https://8.8.8.8/x", allow_private=False) is None
    assert asyncio.run(netguard.resolve_destination("http://134744072/", False)).ip == "8.8.8.8"
    assert netguard.check_destination("http://127.0.0.1/", allow_private=True) is None


@pytest.mark.parametrize("answers", [["10.1.2.3"], ["8.8.8.8", "127.0.0.1"], ["::1"], ["169.254.169.254"]])
def test_names_resolving_to_private_addresses_are_refused(buyer: BuyerServer, monkeypatch: pytest.MonkeyPatch,
                                                          answers: list[str]) -> None:
    fake_dns(monkeypatch, answers)
    buyer.route("/leads", status=200)
    result = deliver(make_endpoint(f"http://buyer.test:{buyer.port}/leads"), allow_private=False)
    assert result.outcome == "failure" and "buyer.test resolves to" in (result.reason or "")
    assert buyer.requests == []


def test_connection_goes_to_the_checked_address(buyer: BuyerServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # The name "resolves" to the buyer's address and that address is deemed public: the request
    # must reach exactly that address, with the original Host header.
    fake_dns(monkeypatch, ["127.0.0.1"])
    monkeypatch.setattr(netguard, "address_problem", lambda ip: None)
    buyer.route("/leads", status=200)
    result = deliver(make_endpoint(f"http://buyer.test:{buyer.port}/leads"), allow_private=False)
    assert result.outcome == "success", result
    (received,) = buyer.requests
    assert received.headers["host"] == f"buyer.test:{buyer.port}"
    assert result.url == f"http://buyer.test:{buyer.port}/leads"


@pytest.mark.parametrize(("cert_name", "outcome"), [("buyer.test", "success"), ("other.test", "error")])
def test_https_pinned_address_keeps_the_tls_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 cert_name: str, outcome: str) -> None:
    # Connected to the checked address, the certificate is still verified against the URL's name.
    server_ctx, client_ctx = self_signed(tmp_path, cert_name)
    fake_dns(monkeypatch, ["127.0.0.1"])
    monkeypatch.setattr(netguard, "address_problem", lambda ip: None)
    with BuyerServer(tls=server_ctx) as tls_buyer:
        tls_buyer.route("/leads", status=200)
        result = deliver(make_endpoint(f"https://buyer.test:{tls_buyer.port}/leads"), allow_private=False,
                         ssl_context=client_ctx)
        assert result.outcome == outcome, result
        if outcome == "success":
            (received,) = tls_buyer.requests
            assert received.headers["host"] == f"buyer.test:{tls_buyer.port}"
        else:
            assert tls_buyer.requests == [] and "connection failed" in (result.reason or "")


def test_a_lookup_serves_the_next_deliveries_and_is_judged_each_time(buyer: BuyerServer,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    lookups: list[str] = []

    def counting(host: str) -> list:
        lookups.append(host)
        return [ipaddress.ip_address("127.0.0.1")]

    monkeypatch.setattr(netguard, "_lookup", counting)
    monkeypatch.setattr(netguard, "address_problem", lambda ip: None)
    buyer.route("/leads", status=200)
    endpoint = make_endpoint(f"http://buyer.test:{buyer.port}/leads")
    assert [deliver(endpoint, allow_private=False).outcome for _ in range(3)] == ["success"] * 3
    assert lookups == ["buyer.test"]
    monkeypatch.undo()  # the same kept address, judged again: loopback is refused
    refused = deliver(endpoint, allow_private=False)
    assert refused.outcome == "failure" and "loopback" in (refused.reason or "")
    assert len(buyer.requests) == 3


def test_a_failed_lookup_is_not_kept(buyer: BuyerServer, monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list = [OSError("temporary failure"), [ipaddress.ip_address("127.0.0.1")]]

    def flaky(host: str) -> list:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(netguard, "_lookup", flaky)
    monkeypatch.setattr(netguard, "address_problem", lambda ip: None)
    buyer.route("/leads", status=200)
    endpoint = make_endpoint(f"http://buyer.test:{buyer.port}/leads")
    assert deliver(endpoint, allow_private=False).outcome == "error"
    assert deliver(endpoint, allow_private=False).outcome == "success"
    assert answers == []


def test_unresolvable_host_is_a_retryable_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(host: str) -> list:
        raise OSError("no such host")

    monkeypatch.setattr(netguard, "_lookup", fail)
    result = deliver(make_endpoint("http://buyer.test/leads"), allow_private=False)
    assert result.outcome == "error" and "cannot resolve" in (result.reason or "")


def test_hung_resolver_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def hang(host: str) -> list:
        release.wait(5)
        return []

    monkeypatch.setattr(netguard, "_lookup", hang)
    try:
        result, elapsed = timed(deliver, make_endpoint("http://buyer.test/leads", timeoutSeconds=0.3),
                                allow_private=False)
        assert result.outcome == "error" and elapsed < 1
        assert netguard.check_destination("http://buyer.test/", False, timeout=0.1) is not None
    finally:
        release.set()


# ---- adapter registration and validation -----------------------------------------------------


def test_registered_through_the_plugin_hook() -> None:
    from appliance import plugins

    registry = plugins.Registry({})
    report = registry.register(http_delivery, "http_delivery", http_delivery.__file__, builtin=True)
    assert report.error is None, report.error
    assert isinstance(registry.delivery_adapter("http"), HttpDelivery)


def test_validate() -> None:
    adapter = HttpDelivery()
    assert adapter.validate(make_endpoint("https://buyer.example/in")) == []
    no_url = msgspec.convert({"deliveryEndpointId": "ep_1", "adapter": "elsewhere"}, DeliveryEndpoint)
    assert adapter.validate(no_url) == ["url: required for the http adapter"]
    assert deliver(no_url).outcome == "failure"
    assert adapter.validate(make_endpoint("http://0177.0.0.1/")) == ["url: must be an http or https URL with a host"]


def test_buyer_server_leaves_no_threads() -> None:
    before = set(threading.enumerate())
    with BuyerServer() as server:
        server.route("/drip", drip=True)
        server.route("/huge", size=5 * 1024 * 1024)
        result, _ = timed(deliver, make_endpoint(server.url("/drip"), timeoutSeconds=0.2))
        assert result.outcome == "error"
        deliver(make_endpoint(server.url("/huge")))
    leftover = [t for t in set(threading.enumerate()) - before if not t.name.startswith("netguard")]
    assert leftover == []
