"""PATCH /api/v1/leads/bulk through HTTP: each allowed key, merges, status follow-through and
jobs, tenant isolation, and every VALIDATION_ERROR path."""

from __future__ import annotations

import pytest

from tests.api_helpers import data, validation_error
from tests.bundles import standard_bundle
from tests.conftest import make_tenant

URL = "/api/v1/leads/bulk"




def submit(client, tenant, n: int, campaign: str = "AC01", **extra) -> dict:
    response = client.post("/api/v1/leads/submit", headers=tenant.headers, json={
        "campaignId": campaign, "firstName": "Jan", "lastName": "Doe", "email": f"jan{n}@example.com",
        "phone": f"+1415555{n:04d}", **extra})
    assert response.status_code == 201, response.text
    return response.json()["data"]


def lead(client, tenant, lead_id: str) -> dict:
    return data(client.get(f"/api/v1/leads/{lead_id}", headers=tenant.headers))


def bulk(client, tenant, lead_ids, updates):
    return client.patch(URL, headers=tenant.headers, json={"leadIds": lead_ids, "updates": updates})


@pytest.fixture
def three(client, tenant) -> list[dict]:
    return [submit(client, tenant, n, questionnaire={"injured": "no", "other": "kept"}) for n in range(3)]


def test_plain_keys(client, tenant, three):
    ids = [m["leadId"] for m in three]
    result = data(bulk(client, tenant, ids[:2], {"notes": "called twice", "timezone": "America/Chicago",
                                                 "isTest": True}))
    assert result == {"modifiedCount": 2}
    for lead_id in ids[:2]:
        got = lead(client, tenant, lead_id)
        assert (got["notes"], got["timezone"], got["isTest"]) == ("called twice", "America/Chicago", True)
        assert got["updatedAt"] >= got["createdAt"]
    untouched = lead(client, tenant, ids[2])
    assert (untouched["notes"], untouched["timezone"], untouched["isTest"]) == (None, None, False)
    # null clears notes and timezone
    assert data(bulk(client, tenant, ids[:1], {"notes": None, "timezone": None}))["modifiedCount"] == 1
    cleared = lead(client, tenant, ids[0])
    assert cleared["notes"] is None and cleared["timezone"] is None and cleared["isTest"] is True


def test_custom_fields_are_merged(client, tenant):
    made = submit(client, tenant, 1, customFields={"a": 1, "b": "x"})
    data(bulk(client, tenant, [made["leadId"]], {"customFields": {"b": "y", "c": [1, 2]}}))
    assert lead(client, tenant, made["leadId"])["customFields"] == {"a": 1, "b": "y", "c": [1, 2]}


def test_questionnaire_is_merged_by_key(client, tenant, three):
    lead_id = three[0]["leadId"]
    before = lead(client, tenant, lead_id)["questionnaire"]
    assert before == [{"key": "injured", "question": "Were you injured?", "answer": "no"},
                      {"key": "other", "question": "other", "answer": "kept"}]
    data(bulk(client, tenant, [lead_id], {"questionnaire": {"injured": "yes", "newKey": 3}}))
    assert lead(client, tenant, lead_id)["questionnaire"] == [
        {"key": "injured", "question": "Were you injured?", "answer": "yes"},
        {"key": "other", "question": "other", "answer": "kept"},
        {"key": "newKey", "question": "newKey", "answer": 3},
    ]


def test_questionnaire_new_key_takes_its_field_library_label(client, tenant):
    made = submit(client, tenant, 1)
    data(bulk(client, tenant, [made["leadId"]], {"questionnaire": {"injured": True}}))
    assert lead(client, tenant, made["leadId"])["questionnaire"] == [
        {"key": "injured", "question": "Were you injured?", "answer": True}]


