"""POST /api/v1/leads/{leadId}/repost and /deliver. The delivery worker is not involved: failed and
error leads are made through the storage layer, and the tests check the deliver job rows."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from appliance.domain.delivery_target import endpoint_override
from appliance.domain.submission import SubmitLead
from appliance.errors import InvalidState
from appliance.services import reposts, tenancy
from appliance.services.tenant_settings import load_settings
from tests.conftest import make_tenant
from tests.worker_helpers import live_app, endpoint, lead_body, status_is, wait_for
from tests.submit_support import (  # noqa: F401
    accepted, api, clock, condition, events_of, jobs, person, plain, read_lead, rule_set, setup_tenant,
    source_key,
)
from tests.engine import engine

ENDPOINTS = [{"deliveryEndpointId": "ep-main", "url": "https://buyer.example.com/in"},
             {"deliveryEndpointId": "ep-alt", "url": "https://other-buyer.example.com/in"}]
QUALIFY_RULES = {"rules": [
    rule_set(condition("address.state", "equals", ["NY"]), name="no NY"),
    rule_set({**condition("address.state", "equals", ["TX"]), "maxSeverity": "review"}, name="TX review"),
]}


def _campaigns(archived: bool = False) -> list[dict]:
    return [
        plain("SC1", delivery={"deliveryEndpointId": "ep-main"}),
        plain("QL1", qualification=QUALIFY_RULES, delivery={"deliveryEndpointId": "ep-main"}),
        plain("HR1", firstIntakeAction={"enabled": True, "action": "human_review",
                                        "humanReview": {"reason": "check first"}}),
        plain("EN1", firstIntakeAction={"enabled": True, "action": "engage", "engage": {"goalId": "g"}}),
        plain("OFF", active=False),
        plain("ARC", archivedAt="2026-01-01T00:00:00.000Z"),
        plain("GONE", **({"archivedAt": "2026-03-01T00:00:00.000Z"} if archived else {})),
    ]


@pytest.fixture
def tenant(runtime):
    return setup_tenant(runtime, *_campaigns(), deliveryEndpoints=ENDPOINTS)


@pytest.fixture
def other(runtime):
    return setup_tenant(runtime, plain("SC1"), name="Other Agency",
                        deliveryEndpoints=[{"deliveryEndpointId": "ep-theirs", "url": "https://x.example.com/"}])


# ---- helpers -------------------------------------------------------------------------------------

def post(api, tenant, lead_id, action, body, expect):
    kwargs = {"json": body} if body is not ... else {}
    response = api.post(f"/api/v1/leads/{lead_id}/{action}", headers=tenant.headers, **kwargs)
    assert response.status_code == expect, response.text
    return response.json()


def repost(api, tenant, lead_id, body=..., expect=201):
    return post(api, tenant, lead_id, "repost", body, expect)


def deliver(api, tenant, lead_id, body, expect=201):
    return post(api, tenant, lead_id, "deliver", body, expect)


def set_status(runtime, tenant, lead_id, status):
    """What the delivery worker would leave behind: the lead and its last submission in `status`,
    the submission's delivery job done."""
    def unit(tx):
        lead = tx.leads.get_lead(tenant.tenant_id, lead_id)
        tx.leads.update_lead(tenant.tenant_id, msgspec.structs.replace(lead, status=status))
        last = tx.leads.latest_submission(tenant.tenant_id, lead_id)
        tx.leads.update_submission(tenant.tenant_id, msgspec.structs.replace(last, status=status))
        return last.submission_id
    submission_id = runtime.store.write_sync(unit)
    engine(runtime.store).write_sync(lambda conn: conn.execute("UPDATE jobs SET state = 'done' WHERE submission_id = ?",
                                                              (submission_id,)))


def lead_in(api, runtime, tenant, status, code="SC1", **fields):
    data = accepted(api, tenant, person(code, **fields))
    assert data["status"] == "qualified"
    set_status(runtime, tenant, data["leadId"], status)
    return data


def rejected_lead(api, tenant):
    data = accepted(api, tenant, person("HR1"))
    assert data["status"] == "pending_action"
    response = api.post(f"/api/v1/leads/{data['leadId']}/approve", json={"status": "rejected", "reason": "no"},
                        headers=tenant.headers)
    assert response.status_code == 200, response.text
    return data


def state(api, runtime, tenant, lead_id):
    lead = read_lead(api, runtime, tenant, lead_id)
    return lead["status"], lead["submissionCount"], len(lead["submissions"])


def error_details(envelope, code="VALIDATION_ERROR"):
    assert envelope["success"] is False
    assert envelope["error"]["code"] == code
    return envelope["error"]["details"]


# ---- repost: simple retry ------------------------------------------------------------------------

