"""The built-in http delivery adapter's `ping` (CONTRACT 9.1: asking a buyer for a bid before a
lead is sold at auction), called through the plugin surface as the worker calls it, against a
real local buyer server (tests/buyer_server.py): the request the ping sends (its own URL, method,
body format, headers and field mapping; the endpoint's auth and credential headers, not its other
headers), faults, the SSRF guard, the 1 MiB cap, and how the answer is read into a bid
(`accepted` matcher, `bidPath`, `pingTokenPath`, `messagePath`, unusable bids).

Like tests/test_http_delivery.py: tests that talk to the local buyer set
allow_private_addresses=True; the SSRF test does not, and asserts that the buyer received nothing."""

from __future__ import annotations

import asyncio
import base64
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import msgspec
import pytest

from appliance.adapters import http_delivery, netguard
from appliance.adapters.http_delivery import HttpDelivery
from appliance.domain.endpoint import DeliveryEndpoint, fill_credentials, split_credentials
from appliance.sdk import PingRequest, PingResult
from tests.buyer_server import BuyerServer, free_port
from tests.http_helpers import LEAD, make_endpoint
from tests.test_http_delivery import timed

SECRET = "s3cr3t-Value-9f8e7d"

MAPPING = [
    {"clientKey": "state", "leadField": "address.state", "required": True},
    {"clientKey": "zip", "leadField": "address.zip"},
    {"clientKey": "debt", "leadField": "questionnaire.debt", "type": "integer"},
    {"clientKey": "owner", "leadField": "questionnaire.homeowner", "type": "boolean"},
    {"clientKey": "vendor_id", "value": "42", "type": "integer"},
]
MAPPED = {"state": "CA", "zip": "94105", "debt": 25000, "owner": True, "vendor_id": 42}


@pytest.fixture(autouse=True)
def fresh_dns() -> Iterator[None]:
    # netguard keeps lookups for 30 s (as in tests/test_http_delivery.py).
    netguard.forget_resolutions()
    yield
    netguard.forget_resolutions()


@pytest.fixture
def buyer() -> Iterator[BuyerServer]:
    with BuyerServer() as server:
        # The endpoint's own (post) URL: a ping must never reach it.
        server.route("/post", status=500, body={"error": "the ping went to the post URL"})
        yield server


def pinging(buyer_or_url: BuyerServer | str, *, ping_path: str = "/ping", rules: dict | None = None,
            **ping: Any) -> dict[str, Any]:
    """An endpoint's wire fields with a ping to `ping_path` (its post URL is /post)."""
    if isinstance(buyer_or_url, BuyerServer):
        post_url, ping_url = buyer_or_url.url("/post"), buyer_or_url.url(ping_path)
    else:
        post_url = ping_url = buyer_or_url
    return {"url": post_url, "fieldMapping": [{"clientKey": "everything", "leadField": "email"}],
            "ping": {"url": ping_url, "responseRules": rules or {"bidPath": "bid"}, **ping}}


def ping(fields: dict[str, Any], lead: dict[str, Any] | None = None, *, allow_private: bool = True,
         timeout_seconds: float = 5.0) -> PingResult:
    """`HttpDelivery.ping` as the auction calls it: the endpoint as opened from the secret store
    (credentials split off as stored, then filled back) and its opened secrets."""
    url = fields.pop("url")
    stored, secrets = split_credentials(make_endpoint(url, **fields))
    endpoint, missing = fill_credentials(stored, secrets)
    assert missing == []
    request = PingRequest(lead=LEAD if lead is None else lead, auction_id="auc_test", endpoint=endpoint,
                          secrets=secrets, settings={}, timeout_seconds=timeout_seconds,
                          allow_private_addresses=allow_private, now=datetime(2024, 5, 1, 12, tzinfo=UTC))

    async def run() -> PingResult:
        adapter = HttpDelivery()
        assert adapter.can_ping
        try:
            async with httpx.AsyncClient() as http:  # part of the adapter interface; the http adapter has its own
                return await adapter.ping(request, http)
        finally:
            await adapter.aclose()

    return asyncio.run(run())


def answered(buyer: BuyerServer, body: Any, status: int = 200, rules: dict | None = None, **reply: Any) -> PingResult:
    """The ping's result when the buyer answers `body` with `status` (raw bytes/str as they are)."""
    buyer.route("/ping", status=status, body=body, **reply)
    return ping(pinging(buyer, rules=rules))


