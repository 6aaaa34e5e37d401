"""Suppliers who ping before they post (CONTRACT 9.2 and 9.10), through the public surface:
POST /api/v1/leads/ping with a source key or a tenant key (the answer's shape, the payout offered:
the winning bids less the campaign's margin, or the source's fixed payout), its validation, the
source's ping limits (429 with Retry-After), its refusals (duplicate by digest or by the contact
it carries, disqualified, cap, no bid), POST /api/v1/leads/submit with the `pingId` (sold to the
ping's winners at their bids without another round, the payout booked as the lead's cost, the
ping token carried by the post) and every 409 it answers with nothing stored, GET /api/v1/pings
(filters, pages) and `[retention] ping_days` (the ticker's purge, run by moving the clock).

Buyers answer through the scripted adapter of the plugin folder (tests/worker_helpers.py: an
endpoint's `config.ping` is its bid; the plugin's module-level PINGS list records every ping) or,
for the built-in `http` adapter, through a real local buyer server (tests/buyer_server.py)."""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from appliance.config import ConfigError, load_config
from appliance.runtime import Runtime
from tests.bundles import campaign
from tests.buyer_server import BuyerServer
from tests.conftest import Tenant, make_tenant
from tests.submit_support import (  # noqa: F401 (clock)
    START,
    FakeClock,
    clock,
    condition,
    rule_set,
    source_key,
)
from tests.worker_helpers import endpoint, lead_of, live_app, status_is, wait_for

PING_URL = {"url": "https://buyer.example.com/ping", "responseRules": {"bidPath": "bid"}}
UNKNOWN_PING = "png_01JD0000000000000000000000"


# ---- fixtures ------------------------------------------------------------------------------------

@pytest.fixture
def ping_days() -> int | None:
    """`[retention] ping_days` for the test's config (None: the default); a test parametrizes it."""
    return None


@pytest.fixture
def config_file(config_file: Path, ping_days: int | None) -> Path:
    with config_file.open("a") as f:  # the http adapter's buyer is on loopback
        f.write("\n[delivery]\nallow_private_addresses = true\n")
        if ping_days is not None:
            f.write(f"\n[retention]\nping_days = {ping_days}\n")
    return config_file


@pytest.fixture
def live(runtime: Runtime, clock: FakeClock, tmp_path: Path) -> Iterator[TestClient]:
    """The app with its job loop and ticker, on the fake clock, with the scripted adapter."""
    with live_app(runtime, tmp_path) as client:
        yield client


# ---- helpers -------------------------------------------------------------------------------------

def bidder(endpoint_id: str, ping: str, answers: str = "success", **extra) -> dict:
    """A scripted buyer: `ping` is its answer to every ping (a bid such as "12.5", or "none")."""
    return endpoint(endpoint_id, config={"answers": answers, "ping": ping}, ping=PING_URL, **extra)


def source(source_id: str, **extra) -> dict:
    return {"sourceId": source_id, "name": f"Source {source_id}", **extra}


def auctioned(code: str, buyer_ids: list[str], *, auction: dict | None = None, sources: list[dict] | None = None,
              items: list[dict] | None = None, **extra) -> dict:
    """A campaign that sells at auction to `buyer_ids` (distribution items, unless `items`)."""
    distribution: dict[str, Any] = {"method": "auction",
                                    "endpoints": items or [{"deliveryEndpointId": b} for b in buyer_ids]}
    if auction is not None:
        distribution["auction"] = auction
    if sources is not None:
        extra["ingestion"] = {"sources": sources}
    return campaign(code, f"Campaign {code}", delivery={"distribution": distribution}, **extra)


def plain(code: str, *, sources: list[dict] | None = None, **extra) -> dict:
    """A campaign that does not auction (and delivers nowhere)."""
    if sources is not None:
        extra["ingestion"] = {"sources": sources}
    return campaign(code, f"Campaign {code}", **extra)


def setup(runtime: Runtime, *campaigns: dict, buyers: list[dict] | None = None, name: str = "Pings") -> Tenant:
    return make_tenant(runtime, name, {"deliveryEndpoints": buyers or [], "campaigns": list(campaigns)})


def headers(who: Tenant | str) -> dict[str, str]:
    return who.headers if isinstance(who, Tenant) else {"X-API-Key": who}


def ping_response(client: TestClient, who: Tenant | str, body: dict):
    return client.post("/api/v1/leads/ping", json=body, headers=headers(who))


def ping(client: TestClient, who: Tenant | str, body: dict) -> dict:
    response = ping_response(client, who, body)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def post(client: TestClient, who: Tenant | str, body: dict):
    return client.post("/api/v1/leads/submit", json=body, headers=headers(who))


def posted(client: TestClient, who: Tenant | str, body: dict) -> dict:
    response = post(client, who, body)
    assert response.status_code == 201, response.text
    return response.json()["data"]


_n = iter(range(1000, 9999))


def person(code: str, **extra) -> dict:
    """A full submit body with an email and phone no other call returns."""
    n = next(_n)
    return {"campaignId": code, "firstName": "Ann", "lastName": "Lee", "email": f"ann.{n}@example.com",
            "phone": f"+1 415 555 {n:04d}", "address": {"state": "CA", "zip": "94105"}, **extra}


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def e164(phone: str) -> str:
    return "+" + "".join(ch for ch in phone if ch.isdigit())