@pytest.mark.parametrize("status", ["failed", "error"])
def test_simple_retry_creates_a_qualified_repost_submission_and_a_job(api, runtime, tenant, clock, status):
    data = lead_in(api, runtime, tenant, status)
    clock.advance(minutes=3)
    envelope = repost(api, tenant, data["leadId"], {})
    new_id = envelope["data"]["newSubmissionId"]
    assert envelope == {"success": True, "data": {"newSubmissionId": new_id, "leadId": data["leadId"],
                                                  "requiresQualification": False}}
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert (lead["status"], lead["submissionCount"], lead["campaignId"]) == ("qualified", 2, "SC1")
    first, new = lead["submissions"]
    assert first["status"] == status
    assert new["submissionId"] == new_id and new["submissionNumber"] == 2
    assert (new["flowType"], new["status"], new["campaign"]["campaignId"]) == ("repost", "qualified", "SC1")
    assert new["campaign"]["clientName"] == "Client SC1"
    assert new["qualification"]["method"] == "skipped" and new["qualification"]["passed"] is True
    assert new["qualifiedAt"] == "2026-03-10T15:03:00.000Z"
    (event,) = events_of(new, "repost")
    assert event["reason"] == f"simple retry after {status}"
    assert event["details"]["mode"] == "simple"
    assert event["details"]["requestedBy"] == f"key:{tenant.key_id}"
    assert event["details"]["previousSubmissionId"] == first["submissionId"]
    assert "deliveryEndpointId" not in event["details"]
    assert jobs(runtime, new_id) == [("deliver", "ready")]
    assert jobs(runtime, first["submissionId"]) == [("deliver", "done")]
    submission = runtime.store.reader().leads.get_submission(tenant.tenant_id, new_id)
    assert endpoint_override(submission) is None


def test_an_empty_request_body_is_a_simple_retry(api, runtime, tenant):
    data = lead_in(api, runtime, tenant, "failed")
    envelope = repost(api, tenant, data["leadId"])  # no body at all
    assert envelope["data"]["requiresQualification"] is False
    assert state(api, runtime, tenant, data["leadId"]) == ("qualified", 2, 2)


def test_simple_retry_records_the_delivery_endpoint_override(api, runtime, tenant):
    data = lead_in(api, runtime, tenant, "failed")
    envelope = repost(api, tenant, data["leadId"], {"deliveryInfo": {"deliveryEndpointId": "ep-alt"}})
    new = read_lead(api, runtime, tenant, data["leadId"])["submissions"][-1]
    assert events_of(new, "repost")[0]["details"]["deliveryEndpointId"] == "ep-alt"
    submission = runtime.store.reader().leads.get_submission(tenant.tenant_id, envelope["data"]["newSubmissionId"])
    assert endpoint_override(submission) == "ep-alt"
    assert jobs(runtime, new["submissionId"]) == [("deliver", "ready")]


def test_simple_retry_cancels_open_jobs_of_the_last_submission(api, runtime, tenant):
    data = lead_in(api, runtime, tenant, "error")
    engine(runtime.store).write_sync(lambda conn: conn.execute("UPDATE jobs SET state = 'held' WHERE submission_id = ?",
                                                              (data["submissionId"],)))
    envelope = repost(api, tenant, data["leadId"], {})
    assert jobs(runtime, data["submissionId"]) == [("deliver", "cancelled")]
    assert jobs(runtime, envelope["data"]["newSubmissionId"]) == [("deliver", "ready")]


def test_a_running_delivery_refuses_a_repost(api, runtime, tenant):
    data = lead_in(api, runtime, tenant, "error")
    engine(runtime.store).write_sync(lambda conn: conn.execute("UPDATE jobs SET state = 'running' WHERE submission_id = ?",
                                                              (data["submissionId"],)))
    details = error_details(repost(api, tenant, data["leadId"], {}, expect=409), "INVALID_STATE")
    assert any("running" in d for d in details)
    assert state(api, runtime, tenant, data["leadId"]) == ("error", 1, 1)


def test_reposting_a_rejected_lead_approves_it_and_does_not_hold_it_again(api, runtime, tenant, clock):
    data = rejected_lead(api, tenant)
    clock.advance(minutes=1)
    envelope = repost(api, tenant, data["leadId"], {})
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert lead["status"] == "qualified"
    assert lead["approval"] == {"status": "approved", "campaignId": "HR1", "decidedAt": "2026-03-10T15:01:00.000Z",
                                "decidedBy": f"key:{tenant.key_id}", "reason": "approved by repost"}
    new = lead["submissions"][-1]
    assert (new["flowType"], new["status"], new["campaign"]["campaignId"]) == ("repost", "qualified", "HR1")
    assert events_of(new, "approval_approved")[0]["details"]["previous"] == "rejected"
    assert jobs(runtime, envelope["data"]["newSubmissionId"]) == [("deliver", "ready")]