# ---- the request a ping sends ---------------------------------------------------------------


def test_post_json_body_from_the_ping_field_mapping(buyer: BuyerServer) -> None:
    buyer.route("/ping", status=200, body={"bid": 12.5})
    result = ping(pinging(buyer, fieldMapping=MAPPING))
    assert (result.outcome, result.bid, result.status_code, result.reason) == ("bid", 12.5, 200, None)
    (received,) = buyer.requests  # the ping only: the endpoint's own URL got nothing
    assert received.method == "POST" and received.path == "/ping"
    assert received.headers["content-type"] == "application/json"
    assert received.json() == MAPPED  # the ping's mapping, not the endpoint's ("everything": the email)


def test_ping_without_mapping_sends_the_lead(buyer: BuyerServer) -> None:
    buyer.route("/ping", status=200, body={"bid": 3})
    partial = {"leadId": "lead_9", "address": {"state": "TX"}}  # a supplier's ping: no contact fields
    assert ping(pinging(buyer), partial).outcome == "bid"
    assert buyer.requests[0].json() == partial


def test_get_sends_the_mapped_fields_as_query_parameters(buyer: BuyerServer) -> None:
    buyer.route("/ping", status=200, body={"bid": 4})
    result = ping(pinging(buyer, ping_path="/ping?campaign=7", method="GET", fieldMapping=MAPPING[:3]))
    assert (result.outcome, result.bid) == ("bid", 4.0)
    (received,) = buyer.requests
    assert received.method == "GET" and received.path == "/ping" and received.body == b""
    assert received.params() == {"campaign": "7", "state": "CA", "zip": "94105", "debt": "25000"}
    assert "content-type" not in received.headers


def test_form_body(buyer: BuyerServer) -> None:
    buyer.route("/ping", status=200, body={"bid": 5})
    assert ping(pinging(buyer, bodyFormat="form", fieldMapping=MAPPING)).outcome == "bid"
    (received,) = buyer.requests
    assert received.method == "POST"
    assert received.headers["content-type"] == "application/x-www-form-urlencoded"
    assert received.form() == {"state": "CA", "zip": "94105", "debt": "25000", "owner": "true", "vendor_id": "42"}


def test_xml_body(buyer: BuyerServer) -> None:
    buyer.route("/ping", status=200, body={"bid": 6})
    mapping = [*MAPPING, {"clientKey": "last name", "leadField": "lastName"}]
    assert ping(pinging(buyer, bodyFormat="xml", fieldMapping=mapping)).outcome == "bid"
    (received,) = buyer.requests
    assert received.headers["content-type"].startswith("application/xml")
    root = ET.fromstring(received.body)
    assert root.tag == "lead"
    assert root.findtext("state") == "CA" and root.findtext("debt") == "25000" and root.findtext("owner") == "true"
    assert root.findtext("last_name") == "O'Neil & <Co>"


def test_a_required_value_missing_sends_nothing(buyer: BuyerServer) -> None:
    buyer.route("/ping", status=200, body={"bid": 6})
    result = ping(pinging(buyer, fieldMapping=MAPPING), {**LEAD, "address": {}})
    assert result.outcome == "error" and "state: required value missing" in (result.reason or "")
    assert buyer.requests == []


@pytest.mark.parametrize(("auth", "header", "expected"), [
    ({"type": "basic", "username": "buyer", "password": SECRET}, "authorization",
     "Basic " + base64.b64encode(f"buyer:{SECRET}".encode()).decode()),
    ({"type": "bearer", "token": SECRET}, "authorization", f"Bearer {SECRET}"),
    ({"type": "header", "headerName": "X-Buyer-Auth", "token": SECRET}, "x-buyer-auth", SECRET),
])
def test_the_endpoint_auth_goes_with_the_ping(buyer: BuyerServer, auth: dict, header: str, expected: str) -> None:
    buyer.route("/ping", status=200, body={"bid": 7})
    result = ping(pinging(buyer, fieldMapping=MAPPING[:1]) | {"auth": auth})
    assert result.outcome == "bid", result
    (received,) = buyer.requests
    assert received.headers[header] == expected


