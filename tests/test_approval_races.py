"""Approval decisions against the real delivery worker and a real buyer: one delivery per decision
that allows it, whatever the order and timing of approve / pending / reject calls; a decision that
comes too late (the delivery under way, delivered or failed) is refused with 409 and recorded
nowhere, so a lead never ends `rejected` and `delivered`."""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from appliance.config import load_config
from appliance.runtime import create_runtime
from tests.bundles import campaign
from tests.buyer_server import BuyerServer, Reply, wait_until
from tests.conftest import make_tenant
from tests.servers import live_server, person, write_config

SUBMIT = "/api/v1/leads/submit"
HUMAN_REVIEW = {"enabled": True, "action": "human_review", "humanReview": {"reason": "check first"}}


@pytest.fixture
def desk(tmp_path, backend_toml) -> Iterator[tuple[httpx.Client, BuyerServer]]:
    """A served appliance with a held campaign (HR) delivering to a local buyer that answers after
    a short delay, so decisions land while deliveries are in flight."""
    runtime = create_runtime(load_config(write_config(tmp_path, extra="\n[delivery]\nallow_private_addresses = true\n", backend=backend_toml)))
    try:
        with BuyerServer() as buyer:
            buyer.route("/in", status=200, body={"id": "B-1"}, delay=0.15)
            bundle = {
                "deliveryEndpoints": [{"deliveryEndpointId": "ep", "url": buyer.url("/in"),
                                       "retry": {"maxAttempts": 3, "backoffSeconds": [2]}}],
                "campaigns": [campaign("HR1", "Held", firstIntakeAction=HUMAN_REVIEW,
                                       delivery={"deliveryEndpointId": "ep"})],
            }
            tenant = make_tenant(runtime, "Desk", bundle)
            with live_server(runtime) as base, \
                    httpx.Client(base_url=base, headers=tenant.headers, timeout=20) as http:
                yield http, buyer
    finally:
        runtime.close()


def held_lead(http: httpx.Client, n: int) -> dict:
    answer = http.post(SUBMIT, json={"campaignId": "HR1", **person(n)})
    assert answer.status_code == 201, answer.text
    data = answer.json()["data"]
    assert data["status"] == "pending_action"
    return data


def decide(http: httpx.Client, lead_id: str, status: str) -> int:
    answer = http.post(f"/api/v1/leads/{lead_id}/approve", json={"status": status})
    assert answer.status_code in (200, 409), answer.text
    return answer.status_code


def decision(http: httpx.Client, lead_id: str, status: str) -> tuple[str, int, dict]:
    """The decision asked for, and the status and body it was answered with."""
    answer = http.post(f"/api/v1/leads/{lead_id}/approve", json={"status": status})
    return status, answer.status_code, answer.json()


def lead(http: httpx.Client, lead_id: str) -> dict:
    return http.get(f"/api/v1/leads/{lead_id}").json()["data"]


def posts_by_submission(buyer: BuyerServer) -> Counter:
    return Counter(r.headers["idempotency-key"] for r in buyer.requests_to("/in"))


def refused(http: httpx.Client, lead_id: str, status: str) -> str:
    """The one detail of a decision answered 409 INVALID_STATE."""
    answer = http.post(f"/api/v1/leads/{lead_id}/approve", json={"status": status})
    assert answer.status_code == 409, answer.text
    error = answer.json()["error"]
    assert error["code"] == "INVALID_STATE" and len(error["details"]) == 1, error
    return error["details"][0]


def approval_events(found: dict) -> list[str]:
    return [step["type"] for step in found["submissions"][-1]["journeyEvents"] if step["type"].startswith("approval_")]


UNDER_WAY = "approval: the lead's delivery is already under way and cannot be called back"
DELIVERED = "approval: the lead is already delivered; a decision no longer changes it"
FAILED = "approval: the lead's delivery already failed; repost the lead to send it again"
# A lead's status and the approvals it may have once nothing is in flight.
AGREEING = {"delivered": {"approved", "pending"}, "rejected": {"rejected"}, "pending_action": {"pending"}}


def settled(http: httpx.Client, buyer: BuyerServer, data: dict) -> bool:
    """Nothing in flight for the lead: a POST the buyer got is recorded, and none is due."""
    status = lead(http, data["leadId"])["status"]
    return status in AGREEING and posts_by_submission(buyer)[data["submissionId"]] == (status == "delivered")