def test_a_second_repost_is_invalid_state(api, runtime, tenant):
    data = lead_in(api, runtime, tenant, "failed")
    repost(api, tenant, data["leadId"], {})
    details = error_details(repost(api, tenant, data["leadId"], {}, expect=409), "INVALID_STATE")
    assert details == ["status: the lead is qualified; only failed, rejected, error or returned leads can be reposted"]
    assert state(api, runtime, tenant, data["leadId"]) == ("qualified", 2, 2)


def test_simple_retry_of_a_campaign_archived_since_is_invalid_state(api, runtime, tenant):
    data = lead_in(api, runtime, tenant, "failed", code="GONE")
    tenancy.import_bundle(runtime, tenant.tenant_id, msgspec.json.encode({"campaigns": _campaigns(archived=True)}),
                          "json")
    details = error_details(repost(api, tenant, data["leadId"], {}, expect=409), "INVALID_STATE")
    assert details[0].startswith("campaign: GONE")
    assert state(api, runtime, tenant, data["leadId"]) == ("failed", 1, 1)
    # a modified retry to an active campaign is the way out
    repost(api, tenant, data["leadId"], {"campaignId": "SC1"})
    assert state(api, runtime, tenant, data["leadId"]) == ("qualified", 2, 2)


# ---- repost: modified retry ----------------------------------------------------------------------

def test_modified_retry_merges_the_payload_and_requalifies(api, runtime, tenant):
    data = lead_in(api, runtime, tenant, "failed", address={"state": "NJ", "city": "Newark"},
                   customFields={"a": 1})
    body = {"campaignId": "QL1", "deliveryInfo": {"deliveryEndpointId": "ep-alt"},
            "modifiedPayload": {"firstName": "  grace  ", "lastName": "HOPPER", "email": "Grace@Example.COM",
                                "address": {"state": "CA"}, "customFields": {"b": 2}}}
    envelope = repost(api, tenant, data["leadId"], body)
    assert envelope["data"]["requiresQualification"] is True
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert (lead["firstName"], lead["lastName"], lead["email"]) == ("Grace", "Hopper", "grace@example.com")
    assert lead["address"] == {"street": None, "city": None, "state": "CA", "zip": None}
    assert lead["customFields"] == {"a": 1, "b": 2}
    assert (lead["status"], lead["campaignId"], lead["clientId"], lead["submissionCount"]) == (
        "qualified", "QL1", "cli-QL1", 2)
    new = lead["submissions"][-1]
    assert (new["flowType"], new["status"], new["campaign"]["campaignId"]) == ("repost", "qualified", "QL1")
    assert new["qualification"]["method"] == "rules" and new["qualification"]["passed"] is True
    assert new["routing"]["wasRouted"] is False
    details = events_of(new, "repost")[0]["details"]
    assert (details["mode"], details["deliveryEndpointId"]) == ("modified", "ep-alt")
    assert events_of(new, "qualification")
    assert jobs(runtime, new["submissionId"]) == [("deliver", "ready")]
    # the new names are searchable
    found = api.get("/api/v1/leads", params={"search": "grace hopper"}, headers=tenant.headers).json()["data"]
    assert [item["leadId"] for item in found["leads"]] == [data["leadId"]]


def test_modified_retry_that_fails_qualification_disqualifies_without_a_job(api, runtime, tenant):
    data = rejected_lead(api, tenant)
    envelope = repost(api, tenant, data["leadId"], {"campaignId": "QL1", "modifiedPayload": {
        "address": {"state": "NY"}}})
    assert envelope["data"]["requiresQualification"] is True
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert lead["status"] == "disqualified"
    assert lead["approval"]["status"] == "rejected"  # nothing was sent: the rejection stands
    new = lead["submissions"][-1]
    assert (new["status"], new["flowType"]) == ("disqualified", "repost")
    assert new["qualification"]["passed"] is False
    assert "no NY" in new["result"]
    assert jobs(runtime, new["submissionId"]) == []


def test_modified_retry_does_not_fall_back_to_other_campaigns(api, runtime):
    tenant = setup_tenant(runtime, plain("SC1"), plain("QL1", qualification={**QUALIFY_RULES,
                                                                             "fallbackCampaigns": ["SC1"]}))
    data = lead_in(api, runtime, tenant, "failed")
    repost(api, tenant, data["leadId"], {"campaignId": "QL1", "modifiedPayload": {"address": {"state": "NY"}}})
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert (lead["status"], lead["campaignId"]) == ("disqualified", "QL1")
    assert lead["submissions"][-1]["routing"]["alternativeCampaigns"] == []