def test_credential_headers_go_with_the_ping_other_endpoint_headers_do_not(buyer: BuyerServer) -> None:
    buyer.route("/ping", status=200, body={"bid": 8})
    fields = pinging(buyer, headers={"X-Ping-Source": "appliance", "Accept-Language": "en"}) | {
        # X-Api-Key looks like a credential; X-Partner is one because the endpoint says so.
        "headers": {"X-Api-Key": SECRET, "X-Partner": "partner-77", "X-Vendor": "v1", "X-Campaign": "post-only"},
        "secretHeaders": ["X-Partner"]}
    assert ping(fields).outcome == "bid"
    (received,) = buyer.requests
    assert received.headers["x-api-key"] == SECRET
    assert received.headers["x-partner"] == "partner-77"
    assert "x-vendor" not in received.headers and "x-campaign" not in received.headers
    # The ping's own headers are sent.
    assert received.headers["x-ping-source"] == "appliance" and received.headers["accept-language"] == "en"


def test_ping_headers_are_sent(buyer: BuyerServer) -> None:
    buyer.route("/ping", status=200, body={"bid": 9})
    assert ping(pinging(buyer, headers={"X-Ping-Version": "2", "Content-Type": "application/vnd.bids+json"})
                ).outcome == "bid"
    (received,) = buyer.requests
    assert received.headers["x-ping-version"] == "2"
    assert received.headers["content-type"] == "application/vnd.bids+json"  # a ping header beats the default


def test_an_endpoint_without_ping_cannot_be_pinged(buyer: BuyerServer) -> None:
    result = ping({"url": buyer.url("/post")})
    assert result.outcome == "error" and result.reason == "the endpoint has no ping"
    assert buyer.requests == []


def test_the_http_adapter_pings_through_the_plugin_hook() -> None:
    from appliance import plugins

    registry = plugins.Registry({})
    report = registry.register(http_delivery, "http_delivery", http_delivery.__file__, builtin=True)
    assert report.error is None, report.error
    adapter = registry.delivery_adapter("http")
    assert isinstance(adapter, HttpDelivery) and adapter.can_ping


# ---- faults -------------------------------------------------------------------------------


def test_no_answer_within_the_timeout_raises_timeout_error(buyer: BuyerServer) -> None:
    """The round records a ping that raised TimeoutError as `timeout` (no answer in time)."""
    buyer.route("/ping", status=200, body={"bid": 5}, delay=3)
    fields = pinging(buyer)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="timed out"):
        ping(fields, timeout_seconds=0.3)
    assert time.monotonic() - start < 1.0


def test_a_body_that_drips_ends_at_the_timeout(buyer: BuyerServer) -> None:
    buyer.route("/ping", status=200, drip=True, drip_interval=0.02)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="timed out"):
        ping(pinging(buyer), timeout_seconds=0.4)
    assert 0.3 < time.monotonic() - start < 1.1


def test_connection_refused_is_an_error() -> None:
    url = f"http://127.0.0.1:{free_port()}/ping"
    result, elapsed = timed(ping, pinging(url))
    assert result.outcome == "error" and "connection failed" in (result.reason or ""), result
    assert elapsed < 2


def test_connection_closed_without_an_answer_is_an_error(buyer: BuyerServer) -> None:
    buyer.route("/ping", close=True)
    result = ping(pinging(buyer))
    assert result.outcome == "error" and result.status_code is None and result.bid is None


def test_private_destination_refused_by_the_ssrf_guard(buyer: BuyerServer) -> None:
    buyer.route("/ping", status=200, body={"bid": 5})
    result, elapsed = timed(ping, pinging(buyer), allow_private=False)
    # The guard's `failure` (nothing was sent) is a lost bid: outcome error, with the reason.
    assert result.outcome == "error", result
    assert (result.reason or "").startswith("destination refused") and "loopback" in (result.reason or "")
    assert result.bid is None and elapsed < 2
    time.sleep(0.05)  # as in test_http_delivery: no moment to await for a request that never came
    assert buyer.requests == []


def test_the_answer_is_read_up_to_one_mib(buyer: BuyerServer) -> None:
    """Past 1 MiB nothing is read: a JSON bid padded with whitespace to beyond the cap, then
    garbage, reads as the bid (the whole body would not be JSON)."""
    head = b'{"bid": 7.25}'
    body = head + b" " * (http_delivery.MAX_RESPONSE_BYTES - len(head)) + b"not json" * 100_000
    result, elapsed = timed(answered, buyer, body, headers={"Content-Type": "application/json"})
    assert (result.outcome, result.bid) == ("bid", 7.25), result
    assert elapsed < 3
    # Garbage at the last byte of the first MiB is read, and spoils the answer.
    spoiled = head + b" " * (http_delivery.MAX_RESPONSE_BYTES - len(head) - 1) + b"x" + b" " * 100
    result = answered(buyer, spoiled, headers={"Content-Type": "application/json"})
    assert result.outcome == "error" and "not JSON" in (result.reason or "")