def partial(body: dict, **extra) -> dict:
    """The ping of a full body: no contact fields, the email's and the phone's digests instead."""
    kept = {k: v for k, v in body.items() if k not in ("firstName", "lastName", "email", "phone")}
    return {**kept, "emailHash": sha(body["email"]), "phoneHash": sha(e164(body["phone"])), **extra}


def pings_listed(client: TestClient, tenant: Tenant, **query) -> dict:
    response = client.get("/api/v1/pings", params=query, headers=tenant.headers)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def ping_ids(client: TestClient, tenant: Tenant, **query) -> list[str]:
    return [item["pingId"] for item in pings_listed(client, tenant, limit=100, **query)["items"]]


def listed_ping(client: TestClient, tenant: Tenant, ping_id: str) -> dict:
    (item,) = [i for i in pings_listed(client, tenant, limit=100)["items"] if i["pingId"] == ping_id]
    return item


def lead_ids(client: TestClient, tenant: Tenant) -> list[str]:
    response = client.get("/api/v1/leads", params={"limit": 100}, headers=tenant.headers)
    assert response.status_code == 200, response.text
    return [item["leadId"] for item in response.json()["data"]["leads"]]


def ledger(client: TestClient, tenant: Tenant, lead_id: str) -> list[tuple]:
    response = client.get("/api/v1/ledger", params={"leadId": lead_id}, headers=tenant.headers)
    assert response.status_code == 200, response.text
    return sorted((e["kind"], e["leadStatus"], e["deliveryEndpointId"], e["amount"], e["currency"])
                  for e in response.json()["data"]["items"])


def auctions(client: TestClient, tenant: Tenant, lead_id: str) -> list[dict]:
    response = client.get(f"/api/v1/leads/{lead_id}/auctions", headers=tenant.headers)
    assert response.status_code == 200, response.text
    return response.json()["data"]["items"]


def scripted_pings() -> list[tuple[str, str, dict]]:
    """(endpointId, auctionId, lead) of every ping the scripted plugin, as the running app loaded
    it, has answered."""
    return list(sys.modules["appliance_plugins.scripted"].PINGS)


def refused_with(answer: dict, reason: str) -> None:
    assert (answer["accepted"], answer["bid"], answer["reason"]) == (False, None, reason), answer
    assert answer["pingId"].startswith("png_")