def test_status_change_moves_latest_submission_and_cancels_jobs(client, tenant, runtime, three):
    reader = runtime.store.reader()
    target = three[0]
    assert [s for _, s, _ in reader.jobs.jobs_of(target["submissionId"])] == ["ready"]
    data(bulk(client, tenant, [target["leadId"]], {"status": "rejected"}))
    got = lead(client, tenant, target["leadId"])
    assert got["status"] == "rejected"
    submission = got["submissions"][-1]
    assert submission["status"] == "rejected"
    last = submission["journeyEvents"][-1]
    assert last["type"] == "status_changed" and last["reason"] == "bulk update"
    assert last["details"] == {"previous": "qualified", "status": "rejected", "actor": f"key:{tenant.key_id}"}
    assert [s for _, s, _ in reader.jobs.jobs_of(target["submissionId"])] == ["cancelled"]
    # rejected is repostable, and the status filter sees it
    listed = client.get("/api/v1/leads?status=rejected", headers=tenant.headers).json()["data"]["leads"]
    assert [x["leadId"] for x in listed] == [target["leadId"]]


def test_status_change_to_a_working_status_keeps_jobs(client, tenant, runtime, three):
    data(bulk(client, tenant, [three[1]["leadId"]], {"status": "queued"}))
    assert [s for _, s, _ in runtime.store.reader().jobs.jobs_of(three[1]["submissionId"])] == ["ready"]
    assert lead(client, tenant, three[1]["leadId"])["status"] == "queued"


def test_same_status_adds_no_event(client, tenant, three):
    before = lead(client, tenant, three[0]["leadId"])["submissions"][-1]
    data(bulk(client, tenant, [three[0]["leadId"]], {"status": "qualified", "notes": "n"}))
    assert lead(client, tenant, three[0]["leadId"])["submissions"][-1] == before


def test_unknown_duplicate_and_other_tenants_ids_are_not_counted(client, tenant, other_tenant, three):
    theirs = submit(client, other_tenant, 1, campaign="OC01")
    before = lead(client, other_tenant, theirs["leadId"])
    ids = [three[0]["leadId"], three[0]["leadId"], theirs["leadId"], "lead_01JD0000000000000000000000", "x"]
    assert data(bulk(client, tenant, ids, {"status": "failed", "notes": "mine"})) == {"modifiedCount": 1}
    assert lead(client, other_tenant, theirs["leadId"]) == before
    assert lead(client, tenant, three[0]["leadId"])["notes"] == "mine"
    assert data(bulk(client, tenant, [theirs["leadId"]], {"notes": "nope"})) == {"modifiedCount": 0}
    assert lead(client, other_tenant, theirs["leadId"]) == before


def test_a_thousand_ids_are_allowed(client, tenant, three):
    ids = [m["leadId"] for m in three] + [f"lead_unknown{i}" for i in range(997)]
    assert data(bulk(client, tenant, ids, {"isTest": True})) == {"modifiedCount": 3}


def test_requires_a_key(client, three):
    response = client.patch(URL, json={"leadIds": [three[0]["leadId"]], "updates": {"notes": "x"}})
    assert response.status_code == 401