def test_a_huge_answer_ends_promptly(buyer: BuyerServer) -> None:
    buyer.route("/ping", status=200, size=5 * 1024 * 1024)
    result, elapsed = timed(ping, pinging(buyer), timeout_seconds=10)
    assert result.outcome == "error" and "not JSON" in (result.reason or "")
    assert elapsed < 3


# ---- reading the answer ---------------------------------------------------------------------


@pytest.mark.parametrize(("accepted", "status", "body", "outcome"), [
    ({"statusCodes": [201]}, 201, {"bid": 5}, "bid"),
    ({"statusCodes": [201]}, 200, {"bid": 5}, "no_bid"),
    ({"jsonPath": "decision", "values": ["buy", "maybe"]}, 200, {"decision": "Buy", "bid": 5}, "bid"),
    ({"jsonPath": "decision", "values": ["buy", "maybe"]}, 200, {"decision": "pass", "bid": 5}, "no_bid"),
    ({"jsonPath": "decision", "values": ["buy"]}, 200, {"bid": 5}, "no_bid"),
    ({"bodyPattern": r'"interested"\s*:\s*true'}, 200, {"interested": True, "bid": 5}, "bid"),
    ({"bodyPattern": r'"interested"\s*:\s*true'}, 200, {"interested": False, "bid": 5}, "no_bid"),
])
def test_accepted_matcher(buyer: BuyerServer, accepted: dict, status: int, body: Any, outcome: str) -> None:
    result = answered(buyer, body, status, rules={"accepted": accepted, "bidPath": "bid"})
    assert result.outcome == outcome, result
    assert result.bid == (5.0 if outcome == "bid" else None)
    assert result.status_code == status
    if outcome == "no_bid":
        assert result.reason == f"HTTP {status}: no bid"


def test_accepted_without_a_bid_at_the_path_is_an_error(buyer: BuyerServer) -> None:
    result = answered(buyer, {"decision": "buy"}, rules={"accepted": {"jsonPath": "decision", "values": ["buy"]},
                                                         "bidPath": "price"})
    assert result.outcome == "error" and result.reason == "HTTP 200: no bid at price"


def test_nested_bid_token_and_message(buyer: BuyerServer) -> None:
    body = {"result": {"offer": {"price": "12.50", "token": "tok-ABC-123"}, "message": "we will take it"}}
    rules = {"bidPath": "result.offer.price", "pingTokenPath": "result.offer.token", "messagePath": "result.message"}
    result = answered(buyer, body, rules=rules)
    assert (result.outcome, result.bid, result.ping_token, result.message, result.reason) == \
        ("bid", 12.5, "tok-ABC-123", "we will take it", None)


def test_numeric_token_and_message_of_a_refusal(buyer: BuyerServer) -> None:
    rules = {"bidPath": "offer.price", "pingTokenPath": "offer.id", "messagePath": "why"}
    result = answered(buyer, {"offer": {"price": 3, "id": 991}}, rules=rules)
    assert (result.outcome, result.bid, result.ping_token) == ("bid", 3.0, "991")
    result = answered(buyer, {"why": "state not served"}, 400, rules=rules)
    assert (result.outcome, result.message, result.bid, result.ping_token) == \
        ("no_bid", "state not served", None, None)


BAD_BIDS = [
    ("$12", "bid '$12' is not a number"),
    ("12 USD", "bid '12 USD' is not a number"),
    (-1, "bid -1 is negative"),
    (1e7, "is over 1,000,000"),
    (True, "bid is true, not a number"),
    ("NaN", "bid 'NaN' is not a number"),
    ("Infinity", "bid 'Infinity' is not a number"),
    ("-inf", "bid is not a finite number"),
    ("", "is not a number"),
    ({"amount": 5}, "bid is not a number"),
]