def test_decisions_while_the_delivery_is_under_way_are_refused_and_it_posts_once(desk):
    http, buyer = desk
    at_buyer = threading.Event()  # the buyer holds the POST until the test lets it answer
    buyer.route("/in", lambda _request: Reply(status=200 if at_buyer.wait(10) else 503, body={"id": "B-1"}))
    data = held_lead(http, 1)
    try:
        assert decide(http, data["leadId"], "approved") == 200
        assert wait_until(lambda: buyer.requests_to("/in"), timeout=10)  # the attempt is running
        for status in ("pending", "rejected", "approved"):
            assert refused(http, data["leadId"], status) == UNDER_WAY
        found = lead(http, data["leadId"])
        assert (found["status"], found["approval"]["status"]) == ("qualified", "approved")
        assert approval_events(found) == ["approval_approved"]
    finally:
        at_buyer.set()
    assert wait_until(lambda: lead(http, data["leadId"])["status"] == "delivered", timeout=10)
    assert lead(http, data["leadId"])["approval"]["status"] == "approved"
    assert not wait_until(lambda: len(buyer.requests_to("/in")) > 1, timeout=1.0)
    assert posts_by_submission(buyer) == {data["submissionId"]: 1}


def test_a_delivered_lead_refuses_decisions_and_records_a_reset_that_changes_nothing(desk):
    http, buyer = desk
    data = held_lead(http, 2)
    decide(http, data["leadId"], "approved")
    assert wait_until(lambda: lead(http, data["leadId"])["status"] == "delivered", timeout=10)
    for status in ("rejected", "approved"):
        assert refused(http, data["leadId"], status) == DELIVERED
    assert approval_events(lead(http, data["leadId"])) == ["approval_approved"]
    assert decide(http, data["leadId"], "pending") == 200
    found = lead(http, data["leadId"])
    assert (found["status"], found["approval"]["status"]) == ("delivered", "pending")
    assert found["submissions"][-1]["status"] == "delivered"
    assert refused(http, data["leadId"], "rejected") == refused(http, data["leadId"], "approved") == DELIVERED
    repost = http.post(f"/api/v1/leads/{data['leadId']}/repost", json={})
    assert repost.status_code == 409, repost.text
    assert approval_events(lead(http, data["leadId"])) == ["approval_approved", "approval_pending"]
    assert not wait_until(lambda: len(buyer.requests_to("/in")) > 1, timeout=1.0)
    assert posts_by_submission(buyer) == {data["submissionId"]: 1}


def test_a_failed_lead_refuses_every_decision_and_is_sent_again_by_a_repost(desk):
    http, buyer = desk
    buyer.route("/in", status=400, body={"error": "not wanted"})  # `failure`: never retried
    data = held_lead(http, 3)
    decide(http, data["leadId"], "approved")
    assert wait_until(lambda: lead(http, data["leadId"])["status"] == "failed", timeout=10)
    for status in ("rejected", "approved", "pending"):
        assert refused(http, data["leadId"], status) == FAILED
    found = lead(http, data["leadId"])
    assert (found["status"], found["approval"]["status"]) == ("failed", "approved")
    assert approval_events(found) == ["approval_approved"]
    buyer.route("/in", status=200, body={"id": "B-2"})
    repost = http.post(f"/api/v1/leads/{data['leadId']}/repost", json={})
    assert repost.status_code == 201, repost.text
    assert wait_until(lambda: lead(http, data["leadId"])["status"] == "delivered", timeout=10)


def test_a_retry_scheduled_before_a_reset_waits_for_the_next_approval(desk):
    http, buyer = desk
    answers = iter([Reply(status=503), Reply(status=200, body={"id": "B-2"})])
    buyer.route("/in", lambda _request: next(answers))
    data = held_lead(http, 4)
    decide(http, data["leadId"], "approved")
    # 503: a retry in 2 s, time enough for the reset below to land first on a busy machine; the
    # reset waits until the error is recorded (while the attempt runs it would be refused)
    assert wait_until(lambda: "delivery_error" in [step["type"] for step in
                                                   lead(http, data["leadId"])["submissions"][-1]["journeyEvents"]],
                      timeout=10)
    assert decide(http, data["leadId"], "pending") == 200
    assert not wait_until(lambda: len(buyer.requests_to("/in")) > 1, timeout=3)  # the retry did not send
    assert lead(http, data["leadId"])["status"] == "pending_action"
    assert decide(http, data["leadId"], "approved") == 200
    assert wait_until(lambda: lead(http, data["leadId"])["status"] == "delivered", timeout=10)
    assert len(buyer.requests_to("/in")) == 2