def test_a_review_rule_does_not_hold_a_modified_retry(api, runtime, tenant):
    data = lead_in(api, runtime, tenant, "failed")
    repost(api, tenant, data["leadId"], {"campaignId": "QL1", "modifiedPayload": {"address": {"state": "TX"}}})
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert (lead["status"], lead["approval"]) == ("qualified", None)
    new = lead["submissions"][-1]
    assert events_of(new, "review_waived") and not events_of(new, "held_for_review")
    assert jobs(runtime, new["submissionId"]) == [("deliver", "ready")]


def test_campaign_id_alone_requalifies_the_unchanged_lead(api, runtime, tenant):
    data = lead_in(api, runtime, tenant, "failed", address={"state": "NY"})
    envelope = repost(api, tenant, data["leadId"], {"campaignId": "QL1"})
    assert envelope["data"]["requiresQualification"] is True
    assert state(api, runtime, tenant, data["leadId"]) == ("disqualified", 2, 2)


def test_modified_payload_has_the_submit_fields_but_lead_campaign_and_ping_ids():
    assert set(reposts.ModifiedPayload.__struct_fields__) == set(SubmitLead.__struct_fields__) - {
        "lead_id", "campaign_id", "ping_id"}


@pytest.mark.parametrize(("body", "expected"), [
    ({"modifiedPayload": {"firstName": "X"}}, "campaignId: required with modifiedPayload"),
    ({"campaignId": "NOPE", "modifiedPayload": {}}, "campaignId: unknown campaign"),
    ({"campaignId": "OFF", "modifiedPayload": {}}, "campaignId: campaign is inactive or archived"),
    ({"campaignId": "ARC"}, "campaignId: campaign is inactive or archived"),
    ({"campaignId": ""}, "campaignId: "),
    ({"campaignId": 5}, "campaignId: expected str"),
    ({"campaignId": "SC1", "modifiedPayload": {"email": "not-an-email"}},
     "modifiedPayload.email: must be a valid email address"),
    ({"campaignId": "SC1", "modifiedPayload": {"email": 5}}, "modifiedPayload.email: expected str"),
    ({"campaignId": "SC1", "modifiedPayload": {"phone": "12345678901234"}}, "modifiedPayload.phone: "),
    ({"campaignId": "SC1", "modifiedPayload": {"dateOfBirth": "2001-02-30"}}, "modifiedPayload.dateOfBirth: "),
    ({"campaignId": "SC1", "modifiedPayload": {"compliance": {"tcpaConsent": "yes"}}},
     "modifiedPayload.compliance.tcpaConsent: expected bool"),
    ({"campaignId": "SC1", "modifiedPayload": {"leadId": "lead_x"}}, "modifiedPayload.leadId: unknown field"),
    ({"campaignId": "SC1", "modifiedPayload": {"campaignId": "SC1"}},
     "modifiedPayload.campaignId: unknown field"),
    ({"campaignId": "SC1", "modifiedPayload": "x"}, "modifiedPayload: expected object"),
    ({"deliveryInfo": {"deliveryEndpointId": "ep-nope"}},
     "deliveryInfo.deliveryEndpointId: unknown delivery endpoint"),
    ({"deliveryInfo": {"deliveryEndpointId": "ep-theirs"}},
     "deliveryInfo.deliveryEndpointId: unknown delivery endpoint"),
    ({"deliveryInfo": {"deliveryEndpointId": ""}}, "deliveryInfo.deliveryEndpointId: "),
    ({"deliveryInfo": {"url": "https://x.example.com"}}, "deliveryInfo.url: unknown field"),
    ({"deliveryInfo": "ep-alt"}, "deliveryInfo: expected object"),
    ({"reason": "again"}, "reason: unknown field"),
    ([], "body: expected object"),
])
def test_bad_repost_body_is_a_validation_error_and_changes_nothing(api, runtime, tenant, other, body, expected):
    data = lead_in(api, runtime, tenant, "failed")
    details = error_details(repost(api, tenant, data["leadId"], body, expect=400))
    assert any(d.startswith(expected) for d in details), details
    assert state(api, runtime, tenant, data["leadId"]) == ("failed", 1, 1)
    assert jobs(runtime, data["submissionId"]) == [("deliver", "done")]


def test_repost_reports_every_reference_problem_at_once(api, runtime, tenant):
    data = lead_in(api, runtime, tenant, "failed")
    details = error_details(repost(api, tenant, data["leadId"], {
        "campaignId": "NOPE", "deliveryInfo": {"deliveryEndpointId": "ep-nope"},
        "modifiedPayload": {"email": "bad"}}, expect=400))
    assert details == ["campaignId: unknown campaign", "deliveryInfo.deliveryEndpointId: unknown delivery endpoint",
                       "modifiedPayload.email: must be a valid email address"]


