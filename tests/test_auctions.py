"""Outbound auctions (ping-post), end to end through the public surface: leads submitted over
HTTP, the job loop pinging the buyers of an `auction` distribution, the round recorded (the
`auction` journey event, GET /api/v1/leads/{leadId}/auctions, the console's lead page), the post
sent to the winner(s) and the revenue booked (GET /api/v1/ledger). Buyers answer through the
scripted adapter of the plugin folder (an endpoint's `config.ping` is its bid, `config.answers`
its answer to the post) or, for the built-in `http` adapter, through a real local buyer server
(tests/buyer_server.py). Bad bundles go through the CLI's `import`, as an operator's do."""

from __future__ import annotations

import copy
import html
import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import TestClient

from appliance.runtime import Runtime
from appliance.services import tenancy
from tests.bundles import campaign
from tests.buyer_server import BuyerServer, Reply
from tests.conftest import make_tenant
from tests.submit_support import FakeClock, clock  # noqa: F401 (the clock fixture)
from tests.people import sign_in
from tests.worker_helpers import (
    endpoint,
    lead_body,
    lead_of,
    live_app,
    status_is,
    submit,
    wait_for,
)

PING = {"url": "https://buyer.example.com/ping", "responseRules": {"bidPath": "bid"}}


@pytest.fixture
def config_file(config_file: Path) -> Path:
    with config_file.open("a") as f:  # the http adapter's buyer is on loopback
        f.write("\n[delivery]\nallow_private_addresses = true\n")
    return config_file


@pytest.fixture
def live(runtime: Runtime, clock: FakeClock, tmp_path) -> Iterator[TestClient]:
    with live_app(runtime, tmp_path) as client:
        yield client


# ---- helpers -------------------------------------------------------------------------------------

def bidder(endpoint_id: str, ping: str, answers: str = "success", ping_extra: dict | None = None, **extra) -> dict:
    """A scripted buyer: `ping` is what it answers every ping ("12.5", "none", "error", "raise",
    "mistyped", "sleep:<s>", "late:<s>:<bid>"), `answers` what it answers the post."""
    return endpoint(endpoint_id, config={"answers": answers, "ping": ping}, ping={**PING, **(ping_extra or {})},
                    **extra)


def fixed(endpoint_id: str, answers: str = "success") -> dict:
    """A scripted buyer without a ping: it bids the distribution item's fixed `bid`."""
    return endpoint(endpoint_id, config={"answers": answers})


def bundle(buyers: list[dict], items: list[dict] | None = None, auction: dict | None = None, **delivery) -> dict:
    items = items if items is not None else [{"deliveryEndpointId": b["deliveryEndpointId"]} for b in buyers]
    distribution = {"method": "auction", "endpoints": items, **({"auction": auction} if auction is not None else {})}
    return {"deliveryEndpoints": buyers,
            "campaigns": [campaign("AU1", "Auctioned", delivery={"distribution": distribution, **delivery})]}


def auction_tenant(runtime: Runtime, buyers: list[dict], items: list[dict] | None = None,
                   auction: dict | None = None, name: str = "T", **delivery):
    return make_tenant(runtime, name, bundle(buyers, items, auction, **delivery))


def reimport(runtime: Runtime, tenant, buyers: list[dict], items: list[dict] | None = None,
             auction: dict | None = None, **delivery) -> None:
    tenancy.import_bundle(runtime, tenant.tenant_id, msgspec.json.encode(bundle(buyers, items, auction, **delivery)),
                          "json")


def scripted() -> Any:
    """The scripted plugin as the running app loaded it (its PINGS and CALLS)."""
    return sys.modules["appliance_plugins.scripted"]


def pinged(auction_id: str | None = None) -> list[str]:
    return [eid for eid, aid, _ in scripted().PINGS if auction_id is None or aid == auction_id]


def events(lead: dict, kind: str, submission: int = -1) -> list[dict]:
    return [e for e in lead["submissions"][submission]["journeyEvents"] if e["type"] == kind]


def attempts(lead: dict, submission: int = -1) -> list[tuple[str, str]]:
    """(event type, deliveryEndpointId) of each post of a submission."""
    return [(e["type"], e["details"]["deliveryEndpointId"]) for e in lead["submissions"][submission]["journeyEvents"]
            if e["type"].startswith("deliver") and (e.get("details") or {}).get("deliveryEndpointId")]


def outcomes(round_: dict) -> dict[str, tuple[str, float | None]]:
    return {b["deliveryEndpointId"]: (b["outcome"], b["bid"]) for b in round_["bids"]}


def reasons(round_: dict) -> dict[str, str | None]:
    return {b["deliveryEndpointId"]: b["reason"] for b in round_["bids"]}


def auctions(client: TestClient, tenant, lead_id: str, **query) -> dict:
    response = client.get(f"/api/v1/leads/{lead_id}/auctions", headers=tenant.headers, params=query)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def revenue(client: TestClient, tenant, lead_id: str) -> list[tuple[str, float, str]]:
    response = client.get("/api/v1/ledger", params={"leadId": lead_id}, headers=tenant.headers)
    assert response.status_code == 200, response.text
    return sorted((e["deliveryEndpointId"], e["amount"], e["currency"]) for e in response.json()["data"]["items"]
                  if e["kind"] == "revenue")


def settled(runtime: Runtime, submission_id: str) -> bool:
    """No job of the submission is left to run."""
    return all(state in ("done", "dead", "cancelled")
               for _, state, _ in runtime.store.reader().jobs.jobs_of(submission_id))


