"""Approval decisions against the real delivery worker and a real buyer: one delivery per decision
that allows it, whatever the order and timing of approve / pending / reject calls, and a decision
never turns a delivered lead back into one that can be sent again."""

from __future__ import annotations

import random
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


def lead(http: httpx.Client, lead_id: str) -> dict:
    return http.get(f"/api/v1/leads/{lead_id}").json()["data"]


def posts_by_submission(buyer: BuyerServer) -> Counter:
    return Counter(r.headers["idempotency-key"] for r in buyer.requests_to("/in"))


def test_approve_pending_approve_while_the_first_delivery_is_in_flight_posts_once(desk):
    http, buyer = desk
    data = held_lead(http, 1)
    assert decide(http, data["leadId"], "approved") == 200
    assert wait_until(lambda: buyer.requests_to("/in"), timeout=10)  # the POST is at the buyer now
    assert decide(http, data["leadId"], "pending") == 200
    assert decide(http, data["leadId"], "approved") == 200
    assert wait_until(lambda: lead(http, data["leadId"])["status"] == "delivered", timeout=10)
    assert not wait_until(lambda: len(buyer.requests_to("/in")) > 1, timeout=1.5)
    assert posts_by_submission(buyer) == {data["submissionId"]: 1}


def test_pending_and_rejected_leave_a_delivered_lead_delivered_and_not_repostable(desk):
    http, buyer = desk
    data = held_lead(http, 2)
    decide(http, data["leadId"], "approved")
    assert wait_until(lambda: lead(http, data["leadId"])["status"] == "delivered", timeout=10)
    assert decide(http, data["leadId"], "pending") == 200
    assert lead(http, data["leadId"])["status"] == "delivered"
    assert decide(http, data["leadId"], "rejected") == 200
    found = lead(http, data["leadId"])
    assert found["status"] == "delivered"
    assert found["approval"]["status"] == "rejected"  # the decision is recorded all the same
    assert found["submissions"][-1]["status"] == "delivered"
    repost = http.post(f"/api/v1/leads/{data['leadId']}/repost", json={})
    assert repost.status_code == 409, repost.text
    assert decide(http, data["leadId"], "pending") == 200
    assert decide(http, data["leadId"], "approved") == 200
    assert not wait_until(lambda: len(buyer.requests_to("/in")) > 1, timeout=1.5)
    assert posts_by_submission(buyer) == {data["submissionId"]: 1}


def test_a_retry_scheduled_before_a_reset_waits_for_the_next_approval(desk):
    http, buyer = desk
    answers = iter([Reply(status=503), Reply(status=200, body={"id": "B-2"})])
    buyer.route("/in", lambda _request: next(answers))
    data = held_lead(http, 3)
    decide(http, data["leadId"], "approved")
    # 503: a retry in 2 s, time enough for the reset below to land first on a busy machine
    assert wait_until(lambda: len(buyer.requests_to("/in")) == 1, timeout=10)
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
    for data in leads:  # end every lead approved: pending first is always allowed
        assert decide(http, data["leadId"], "pending") == 200
        assert decide(http, data["leadId"], "approved") == 200
    assert wait_until(lambda: all(lead(http, d["leadId"])["status"] == "delivered" for d in leads), timeout=20), \
        {d["leadId"]: lead(http, d["leadId"])["status"] for d in leads}
    wait_until(lambda: False, timeout=1.0)  # room for a stray second delivery to show
    assert posts_by_submission(buyer) == {d["submissionId"]: 1 for d in leads}