def test_malformed_json_and_wrong_content_type(api, runtime, tenant):
    data = lead_in(api, runtime, tenant, "failed")
    path = f"/api/v1/leads/{data['leadId']}/repost"
    assert api.post(path, content=b"{", headers={**tenant.headers, "Content-Type": "application/json"}
                    ).status_code == 400
    assert api.post(path, content=b"{}", headers={**tenant.headers, "Content-Type": "text/plain"}).status_code == 415
    assert state(api, runtime, tenant, data["leadId"]) == ("failed", 1, 1)


# ---- repost: refusals ----------------------------------------------------------------------------

@pytest.mark.parametrize("status", ["qualified", "pending_action", "disqualified", "delivered", "queued", "new",
                                    "pending", "duplicate"])
def test_repost_of_a_lead_not_failed_rejected_or_error_is_invalid_state(api, runtime, tenant, status):
    data = accepted(api, tenant, person("SC1"))
    if status != "qualified":
        set_status(runtime, tenant, data["leadId"], status)
    for body in ({}, {"campaignId": "SC1", "modifiedPayload": {"firstName": "Zed"}}):
        details = error_details(repost(api, tenant, data["leadId"], body, expect=409), "INVALID_STATE")
        assert details == [f"status: the lead is {status}; only failed, rejected, error or returned leads can be reposted"]
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert (lead["status"], lead["firstName"], len(lead["submissions"])) == (status, "Ada", 1)


def test_repost_with_a_pending_approval_is_invalid_state(api, runtime, tenant):
    data = rejected_lead(api, tenant)
    api.post(f"/api/v1/leads/{data['leadId']}/approve", json={"status": "pending"}, headers=tenant.headers)
    set_status(runtime, tenant, data["leadId"], "error")
    details = error_details(repost(api, tenant, data["leadId"], {}, expect=409), "INVALID_STATE")
    assert details == ["approval: the lead's approval is pending; decide it first"]
    assert state(api, runtime, tenant, data["leadId"]) == ("error", 1, 1)


def test_a_failed_lead_left_with_a_pending_approval_is_sent_again_by_a_repost(api, runtime, tenant):
    """A decision on a failed lead is refused, so a pending approval an earlier version left on one
    could never be decided: the repost decides it, as it overrides a rejection."""
    data = rejected_lead(api, tenant)
    api.post(f"/api/v1/leads/{data['leadId']}/approve", json={"status": "pending"}, headers=tenant.headers)
    set_status(runtime, tenant, data["leadId"], "failed")
    repost(api, tenant, data["leadId"], {})
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert (lead["status"], lead["approval"]["status"]) == ("qualified", "approved")
    approved = [e for e in lead["submissions"][-1]["journeyEvents"] if e["type"] == "approval_approved"]
    assert approved[-1]["details"]["previous"] == "pending" and approved[-1]["details"]["via"] == "repost"


def test_repost_of_an_unknown_lead_is_404(api, tenant):
    envelope = repost(api, tenant, "lead_01JDNOTALEADATALL0000000000", {"campaignId": "NOPE"}, expect=404)
    assert envelope == {"success": False, "error": {"code": "NOT_FOUND", "message": "Resource not found"}}


def test_repost_of_another_tenants_lead_is_404_and_changes_nothing(api, runtime, tenant, other):
    theirs = lead_in(api, runtime, other, "failed")
    for body in ({}, {"campaignId": "SC1", "modifiedPayload": {"firstName": "Mallory"}}):
        assert repost(api, tenant, theirs["leadId"], body, expect=404)["error"]["code"] == "NOT_FOUND"
    lead = read_lead(api, runtime, other, theirs["leadId"])
    assert (lead["status"], lead["firstName"], len(lead["submissions"])) == ("failed", "Ada", 1)
    assert jobs(runtime, theirs["submissionId"]) == [("deliver", "done")]


def test_repost_and_deliver_need_a_tenant_key(api, runtime, tenant):
    data = lead_in(api, runtime, tenant, "failed", code="SC1")
    for action, body in (("repost", {}), ("deliver", {"campaignId": "SC1"})):
        path = f"/api/v1/leads/{data['leadId']}/{action}"
        assert api.post(path, json=body).status_code == 401
    assert state(api, runtime, tenant, data["leadId"]) == ("failed", 1, 1)


def test_source_keys_may_not_repost_or_deliver(api, runtime):
    tenant = setup_tenant(runtime, plain("SC1", ingestion={"sources": [{"sourceId": "web"}]}))
    web = {"X-API-Key": source_key(runtime, tenant, "web")}
    data = lead_in(api, runtime, tenant, "failed")
    assert api.post(f"/api/v1/leads/{data['leadId']}/repost", json={}, headers=web).status_code == 403
    assert api.post(f"/api/v1/leads/{data['leadId']}/deliver", json={"campaignId": "SC1"},
                    headers=web).status_code == 403
    assert state(api, runtime, tenant, data["leadId"]) == ("failed", 1, 1)