def at(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def eventually(predicate, timeout: float = 8.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


# ---- who may ping, and the answer ----------------------------------------------------------------

def test_a_source_key_pings_its_own_campaigns_only(live, runtime):
    tenant = setup(runtime, plain("PG1", sources=[source("web", payout=7.5)]), plain("PG2", sources=[source("other")]),
                   plain("PG3"))
    web = source_key(runtime, tenant, "web")
    answer = ping(live, web, {"campaignId": "PG1"})
    assert answer["accepted"] is True and answer["bid"] == 7.5
    for code in ("PG2", "PG3", "NOPE"):
        response = ping_response(live, web, {"campaignId": code})
        assert response.status_code == 403, response.text
        assert response.json()["error"]["code"] == "FORBIDDEN"
    # the source is resolved before the lead's fields are validated: a bad email to a foreign campaign is 403
    response = ping_response(live, web, {"campaignId": "PG2", "email": "not-an-email"})
    assert response.status_code == 403, response.text
    assert ping_ids(live, tenant) == [answer["pingId"]]  # the refused ones stored nothing
    assert listed_ping(live, tenant, answer["pingId"])["sourceId"] == "web"


def test_a_tenant_key_pings_and_the_answer_has_the_pinned_shape(live, runtime):
    tenant = setup(runtime, auctioned("AU1", ["a", "b"], auction={"bidTtlSeconds": 120, "currency": "EUR"}),
                   buyers=[bidder("a", "10"), bidder("b", "20")])
    before = len(scripted_pings())
    response = ping_response(live, tenant, {"campaignId": "AU1", "address": {"state": "TX"},
                                            "emailHash": sha("someone@example.com")})
    assert response.status_code == 200, response.text
    answer = response.json()["data"]
    assert set(answer) == {"pingId", "accepted", "bid", "currency", "expiresAt", "reason"}
    assert answer["pingId"].startswith("png_")
    assert (answer["accepted"], answer["bid"], answer["currency"], answer["reason"]) == (True, 20.0, "EUR", None)
    assert answer["expiresAt"] == at(START + timedelta(seconds=120))  # the round's end + bidTtlSeconds
    # the round was held with the partial lead: both buyers asked, no contact sent
    asked = scripted_pings()[before:]
    assert sorted(eid for eid, _, _ in asked) == ["a", "b"]
    assert all(lead.get("email") is None and (lead.get("address") or {}).get("state") == "TX" for _, _, lead in asked)
    item = listed_ping(live, tenant, answer["pingId"])
    assert item == {"pingId": answer["pingId"], "sourceId": None, "campaignId": "AU1", "accepted": True, "bid": 20.0,
                    "currency": "EUR", "reason": None, "createdAt": at(START), "leadId": None}


@pytest.mark.parametrize(("bid", "margin", "offered"), [
    ("20", None, 20.0),
    ("20", {"percent": 20}, 16.0),                  # 20 = 20 % of the winning bid
    ("20", {"amount": 3.5}, 16.5),
    ("20", {"percent": 20, "amount": 3.5}, 12.5),   # the percentage first (20 - 4 - 3.5), then the amount
    ("10", {"percent": 33.333}, 6.67),              # cents: 6.6667
    ("12.344", None, 12.34),                        # cents: 12.344
    ("9.996", None, 10.0),                          # cents: 9.996
    ("10", {"amount": 12}, 0.0),                    # never below 0
    ("10", {"percent": 100, "amount": 1}, 0.0),
], ids=["none", "percent", "amount", "both", "round-up", "round-down", "round-to-whole", "floor-0", "all-kept"])
def test_the_payout_is_the_winning_bid_less_the_margin(live, runtime, bid, margin, offered):
    auction = {"margin": margin} if margin is not None else {}
    tenant = setup(runtime, auctioned("AU1", ["low", "win"], auction=auction),
                   buyers=[bidder("low", "1"), bidder("win", bid)])
    answer = ping(live, tenant, {"campaignId": "AU1"})
    assert (answer["accepted"], answer["bid"], answer["reason"]) == (True, offered, None)


def test_the_payout_rounds_a_half_cent_of_the_decimal_amount(live, runtime):
    tenant = setup(runtime, auctioned("AU1", ["win"], auction={"margin": {"percent": 50}}),
                   buyers=[bidder("win", "5.35")])
    assert ping(live, tenant, {"campaignId": "AU1"})["bid"] == 2.68


def test_shared_mode_offers_the_sum_of_the_winners_bids_less_the_margin(live, runtime):
    tenant = setup(runtime, auctioned("AU1", ["a", "b", "c"], auction={
        "mode": "shared", "maxWinners": 2, "margin": {"percent": 10, "amount": 1}}),
        buyers=[bidder("a", "10"), bidder("b", "20"), bidder("c", "5")])
    answer = ping(live, tenant, {"campaignId": "AU1"})
    assert answer["accepted"] is True
    assert answer["bid"] == 26.0  # (20 + 10) - 10 % - 1; c's 5 is not among the 2 winners


def test_the_campaign_routed_to_decides_whether_a_round_is_held(live, runtime):
    tenant = setup(runtime, plain("RT1", qualification={"autoRoutingEnabled": True, "routingRules": [
        {"routeName": "CA", "priority": 1, "active": True, "logicalOperator": "AND",
         "subRules": [{"logicalOperator": "AND", "conditions": [condition("address.state", "equals", ["CA"])]}],
         "routeTo": {"campaignId": "AU1"}}]}),
        auctioned("AU1", ["a"], auction={"margin": {"amount": 2}}), buyers=[bidder("a", "10")])
    before = len(scripted_pings())
    body = person("RT1", address={"state": "CA"})
    routed = ping(live, tenant, partial(body))  # routed to AU1: its round and margin
    assert (routed["accepted"], routed["bid"]) == (True, 8.0)
    assert len(scripted_pings()) == before + 1
    stays = ping(live, tenant, {"campaignId": "RT1", "address": {"state": "TX"}})  # RT1 does not auction
    assert (stays["accepted"], stays["bid"]) == (True, None)
    assert len(scripted_pings()) == before + 1
    assert listed_ping(live, tenant, routed["pingId"])["campaignId"] == "RT1"  # the campaign pinged
    data = posted(live, tenant, {**body, "pingId": routed["pingId"]})
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    assert lead["status"] == "delivered", lead["submissions"][-1]["result"]
    assert lead["campaignId"] == "AU1"
    assert len(scripted_pings()) == before + 1
    assert ledger(live, tenant, data["leadId"]) == [("cost", "lead_ingested", None, 8.0, "USD"),
                                                    ("revenue", "delivered", "a", 10.0, "USD")]


def test_a_campaign_that_does_not_auction_offers_the_sources_payout(live, runtime):
    tenant = setup(runtime, plain("PG1", sources=[source("paid", payout=7.5), source("unpaid")]))
    paid = ping(live, source_key(runtime, tenant, "paid"), {"campaignId": "PG1"})
    assert (paid["accepted"], paid["bid"], paid["currency"], paid["reason"]) == (True, 7.5, "USD", None)
    assert paid["expiresAt"] == at(START + timedelta(seconds=60))
    unpaid = ping(live, source_key(runtime, tenant, "unpaid"), {"campaignId": "PG1"})
    assert (unpaid["accepted"], unpaid["bid"], unpaid["reason"]) == (True, None, None)
    by_tenant = ping(live, tenant, {"campaignId": "PG1"})  # no source: no payout
    assert (by_tenant["accepted"], by_tenant["bid"]) == (True, None)
    assert listed_ping(live, tenant, paid["pingId"])["bid"] == 7.5


# ---- validation ------------------------------------------------------------------------------------

GOOD_HASH = sha("ann@example.com")


@pytest.mark.parametrize(("field", "value"), [
    ("emailHash", GOOD_HASH.upper()),
    ("emailHash", GOOD_HASH[:63]),
    ("emailHash", GOOD_HASH + "0"),
    ("emailHash", "z" * 64),
    ("phoneHash", GOOD_HASH.upper()),
    ("phoneHash", GOOD_HASH[:63]),
    ("phoneHash", "+14155550123"),
], ids=["email-upper", "email-63", "email-65", "email-not-hex", "phone-upper", "phone-63", "phone-not-hashed"])
def test_a_malformed_hash_is_400_naming_the_field(live, runtime, field, value):
    tenant = setup(runtime, plain("PG1"))
    response = ping_response(live, tenant, {"campaignId": "PG1", field: value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "VALIDATION_ERROR"
    assert any(field in detail for detail in error["details"]), error
    assert ping_ids(live, tenant) == []


def test_contact_fields_present_are_validated_like_submit(live, runtime):
    tenant = setup(runtime, plain("PG1"))
    response = ping_response(live, tenant, {"campaignId": "PG1", "email": "not-an-email"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "VALIDATION_ERROR"
    assert "email: must be a valid email address" in response.json()["error"]["details"]
    missing = ping_response(live, tenant, {"emailHash": GOOD_HASH})
    assert missing.status_code == 400 and any("campaignId" in d for d in missing.json()["error"]["details"])
    assert ping_ids(live, tenant) == []


def test_a_ping_without_any_contact_field_is_accepted(live, runtime):
    tenant = setup(runtime, plain("PG1", sources=[source("web", payout=3)]))
    answer = ping(live, source_key(runtime, tenant, "web"), {"campaignId": "PG1"})
    assert (answer["accepted"], answer["bid"], answer["reason"]) == (True, 3.0, None)
    with_some = ping(live, tenant, {"campaignId": "PG1", "firstName": "Ann", "address": {"state": "CA"}})
    assert with_some["accepted"] is True


# ---- refusals: 200 accepted false ------------------------------------------------------------------

def test_a_duplicate_by_digest_or_by_the_contact_it_carries(live, runtime, clock):
    tenant = setup(runtime, plain("DD1"), plain("DD2"))
    body = person("DD1", email="dup.one@example.com", phone="+1 415 555 0123")
    posted(live, tenant, body)
    refused_with(ping(live, tenant, {"campaignId": "DD1", "emailHash": sha("dup.one@example.com")}), "duplicate")
    refused_with(ping(live, tenant, {"campaignId": "DD1", "phoneHash": sha("+14155550123")}), "duplicate")
    refused_with(ping(live, tenant, {"campaignId": "DD1", "email": "Dup.One@Example.com"}), "duplicate")
    refused_with(ping(live, tenant, {"campaignId": "DD1", "phone": "(415) 555-0123"}), "duplicate")
    # a digest of neither, another campaign
    assert ping(live, tenant, {"campaignId": "DD1", "emailHash": sha("someone.else@example.com"),
                               "phoneHash": sha("+14155550999")})["accepted"] is True
    assert ping(live, tenant, {"campaignId": "DD2", "emailHash": sha("dup.one@example.com"),
                               "phoneHash": sha("+14155550123")})["accepted"] is True
    # outside the dedupe window (30 days by default)
    clock.advance(days=31)
    assert ping(live, tenant, {"campaignId": "DD1", "emailHash": sha("dup.one@example.com")})["accepted"] is True
    assert ping(live, tenant, {"campaignId": "DD1", "email": "dup.one@example.com"})["accepted"] is True


def test_the_campaigns_own_dedupe_window_and_fields_apply(live, runtime, clock):
    tenant = setup(runtime, plain("DD1", qualification={"dedupeOverride": {
        "window": 2, "matchFields": {"email": True, "phone": False}}}))
    posted(live, tenant, person("DD1", email="dup.two@example.com", phone="+1 415 555 0124"))
    refused_with(ping(live, tenant, {"campaignId": "DD1", "emailHash": sha("dup.two@example.com")}), "duplicate")
    assert ping(live, tenant, {"campaignId": "DD1", "phoneHash": sha("+14155550124")})["accepted"] is True
    clock.advance(days=2, minutes=1)
    assert ping(live, tenant, {"campaignId": "DD1", "emailHash": sha("dup.two@example.com")})["accepted"] is True


def test_a_lead_that_fails_a_qualification_rule_is_disqualified(live, runtime):
    tenant = setup(runtime, plain("QQ1", sources=[source("web", payout=4)], qualification={
        "rules": [rule_set(condition("address.state", "equals", ["NY"]), name="no NY")]}))
    web = source_key(runtime, tenant, "web")
    refused_with(ping(live, web, {"campaignId": "QQ1", "address": {"state": "NY"}}), "disqualified")
    assert ping(live, web, {"campaignId": "QQ1", "address": {"state": "CA"}})["bid"] == 4.0


def test_a_lead_without_the_sources_attestation_is_disqualified(live, runtime):
    tenant = setup(runtime, plain("QQ1", sources=[source("web", payout=4)], qualification={
        "tcpaPolicy": {"ingestionPolicy": {"requireSourceAttestation": True}}}))
    web = source_key(runtime, tenant, "web")
    refused_with(ping(live, web, {"campaignId": "QQ1"}), "disqualified")
    attested = {"tcpaConsent": True, "consentTimestamp": "2026-03-10T14:00:00Z"}
    assert ping(live, web, {"campaignId": "QQ1", "compliance": attested})["accepted"] is True


def test_a_source_whose_cap_is_full_is_refused_cap(live, runtime):
    tenant = setup(runtime, plain("CC1", sources=[source("web", payout=5, caps=[{"cap": 1, "type": "daily"}])]))
    web = source_key(runtime, tenant, "web")
    assert ping(live, web, {"campaignId": "CC1"})["accepted"] is True  # room left
    assert posted(live, web, person("CC1"))["status"] == "qualified"  # the lead takes the cap's room
    refused_with(ping(live, web, {"campaignId": "CC1"}), "cap")


@pytest.mark.parametrize(("buyers", "items", "auction"), [
    ([bidder("a", "none"), bidder("b", "none")], None, {}),
    ([bidder("a", "10"), bidder("b", "14.99")], None, {"floor": 15}),
    ([bidder("a", "10")], [{"deliveryEndpointId": "a", "conditions": {"subRules": [{"conditions": [
        condition("address.state", "equals", ["TX"])]}]}}], {}),
], ids=["all-pass", "below-floor", "nobody-askable"])
def test_an_auction_without_a_bid_is_refused_no_bid(live, runtime, buyers, items, auction):
    tenant = setup(runtime, auctioned("AU1", [b["deliveryEndpointId"] for b in buyers], items=items,
                                      auction={"currency": "EUR", **auction}), buyers=buyers)
    answer = ping(live, tenant, {"campaignId": "AU1", "address": {"state": "CA"}})
    refused_with(answer, "no bid")
    assert answer["currency"] == "EUR"
    assert listed_ping(live, tenant, answer["pingId"])["reason"] == "no bid"


# ---- ping limits ---------------------------------------------------------------------------------

def test_a_ping_over_the_sources_per_minute_limit_is_429_with_retry_after(live, runtime, clock):
    tenant = setup(runtime, plain("LL1", sources=[source("web", payout=2, pingLimits=[{"type": "per_minute", "cap": 2}]),
                                               source("other", pingLimits=[{"type": "per_minute", "cap": 2}])],
                                  qualification={"rules": [rule_set(condition("address.state", "equals", ["NY"]))]}))
    web = source_key(runtime, tenant, "web")
    clock.advance(seconds=15)  # 15:00:15: the minute ends in 45 s
    first = ping(live, web, {"campaignId": "LL1", "address": {"state": "NY"}})
    refused_with(first, "disqualified")  # a refused ping is stored, so it counts
    second = ping(live, web, {"campaignId": "LL1"})
    assert second["accepted"] is True
    third = ping_response(live, web, {"campaignId": "LL1"})
    assert third.status_code == 429, third.text
    assert third.json()["error"]["code"] == "RATE_LIMITED"
    retry_after = int(third.headers["Retry-After"])
    assert 1 <= retry_after <= 60
    assert retry_after == 45  # seconds to the end of the minute
    # validation comes before the limit
    assert ping_response(live, web, {"campaignId": "LL1", "emailHash": "BAD"}).status_code == 400
    # the limit is the source's own; a tenant key has none
    assert ping(live, source_key(runtime, tenant, "other"), {"campaignId": "LL1"})["accepted"] is True
    for _ in range(3):
        assert ping(live, tenant, {"campaignId": "LL1"})["accepted"] is True
    assert ping_ids(live, tenant, sourceId="web") == [second["pingId"], first["pingId"]]  # the 429 stored nothing
    clock.advance(minutes=1)
    assert ping(live, web, {"campaignId": "LL1"})["accepted"] is True
    assert len(ping_ids(live, tenant, sourceId="web")) == 3


@pytest.mark.parametrize(("kind", "zone", "retry_after"), [
    ("hourly", None, 3585),                     # 15:00:15 UTC: the hour ends at 16:00
    ("daily", None, 9 * 3600 - 15),             # the day ends at midnight UTC
    ("daily", "America/New_York", 13 * 3600 - 15),  # 11:00:15 in New York: its midnight is 04:00 UTC
])
def test_hourly_and_daily_ping_limits_retry_after_the_periods_end(live, runtime, clock, kind, zone, retry_after):
    extra = {"delivery": {"deliverySchedule": {"timezone": zone}}} if zone else {}
    tenant = setup(runtime, plain("LL1", sources=[source("web", pingLimits=[{"type": kind, "cap": 1}])], **extra))
    web = source_key(runtime, tenant, "web")
    clock.advance(seconds=15)
    assert ping(live, web, {"campaignId": "LL1"})["accepted"] is True
    over = ping_response(live, web, {"campaignId": "LL1"})
    assert over.status_code == 429, over.text
    assert int(over.headers["Retry-After"]) == retry_after
    clock.advance(seconds=retry_after)
    assert ping(live, web, {"campaignId": "LL1"})["accepted"] is True


# ---- posting with the pingId ---------------------------------------------------------------------

def test_a_lead_posted_with_its_ping_is_sold_to_the_pings_winner_at_its_bid(live, runtime, clock):
    tenant = setup(runtime, auctioned("AU1", ["a", "b", "c"], auction={"margin": {"percent": 20}, "currency": "EUR"},
                                      sources=[source("web", costMilestones=[{"leadStatus": "lead_ingested",
                                                                               "amount": 2.5, "currency": "EUR"}])]),
                   buyers=[bidder("a", "10"), bidder("b", "20"), bidder("c", "none")])
    web = source_key(runtime, tenant, "web")
    body = person("AU1")
    answer = ping(live, web, partial(body))
    assert (answer["accepted"], answer["bid"], answer["currency"]) == (True, 16.0, "EUR")
    pinged = len(scripted_pings())
    clock.advance(seconds=10)
    data = posted(live, web, {**body, "pingId": answer["pingId"]})
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    assert lead["status"] == "delivered", lead["submissions"][-1]["result"]
    assert lead["submissions"][-1]["responseFields"]["echo"] == "b"
    assert len(scripted_pings()) == pinged  # no new round: nobody was pinged again

    (event,) = [e for e in lead["submissions"][-1]["journeyEvents"] if e["type"] == "auction"]
    assert f"the round of ping {answer['pingId']}" in event["reason"]
    assert event["details"]["winners"] == ["b"]
    (round_,) = auctions(live, tenant, data["leadId"])
    assert round_["submissionId"] == data["submissionId"]
    assert round_["auctionId"] == event["details"]["auctionId"]
    assert round_["startedAt"] == at(START)  # the ping's round, held 10 s before the post
    assert round_["winners"] == ["b"] and round_["currency"] == "EUR"
    assert {b["deliveryEndpointId"]: (b["outcome"], b["bid"]) for b in round_["bids"]} == {
        "a": ("bid", 10.0), "b": ("bid", 20.0), "c": ("no_bid", None)}

    # revenue = the bid; cost = the payout offered, instead of the source's lead_ingested milestone
    assert ledger(live, tenant, data["leadId"]) == [("cost", "lead_ingested", None, 16.0, "EUR"),
                                                    ("revenue", "delivered", "b", 20.0, "EUR")]
    assert listed_ping(live, tenant, answer["pingId"])["leadId"] == data["leadId"]

    # the milestone is configured: a lead posted without a ping books it
    other = posted(live, web, person("AU1"))
    wait_for(live, tenant, other["leadId"], status_is("delivered", "failed"))
    assert ("cost", "lead_ingested", None, 2.5, "EUR") in ledger(live, tenant, other["leadId"])


def test_shared_a_lead_posted_with_its_ping_is_sold_to_each_winner_at_its_bid(live, runtime):
    tenant = setup(runtime, auctioned("AU1", ["a", "b", "c"], auction={"mode": "shared", "maxWinners": 2,
                                                                      "margin": {"amount": 5}}),
                   buyers=[bidder("a", "10"), bidder("b", "20"), bidder("c", "5")])
    body = person("AU1")
    answer = ping(live, tenant, partial(body))
    assert answer["bid"] == 25.0
    pinged = len(scripted_pings())
    data = posted(live, tenant, {**body, "pingId": answer["pingId"]})
    deadline = time.monotonic() + 15
    while len([e for e in ledger(live, tenant, data["leadId"]) if e[0] == "revenue"]) < 2:
        assert time.monotonic() < deadline, ledger(live, tenant, data["leadId"])
        live.app_state.worker.wake()
        time.sleep(0.03)
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    assert lead["status"] == "delivered"
    assert len(scripted_pings()) == pinged
    assert ledger(live, tenant, data["leadId"]) == [("cost", "lead_ingested", None, 25.0, "USD"),
                                                    ("revenue", "delivered", "a", 10.0, "USD"),
                                                    ("revenue", "delivered", "b", 20.0, "USD")]
    (round_,) = auctions(live, tenant, data["leadId"])
    assert sorted(round_["winners"]) == ["a", "b"] and round_["submissionId"] == data["submissionId"]


def test_the_post_carries_the_buyers_ping_token(live, runtime):
    with BuyerServer() as buyer:
        buyer.route("/ping", status=200, body={"bid": 30, "token": "PT-9"})
        buyer.route("/post", status=200, body={"ok": True})
        ep = {"deliveryEndpointId": "acme", "adapter": "http", "url": buyer.url("/post"), "retry": {"maxAttempts": 1},
              "fieldMapping": [{"clientKey": "token", "leadField": "auction.pingToken"},
                               {"clientKey": "bid", "leadField": "auction.bid", "type": "number"},
                               {"clientKey": "email", "leadField": "email"}],
              "ping": {"url": buyer.url("/ping"), "timeoutMs": 2000,
                       "fieldMapping": [{"clientKey": "state", "leadField": "address.state"}],
                       "responseRules": {"bidPath": "bid", "pingTokenPath": "token"}}}
        tenant = setup(runtime, auctioned("AU1", ["acme"], auction={"margin": {"percent": 10}}), buyers=[ep])
        body = person("AU1")
        answer = ping(live, tenant, partial(body))
        assert (answer["accepted"], answer["bid"]) == (True, 27.0)
        (asked,) = buyer.requests_to("/ping")
        assert asked.json() == {"state": "CA"}
        data = posted(live, tenant, {**body, "pingId": answer["pingId"]})
        lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
        assert lead["status"] == "delivered", lead["submissions"][-1]["result"]
        (sent,) = buyer.requests_to("/post")
        assert sent.json() == {"token": "PT-9", "bid": 30, "email": body["email"]}
        assert len(buyer.requests_to("/ping")) == 1  # not pinged again
        assert ("revenue", "delivered", "acme", 30.0, "USD") in ledger(live, tenant, data["leadId"])


# ---- posting with a pingId that may not be used: 409, nothing stored ----------------------------

def refused_post(client: TestClient, tenant: Tenant, who: Tenant | str, body: dict, detail: str) -> None:
    before = lead_ids(client, tenant)
    response = post(client, who, body)
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["code"] == "INVALID_STATE"
    assert error["details"] == [detail]
    assert lead_ids(client, tenant) == before  # nothing stored


def test_every_pingid_that_may_not_be_used_is_409_and_stores_nothing(live, runtime, clock, other_tenant):
    milestone = [{"leadStatus": "lead_ingested", "amount": 2.5}]
    tenant = setup(runtime, plain("PG1", sources=[source("web", payout=5, costMilestones=milestone),
                                                  source("partner", payout=5)],
                                  qualification={"rules": [rule_set(condition("address.state", "equals", ["NY"]))]}),
                   plain("PG2", sources=[source("web", payout=5)]))
    web, partner = source_key(runtime, tenant, "web"), source_key(runtime, tenant, "partner")

    refused_post(live, tenant, web, {**person("PG1"), "pingId": UNKNOWN_PING}, "pingId: unknown ping")

    theirs = ping(live, other_tenant, {"campaignId": "OC01"})
    assert theirs["accepted"] is True
    refused_post(live, tenant, tenant, {**person("PG1"), "pingId": theirs["pingId"]}, "pingId: unknown ping")

    by_web = ping(live, web, {"campaignId": "PG1"})
    refused_post(live, tenant, partner, {**person("PG1"), "pingId": by_web["pingId"]},
                 "pingId: the ping was made by another source")
    refused_post(live, tenant, tenant, {**person("PG1"), "pingId": by_web["pingId"]},
                 "pingId: the ping was made by another source")
    by_tenant = ping(live, tenant, {"campaignId": "PG1"})  # a tenant-key ping has no source
    refused_post(live, tenant, web, {**person("PG1"), "pingId": by_tenant["pingId"]},
                 "pingId: the ping was made by another source")

    refused_post(live, tenant, web, {**person("PG2"), "pingId": by_web["pingId"]},
                 "pingId: the ping was for campaign PG1")

    body = person("PG1")
    first = posted(live, web, {**body, "pingId": by_web["pingId"]})
    refused_post(live, tenant, web, {**person("PG1"), "pingId": by_web["pingId"]}, "pingId: already posted")
    assert listed_ping(live, tenant, by_web["pingId"])["leadId"] == first["leadId"]
    # a campaign that does not auction: the lead's cost is the source's payout offered, not its milestone
    assert ledger(live, tenant, first["leadId"]) == [("cost", "lead_ingested", None, 5.0, "USD")]

    refused = ping(live, web, {"campaignId": "PG1", "address": {"state": "NY"}})
    refused_with(refused, "disqualified")
    refused_post(live, tenant, web, {**person("PG1"), "pingId": refused["pingId"]},
                 "pingId: the ping was not accepted")

    fresh = ping(live, web, {"campaignId": "PG1"})
    assert fresh["expiresAt"] == at(clock.now() + timedelta(seconds=60))
    clock.advance(seconds=61)
    refused_post(live, tenant, web, {**person("PG1"), "pingId": fresh["pingId"]},
                 f"pingId: expired at {fresh['expiresAt']}")

    for ping_id in (by_tenant["pingId"], refused["pingId"], fresh["pingId"]):
        assert listed_ping(live, tenant, ping_id)["leadId"] is None
    assert lead_ids(live, tenant) == [first["leadId"]]


def test_an_auction_pings_bids_expire_with_its_ttl(live, runtime, clock):
    tenant = setup(runtime, auctioned("AU1", ["a"], auction={"bidTtlSeconds": 30}), buyers=[bidder("a", "10")])
    body = person("AU1")
    answer = ping(live, tenant, partial(body))
    assert answer["expiresAt"] == at(START + timedelta(seconds=30))
    clock.advance(seconds=30)  # at expiresAt: expired
    refused_post(live, tenant, tenant, {**body, "pingId": answer["pingId"]}, f"pingId: expired at {answer['expiresAt']}")


# ---- GET /api/v1/pings ---------------------------------------------------------------------------

def test_the_pings_list_filters_and_pages(client, runtime, other_tenant):
    """On the real clock (no fake one): dates bound the pings' ids, which are made on the wall clock."""
    tenant = setup(runtime, plain("PG1", sources=[source("web", payout=1), source("partner")]),
                   plain("PG2", sources=[source("web", payout=2)]))
    web, partner = source_key(runtime, tenant, "web"), source_key(runtime, tenant, "partner")
    made = [ping(client, who, {"campaignId": code})["pingId"]
            for who, code in ((web, "PG1"), (partner, "PG1"), (web, "PG2"), (tenant, "PG2"), (web, "PG1"))]
    ping(client, other_tenant, {"campaignId": "OC01"})  # another tenant's: never listed
    newest_first = list(reversed(made))

    assert ping_ids(client, tenant) == newest_first
    assert ping_ids(client, tenant, sourceId="web") == [made[4], made[2], made[0]]
    assert ping_ids(client, tenant, sourceId="partner") == [made[1]]
    assert ping_ids(client, tenant, campaignId="PG2") == [made[3], made[2]]
    assert ping_ids(client, tenant, sourceId="web", campaignId="PG1") == [made[4], made[0]]
    assert ping_ids(client, tenant, sourceId="nobody") == []

    item = pings_listed(client, tenant, limit=100)["items"][0]
    assert set(item) == {"pingId", "sourceId", "campaignId", "accepted", "bid", "currency", "reason", "createdAt",
                         "leadId"}
    assert (item["sourceId"], item["campaignId"], item["bid"], item["leadId"]) == ("web", "PG1", 1.0, None)

    today = datetime.now(UTC).date()
    assert ping_ids(client, tenant, startDate=str(today)) == newest_first
    assert ping_ids(client, tenant, endDate=str(today)) == newest_first
    assert ping_ids(client, tenant, startDate=str(today), endDate=str(today)) == newest_first
    assert ping_ids(client, tenant, startDate=str(today + timedelta(days=1))) == []
    assert ping_ids(client, tenant, endDate=str(today - timedelta(days=1))) == []

    walked, cursor = [], None
    for _ in range(10):
        page = pings_listed(client, tenant, limit=1, **({"cursor": cursor} if cursor else {}))
        walked += [i["pingId"] for i in page["items"]]
        assert len(page["items"]) == 1
        if not page["hasMore"]:
            assert page["nextCursor"] is None
            break
        cursor = page["nextCursor"]
        assert cursor == page["items"][-1]["pingId"]
    assert walked == newest_first
    page = pings_listed(client, tenant, limit=2, sourceId="web")
    assert [i["pingId"] for i in page["items"]] == [made[4], made[2]] and page["hasMore"] is True
    rest = pings_listed(client, tenant, limit=2, sourceId="web", cursor=page["nextCursor"])
    assert [i["pingId"] for i in rest["items"]] == [made[0]] and rest["hasMore"] is False

    response = client.get("/api/v1/pings", params={"limit": 0}, headers=tenant.headers)
    assert response.status_code == 400 and any("limit" in d for d in response.json()["error"]["details"])
    for bad in ("lead_01JD0000000000000000000000", "nonsense"):
        response = client.get("/api/v1/pings", params={"cursor": bad}, headers=tenant.headers)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "VALIDATION_ERROR" and any("cursor" in d for d in error["details"])


# ---- retention -----------------------------------------------------------------------------------

def test_pings_older_than_ping_days_are_purged_by_the_ticker(live, runtime, clock):
    """Default `ping_days` (7). The ticker purges once an hour of the clock has passed since its
    last purge; the test moves the fake clock and waits for a tick."""
    tenant = setup(runtime, auctioned("AU1", ["a"]), plain("PG1", sources=[source("web", payout=1)]),
                   buyers=[bidder("a", "10")])
    body = person("AU1")
    sold = ping(live, tenant, partial(body))
    unsold = ping(live, tenant, {"campaignId": "AU1"})  # its round is never posted
    assert unsold["accepted"] is True
    data = posted(live, tenant, {**body, "pingId": sold["pingId"]})
    assert wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))["status"] == "delivered"
    clock.advance(days=6)
    recent = ping(live, source_key(runtime, tenant, "web"), {"campaignId": "PG1"})
    clock.advance(days=1, minutes=1)  # sold and unsold: 7 days 1 minute old; recent: 1 day 1 minute
    assert eventually(lambda: ping_ids(live, tenant) == [recent["pingId"]]), ping_ids(live, tenant)
    # the round of the posted ping stays with its lead
    (round_,) = auctions(live, tenant, data["leadId"])
    assert round_["submissionId"] == data["submissionId"] and round_["winners"] == ["a"]
    assert lead_of(live, tenant, data["leadId"])["status"] == "delivered"


@pytest.mark.parametrize("ping_days", [2])
def test_the_config_sets_how_long_pings_are_kept(live, runtime, clock, ping_days):
    tenant = setup(runtime, plain("PG1"))
    old = ping(live, tenant, {"campaignId": "PG1"})
    clock.advance(days=1)
    young = ping(live, tenant, {"campaignId": "PG1"})
    assert eventually(lambda: ping_ids(live, tenant) == [young["pingId"], old["pingId"]])
    clock.advance(days=1, minutes=1)  # old: 2 days 1 minute (past 2 days, within the default 7)
    assert eventually(lambda: ping_ids(live, tenant) == [young["pingId"]]), ping_ids(live, tenant)


@pytest.mark.parametrize("days", [0, 3651])
def test_ping_days_out_of_range_is_a_config_error(tmp_path, days):
    path = tmp_path / "bad.toml"
    path.write_text(f'[storage]\npath = "{tmp_path / "d"}"\n\n[retention]\nping_days = {days}\n')
    with pytest.raises(ConfigError, match="ping_days"):
        load_config(path)


def test_a_pinged_lead_the_submit_finds_duplicate_costs_nothing_of_the_ping(live, runtime):
    tenant = setup(runtime, auctioned("AU1", ["a"]), buyers=[bidder("a", "10")])
    body = person("AU1")
    answer = ping(live, tenant, partial(body))
    assert answer["accepted"] is True and answer["bid"] == 10.0
    posted(live, tenant, {**body, "email": body["email"]})  # the same lead, sent straight meanwhile
    data = posted(live, tenant, {**body, "pingId": answer["pingId"]})
    assert data["status"] == "duplicate"
    assert [e for e in ledger(live, tenant, data["leadId"]) if e[0] == "cost"] == []
    assert listed_ping(live, tenant, answer["pingId"])["leadId"] == data["leadId"]  # the ping is used up


def test_the_leads_fields_are_checked_before_its_ping(live, runtime):
    tenant = setup(runtime, auctioned("AU1", ["a"]), buyers=[bidder("a", "10")])
    before = lead_ids(live, tenant)
    response = post(live, tenant, {**person("AU1"), "email": "not-an-email", "pingId": "png_unknown"})
    assert response.status_code == 400
    assert response.json()["error"]["details"] == ["email: must be a valid email address"]
    assert lead_ids(live, tenant) == before


def test_a_ping_over_its_limit_says_which_limit_in_its_429(live, runtime):
    tenant = setup(runtime, auctioned("AU1", ["a"], sources=[source("web", pingLimits=[{"type": "hourly", "cap": 1}])]),
                   buyers=[bidder("a", "10")])
    web = source_key(runtime, tenant, "web")
    ping(live, web, {"campaignId": "AU1"})
    response = ping_response(live, web, {"campaignId": "AU1"})
    assert response.status_code == 429
    assert response.json()["error"]["message"] == "Too many pings from this source: its hourly ping limit of 1 is reached"