def quiet_for(client: TestClient, seconds: float = 0.3) -> None:
    """Let the worker run (woken) for a while: anything due would happen now."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        client.app_state.worker.wake()
        time.sleep(0.03)


# ---- exclusive -----------------------------------------------------------------------------------

def test_exclusive_the_highest_bid_wins_ties_go_to_the_faster_answer_and_losers_get_nothing(live, runtime):
    buyers = [bidder("slow", "late:0.15:20"), bidder("fast", "20"), bidder("low", "10"), bidder("pass", "none"),
              bidder("broken", "error"), bidder("crash", "raise"), bidder("typo", "mistyped"),
              bidder("cheap", "3")]
    tenant = auction_tenant(runtime, buyers, auction={"floor": 5, "currency": "EUR"},
                            revenueMilestones=[{"leadStatus": "delivered", "amount": 25}])
    data = submit(live, tenant, lead_body("AU1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    assert lead["status"] == "delivered"

    assert attempts(lead) == [("delivered", "fast")]  # the post reached the winner only
    assert len(scripted().CALLS) == 1
    assert lead["submissions"][-1]["responseFields"]["echo"] == "fast"

    (event,) = events(lead, "auction")
    details = event["details"]
    assert details["auctionId"].startswith("auc_") and details["winners"] == ["fast"]
    assert details["submissionId"] == data["submissionId"]
    assert event["reason"].startswith("auction: sold to fast")
    assert sorted(pinged(details["auctionId"])) == sorted(b["deliveryEndpointId"] for b in buyers)
    assert outcomes(details) == {
        "slow": ("bid", 20.0), "fast": ("bid", 20.0), "low": ("bid", 10.0), "pass": ("no_bid", None),
        "broken": ("error", None), "crash": ("error", None), "typo": ("error", None), "cheap": ("below_floor", 3.0)}
    said = reasons(details)
    assert said["fast"] is None and said["pass"] == "not interested" and said["broken"] == "HTTP 503"
    assert said["crash"].startswith("adapter raised") and "ping bug" in said["crash"]
    assert "invalid ping result" in said["typo"] and "bid" in said["typo"]  # "$5" is not a number
    assert said["cheap"] and "floor" in said["cheap"]
    by_id = {b["deliveryEndpointId"]: b for b in details["bids"]}
    assert by_id["slow"]["responseMs"] >= 100 > by_id["fast"]["responseMs"]
    assert (details["mode"], details["floor"], details["currency"]) == ("exclusive", 5.0, "EUR")

    assert "tok-" not in json.dumps(lead)  # ping tokens stay in storage

    # The sale's revenue is the bid naming the buyer, in the auction's currency, not the milestone.
    assert revenue(live, tenant, data["leadId"]) == [("fast", 20.0, "EUR")]


def test_exclusive_ties_go_to_the_faster_answer_whatever_the_order(live, runtime):
    tenant = auction_tenant(runtime, [bidder("first", "7"), bidder("second", "late:0.15:7")],
                            items=[{"deliveryEndpointId": "second"}, {"deliveryEndpointId": "first"}])
    data = submit(live, tenant, lead_body("AU1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    assert attempts(lead) == [("delivered", "first")]
    assert events(lead, "auction")[0]["details"]["winners"] == ["first"]


# ---- shared --------------------------------------------------------------------------------------

def test_shared_posts_to_each_of_the_top_max_winners_each_a_sale(live, runtime):
    tenant = auction_tenant(runtime, [bidder("a", "30"), bidder("b", "20"), bidder("c", "10"), bidder("d", "none")],
                            auction={"mode": "shared", "maxWinners": 2},
                            revenueMilestones=[{"leadStatus": "delivered", "amount": 25}])
    data = submit(live, tenant, lead_body("AU1"))
    lead = wait_for(live, tenant, data["leadId"], lambda l: len(events(l, "delivered")) == 2)
    wait_for(live, tenant, data["leadId"], lambda l: settled(runtime, data["submissionId"]))
    lead = lead_of(live, tenant, data["leadId"])
    assert lead["status"] == "delivered"
    assert sorted(attempts(lead)) == [("delivered", "a"), ("delivered", "b")]  # never c
    assert len(scripted().CALLS) == 2 and len(pinged()) == 4  # one round
    (event,) = events(lead, "auction")
    assert event["details"]["winners"] == ["a", "b"] and event["details"]["mode"] == "shared"
    assert revenue(live, tenant, data["leadId"]) == [("a", 30.0, "USD"), ("b", 20.0, "USD")]


def test_shared_sells_to_three_by_default(live, runtime):
    tenant = auction_tenant(runtime, [bidder(x, str(n)) for x, n in (("a", 4), ("b", 3), ("c", 2), ("d", 1))],
                            auction={"mode": "shared"})
    data = submit(live, tenant, lead_body("AU1"))
    lead = wait_for(live, tenant, data["leadId"], lambda l: len(events(l, "delivered")) == 3)
    assert events(lead, "auction")[0]["details"]["winners"] == ["a", "b", "c"]
    wait_for(live, tenant, data["leadId"], lambda l: settled(runtime, data["submissionId"]))
    assert [who for who, _, _ in revenue(live, tenant, data["leadId"])] == ["a", "b", "c"]


def test_shared_one_winner_failing_leaves_the_lead_delivered_and_moves_to_no_other_bid(live, runtime):
    tenant = auction_tenant(runtime, [bidder("a", "30", "failure"), bidder("b", "20"), bidder("c", "10")],
                            auction={"mode": "shared", "maxWinners": 2})
    data = submit(live, tenant, lead_body("AU1"))
    wait_for(live, tenant, data["leadId"], lambda l: len(attempts(l)) == 2)
    wait_for(live, tenant, data["leadId"], lambda l: settled(runtime, data["submissionId"]))
    quiet_for(live)
    lead = lead_of(live, tenant, data["leadId"])
    assert sorted(attempts(lead)) == [("delivered", "b"), ("delivery_failure", "a")]  # c is not posted
    assert lead["status"] == "delivered"
    assert len(pinged()) == 3
    assert revenue(live, tenant, data["leadId"]) == [("b", 20.0, "USD")]


def test_shared_every_winner_failing_fails_the_lead(live, runtime):
    tenant = auction_tenant(runtime, [bidder("a", "30", "failure"), bidder("b", "20", "duplicate"),
                                      bidder("c", "10")], auction={"mode": "shared", "maxWinners": 2})
    data = submit(live, tenant, lead_body("AU1"))
    lead = wait_for(live, tenant, data["leadId"], lambda l: len(attempts(l)) == 2 and l["status"] == "failed")
    wait_for(live, tenant, data["leadId"], lambda l: settled(runtime, data["submissionId"]))
    quiet_for(live)
    lead = lead_of(live, tenant, data["leadId"])
    assert lead["status"] == "failed"
    assert sorted(attempts(lead)) == [("delivery_duplicate", "b"), ("delivery_failure", "a")]
    assert revenue(live, tenant, data["leadId"]) == []


def test_shared_sales_of_one_lead_are_not_held_back_by_the_campaigns_own_cap(live, runtime):
    tenant = auction_tenant(runtime, [bidder("a", "30"), bidder("b", "20")], auction={"mode": "shared", "maxWinners": 2},
                            deliveryLimits=[{"cap": 1, "type": "daily"}])
    data = submit(live, tenant, lead_body("AU1"))
    lead = wait_for(live, tenant, data["leadId"], lambda l: len(attempts(l)) == 2 or l["status"] == "queued", timeout=5)
    assert lead["status"] == "delivered", lead["submissions"][-1]["result"]
    assert sorted(attempts(lead)) == [("delivered", "a"), ("delivered", "b")]
    assert revenue(live, tenant, data["leadId"]) == [("a", 30.0, "USD"), ("b", 20.0, "USD")]


def test_a_shared_sale_counts_once_against_the_buyers_own_limit(live, runtime):
    items = [{"deliveryEndpointId": "a"}, {"deliveryEndpointId": "b", "deliveryLimits": [{"cap": 2, "type": "daily"}]},
             {"deliveryEndpointId": "c"}]
    tenant = auction_tenant(runtime, [bidder("a", "30"), bidder("b", "20"), bidder("c", "10")], items,
                            auction={"mode": "shared", "maxWinners": 2})
    first = submit(live, tenant, lead_body("AU1"))
    wait_for(live, tenant, first["leadId"], lambda l: len(events(l, "delivered")) == 2)
    wait_for(live, tenant, first["leadId"], lambda l: settled(runtime, first["submissionId"]))
    second = submit(live, tenant, lead_body("AU1"))  # b has had one of its two leads today
    lead = wait_for(live, tenant, second["leadId"], lambda l: len(events(l, "auction")) == 1)
    round_ = events(lead, "auction")[0]["details"]
    assert outcomes(round_)["b"] == ("bid", 20.0), reasons(round_)["b"]
    assert round_["winners"] == ["a", "b"]


def test_a_shared_winner_paused_mid_retry_waits_and_nobody_is_sold_the_lead_twice(live, runtime, clock):
    tenant = auction_tenant(runtime, [bidder("a", "30"), bidder("b", "20", "error,success",
                                                                retry={"maxAttempts": 3, "backoffSeconds": [30]}),
                                      bidder("c", "10")], auction={"mode": "shared", "maxWinners": 2,
                                                                     "bidTtlSeconds": 3600})
    data = submit(live, tenant, lead_body("AU1"))
    wait_for(live, tenant, data["leadId"], lambda l: sorted(attempts(l)) == [("delivered", "a"), ("delivery_error", "b")])
    assert live.post("/api/v1/endpoints/b/pause", headers=tenant.headers).status_code == 200
    clock.advance(seconds=31)  # b's retry is due while b is paused
    quiet_for(live, 0.5)
    assert sorted(attempts(lead_of(live, tenant, data["leadId"]))) == [("delivered", "a"), ("delivery_error", "b")]
    assert live.post("/api/v1/endpoints/b/resume", headers=tenant.headers).status_code == 200
    lead = wait_for(live, tenant, data["leadId"], lambda l: len(attempts(l)) == 3, timeout=5)
    assert sorted(attempts(lead)) == [("delivered", "a"), ("delivered", "b"), ("delivery_error", "b")]


# ---- floor, fixed bids, skipped buyers ------------------------------------------------------------

def test_fixed_bids_stand_beside_pinged_ones_and_the_floor_holds_for_both(live, runtime):
    buyers = [bidder("pinged", "18"), fixed("steady"), fixed("stingy"), bidder("under", "6"), bidder("exact", "7.5")]
    items = [{"deliveryEndpointId": "pinged"}, {"deliveryEndpointId": "steady", "bid": 25},
             {"deliveryEndpointId": "stingy", "bid": 4}, {"deliveryEndpointId": "under"},
             {"deliveryEndpointId": "exact"}]
    tenant = auction_tenant(runtime, buyers, items, auction={"floor": 7.5})
    data = submit(live, tenant, lead_body("AU1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    assert attempts(lead) == [("delivered", "steady")]
    round_ = events(lead, "auction")[0]["details"]
    assert outcomes(round_) == {"pinged": ("bid", 18.0), "steady": ("bid", 25.0), "stingy": ("below_floor", 4.0),
                                "under": ("below_floor", 6.0), "exact": ("bid", 7.5)}  # at the floor stands
    by_id = {b["deliveryEndpointId"]: b for b in round_["bids"]}
    assert (by_id["steady"]["reason"], by_id["steady"]["responseMs"]) == ("fixed bid", 0)
    assert sorted(pinged()) == ["exact", "pinged", "under"]  # a fixed bid is not pinged
    assert revenue(live, tenant, data["leadId"]) == [("steady", 25.0, "USD")]


def test_a_higher_pinged_bid_beats_a_fixed_bid(live, runtime):
    tenant = auction_tenant(runtime, [bidder("pinged", "30.5"), fixed("steady")],
                            [{"deliveryEndpointId": "pinged"}, {"deliveryEndpointId": "steady", "bid": 25}])
    data = submit(live, tenant, lead_body("AU1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    assert attempts(lead) == [("delivered", "pinged")]
    assert revenue(live, tenant, data["leadId"]) == [("pinged", 30.5, "USD")]


def test_filtered_paused_and_full_buyers_are_skipped_and_never_pinged(live, runtime):
    buyers = [bidder("ca_only", "50"), bidder("resting", "60"), bidder("capped", "40"), bidder("open", "10")]
    items = [{"deliveryEndpointId": "ca_only", "conditions": {"subRules": [{"conditions": [
                 {"field": "address.state", "operator": "equals", "value": ["CA"]}]}]}},
             {"deliveryEndpointId": "resting"},
             {"deliveryEndpointId": "capped", "deliveryLimits": [{"cap": 2, "type": "daily"}]},
             {"deliveryEndpointId": "open"}]
    tenant = auction_tenant(runtime, buyers, items)
    paused = live.post("/api/v1/endpoints/resting/pause", headers=tenant.headers, json={"reason": "holiday"})
    assert paused.status_code == 200, paused.text

    first = submit(live, tenant, lead_body("AU1", address={"state": "TX"}))
    lead = wait_for(live, tenant, first["leadId"], status_is("delivered", "failed"))
    assert attempts(lead) == [("delivered", "capped")]
    round_ = events(lead, "auction")[0]["details"]
    assert outcomes(round_) == {"ca_only": ("skipped", None), "resting": ("skipped", None),
                                "capped": ("bid", 40.0), "open": ("bid", 10.0)}
    assert reasons(round_)["ca_only"] == "the buyer's filter" and reasons(round_)["resting"] == "paused"
    assert sorted(pinged(round_["auctionId"])) == ["capped", "open"]
    again = submit(live, tenant, lead_body("AU1", address={"state": "TX"}))  # its second of two today
    assert attempts(wait_for(live, tenant, again["leadId"], status_is("delivered", "failed"))) == \
        [("delivered", "capped")]

    second = submit(live, tenant, lead_body("AU1", address={"state": "TX"}))
    lead = wait_for(live, tenant, second["leadId"], status_is("delivered", "failed"))
    assert attempts(lead) == [("delivered", "open")]
    round_ = events(lead, "auction")[0]["details"]
    assert outcomes(round_)["capped"] == ("skipped", None)
    assert "daily delivery limit of 2 reached" in reasons(round_)["capped"]
    assert sorted(pinged(round_["auctionId"])) == ["open"]

    californian = submit(live, tenant, lead_body("AU1", address={"state": "CA"}))
    lead = wait_for(live, tenant, californian["leadId"], status_is("delivered", "failed"))
    assert attempts(lead) == [("delivered", "ca_only")]


def test_a_lead_no_buyer_takes_fails_without_a_ping(live, runtime):
    items = [{"deliveryEndpointId": "ca_only", "conditions": {"subRules": [{"conditions": [
        {"field": "address.state", "operator": "equals", "value": ["CA"]}]}]}}]
    tenant = auction_tenant(runtime, [bidder("ca_only", "50")], items)
    data = submit(live, tenant, lead_body("AU1", address={"state": "TX"}))
    lead = wait_for(live, tenant, data["leadId"], status_is("failed", "delivered"))
    assert lead["status"] == "failed"
    assert "no buyer of the auction takes this lead" in lead["submissions"][-1]["result"]
    assert events(lead, "distribution_exhausted")
    assert pinged() == [] and scripted().CALLS == []


def test_every_buyer_paused_queues_the_lead_until_a_resume_then_it_is_auctioned(live, runtime):
    tenant = auction_tenant(runtime, [bidder("a", "12")])
    assert live.post("/api/v1/endpoints/a/pause", headers=tenant.headers).status_code == 200
    data = submit(live, tenant, lead_body("AU1"))
    wait_for(live, tenant, data["leadId"], status_is("queued"))
    quiet_for(live)
    assert pinged() == []
    assert live.post("/api/v1/endpoints/a/resume", headers=tenant.headers).status_code == 200
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    assert attempts(lead) == [("delivered", "a")]
    assert revenue(live, tenant, data["leadId"]) == [("a", 12.0, "USD")]


def test_a_buyers_own_hours_leave_it_out_and_a_lead_nobody_can_take_now_waits_for_them(live, runtime, clock):
    # START is a Tuesday, 15:00 UTC: "night" buys from 20:00 only.
    hours = {"timezone": "UTC", "specificDays": [{"day": "Tuesday", "startTime": "20:00", "endTime": "23:00"}]}
    tenant = auction_tenant(runtime, [bidder("night", "70"), bidder("day", "10")],
                            [{"deliveryEndpointId": "night", "deliverySchedule": hours}, {"deliveryEndpointId": "day"}])
    data = submit(live, tenant, lead_body("AU1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    assert attempts(lead) == [("delivered", "day")]
    round_ = events(lead, "auction")[0]["details"]
    assert outcomes(round_)["night"] == ("skipped", None) and reasons(round_)["night"]
    assert pinged(round_["auctionId"]) == ["day"]

    reimport(runtime, tenant, [bidder("night", "70"), bidder("day", "10")],
             [{"deliveryEndpointId": "night", "deliverySchedule": hours}, {"deliveryEndpointId": "day", "active": False}])
    data = submit(live, tenant, lead_body("AU1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("queued", "failed", "delivered"))
    assert lead["status"] == "queued"
    quiet_for(live)
    assert len(pinged()) == 1  # nobody asked: "day" is inactive, "night" closed
    clock.advance(hours=5)
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    assert attempts(lead) == [("delivered", "night")]
    assert "day" not in outcomes(events(lead, "auction")[0]["details"]) or \
        outcomes(events(lead, "auction")[0]["details"])["day"][0] == "skipped"
    assert pinged()[1:] == ["night"]


def test_campaign_limits_hold_around_the_auction_and_a_lead_without_a_sale_gives_its_room_back(live, runtime):
    buyers = [bidder("ca", "10"), bidder("tx", "2")]
    items = [{"deliveryEndpointId": "ca", "conditions": {"subRules": [{"conditions": [
                 {"field": "address.state", "operator": "equals", "value": ["CA"]}]}]}},
             {"deliveryEndpointId": "tx", "conditions": {"subRules": [{"conditions": [
                 {"field": "address.state", "operator": "equals", "value": ["TX"]}]}]}}]
    tenant = auction_tenant(runtime, buyers, items, auction={"floor": 5},
                            deliveryLimits=[{"cap": 1, "type": "daily"}])
    nobody = submit(live, tenant, lead_body("AU1", address={"state": "NV"}))  # no buyer takes it
    assert wait_for(live, tenant, nobody["leadId"], status_is("failed", "delivered", "queued"))["status"] == "failed"
    unsold = submit(live, tenant, lead_body("AU1", address={"state": "TX"}))  # a bid under the floor
    assert wait_for(live, tenant, unsold["leadId"], status_is("failed", "delivered", "queued"))["status"] == "failed"
    sold = submit(live, tenant, lead_body("AU1", address={"state": "CA"}))  # the day's one delivery
    lead = wait_for(live, tenant, sold["leadId"], status_is("failed", "delivered", "queued"))
    assert lead["status"] == "delivered" and attempts(lead) == [("delivered", "ca")]
    before = len(pinged())
    full = submit(live, tenant, lead_body("AU1", address={"state": "CA"}))
    lead = wait_for(live, tenant, full["leadId"], status_is("failed", "delivered", "queued"))
    assert lead["status"] == "queued" and "daily delivery limit of 1 reached" in lead["submissions"][-1]["result"]
    quiet_for(live)
    assert len(pinged()) == before  # no round while the campaign is full
    assert auctions(live, tenant, full["leadId"])["items"] == []


def test_an_inactive_buyer_is_neither_pinged_nor_sold_to(live, runtime):
    tenant = auction_tenant(runtime, [bidder("off", "90"), bidder("on", "10")],
                            [{"deliveryEndpointId": "off", "active": False}, {"deliveryEndpointId": "on"}])
    data = submit(live, tenant, lead_body("AU1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    assert attempts(lead) == [("delivered", "on")] and pinged() == ["on"]
    assert outcomes(events(lead, "auction")[0]["details"]).get("off", ("skipped",))[0] == "skipped"


# ---- exclusive fallback and bid TTL --------------------------------------------------------------

def test_exclusive_a_refused_post_goes_to_the_next_standing_bid_without_a_new_round(live, runtime):
    buyers = [bidder("a", "30", "error", retry={"maxAttempts": 1}), bidder("b", "25", "failure"),
              bidder("c", "20", "duplicate"), bidder("d", "15"), bidder("e", "10"), bidder("f", "none")]
    tenant = auction_tenant(runtime, buyers, revenueMilestones=[{"leadStatus": "delivered", "amount": 99}])
    data = submit(live, tenant, lead_body("AU1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    assert attempts(lead) == [("delivery_error", "a"), ("delivery_failure", "b"), ("delivery_duplicate", "c"),
                              ("delivered", "d")]
    assert len(pinged()) == 6  # one round only
    assert len(events(lead, "auction")) == 1
    assert len(auctions(live, tenant, data["leadId"])["items"]) == 1
    assert revenue(live, tenant, data["leadId"]) == [("d", 15.0, "USD")]


def test_exclusive_the_lead_fails_when_no_standing_bid_is_left(live, runtime):
    tenant = auction_tenant(runtime, [bidder("a", "30", "failure"), bidder("b", "20", "duplicate"),
                                      bidder("c", "none")])
    data = submit(live, tenant, lead_body("AU1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("failed", "delivered"))
    assert lead["status"] == "failed"
    assert attempts(lead) == [("delivery_failure", "a"), ("delivery_duplicate", "b")]
    assert len(pinged()) == 3


def test_an_expired_bid_is_not_posted_and_the_lead_fails(live, runtime, clock):
    tenant = auction_tenant(runtime, [bidder("a", "30", "error", retry={"maxAttempts": 3, "backoffSeconds": [30]}),
                                      bidder("b", "20")], auction={"bidTtlSeconds": 10})
    data = submit(live, tenant, lead_body("AU1"))
    wait_for(live, tenant, data["leadId"], lambda l: attempts(l) == [("delivery_error", "a")])
    assert len(scripted().CALLS) == 1
    clock.advance(seconds=31)  # the retry is due; the round's bids stood 10 s
    lead = wait_for(live, tenant, data["leadId"], status_is("failed", "delivered"))
    assert lead["status"] == "failed"
    assert len(scripted().CALLS) == 1  # not posted again, not posted to b
    assert [who for _, who in attempts(lead)] == ["a", "a"]
    assert "expired" in lead["submissions"][-1]["result"]
    assert len(pinged()) == 2  # no new round
    assert revenue(live, tenant, data["leadId"]) == []


def test_a_refusal_after_the_bid_ttl_fails_the_lead_without_posting_the_next_bid(live, runtime, clock, buyer):
    buyer.route("/ping/a", body={"bid": 30})
    buyer.route("/ping/b", body={"bid": 20})
    buyer.route("/post/a", status=400, body={"error": "no"}, delay=0.4)  # refused, slowly
    buyer.route("/post/b", body={"ok": True})
    tenant = auction_tenant(runtime, [http_buyer(buyer, "a", {}), http_buyer(buyer, "b", {})],
                            auction={"bidTtlSeconds": 60})
    data = submit(live, tenant, lead_body("AU1"))
    deadline = time.monotonic() + 5
    while not buyer.requests_to("/post/a") and time.monotonic() < deadline:
        time.sleep(0.01)
    clock.advance(seconds=61)  # while a's answer is on its way, the round's bids expire
    lead = wait_for(live, tenant, data["leadId"], status_is("failed", "delivered"))
    assert lead["status"] == "failed"
    assert "the bids expired" in lead["submissions"][-1]["result"]
    assert attempts(lead) == [("delivery_failure", "a")]
    assert buyer.requests_to("/post/b") == [] and len(buyer.requests_to("/ping/b")) == 1


def test_a_post_within_the_bid_ttl_is_sent(live, runtime, clock):
    tenant = auction_tenant(runtime, [bidder("a", "30", "error,success",
                                             retry={"maxAttempts": 3, "backoffSeconds": [30]})],
                            auction={"bidTtlSeconds": 60})
    data = submit(live, tenant, lead_body("AU1"))
    wait_for(live, tenant, data["leadId"], lambda l: attempts(l) == [("delivery_error", "a")])
    clock.advance(seconds=31)
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    assert attempts(lead) == [("delivery_error", "a"), ("delivered", "a")]
    assert len(pinged()) == 1
    assert revenue(live, tenant, data["leadId"]) == [("a", 30.0, "USD")]


def test_a_return_reverses_the_winning_bid(live, runtime):
    tenant = auction_tenant(runtime, [bidder("a", "33.3"), bidder("b", "20")],
                            revenueMilestones=[{"leadStatus": "delivered", "amount": 25}])
    data = submit(live, tenant, lead_body("AU1"))
    wait_for(live, tenant, data["leadId"], status_is("delivered"))
    response = live.post(f"/api/v1/leads/{data['leadId']}/return", json={"reason": "bad number"},
                         headers=tenant.headers)
    assert response.status_code == 200, response.text
    entry = response.json()["data"]["entry"]
    assert (entry["deliveryEndpointId"], entry["amount"], entry["kind"]) == ("a", -33.3, "return")


# ---- durability ----------------------------------------------------------------------------------

def test_a_stop_mid_round_holds_a_new_round_at_the_next_start(runtime, clock, tmp_path):
    tenant = auction_tenant(runtime, [bidder("a", "sleep:30")], auction={"timeoutMs": 10000})
    with live_app(runtime, tmp_path) as client:
        client.app_state.worker.grace_seconds = 0.1
        data = submit(client, tenant, lead_body("AU1"))
        deadline = time.monotonic() + 5
        while not scripted().PINGS and time.monotonic() < deadline:
            client.app_state.worker.wake()
            time.sleep(0.02)
        assert pinged() == ["a"]
    reimport(runtime, tenant, [bidder("a", "10")], auction={"timeoutMs": 10000})  # "a" answers at once now
    with live_app(runtime, tmp_path) as client:
        lead = wait_for(client, tenant, data["leadId"], status_is("delivered", "failed"))
        assert attempts(lead) == [("delivered", "a")]
        assert pinged() == ["a"]  # pinged again: the cut-off round sold nothing
        rounds = auctions(client, tenant, data["leadId"])["items"]
        assert len(rounds) == 1 and rounds[0]["winners"] == ["a"]
        assert revenue(client, tenant, data["leadId"]) == [("a", 10.0, "USD")]


def test_a_stop_mid_post_resends_to_the_winner_at_its_bid_without_a_new_round(runtime, clock, tmp_path):
    tenant = auction_tenant(runtime, [bidder("w", "10", "sleep:30"), bidder("x", "5")])
    with live_app(runtime, tmp_path) as client:
        client.app_state.worker.grace_seconds = 0.1
        data = submit(client, tenant, lead_body("AU1"))
        deadline = time.monotonic() + 5
        while not scripted().CALLS and time.monotonic() < deadline:
            client.app_state.worker.wake()
            time.sleep(0.02)
        assert len(scripted().CALLS) == 1
    reimport(runtime, tenant, [bidder("w", "1"), bidder("x", "99")])  # a new round would sell to x
    with live_app(runtime, tmp_path) as client:
        lead = wait_for(client, tenant, data["leadId"], status_is("delivered", "failed"))
        assert attempts(lead) == [("delivered", "w")]
        assert pinged() == []
        assert len(auctions(client, tenant, data["leadId"])["items"]) == 1
        assert revenue(client, tenant, data["leadId"]) == [("w", 10.0, "USD")]


# ---- no bid --------------------------------------------------------------------------------------

def test_no_bid_fail_fails_the_lead_and_a_repost_runs_a_new_round(live, runtime):
    tenant = auction_tenant(runtime, [bidder("a", "5"), bidder("b", "none")], auction={"floor": 10})
    data = submit(live, tenant, lead_body("AU1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("failed", "delivered"))
    assert lead["status"] == "failed"
    assert lead["submissions"][-1]["result"].startswith("auction: no bid at or above the floor")
    (event,) = events(lead, "auction")
    assert event["details"]["winners"] == [] and outcomes(event["details"])["a"] == ("below_floor", 5.0)
    assert scripted().CALLS == []

    reimport(runtime, tenant, [bidder("a", "15"), bidder("b", "none")], auction={"floor": 10})
    response = live.post(f"/api/v1/leads/{data['leadId']}/repost", headers=tenant.headers, json={})
    assert response.status_code == 201, response.text
    lead = wait_for(live, tenant, data["leadId"],
                    lambda l: len(l["submissions"]) == 2 and l["status"] in ("delivered", "failed"))
    assert lead["status"] == "delivered"
    assert attempts(lead) == [("delivered", "a")]
    assert len(pinged()) == 4  # two rounds of two
    rounds = auctions(live, tenant, data["leadId"])["items"]
    assert [r["submissionId"] for r in rounds] == [lead["submissions"][1]["submissionId"], data["submissionId"]]
    assert [r["winners"] for r in rounds] == [["a"], []]
    assert revenue(live, tenant, data["leadId"]) == [("a", 15.0, "USD")]


def test_no_bid_queue_queues_the_lead_and_the_timed_work_auctions_it_again(live, runtime, clock):
    tenant = auction_tenant(runtime, [bidder("a", "none")], auction={"noBid": "queue"})
    data = submit(live, tenant, lead_body("AU1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("queued", "failed", "delivered"))
    assert lead["status"] == "queued"
    assert lead["submissions"][-1]["result"].startswith("auction: no bid at or above the floor")
    assert len(pinged()) == 1
    clock.advance(seconds=290)
    quiet_for(live)
    assert len(pinged()) == 1  # not yet
    clock.advance(seconds=11)
    wait_for(live, tenant, data["leadId"], lambda l: len(events(l, "auction")) == 2)
    assert len(pinged()) == 2 and lead_of(live, tenant, data["leadId"])["status"] == "queued"

    reimport(runtime, tenant, [bidder("a", "8")], auction={"noBid": "queue"})
    clock.advance(seconds=301)
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    assert lead["status"] == "delivered" and attempts(lead) == [("delivered", "a")]
    assert len(auctions(live, tenant, data["leadId"])["items"]) == 3
    assert revenue(live, tenant, data["leadId"]) == [("a", 8.0, "USD")]


def test_rounds_without_a_bid_do_not_use_up_the_winners_retries(live, runtime, clock):
    tenant = auction_tenant(runtime, [bidder("a", "none")], auction={"noBid": "queue"})
    data = submit(live, tenant, lead_body("AU1"))
    wait_for(live, tenant, data["leadId"], lambda l: len(events(l, "auction")) == 1)
    clock.advance(seconds=301)
    wait_for(live, tenant, data["leadId"], lambda l: len(events(l, "auction")) == 2)
    reimport(runtime, tenant, [bidder("a", "10", "error", retry={"maxAttempts": 2, "backoffSeconds": [30]})],
             auction={"noBid": "queue"})
    clock.advance(seconds=301)
    lead = wait_for(live, tenant, data["leadId"], lambda l: attempts(l) != [])
    first = events(lead, "delivery_error")[0]
    assert first["details"]["attempt"] == 1 and "retry 2" in first["reason"], first["reason"]
    clock.advance(seconds=31)
    lead = wait_for(live, tenant, data["leadId"], status_is("failed", "delivered"))
    assert attempts(lead) == [("delivery_error", "a"), ("delivery_error", "a")]


def test_no_bid_queue_gives_up_after_twelve_rounds(live, runtime, clock):
    tenant = auction_tenant(runtime, [bidder("a", "none")], auction={"noBid": "queue"})
    data = submit(live, tenant, lead_body("AU1"))
    wait_for(live, tenant, data["leadId"], lambda l: len(events(l, "auction")) == 1)
    for n in range(2, 13):
        clock.advance(seconds=301)
        wait_for(live, tenant, data["leadId"], lambda l, n=n: len(events(l, "auction")) == n)
    lead = wait_for(live, tenant, data["leadId"], status_is("failed", "delivered"))
    assert lead["status"] == "failed" and "12 rounds without a bid" in lead["submissions"][-1]["result"]
    clock.advance(seconds=301)
    quiet_for(live)
    assert len(pinged()) == 12


# ---- timeouts -----------------------------------------------------------------------------------

def test_a_buyer_that_never_answers_costs_the_round_its_deadline_only(live, runtime):
    tenant = auction_tenant(runtime, [bidder("sleepy", "sleep:5"), bidder("quick", "10")],
                            auction={"timeoutMs": 300})
    began = time.monotonic()
    data = submit(live, tenant, lead_body("AU1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    assert time.monotonic() - began < 2.5
    assert attempts(lead) == [("delivered", "quick")]
    round_ = events(lead, "auction")[0]["details"]
    assert outcomes(round_) == {"sleepy": ("timeout", None), "quick": ("bid", 10.0)}
    assert reasons(round_)["sleepy"]
    assert 250 <= round_["durationMs"] < 2500


def test_a_late_answer_is_a_timeout_and_never_sold_to_even_with_the_highest_bid(live, runtime):
    tenant = auction_tenant(runtime, [bidder("late", "late:0.5:99"), bidder("prompt", "10")],
                            auction={"timeoutMs": 200})
    data = submit(live, tenant, lead_body("AU1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    quiet_for(live, 0.5)
    lead = lead_of(live, tenant, data["leadId"])
    assert attempts(lead) == [("delivered", "prompt")]
    round_ = events(lead, "auction")[0]["details"]
    assert outcomes(round_) == {"late": ("timeout", None), "prompt": ("bid", 10.0)}
    assert revenue(live, tenant, data["leadId"]) == [("prompt", 10.0, "USD")]


def test_a_buyers_own_ping_timeout_is_shorter_than_the_round(live, runtime):
    tenant = auction_tenant(runtime, [bidder("hasty", "late:0.4:99", ping_extra={"timeoutMs": 100}),
                                      bidder("patient", "late:0.2:10", ping_extra={"timeoutMs": 1000})])
    data = submit(live, tenant, lead_body("AU1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    assert attempts(lead) == [("delivered", "patient")]
    round_ = events(lead, "auction")[0]["details"]
    assert outcomes(round_) == {"hasty": ("timeout", None), "patient": ("bid", 10.0)}


# ---- the built-in http adapter against a real buyer ---------------------------------------------

BUYER_KEY, SEALED = "bk-9Zq4-secret", "sealed-7Hw2-value"


@pytest.fixture
def buyer() -> Iterator[BuyerServer]:
    with BuyerServer() as server:
        yield server


def http_buyer(buyer: BuyerServer, endpoint_id: str, ping: dict, **extra) -> dict:
    return {"deliveryEndpointId": endpoint_id, "adapter": "http", "url": buyer.url(f"/post/{endpoint_id}"),
            "retry": {"maxAttempts": 1}, "auth": {"type": "header", "headerName": "X-Buyer-Key", "token": BUYER_KEY},
            "headers": {"X-Buyer-Token": SEALED, "X-Plain": "plain"},
            "ping": {"url": buyer.url(f"/ping/{endpoint_id}"), "timeoutMs": 2000,
                     "responseRules": {"bidPath": "bid"}, **ping}, **extra}


def test_http_ping_reads_the_bid_and_token_and_the_post_carries_them_back(live, runtime, buyer):
    buyer.route("/ping/acme", status=200, body={"offer": {"price": 17.5}, "token": "PT-4471"})
    buyer.route("/post/acme", status=200, body={"ok": True})
    ep = http_buyer(buyer, "acme", {
        "fieldMapping": [{"clientKey": "state", "leadField": "address.state"}], "headers": {"X-Ping-Source": "lds"},
        "responseRules": {"bidPath": "offer.price", "pingTokenPath": "token"}},
        fieldMapping=[{"clientKey": "token", "leadField": "auction.pingToken"},
                      {"clientKey": "price", "leadField": "auction.bid", "type": "number"},
                      {"clientKey": "round", "leadField": "auction.auctionId"},
                      {"clientKey": "email", "leadField": "email"}])
    tenant = auction_tenant(runtime, [ep])
    body = lead_body("AU1", address={"state": "CA", "zip": "94105"})
    data = submit(live, tenant, body)
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    assert lead["status"] == "delivered", lead["submissions"][-1]["result"]

    (ping,) = buyer.requests_to("/ping/acme")
    assert ping.method == "POST" and ping.json() == {"state": "CA"}
    assert ping.headers["x-buyer-key"] == BUYER_KEY and ping.headers["x-buyer-token"] == SEALED
    assert ping.headers["x-ping-source"] == "lds"
    round_ = auctions(live, tenant, data["leadId"])["items"][0]
    (post,) = buyer.requests_to("/post/acme")
    assert post.json() == {"token": "PT-4471", "price": 17.5, "round": round_["auctionId"], "email": body["email"]}
    assert post.headers["idempotency-key"] == data["submissionId"]
    assert post.headers["x-buyer-key"] == BUYER_KEY

    assert outcomes(round_) == {"acme": ("bid", 17.5)} and round_["winners"] == ["acme"]
    shown = live.get(f"/api/v1/leads/{data['leadId']}/auctions", headers=tenant.headers).text
    assert "PT-4471" not in shown and "PT-4471" not in json.dumps(lead)  # ping tokens are never shown
    assert revenue(live, tenant, data["leadId"]) == [("acme", 17.5, "USD")]


def test_http_get_ping_sends_the_mapped_fields_as_query_parameters(live, runtime, buyer):
    buyer.route("/ping/getter", status=200, body={"bid": "12.50"})  # a plain numeric string is a bid
    buyer.route("/post/getter", status=200, body={"ok": True})
    ep = http_buyer(buyer, "getter", {"method": "GET", "url": buyer.url("/ping/getter") + "?src=web",
                                      "fieldMapping": [{"clientKey": "state", "leadField": "address.state"},
                                                       {"clientKey": "zip", "leadField": "address.zip"}]})
    tenant = auction_tenant(runtime, [ep])
    data = submit(live, tenant, lead_body("AU1", address={"state": "TX", "zip": "73301"}))
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    assert lead["status"] == "delivered", lead["submissions"][-1]["result"]
    (ping,) = buyer.requests_to("/ping/getter")
    assert ping.method == "GET" and ping.body == b""
    assert ping.params() == {"src": "web", "state": "TX", "zip": "73301"}
    assert ping.headers["x-buyer-key"] == BUYER_KEY
    assert revenue(live, tenant, data["leadId"]) == [("getter", 12.5, "USD")]


def test_http_unreadable_bids_are_errors_and_refusals_are_no_bids_never_a_sale(live, runtime, buyer):
    answers = {  # each buyer's answer to the ping (a tests.buyer_server.Reply)
        "dollar": Reply(body={"bid": "$12"}), "negative": Reply(body={"bid": -3}),
        "huge": Reply(body={"bid": 2000000}), "word": Reply(body={"bid": "abc"}),
        "page": Reply(body="<html>not json</html>", headers={"Content-Type": "text/html"}),
        "down": Reply(status=503, body={"bid": 50}), "empty": Reply(status=204),
        "refuses": Reply(status=400, body={"bid": 40, "error": "duplicate"}),
        "choosy": Reply(body={"status": "pass", "bid": 70}),  # its `accepted` matcher wants status "ok"
        "good": Reply(body={"bid": 1}),
    }
    for name, reply in answers.items():
        buyer.route(f"/ping/{name}", reply)
        buyer.route(f"/post/{name}", status=200, body={"ok": True})
    tenant = auction_tenant(runtime, [http_buyer(buyer, name, {"responseRules": {
        "bidPath": "bid", "accepted": {"jsonPath": "status", "values": ["ok"]}}} if name == "choosy" else {})
        for name in answers])
    data = submit(live, tenant, lead_body("AU1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    assert lead["status"] == "delivered", lead["submissions"][-1]["result"]
    posted = sorted({r.path for r in buyer.requests if r.path.startswith("/post/")})
    assert posted == ["/post/good"]
    assert all(len(buyer.requests_to(f"/ping/{name}")) == 1 for name in answers)

    round_ = auctions(live, tenant, data["leadId"])["items"][0]
    assert outcomes(round_) == {
        "dollar": ("error", None), "negative": ("error", None), "huge": ("error", None), "word": ("error", None),
        "page": ("error", None), "down": ("error", None), "empty": ("no_bid", None), "refuses": ("no_bid", None),
        "choosy": ("no_bid", None), "good": ("bid", 1.0)}
    said = reasons(round_)
    assert "'$12' is not a number" in said["dollar"]
    assert "-3 is negative" in said["negative"]
    assert "over 1,000,000" in said["huge"]
    assert "'abc' is not a number" in said["word"]
    assert "not JSON" in said["page"]
    assert said["down"] == "HTTP 503"
    assert all(said[name] for name in answers if name != "good")
    assert round_["winners"] == ["good"]
    assert revenue(live, tenant, data["leadId"]) == [("good", 1.0, "USD")]


def test_http_a_slow_buyer_is_a_timeout(live, runtime, buyer):
    buyer.route("/ping/slow", status=200, body={"bid": 80}, delay=1.5)
    buyer.route("/ping/fast", status=200, body={"bid": 5})
    buyer.route("/post/fast", status=200, body={"ok": True})
    tenant = auction_tenant(runtime, [http_buyer(buyer, "slow", {"timeoutMs": 200}),
                                      http_buyer(buyer, "fast", {"timeoutMs": 2000})])
    data = submit(live, tenant, lead_body("AU1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    assert lead["status"] == "delivered"
    round_ = auctions(live, tenant, data["leadId"])["items"][0]
    assert outcomes(round_) == {"slow": ("timeout", None), "fast": ("bid", 5.0)}
    assert buyer.requests_to("/post/slow") == []


def test_http_ping_to_a_private_address_is_refused_without_the_setting(tmp_path, buyer, backend_toml):
    from appliance.config import load_config
    from appliance.runtime import create_runtime
    from tests.servers import write_config
    from tests.submit_support import START

    (tmp_path / "strict").mkdir()
    strict = create_runtime(load_config(write_config(tmp_path / "strict", backend=backend_toml)))
    strict.clock = FakeClock(START)
    try:
        buyer.route("/ping/local", status=200, body={"bid": 50})
        tenant = auction_tenant(strict, [http_buyer(buyer, "local", {})])
        with live_app(strict, tmp_path / "strict") as client:
            data = submit(client, tenant, lead_body("AU1"))
            lead = wait_for(client, tenant, data["leadId"], status_is("delivered", "failed"))
            assert lead["status"] == "failed"
            round_ = auctions(client, tenant, data["leadId"])["items"][0]
            assert outcomes(round_) == {"local": ("error", None)} and reasons(round_)["local"]
        assert buyer.requests == []  # nothing reached the loopback buyer
    finally:
        strict.close()


# ---- GET /api/v1/leads/{leadId}/auctions ----------------------------------------------------------

def test_the_auctions_list_shape_order_paging_and_refusals(live, runtime, clock, other_tenant):
    tenant = auction_tenant(runtime, [bidder("a", "none"), bidder("b", "3")],
                            auction={"noBid": "queue", "floor": 4})
    data = submit(live, tenant, lead_body("AU1"))
    wait_for(live, tenant, data["leadId"], lambda l: len(events(l, "auction")) == 1)
    clock.advance(seconds=301)
    lead = wait_for(live, tenant, data["leadId"], lambda l: len(events(l, "auction")) == 2)

    page = auctions(live, tenant, data["leadId"])
    assert set(page) == {"items", "nextCursor", "hasMore"}
    assert (page["nextCursor"], page["hasMore"]) == (None, False)
    first, second = (e["details"] for e in events(lead, "auction"))
    assert [r["auctionId"] for r in page["items"]] == [second["auctionId"], first["auctionId"]]  # newest first
    assert page["items"] == [second, first]  # the event details are the same summary
    item = page["items"][0]
    assert set(item) == {"auctionId", "submissionId", "startedAt", "endedAt", "durationMs", "mode", "floor",
                         "currency", "bids", "winners"}
    assert item["auctionId"].startswith("auc_") and item["submissionId"] == data["submissionId"]
    assert item["startedAt"] == "2026-03-10T15:05:01.000Z" and isinstance(item["durationMs"], int)
    assert (item["mode"], item["floor"], item["currency"], item["winners"]) == ("exclusive", 4.0, "USD", [])
    assert item["bids"] == [
        {"deliveryEndpointId": "a", "outcome": "no_bid", "bid": None, "responseMs": item["bids"][0]["responseMs"],
         "reason": "not interested"},
        {"deliveryEndpointId": "b", "outcome": "below_floor", "bid": 3.0,
         "responseMs": item["bids"][1]["responseMs"], "reason": item["bids"][1]["reason"]}]
    assert all(isinstance(b["responseMs"], int) for b in item["bids"])

    one = auctions(live, tenant, data["leadId"], limit=1)
    assert [r["auctionId"] for r in one["items"]] == [second["auctionId"]]
    assert one["hasMore"] is True and one["nextCursor"] == second["auctionId"]
    rest = auctions(live, tenant, data["leadId"], limit=1, cursor=one["nextCursor"])
    assert [r["auctionId"] for r in rest["items"]] == [first["auctionId"]]
    assert (rest["hasMore"], rest["nextCursor"]) == (False, None)

    zero = live.get(f"/api/v1/leads/{data['leadId']}/auctions", params={"limit": 0}, headers=tenant.headers)
    assert zero.status_code == 400 and zero.json()["error"]["code"] == "VALIDATION_ERROR"
    assert "limit" in json.dumps(zero.json()["error"])
    bad = live.get(f"/api/v1/leads/{data['leadId']}/auctions", params={"cursor": "xyz"}, headers=tenant.headers)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "VALIDATION_ERROR"
    assert "cursor" in json.dumps(bad.json()["error"])
    unknown = live.get("/api/v1/leads/lead_01JDN0TAKEYATA000000000000/auctions", headers=tenant.headers)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "NOT_FOUND"
    foreign = live.get(f"/api/v1/leads/{data['leadId']}/auctions", headers=other_tenant.headers)
    assert foreign.status_code == 404 and foreign.json()["error"]["code"] == "NOT_FOUND"
    assert "auc_" not in foreign.text


def test_a_lead_never_auctioned_has_an_empty_list(live, runtime):
    tenant = make_tenant(runtime, "Plain", {"deliveryEndpoints": [endpoint("ep")], "campaigns": [
        campaign("PL1", "Plain", delivery={"deliveryEndpointId": "ep"})]})
    data = submit(live, tenant, lead_body("PL1"))
    wait_for(live, tenant, data["leadId"], status_is("delivered"))
    assert auctions(live, tenant, data["leadId"]) == {"items": [], "nextCursor": None, "hasMore": False}


# ---- the console ----------------------------------------------------------------------------------

def test_the_console_lead_page_shows_the_auction_with_its_bids_and_winner(live, runtime):
    tenant = auction_tenant(runtime, [bidder("alpha", "11.25"), bidder("bravo", "42.5"), bidder("charlie", "none")])
    data = submit(live, tenant, lead_body("AU1"))
    wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    auction_id = auctions(live, tenant, data["leadId"])["items"][0]["auctionId"]
    sign_in(live, tenant)
    page = live.get(f"/admin/leads/{data['leadId']}")
    assert page.status_code == 200
    found = re.search(r"<h2>Auctions</h2>(.*?)</section>", page.text, re.DOTALL)
    assert found, page.text[:2000]
    card = found.group(1)
    assert auction_id in card and "sold to bravo" in card
    rows = {re.sub(r"<[^>]+>", " ", cells[0]).split()[0]: [html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
                                                           for c in cells]
            for cells in (re.findall(r"<td[^>]*>(.*?)</td>", row, re.DOTALL)
                          for row in re.findall(r"<tr>(.*?)</tr>", card, re.DOTALL)) if cells}
    assert set(rows) == {"alpha", "bravo", "charlie"}
    assert rows["bravo"][0] == "bravo won" and rows["bravo"][1:3] == ["bid", "42.50"]
    assert rows["alpha"][0] == "alpha" and rows["alpha"][1:3] == ["bid", "11.25"]
    assert rows["charlie"][0] == "charlie" and rows["charlie"][1] == "no bid" and rows["charlie"][2] == ""
    assert rows["charlie"][4] == "not interested"


def test_the_console_lead_page_has_no_auctions_card_without_a_round(live, runtime):
    tenant = make_tenant(runtime, "Plain", {"deliveryEndpoints": [endpoint("ep")], "campaigns": [
        campaign("PL1", "Plain", delivery={"deliveryEndpointId": "ep"})]})
    data = submit(live, tenant, lead_body("PL1"))
    wait_for(live, tenant, data["leadId"], status_is("delivered"))
    sign_in(live, tenant)
    page = live.get(f"/admin/leads/{data['leadId']}")
    assert page.status_code == 200 and "<h2>Auctions</h2>" not in page.text


def test_the_console_escapes_what_a_buyer_answered(live, runtime, buyer):
    buyer.route("/ping/odd", body={"bid": "<script>alert(1)</script>"})
    tenant = auction_tenant(runtime, [http_buyer(buyer, "odd", {})])
    data = submit(live, tenant, lead_body("AU1"))
    wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    sign_in(live, tenant)
    page = live.get(f"/admin/leads/{data['leadId']}").text
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # the reason is shown, escaped


# ---- bad bundles ---------------------------------------------------------------------------------

def _good_bundle() -> dict:
    return {"deliveryEndpoints": [endpoint("pinged", ping=copy.deepcopy(PING)), endpoint("plain")],
            "campaigns": [campaign("AU1", "Auctioned", delivery={"distribution": {
                "method": "auction", "auction": {"mode": "shared", "maxWinners": 2, "floor": 1,
                                                 "margin": {"amount": 1, "percent": 20}},
                "endpoints": [{"deliveryEndpointId": "pinged"}, {"deliveryEndpointId": "plain", "bid": 5}]}})]}


def _auction(b: dict) -> dict:
    return b["campaigns"][0]["delivery"]["distribution"]["auction"]


def _ping(b: dict) -> dict:
    return b["deliveryEndpoints"][0]["ping"]


def _no_bid(b):
    del b["campaigns"][0]["delivery"]["distribution"]["endpoints"][1]["bid"]


def _no_bid_path(b):
    _ping(b)["responseRules"] = {"pingTokenPath": "token"}


def _no_rules(b):
    del _ping(b)["responseRules"]


def _priority(b):
    b["campaigns"][0]["delivery"]["distribution"]["method"] = "priority"


BAD_BUNDLES = [
    ("neither ping nor bid", _no_bid, "campaigns[0].delivery.distribution.endpoints[1].bid"),
    ("ping without bidPath", _no_bid_path, "deliveryEndpoints[0].ping.responseRules.bidPath"),
    ("ping without responseRules", _no_rules, "deliveryEndpoints[0].ping.responseRules.bidPath"),
    ("maxWinners 0", lambda b: _auction(b).update(maxWinners=0), "campaigns[0].delivery.distribution.auction.maxWinners"),
    ("maxWinners 11", lambda b: _auction(b).update(maxWinners=11),
     "campaigns[0].delivery.distribution.auction.maxWinners"),
    ("negative floor", lambda b: _auction(b).update(floor=-1), "campaigns[0].delivery.distribution.auction.floor"),
    ("negative margin amount", lambda b: _auction(b)["margin"].update(amount=-0.5),
     "campaigns[0].delivery.distribution.auction.margin.amount"),
    ("margin percent 101", lambda b: _auction(b)["margin"].update(percent=101),
     "campaigns[0].delivery.distribution.auction.margin.percent"),
    ("auction timeoutMs 10", lambda b: _auction(b).update(timeoutMs=10),
     "campaigns[0].delivery.distribution.auction.timeoutMs"),
    ("auction timeoutMs 20000", lambda b: _auction(b).update(timeoutMs=20000),
     "campaigns[0].delivery.distribution.auction.timeoutMs"),
    ("ping timeoutMs 20", lambda b: _ping(b).update(timeoutMs=20), "deliveryEndpoints[0].ping.timeoutMs"),
    ("auction with method priority", _priority, "campaigns[0].delivery.distribution.auction"),
    ("credential in the ping url", lambda b: _ping(b).update(url="https://buyer.example.com/ping?api_key=k-123"),
     "deliveryEndpoints[0].ping.url"),
    ("credential ping header", lambda b: _ping(b).update(headers={"X-Api-Key": "k-123"}),
     "deliveryEndpoints[0].ping.headers"),
    ("credentials in the ping url's user info",
     lambda b: _ping(b).update(url="https://user:k-123@buyer.example.com/ping"), "deliveryEndpoints[0].ping.url"),
    ("ping method PUT", lambda b: _ping(b).update(method="PUT"), "deliveryEndpoints[0].ping.method"),
    ("currency usd", lambda b: _auction(b).update(currency="usd"), "campaigns[0].delivery.distribution.auction.currency"),
    ("bidTtlSeconds 0", lambda b: _auction(b).update(bidTtlSeconds=0),
     "campaigns[0].delivery.distribution.auction.bidTtlSeconds"),
    ("fixed bid over a million",
     lambda b: b["campaigns"][0]["delivery"]["distribution"]["endpoints"][1].update(bid=1_000_001),
     "campaigns[0].delivery.distribution.endpoints[1].bid"),
    ("negative fixed bid", lambda b: b["campaigns"][0]["delivery"]["distribution"]["endpoints"][1].update(bid=-1),
     "campaigns[0].delivery.distribution.endpoints[1].bid"),
]


def test_a_good_auction_bundle_imports(cli, tmp_path):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    path = tmp_path / "good.json"
    path.write_text(json.dumps(_good_bundle()))
    cli("import", "--tenant", tenant_id, str(path))
    exported = json.loads(cli("export", "--tenant", tenant_id).stdout)
    assert [c["campaignId"] for c in exported["campaigns"]] == ["AU1"]
    distribution = exported["campaigns"][0]["delivery"]["distribution"]
    assert distribution["method"] == "auction" and distribution["auction"]["maxWinners"] == 2


@pytest.mark.parametrize(("change", "field"), [(c, f) for _, c, f in BAD_BUNDLES], ids=[i for i, _, _ in BAD_BUNDLES])
def test_a_bad_auction_bundle_is_refused_naming_the_field_and_nothing_is_imported(cli, tmp_path, change, field):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    bad = _good_bundle()
    change(bad)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    result = cli("import", "--tenant", tenant_id, str(path), expect=1)
    assert f"error: {field}:" in result.stderr, result.stderr
    assert "k-123" not in result.output
    exported = json.loads(cli("export", "--tenant", tenant_id).stdout)
    assert exported["campaigns"] == [] and exported.get("deliveryEndpoints", []) == []


def test_dropping_the_ping_an_auction_campaign_needs_is_refused(cli, tmp_path):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    path = tmp_path / "good.json"
    path.write_text(json.dumps(_good_bundle()))
    cli("import", "--tenant", tenant_id, str(path))
    later = {"deliveryEndpoints": [endpoint("pinged")]}  # the same endpoint, its ping gone
    path.write_text(json.dumps(later))
    result = cli("import", "--tenant", tenant_id, str(path), expect=1)
    assert "deliveryEndpoints[0].ping: required: campaign" in result.stderr
    exported = json.loads(cli("export", "--tenant", tenant_id).stdout)
    assert exported["deliveryEndpoints"][0]["ping"]["url"] == PING["url"]


# ---- plugins written before ping ------------------------------------------------------------------

OLD_PLUGIN = '''
from appliance.sdk import DeliveryAdapter, DeliveryResult, hookimpl

class Legacy(DeliveryAdapter):
    name = "legacy"

    async def deliver(self, request, http):
        return DeliveryResult(outcome="success", status_code=200, message="legacy took it")

@hookimpl
def appliance_delivery_adapters(settings):
    return [Legacy()]
'''


def test_an_adapter_without_ping_still_delivers_and_bids_only_a_fixed_bid(runtime, clock, tmp_path):
    (tmp_path / "plugins").mkdir(exist_ok=True)
    (tmp_path / "plugins" / "legacy.py").write_text(OLD_PLUGIN)
    legacy_pinged = endpoint("old", adapter="legacy", ping=PING)
    legacy_fixed = endpoint("oldfixed", adapter="legacy")
    tenant = auction_tenant(runtime, [legacy_pinged, legacy_fixed, bidder("a", "5")],
                            [{"deliveryEndpointId": "old"}, {"deliveryEndpointId": "oldfixed", "bid": 7},
                             {"deliveryEndpointId": "a"}])
    with live_app(runtime, tmp_path) as client:
        lead = wait_for(client, tenant, submit(client, tenant, lead_body("AU1"))["leadId"], status_is("delivered"))
        (round_,) = auctions(client, tenant, lead["leadId"])["items"]
    assert outcomes(round_) == {"old": ("error", None), "oldfixed": ("bid", 7.0), "a": ("bid", 5.0)}
    assert reasons(round_)["old"] == "delivery adapter 'legacy' cannot ping"
    assert round_["winners"] == ["oldfixed"]
    assert lead["submissions"][-1]["journeyEvents"][-1]["reason"] == "legacy took it"