# ---- deliver -------------------------------------------------------------------------------------

def test_deliver_a_lead_held_by_an_intake_action(api, runtime, tenant, clock):
    data = accepted(api, tenant, person("EN1"))
    assert data["status"] == "pending_action"
    clock.advance(minutes=2)
    envelope = deliver(api, tenant, data["leadId"], {"campaignId": "SC1"})
    new_id = envelope["data"]["newSubmissionId"]
    assert envelope == {"success": True, "data": {"newSubmissionId": new_id, "leadId": data["leadId"]}}
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert (lead["status"], lead["campaignId"], lead["submissionCount"]) == ("qualified", "SC1", 2)
    new = lead["submissions"][-1]
    assert (new["submissionId"], new["submissionNumber"], new["flowType"], new["status"]) == (
        new_id, 2, "manual_delivery", "qualified")
    assert new["routing"]["routingMethod"] == "manual" and new["routing"]["wasRouted"] is False
    assert new["qualification"]["method"] == "rules" and new["qualification"]["passed"] is True
    assert events_of(new, "manual_delivery")[0]["details"]["requestedBy"] == f"key:{tenant.key_id}"
    assert jobs(runtime, new_id) == [("deliver", "ready")]


def test_deliver_to_a_human_review_campaign_does_not_hold_again(api, runtime, tenant):
    data = accepted(api, tenant, person("EN1"))
    envelope = deliver(api, tenant, data["leadId"], {"campaignId": "HR1"})
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert (lead["status"], lead["approval"]) == ("qualified", None)
    new = lead["submissions"][-1]
    assert events_of(new, "first_intake_action_skipped")
    assert not events_of(new, "first_intake_action")
    assert new["firstSubmissionActions"] == []
    assert jobs(runtime, envelope["data"]["newSubmissionId"]) == [("deliver", "ready")]


def test_deliver_after_approval_keeps_the_approval(api, runtime, tenant):
    data = accepted(api, tenant, person("HR1"))
    api.post(f"/api/v1/leads/{data['leadId']}/approve", json={"status": "approved"}, headers=tenant.headers)
    set_status(runtime, tenant, data["leadId"], "failed")
    deliver(api, tenant, data["leadId"], {"campaignId": "SC1"})
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert (lead["status"], lead["approval"]["status"]) == ("qualified", "approved")


def test_deliver_disqualified_by_the_campaign_rules_makes_no_job(api, runtime, tenant):
    data = accepted(api, tenant, person("EN1", address={"state": "NY"}))
    envelope = deliver(api, tenant, data["leadId"], {"campaignId": "QL1"})
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert (lead["status"], lead["campaignId"]) == ("disqualified", "QL1")
    new = lead["submissions"][-1]
    assert (new["status"], new["flowType"], new["qualification"]["passed"]) == ("disqualified", "manual_delivery",
                                                                                False)
    assert jobs(runtime, envelope["data"]["newSubmissionId"]) == []


@pytest.mark.parametrize("status", ["new", "disqualified", "duplicate", "failed", "error", "rejected"])
def test_deliver_accepts_leads_without_delivery_under_way(api, runtime, tenant, status):
    data = lead_in(api, runtime, tenant, status)
    envelope = deliver(api, tenant, data["leadId"], {"campaignId": "SC1"})
    assert state(api, runtime, tenant, data["leadId"]) == ("qualified", 2, 2)
    assert jobs(runtime, envelope["data"]["newSubmissionId"]) == [("deliver", "ready")]


@pytest.mark.parametrize("status", ["delivered", "qualified", "queued", "pending"])
def test_deliver_refuses_delivered_leads_and_leads_with_processing_under_way(api, runtime, tenant, status):
    data = accepted(api, tenant, person("SC1"))
    if status != "qualified":
        set_status(runtime, tenant, data["leadId"], status)
    details = error_details(deliver(api, tenant, data["leadId"], {"campaignId": "SC1"}, expect=409),
                            "INVALID_STATE")
    assert details[0].startswith(f"status: the lead is {status}")
    assert state(api, runtime, tenant, data["leadId"]) == (status, 1, 1)


@pytest.mark.parametrize("decision", ["pending", "rejected"])
def test_deliver_refuses_a_pending_or_rejected_approval(api, runtime, tenant, decision):
    data = accepted(api, tenant, person("HR1")) if decision == "pending" else rejected_lead(api, tenant)
    details = error_details(deliver(api, tenant, data["leadId"], {"campaignId": "SC1"}, expect=409),
                            "INVALID_STATE")
    assert details == [f"approval: the lead's approval is {decision}; "
                       "a lead with a pending or rejected approval cannot be delivered"]
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert (lead["approval"]["status"], len(lead["submissions"])) == (decision, 1)
    assert jobs(runtime, data["submissionId"]) == []