def test_concurrent_decisions_deliver_each_submission_exactly_once(desk):
    http, buyer = desk
    leads = [held_lead(http, 100 + n) for n in range(10)]
    rng = random.Random(13)
    calls = [(rng.choice(leads)["leadId"], rng.choice(["approved", "pending", "rejected", "approved"]))
             for _ in range(50)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda call: decide(http, *call), calls))
    assert wait_until(lambda: all(settled(http, buyer, d) for d in leads), timeout=20)
    for data in leads:  # end every lead approved: with nothing in flight, pending first is allowed
        if lead(http, data["leadId"])["status"] != "delivered":
            assert decide(http, data["leadId"], "pending") == 200
            assert decide(http, data["leadId"], "approved") == 200
    assert wait_until(lambda: all(lead(http, d["leadId"])["status"] == "delivered" for d in leads), timeout=20), \
        {d["leadId"]: lead(http, d["leadId"])["status"] for d in leads}
    wait_until(lambda: False, timeout=1.0)  # room for a stray second delivery to show
    assert posts_by_submission(buyer) == {d["submissionId"]: 1 for d in leads}


def approvals_in_journey(submission: dict) -> list[tuple[str, str]]:
    """The decisions the journey records, as (decision, time), each checked against the delivery
    around it: `approved` and `rejected` only on a pending approval and never once the lead was
    delivered, and a delivery recorded only under the approval it was claimed with."""
    approval, delivered, decided = "pending", False, []
    for step in submission["journeyEvents"]:
        if step["type"].startswith("approval_"):
            made = step["type"].removeprefix("approval_")
            assert made == "pending" or (approval == "pending" and not delivered), (made, approval, delivered)
            approval = made
            decided.append((made, step["timestamp"]))
        elif step["type"] == "delivered":
            assert approval == "approved", submission["journeyEvents"]
            delivered = True
    return decided


def mixed_decisions(http: httpx.Client, buyer: BuyerServer, data: dict, calls: list[str]) -> Counter:
    """`calls` on the lead at once (16 at a time), then its checks once nothing is in flight;
    the details of the refusals."""
    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(lambda status: decision(http, data["leadId"], status), calls))
    assert wait_until(lambda: settled(http, buyer, data), timeout=15), lead(http, data["leadId"])
    found = lead(http, data["leadId"])
    assert found["approval"]["status"] in AGREEING[found["status"]], (found["status"], found["approval"])
    recorded = approvals_in_journey(found["submissions"][-1])
    assert Counter(recorded) == Counter((body["data"]["approval"]["status"], body["data"]["approval"]["decidedAt"])
                                        for _, code, body in answers if code == 200)
    assert found["approval"]["status"] == (recorded[-1][0] if recorded else "pending")
    refusals: Counter = Counter()
    for status, code, body in answers:
        if code == 200:
            assert body["data"]["approval"]["status"] == status
            continue
        assert code == 409, body
        assert body["error"]["code"] == "INVALID_STATE"
        assert body["error"]["details"] and all(d.startswith("approval: ") for d in body["error"]["details"])
        refusals.update(body["error"]["details"])
    return refusals


def test_mixed_decisions_during_a_slow_delivery_never_contradict_it(desk):
    """Ten leads in turn, each with 50 concurrent approve / reject / pending calls while a slow
    buyer (0.3-0.8 s) takes its delivery: each 200 is a decision the journey records where it was
    allowed, each 409 says why, and the lead ends with a status its approval agrees with."""
    http, buyer = desk
    rng, delays = random.Random(29), random.Random(31)
    buyer.route("/in", lambda _request: Reply(status=200, body={"id": "B-3"}, delay=delays.uniform(0.3, 0.8)))
    refusals: Counter = Counter()
    for n in range(10):
        refusals += mixed_decisions(http, buyer, held_lead(http, 200 + n),
                                    [rng.choice(["approved", "rejected", "pending"]) for _ in range(50)])
    assert refusals[UNDER_WAY], refusals  # decisions did land while deliveries ran