@pytest.mark.parametrize(("bid", "problem"), [*BAD_BIDS, (None, "bid is null, not a number")])
def test_an_unusable_bid_is_an_error_naming_the_problem(buyer: BuyerServer, bid: Any, problem: str) -> None:
    # `accepted` says the answer is a bid; the value at bidPath cannot be one.
    result = answered(buyer, {"bid": bid}, rules={"accepted": {"statusCodes": [200]}, "bidPath": "bid"})
    assert result.outcome == "error", result
    assert problem in (result.reason or ""), result.reason
    assert result.bid is None


@pytest.mark.parametrize(("bid", "problem"), BAD_BIDS)
def test_an_unusable_bid_with_the_default_matcher_is_an_error(buyer: BuyerServer, bid: Any, problem: str) -> None:
    result = answered(buyer, {"bid": bid})
    assert result.outcome == "error" and problem in (result.reason or ""), result
    assert result.bid is None


def test_a_null_bid_with_the_default_matcher_is_no_bid(buyer: BuyerServer) -> None:
    # The default `accepted` is "a 2xx with a bid" (docs: a non-null value at bidPath): null passes.
    result = answered(buyer, {"bid": None})
    assert (result.outcome, result.reason) == ("no_bid", "HTTP 200: no bid")


@pytest.mark.parametrize("raw", [b'{"bid": NaN}', b'{"bid": Infinity}', b'{"bid": 1e999}'])
def test_non_finite_json_numbers_are_errors(buyer: BuyerServer, raw: bytes) -> None:
    result = answered(buyer, raw, headers={"Content-Type": "application/json"})
    assert result.outcome == "error" and result.bid is None, result


@pytest.mark.parametrize(("bid", "amount"), [(0, 0.0), ("12.50", 12.5), (" 7 ", 7.0), (1_000_000, 1e6), (0.01, 0.01)])
def test_usable_bids(buyer: BuyerServer, bid: Any, amount: float) -> None:
    result = answered(buyer, {"bid": bid})
    assert (result.outcome, result.bid) == ("bid", amount), result


@pytest.mark.parametrize(("status", "outcome"), [
    (204, "no_bid"), (400, "no_bid"), (404, "no_bid"), (409, "no_bid"),
    (503, "error"), (500, "error"), (429, "error"), (408, "error"),
])
def test_status_answers(buyer: BuyerServer, status: int, outcome: str) -> None:
    body = None if status == 204 else {"bid": 5, "message": "nope"}
    result = answered(buyer, body, status, rules={"bidPath": "bid", "messagePath": "message"})
    assert (result.outcome, result.status_code, result.bid) == (outcome, status, None), result
    if outcome == "error":
        assert result.reason == f"HTTP {status}" and result.message == "nope"
    elif status != 204:
        assert result.message == "nope"


def test_a_redirect_is_not_followed(buyer: BuyerServer) -> None:
    buyer.route("/ping", status=302, headers={"Location": buyer.url("/elsewhere")})
    buyer.route("/elsewhere", status=200, body={"bid": 50})
    result = ping(pinging(buyer))
    assert result.outcome != "bid" and result.bid is None, result
    assert [r.path for r in buyer.requests] == ["/ping"]


@pytest.mark.parametrize("body", ["<html>we are down</html>", '{"bid": 5', "bid=5"])
def test_a_2xx_answer_that_is_not_json_is_an_error(buyer: BuyerServer, body: str) -> None:
    result = answered(buyer, body, headers={"Content-Type": "text/html"})
    assert result.outcome == "error" and result.reason == "HTTP 200: the answer is not JSON", result


def test_what_a_ping_result_carries_is_plain_data(buyer: BuyerServer) -> None:
    result = answered(buyer, {"bid": 1.5, "token": "t"}, rules={"bidPath": "bid", "pingTokenPath": "token"})
    assert msgspec.to_builtins(result) == {"outcome": "bid", "bid": 1.5, "ping_token": "t", "reason": None,
                                           "message": None, "status_code": 200}


def test_make_endpoint_refuses_credentials_in_the_ping(buyer: BuyerServer) -> None:
    # What the ping sends as credentials comes from the endpoint only (validated on import).
    with pytest.raises(msgspec.ValidationError, match=r"X-Api-Key looks like a credential.*\$\.ping"):
        msgspec.convert({"deliveryEndpointId": "e", "url": buyer.url("/post"),
                         "ping": {"url": buyer.url("/ping"), "headers": {"X-Api-Key": SECRET},
                                  "responseRules": {"bidPath": "bid"}}}, DeliveryEndpoint)