@pytest.mark.parametrize(("body", "expected"), [
    ({}, "campaignId: required field missing"),
    ({"campaignId": ""}, "campaignId: "),
    ({"campaignId": None}, "campaignId: expected str"),
    ({"campaignId": 7}, "campaignId: expected str"),
    ({"campaignId": "NOPE"}, "campaignId: unknown campaign"),
    ({"campaignId": "OFF"}, "campaignId: campaign is inactive or archived"),
    ({"campaignId": "ARC"}, "campaignId: campaign is inactive or archived"),
    ({"campaignId": "SC1", "force": True}, "force: unknown field"),
])
def test_bad_deliver_body_is_a_validation_error(api, runtime, tenant, body, expected):
    data = accepted(api, tenant, person("EN1"))
    details = error_details(deliver(api, tenant, data["leadId"], body, expect=400))
    assert any(d.startswith(expected) for d in details), details
    assert state(api, runtime, tenant, data["leadId"]) == ("pending_action", 1, 1)


def test_deliver_with_no_body_is_a_validation_error(api, runtime, tenant):
    data = accepted(api, tenant, person("EN1"))
    response = api.post(f"/api/v1/leads/{data['leadId']}/deliver", content=b"",
                        headers={**tenant.headers, "Content-Type": "application/json"})
    assert response.status_code == 400
    assert error_details(response.json()) == ["body: a JSON object is required"]


def test_deliver_an_unknown_or_other_tenants_lead_is_404(api, runtime, tenant, other):
    assert deliver(api, tenant, "lead_nothing", {"campaignId": "SC1"}, expect=404)["error"]["code"] == "NOT_FOUND"
    theirs = accepted(api, other, person("SC1"))
    set_status(runtime, other, theirs["leadId"], "failed")
    assert deliver(api, tenant, theirs["leadId"], {"campaignId": "SC1"}, expect=404)["error"]["code"] == "NOT_FOUND"
    assert state(api, runtime, other, theirs["leadId"]) == ("failed", 1, 1)


def test_openapi_describes_both_operations(api, tenant):
    doc = api.get("/schema/openapi.json").json()
    for path, operation_id in (("/api/v1/leads/{leadId}/repost", "repostLead"),
                               ("/api/v1/leads/{leadId}/deliver", "deliverLead")):
        operation = doc["paths"][path]["post"]
        assert operation["operationId"] == operation_id
        assert {"201", "400", "401", "404", "409"} <= set(operation["responses"])
        assert "requestBody" in operation


# ---- concurrency and the delivery worker ---------------------------------------------------------

def test_concurrent_reposts_of_one_lead_make_one_submission(api, runtime, tenant):
    data = lead_in(api, runtime, tenant, "failed")
    settings = load_settings(runtime.store, tenant.tenant_id, 0)

    async def both():
        return await asyncio.gather(*(reposts.repost(runtime, settings, tenant.tenant_id, tenant.key_id,
                                                     data["leadId"], reposts.RepostBody()) for _ in range(2)),
                                    return_exceptions=True)

    outcomes = asyncio.run(both())
    assert sorted(type(o).__name__ for o in outcomes) == ["InvalidState", "RepostResult"]
    assert any(isinstance(o, InvalidState) for o in outcomes)
    assert state(api, runtime, tenant, data["leadId"]) == ("qualified", 2, 2)


@pytest.fixture
def live(runtime, clock, tmp_path):
    with live_app(runtime, tmp_path) as client:
        yield client


def test_the_worker_delivers_reposts_to_the_named_endpoint(live, runtime):
    tenant = make_tenant(runtime, "Live", {"deliveryEndpoints": [endpoint("ep"), endpoint("ep2")],
                                           "campaigns": [plain("DL1", delivery={"deliveryEndpointId": "ep"})]})
    data = accepted(live, tenant, lead_body("DL1", "failure"))
    lead = wait_for(live, tenant, data["leadId"], status_is("failed"))  # the buyer said no
    assert lead["submissions"][0]["responseFields"] == {"echo": "ep"}
    # simple retry to another endpoint: the buyer still says no, through ep2
    repost(live, tenant, data["leadId"], {"deliveryInfo": {"deliveryEndpointId": "ep2"}})
    lead = wait_for(live, tenant, data["leadId"], lambda lead: lead["status"] == "failed"
                    and len(lead["submissions"]) == 2)
    assert lead["submissions"][1]["responseFields"] == {"echo": "ep2"}
    # modified retry fixes the data; the campaign's own endpoint again
    repost(live, tenant, data["leadId"], {"campaignId": "DL1", "modifiedPayload": {"customFields": {
        "script": "success"}}})
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered"))
    assert [s["flowType"] for s in lead["submissions"]] == ["standard", "repost", "repost"]
    assert lead["submissions"][2]["responseFields"] == {"echo": "ep"}


