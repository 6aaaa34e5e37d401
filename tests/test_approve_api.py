"""POST /api/v1/leads/{leadId}/approve."""

from __future__ import annotations

import pytest

from tests.submit_support import (  # noqa: F401
    accepted, api, clock, events_of, jobs, person, plain, read_lead, rule_set, condition, setup_tenant, source_key,
)


@pytest.fixture
def tenant(runtime):
    return setup_tenant(
        runtime,
        plain("HR1", firstIntakeAction={"enabled": True, "action": "human_review",
                                        "humanReview": {"reason": "check first"}}),
        plain("REV", qualification={"rules": [rule_set({**condition("address.state", "equals", ["CA"]),
                                                        "maxSeverity": "review"}, name="CA review")]}),
        plain("EN1", firstIntakeAction={"enabled": True, "action": "engage", "engage": {"goalId": "g"}}),
        plain("SC1", ingestion={"sources": [{"sourceId": "web"}]}),
    )


def approve(api, tenant, lead_id, body, expect=200):
    response = api.post(f"/api/v1/leads/{lead_id}/approve", json=body, headers=tenant.headers)
    assert response.status_code == expect, response.text
    return response.json()


def held(api, tenant, code="HR1", **fields):
    data = accepted(api, tenant, person(code, **fields))
    assert data["status"] == "pending_action"
    return data


def test_approved_from_pending_qualifies_and_schedules_delivery(api, runtime, tenant, clock):
    data = held(api, tenant)
    assert jobs(runtime, data["submissionId"]) == []
    clock.advance(minutes=5)
    envelope = approve(api, tenant, data["leadId"], {"status": "approved", "reason": "looks fine"})
    assert envelope["success"] is True
    assert envelope["data"] == {"leadId": data["leadId"], "approval": {
        "status": "approved", "campaignId": "HR1", "decidedAt": "2026-03-10T15:05:00.000Z",
        "decidedBy": f"key:{tenant.key_id}", "reason": "looks fine"}}
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert lead["status"] == "qualified"
    assert lead["approval"]["status"] == "approved"
    submission = lead["submissions"][-1]
    assert submission["status"] == "qualified"
    decided = events_of(submission, "approval_approved")
    assert decided and decided[0]["reason"] == "looks fine"
    assert jobs(runtime, data["submissionId"]) == [("deliver", "ready")]


def test_approving_a_lead_held_by_a_review_rule(api, runtime, tenant):
    data = held(api, tenant, "REV", address={"state": "CA"})
    approve(api, tenant, data["leadId"], {"status": "approved"})
    assert read_lead(api, runtime, tenant, data["leadId"])["status"] == "qualified"
    assert [kind for kind, _ in jobs(runtime, data["submissionId"])] == ["deliver"]


def test_rejected_rejects_lead_and_submission(api, runtime, tenant):
    data = held(api, tenant)
    envelope = approve(api, tenant, data["leadId"], {"status": "rejected", "reason": "fake"})
    assert envelope["data"]["approval"]["status"] == "rejected"
    assert envelope["data"]["approval"]["reason"] == "fake"
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert lead["status"] == "rejected"
    assert lead["approval"]["status"] == "rejected"
    assert lead["submissions"][-1]["status"] == "rejected"
    assert events_of(lead["submissions"][-1], "approval_rejected")
    assert jobs(runtime, data["submissionId"]) == []


def test_pending_resets_a_rejection(api, runtime, tenant):
    data = held(api, tenant)
    approve(api, tenant, data["leadId"], {"status": "rejected"})
    envelope = approve(api, tenant, data["leadId"], {"status": "pending"})
    assert envelope["data"]["approval"]["status"] == "pending"
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert lead["status"] == "pending_action"
    assert lead["approval"]["status"] == "pending"
    assert lead["submissions"][-1]["status"] == "pending_action"
    # and it can be decided again
    approve(api, tenant, data["leadId"], {"status": "approved"})
    assert read_lead(api, runtime, tenant, data["leadId"])["status"] == "qualified"


def test_pending_resets_an_approval_and_cancels_the_delivery(api, runtime, tenant):
    data = held(api, tenant)
    approve(api, tenant, data["leadId"], {"status": "approved"})
    approve(api, tenant, data["leadId"], {"status": "pending"})
    assert read_lead(api, runtime, tenant, data["leadId"])["status"] == "pending_action"
    assert jobs(runtime, data["submissionId"]) == [("deliver", "cancelled")]
    approve(api, tenant, data["leadId"], {"status": "approved"})
    assert jobs(runtime, data["submissionId"]) == [("deliver", "cancelled"), ("deliver", "ready")]


def test_pending_on_a_pending_approval_is_allowed(api, runtime, tenant):
    data = held(api, tenant)
    assert approve(api, tenant, data["leadId"], {"status": "pending"})["data"]["approval"]["status"] == "pending"
    assert read_lead(api, runtime, tenant, data["leadId"])["status"] == "pending_action"


@pytest.mark.parametrize("first", ["approved", "rejected"])
@pytest.mark.parametrize("second", ["approved", "rejected"])
def test_deciding_twice_is_invalid_state(api, runtime, tenant, first, second):
    data = held(api, tenant)
    approve(api, tenant, data["leadId"], {"status": first})
    envelope = approve(api, tenant, data["leadId"], {"status": second}, expect=409)
    assert envelope["error"]["code"] == "INVALID_STATE"
    assert envelope["error"]["details"]
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert lead["approval"]["status"] == first
    assert lead["status"] == ("qualified" if first == "approved" else "rejected")