BAD_BODIES = [
        ({"leadIds": ["a"], "updates": {}}, "updates"),
        ({"leadIds": ["a"], "updates": {"firstName": "X"}}, "updates.firstName"),
        ({"leadIds": ["a"], "updates": {"email": "x@example.com"}}, "updates.email"),
        ({"leadIds": ["a"], "updates": {"approval": {"status": "approved"}}}, "updates.approval"),
        ({"leadIds": ["a"], "updates": {"status": "done"}}, "updates.status"),
        ({"leadIds": ["a"], "updates": {"status": None}}, "updates.status"),
        ({"leadIds": ["a"], "updates": {"notes": 5}}, "updates.notes"),
        ({"leadIds": ["a"], "updates": {"notes": "x" * 10_001}}, "updates.notes"),
        ({"leadIds": ["a"], "updates": {"timezone": "Mars/Olympus"}}, "updates.timezone"),
        ({"leadIds": ["a"], "updates": {"timezone": "EST"}}, "updates.timezone"),
        ({"leadIds": ["a"], "updates": {"timezone": 3}}, "updates.timezone"),
        ({"leadIds": ["a"], "updates": {"isTest": "true"}}, "updates.isTest"),
        ({"leadIds": ["a"], "updates": {"isTest": None}}, "updates.isTest"),
        ({"leadIds": ["a"], "updates": {"customFields": [1]}}, "updates.customFields"),
        ({"leadIds": ["a"], "updates": {"customFields": None}}, "updates.customFields"),
        ({"leadIds": ["a"], "updates": {"questionnaire": [{"key": "injured", "answer": "yes"}]}},
         "updates.questionnaire"),
        ({"leadIds": ["a"], "updates": {"questionnaire": "yes"}}, "updates.questionnaire"),
        ({"leadIds": ["a"], "updates": "status=failed"}, "updates"),
        ({"leadIds": [], "updates": {"notes": "x"}}, "leadIds"),
        ({"leadIds": [f"lead_{i}" for i in range(1001)], "updates": {"notes": "x"}}, "leadIds"),
        ({"leadIds": "lead_x", "updates": {"notes": "x"}}, "leadIds"),
        ({"leadIds": [5], "updates": {"notes": "x"}}, "leadIds[0]"),
        ({"leadIds": [""], "updates": {"notes": "x"}}, "leadIds[0]"),
        ({"updates": {"notes": "x"}}, "leadIds"),
        ({"leadIds": ["a"]}, "updates"),
        ({"leadIds": ["a"], "updates": {"notes": "x"}, "dryRun": True}, "dryRun"),
]


def test_bad_bodies_are_validation_errors(client, tenant, three):
    # One tenant for every case (a loop rather than parameters keeps the file fast).
    before = lead(client, tenant, three[0]["leadId"])
    for body, field in BAD_BODIES:
        if isinstance(body.get("leadIds"), list):  # "a" stands for a real lead of the tenant
            body = {**body, "leadIds": [three[0]["leadId"] if i == "a" else i for i in body["leadIds"]]}
        response = client.patch(URL, headers=tenant.headers, json=body)
        assert response.status_code == 400, (body, response.text)
        error = response.json()["error"]
        assert error["code"] == "VALIDATION_ERROR" and error["message"] == "Invalid input data"
        assert any(d.startswith(f"{field}: ") for d in error["details"]), (body, error["details"])
    assert lead(client, tenant, three[0]["leadId"]) == before


def test_unknown_key_names_the_allowed_ones(client, tenant, three):
    details = validation_error(bulk(client, tenant, [three[0]["leadId"]], {"notes": "x", "phone": "1"}),
                               "updates.phone")
    assert "status, notes, timezone, isTest, customFields, questionnaire" in details[0]


def test_answers_are_checked_against_the_field_library(client, runtime):
    bundle = standard_bundle()
    bundle["fieldLibrary"].append({"key": "years", "label": "Years", "question": "How many years?",
                                   "category": "question", "dataType": "integer",
                                   "validationRules": {"min": 1, "max": 50}})
    tenant = make_tenant(runtime, "Rules", bundle)
    made = submit(client, tenant, 1)
    for answer, problem in (("abc", "must be a whole number"), (99, "must be at most 50")):
        details = validation_error(bulk(client, tenant, [made["leadId"]], {"questionnaire": {"years": answer}}),
                                   "updates.questionnaire.years")
        assert details == [f"updates.questionnaire.years: {problem}"]
    data(bulk(client, tenant, [made["leadId"]], {"questionnaire": {"years": 7}}))
    assert lead(client, tenant, made["leadId"])["questionnaire"] == [
        {"key": "years", "question": "How many years?", "answer": 7}]


def test_openapi_documents_the_body(client):
    doc = client.get("/schema/openapi.json").json()
    operation = doc["paths"][URL]["patch"]
    assert operation["operationId"] == "bulkUpdateLeads"
    schemas = doc["components"]["schemas"]
    assert set(schemas["BulkUpdates"]["properties"]) == {"status", "notes", "timezone", "isTest", "customFields",
                                                         "questionnaire"}
    assert schemas["BulkUpdateBody"]["properties"]["leadIds"]["maxItems"] == 1000