# ---- POST /api/v1/leads/redeliver ------------------------------------------------------------------

def redeliver(api, tenant, body: dict, status: int = 200) -> dict:
    response = api.post("/api/v1/leads/redeliver", json=body, headers=tenant.headers)
    assert response.status_code == status, response.text
    return response.json()["data"] if status == 200 else response.json()["error"]


def test_redeliver_reposts_every_failed_lead_that_matches_once(live, runtime, other_tenant):
    bundle = {"deliveryEndpoints": [endpoint("ep"), endpoint("ep2")], "campaigns": [
        plain("DL1", delivery={"deliveryEndpointId": "ep"}), plain("DL2", delivery={"deliveryEndpointId": "ep2"})]}
    tenant = make_tenant(runtime, "Live", bundle)
    failed = [accepted(live, tenant, lead_body(code, "failure"))["leadId"] for code in ("DL1", "DL1", "DL2")]
    delivered = accepted(live, tenant, lead_body("DL1"))["leadId"]
    for lead_id in failed:
        wait_for(live, tenant, lead_id, status_is("failed"))
    wait_for(live, tenant, delivered, status_is("delivered"))
    for c in bundle["campaigns"]:  # what is sent again waits (queued), so the calls below see a still picture
        c["delivery"]["deliveryLimits"] = [{"cap": 0, "type": "daily"}]
    tenancy.import_bundle(runtime, tenant.tenant_id, msgspec.json.encode(bundle), "json")
    assert redeliver(live, tenant, {"status": "failed", "deliveryEndpointId": "ep2"}) == {
        "matched": 1, "reposted": 1, "skipped": []}
    again = redeliver(live, tenant, {"status": "failed", "campaignIds": ["DL1", "DL2"], "leadIds": [*failed, delivered]})
    assert again == {"matched": 2, "reposted": 2, "skipped": []}  # the DL2 lead is no longer failed
    assert redeliver(live, tenant, {"status": "failed"})["matched"] == 0  # sent twice: nothing twice
    for lead_id in failed:
        lead = live.get(f"/api/v1/leads/{lead_id}", headers=tenant.headers).json()["data"]
        assert [s["flowType"] for s in lead["submissions"]] == ["standard", "repost"]
    assert redeliver(live, other_tenant, {"status": "failed", "leadIds": failed})["matched"] == 0


def test_redeliver_tries_queued_leads_at_once(live, runtime):
    capped = {"deliveryEndpoints": [endpoint("ep")], "campaigns": [plain("DL1", delivery={
        "deliveryEndpointId": "ep", "deliveryLimits": [{"cap": 1, "type": "daily"}]})]}
    tenant = make_tenant(runtime, "Live", capped)
    first = accepted(live, tenant, lead_body("DL1"))["leadId"]
    wait_for(live, tenant, first, status_is("delivered"))
    waiting = accepted(live, tenant, lead_body("DL1"))["leadId"]
    wait_for(live, tenant, waiting, status_is("queued"))  # until tomorrow
    capped["campaigns"][0]["delivery"]["deliveryLimits"][0]["cap"] = 5  # the buyer takes more today
    tenancy.import_bundle(runtime, tenant.tenant_id, msgspec.json.encode(capped), "json")
    assert redeliver(live, tenant, {"status": "queued"}) == {"matched": 1, "reposted": 1, "skipped": []}
    wait_for(live, tenant, waiting, status_is("delivered"))


@pytest.mark.parametrize(("body", "field"), [
    ({"status": "delivered"}, "status"),
    ({}, "status"),
    ({"status": "failed", "campaignIds": ["NOPE"]}, "campaignIds[0]"),
    ({"status": "failed", "deliveryEndpointId": "nope"}, "deliveryEndpointId"),
    ({"status": "failed", "startDate": "yesterday"}, "startDate"),
    ({"status": "failed", "startDate": "2026-03-10", "endDate": "2026-03-01"}, "endDate"),
    ({"status": "failed", "leadIds": ["x"] * 10_001}, "leadIds"),
    ({"status": "failed", "colour": "red"}, "colour"),
])
def test_redeliver_refuses_bad_filters_naming_the_field(client, tenant, body, field):
    error = redeliver(client, tenant, body, status=400)
    assert error["code"] == "VALIDATION_ERROR" and any(d.startswith(field) for d in error["details"]), error