@pytest.mark.parametrize("status", ["approved", "rejected", "pending"])
def test_lead_without_approval_is_invalid_state(api, runtime, tenant, status):
    qualified = accepted(api, tenant, person("SC1"))
    engaged = held(api, tenant, "EN1")
    for data, lead_status in ((qualified, "qualified"), (engaged, "pending_action")):
        envelope = approve(api, tenant, data["leadId"], {"status": status}, expect=409)
        assert envelope["error"]["code"] == "INVALID_STATE"
        assert any(d.startswith("approval") for d in envelope["error"]["details"])
        lead = read_lead(api, runtime, tenant, data["leadId"])
        assert lead["status"] == lead_status
        assert lead["approval"] is None


@pytest.mark.parametrize(("body", "prefix"), [
    ({"status": "maybe"}, "status: "),
    ({"status": "APPROVED"}, "status: "),
    ({"status": None}, "status: "),
    ({"status": 1}, "status: "),
    ({}, "status: "),
    ({"status": "approved", "reason": 5}, "reason: "),
    ({"status": "approved", "decidedBy": "someone"}, "decidedBy: "),
], ids=["unknown", "case", "null", "number", "missing", "reason-type", "unknown-field"])
def test_bad_body_is_validation_error(api, runtime, tenant, body, prefix):
    data = held(api, tenant)
    envelope = approve(api, tenant, data["leadId"], body, expect=400)
    assert envelope["error"]["code"] == "VALIDATION_ERROR"
    assert any(d.startswith(prefix) for d in envelope["error"]["details"]), envelope["error"]["details"]
    assert read_lead(api, runtime, tenant, data["leadId"])["approval"]["status"] == "pending"


def test_malformed_body_and_content_type(api, runtime, tenant):
    data = held(api, tenant)
    path = f"/api/v1/leads/{data['leadId']}/approve"
    response = api.post(path, content=b"{", headers={**tenant.headers, "Content-Type": "application/json"})
    assert response.status_code == 400
    response = api.post(path, content=b'{"status": "approved"}', headers={**tenant.headers,
                                                                        "Content-Type": "text/plain"})
    assert response.status_code == 415
    assert read_lead(api, runtime, tenant, data["leadId"])["approval"]["status"] == "pending"


def test_unknown_lead_is_404(api, tenant):
    envelope = approve(api, tenant, "lead_01JDNOTALEADATALL0000000000", {"status": "approved"}, expect=404)
    assert envelope == {"success": False, "error": {"code": "NOT_FOUND", "message": "Resource not found"}}


def test_other_tenants_lead_is_404_and_untouched(api, runtime, tenant):
    other = setup_tenant(runtime, plain("HR1", firstIntakeAction={"enabled": True, "action": "human_review"}),
                         name="Other Agency")
    theirs = held(api, other)
    envelope = approve(api, tenant, theirs["leadId"], {"status": "approved"}, expect=404)
    assert envelope["error"]["code"] == "NOT_FOUND"
    lead = read_lead(api, runtime, other, theirs["leadId"])
    assert lead["status"] == "pending_action"
    assert lead["approval"]["status"] == "pending"
    assert jobs(runtime, theirs["submissionId"]) == []


def test_unknown_lead_is_404_even_with_a_bad_body(api, tenant):
    response = api.post("/api/v1/leads/lead_nothing/approve", json={"status": "approved"}, headers=tenant.headers)
    assert response.status_code == 404


def test_approve_needs_a_tenant_key(api, runtime, tenant):
    data = held(api, tenant)
    path = f"/api/v1/leads/{data['leadId']}/approve"
    assert api.post(path, json={"status": "approved"}).status_code == 401
    web = source_key(runtime, tenant, "web")
    response = api.post(path, json={"status": "approved"}, headers={"X-API-Key": web})
    assert response.status_code == 403
    assert read_lead(api, runtime, tenant, data["leadId"])["approval"]["status"] == "pending"


def test_resubmission_to_a_held_campaign_holds_again(api, runtime, tenant):
    data = held(api, tenant)
    again = accepted(api, tenant, {"leadId": data["leadId"], "campaignId": "HR1"})
    assert again["status"] == "pending_action"
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert lead["approval"]["status"] == "pending"
    assert jobs(runtime, again["submissionId"]) == []


@pytest.mark.parametrize("decision", [None, "rejected"])
def test_resubmission_does_not_schedule_delivery_past_an_open_or_rejected_approval(api, runtime, tenant, decision):
    data = held(api, tenant)
    if decision:
        approve(api, tenant, data["leadId"], {"status": decision})
    again = accepted(api, tenant, {"leadId": data["leadId"], "campaignId": "SC1"})
    lead = read_lead(api, runtime, tenant, data["leadId"])
    blocked = lead["approval"] is not None and lead["approval"]["status"] in ("pending", "rejected")
    scheduled = [kind for kind, state in jobs(runtime, again["submissionId"]) if state == "ready"]
    assert not (blocked and scheduled), (lead["status"], lead["approval"], scheduled)
