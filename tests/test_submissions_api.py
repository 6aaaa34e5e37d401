"""GET and PATCH /api/v1/submissions/{submissionId} through HTTP: merge semantics, journey
events appended, timestamps, the lead following its latest submission, jobs, errors, tenants."""

from __future__ import annotations

import pytest

from tests.api_helpers import data, validation_error


def submit(client, tenant, n: int = 1, campaign: str = "AC01") -> dict:
    response = client.post("/api/v1/leads/submit", headers=tenant.headers, json={
        "campaignId": campaign, "firstName": "Jan", "lastName": "Doe", "email": f"jan{n}@example.com",
        "phone": f"+1415555{n:04d}"})
    assert response.status_code == 201, response.text
    return response.json()["data"]


def get_sub(client, tenant, submission_id: str) -> dict:
    return data(client.get(f"/api/v1/submissions/{submission_id}", headers=tenant.headers))


def patch(client, tenant, submission_id: str, body):
    return client.patch(f"/api/v1/submissions/{submission_id}", headers=tenant.headers, json=body)


def get_lead(client, tenant, lead_id: str) -> dict:
    return data(client.get(f"/api/v1/leads/{lead_id}", headers=tenant.headers))


@pytest.fixture
def made(client, tenant) -> dict:
    return submit(client, tenant)


def test_get_submission(client, tenant, made):
    sub = get_sub(client, tenant, made["submissionId"])
    assert sub["submissionId"] == made["submissionId"] and sub["leadId"] == made["leadId"]
    assert sub["status"] == made["status"] == "qualified" and sub["flowType"] == "standard"
    assert sub == get_lead(client, tenant, made["leadId"])["submissions"][0]


def test_unknown_and_other_tenants_submission_is_404(client, tenant, other_tenant, made):
    theirs = submit(client, other_tenant, campaign="OC01")
    before = get_sub(client, other_tenant, theirs["submissionId"])
    for submission_id in (theirs["submissionId"], "sub_01JD0000000000000000000000", "nope"):
        for response in (client.get(f"/api/v1/submissions/{submission_id}", headers=tenant.headers),
                         patch(client, tenant, submission_id, {"status": "delivered", "result": "x"}),
                         patch(client, tenant, submission_id, {})):
            assert response.status_code == 404, response.text
            assert response.json()["error"] == {"code": "NOT_FOUND", "message": "Resource not found"}
    assert get_sub(client, other_tenant, theirs["submissionId"]) == before
    assert get_lead(client, other_tenant, theirs["leadId"])["status"] == "qualified"


def test_requires_a_key(client, made):
    assert client.get(f"/api/v1/submissions/{made['submissionId']}").status_code == 401
    assert client.patch(f"/api/v1/submissions/{made['submissionId']}", json={}).status_code == 401


def test_empty_body_changes_nothing(client, tenant, made):
    before = get_sub(client, tenant, made["submissionId"])
    assert data(patch(client, tenant, made["submissionId"], {})) == before
    assert get_sub(client, tenant, made["submissionId"]) == before


def test_scalar_fields_and_timestamps(client, tenant, made):
    before = get_sub(client, tenant, made["submissionId"])
    result = data(patch(client, tenant, made["submissionId"], {
        "result": "accepted by buyer", "clientLeadId": "B-77", "flowType": "manual_delivery",
        "qualifiedAt": 1767225600000,                      # epoch milliseconds
        "postedAt": "2026-01-01T10:30:00.5+02:00",         # any ISO 8601 offset
    }))
    assert result["result"] == "accepted by buyer" and result["clientLeadId"] == "B-77"
    assert result["flowType"] == "manual_delivery"
    assert result["qualifiedAt"] == "2026-01-01T00:00:00.000Z"
    assert result["postedAt"] == "2026-01-01T08:30:00.500Z"
    assert result["updatedAt"] >= before["updatedAt"] and result["createdAt"] == before["createdAt"]
    assert get_sub(client, tenant, made["submissionId"]) == result
    # more timestamp forms: a bare date, Z, a fractional epoch; null clears a nullable field
    again = data(patch(client, tenant, made["submissionId"], {"postedAt": "2026-03-04", "qualifiedAt": 1.5,
                                                              "result": None}))
    assert again["postedAt"] == "2026-03-04T00:00:00.000Z" and again["qualifiedAt"] == "1970-01-01T00:00:00.001Z"
    assert again["result"] is None and again["clientLeadId"] == "B-77"


def test_nested_objects_are_merged_shallowly(client, tenant, made):
    before = get_sub(client, tenant, made["submissionId"])
    assert before["posting"] is None and before["qualification"]["passed"] is True
    result = data(patch(client, tenant, made["submissionId"], {
        "qualification": {"reason": "checked by hand", "score": 87.5, "qualifiedAt": "2026-02-02T02:02:02Z"},
        "routing": {"routingMethod": "manual", "alternativeCampaigns": [
            {"campaignId": "AC02", "qualified": False, "priority": 2, "reason": "inactive"}]},
        "posting": {"success": True, "statusCode": 200, "postedAt": 1767225600000},
        "delivery": {"url": "https://buyer.example.com/in", "method": "POST", "deliveredAt": "2026-01-01T00:00:01Z"},
        "responseFields": {"buyerRef": "R1"},
    }))
    qualification = result["qualification"]
    assert qualification["reason"] == "checked by hand" and qualification["score"] == 87.5
    assert qualification["passed"] is True and qualification["method"] == before["qualification"]["method"]
    assert qualification["qualifiedAt"] == "2026-02-02T02:02:02.000Z"
    assert result["routing"]["routingMethod"] == "manual"
    assert result["routing"]["originalCampaignId"] == before["routing"]["originalCampaignId"]
    assert result["routing"]["alternativeCampaigns"][0]["campaignId"] == "AC02"
    assert result["posting"] == {"success": True, "clientLeadId": None, "statusCode": 200,
                                 "postedAt": "2026-01-01T00:00:00.000Z"}
    assert result["delivery"]["deliveredAt"] == "2026-01-01T00:00:01.000Z" and result["delivery"]["success"] is None
    # a second patch keeps what the first one set; responseFields merge by key
    second = data(patch(client, tenant, made["submissionId"], {
        "posting": {"clientLeadId": "C-1"}, "responseFields": {"other": "x", "buyerRef": "R2"},
        "qualification": {"reason": None}}))
    assert second["posting"]["statusCode"] == 200 and second["posting"]["clientLeadId"] == "C-1"
    assert second["responseFields"] == {"buyerRef": "R2", "other": "x"}
    assert second["qualification"]["reason"] is None and second["qualification"]["score"] == 87.5


def test_journey_events_and_actions_are_appended(client, tenant, made):
    history = get_sub(client, tenant, made["submissionId"])["journeyEvents"]
    assert history
    first = data(patch(client, tenant, made["submissionId"], {
        "journeyEvents": [{"type": "buyer_called", "reason": "left voicemail"},
                          {"type": "buyer_note", "timestamp": "2026-01-05T12:00:00+01:00",
                           "details": {"agent": "sam"}}],
        "firstSubmissionActions": [{"action": "sms"}]}))
    events = first["journeyEvents"]
    assert events[:len(history)] == history and len(events) == len(history) + 2
    assert events[-2]["type"] == "buyer_called" and events[-2]["timestamp"] == first["updatedAt"]  # now
    assert events[-1]["timestamp"] == "2026-01-05T11:00:00.000Z" and events[-1]["details"] == {"agent": "sam"}
    second = data(patch(client, tenant, made["submissionId"], {
        "journeyEvents": [{"type": "buyer_called"}], "firstSubmissionActions": ["call", {"x": 1}]}))
    assert second["journeyEvents"][:len(events)] == events and len(second["journeyEvents"]) == len(events) + 1
    assert second["firstSubmissionActions"][-3:] == [{"action": "sms"}, "call", {"x": 1}]
    # an empty list appends nothing and is not a change
    assert data(patch(client, tenant, made["submissionId"], {"journeyEvents": []}))["journeyEvents"] == \
        second["journeyEvents"]


def test_status_change_on_latest_submission_moves_the_lead_and_cancels_jobs(client, tenant, runtime, made):
    reader = runtime.store.reader()
    assert [state for _, state, _ in reader.jobs.jobs_of(made["submissionId"])] == ["ready"]
    result = data(patch(client, tenant, made["submissionId"], {"status": "delivered"}))
    assert result["status"] == "delivered"
    lead = get_lead(client, tenant, made["leadId"])
    assert lead["status"] == "delivered" and lead["updatedAt"] == result["updatedAt"]
    assert [state for _, state, _ in reader.jobs.jobs_of(made["submissionId"])] == ["cancelled"]
    listed = client.get("/api/v1/leads?status=delivered", headers=tenant.headers).json()["data"]["leads"]
    assert [x["leadId"] for x in listed] == [made["leadId"]]


def test_status_queued_keeps_jobs(client, tenant, runtime, made):
    data(patch(client, tenant, made["submissionId"], {"status": "queued"}))
    assert [s for _, s, _ in runtime.store.reader().jobs.jobs_of(made["submissionId"])] == ["ready"]
    assert get_lead(client, tenant, made["leadId"])["status"] == "queued"


def test_status_change_on_an_older_submission_leaves_the_lead(client, tenant, made):
    again = client.post("/api/v1/leads/submit", headers=tenant.headers,
                        json={"campaignId": "AC01", "leadId": made["leadId"]})
    assert again.status_code == 201, again.text
    data(patch(client, tenant, made["submissionId"], {"status": "failed"}))
    assert get_lead(client, tenant, made["leadId"])["status"] == again.json()["data"]["status"]
    data(patch(client, tenant, again.json()["data"]["submissionId"], {"status": "error"}))
    assert get_lead(client, tenant, made["leadId"])["status"] == "error"


def test_other_fields_leave_the_lead_alone(client, tenant, made):
    before = get_lead(client, tenant, made["leadId"])
    data(patch(client, tenant, made["submissionId"], {"result": "x", "status": made["status"]}))
    after = get_lead(client, tenant, made["leadId"])
    assert {k: v for k, v in after.items() if k != "submissions"} == \
        {k: v for k, v in before.items() if k != "submissions"}


BAD_BODIES = [
        ({"status": "done"}, "status"),
        ({"status": None}, "status"),
        ({"status": 3}, "status"),
        ({"flowType": "other"}, "flowType"),
        ({"result": 5}, "result"),
        ({"clientLeadId": ["x"]}, "clientLeadId"),
        ({"qualifiedAt": "yesterday"}, "qualifiedAt"),
        ({"qualifiedAt": -1}, "qualifiedAt"),
        ({"postedAt": 1e20}, "postedAt"),
        ({"postedAt": True}, "postedAt"),
        ({"postedAt": "2026-02-30T00:00:00Z"}, "postedAt"),
        ({"qualification": {"passed": "yes"}}, "qualification.passed"),
        ({"qualification": {"qualifiedAt": "soon"}}, "qualification.qualifiedAt"),
        ({"qualification": {"verdict": "ok"}}, "qualification.verdict"),
        ({"qualification": "passed"}, "qualification"),
        ({"routing": {"routingMethod": "magic"}}, "routing.routingMethod"),
        ({"routing": {"routingEvaluatedAt": "x"}}, "routing.routingEvaluatedAt"),
        ({"routing": {"alternativeCampaigns": None}}, "routing.alternativeCampaigns"),
        ({"posting": {"statusCode": "200"}}, "posting.statusCode"),
        ({"posting": {"postedAt": "x"}}, "posting.postedAt"),
        ({"delivery": {"deliveredAt": "x"}}, "delivery.deliveredAt"),
        ({"delivery": {"extra": 1}}, "delivery.extra"),
        ({"responseFields": {"a": 1}}, "responseFields[...]"),  # msgspec does not name the key
        ({"responseFields": ["a"]}, "responseFields"),
        ({"journeyEvents": {"type": "x"}}, "journeyEvents"),
        ({"journeyEvents": [{"type": "x", "timestamp": "later"}]}, "journeyEvents[0].timestamp"),
        ({"journeyEvents": [{"type": "x", "color": "red"}]}, "journeyEvents[0].color"),
        ({"journeyEvents": [{"type": "x"}] * 201}, "journeyEvents"),
        ({"firstSubmissionActions": "sms"}, "firstSubmissionActions"),
        ({"submissionId": "sub_x"}, "submissionId"),
        ({"leadId": "lead_x"}, "leadId"),
        ({"unknown": 1}, "unknown"),
        ([], "body"),
]


def test_bad_bodies_are_validation_errors(client, tenant, made):
    # One tenant for every case (a loop rather than parameters keeps the file fast).
    before = get_sub(client, tenant, made["submissionId"])
    for body, field in BAD_BODIES:
        response = patch(client, tenant, made["submissionId"], body)
        assert response.status_code == 400, (body, response.text)
        details = response.json()["error"]["details"]
        assert any(d.startswith(f"{field}: ") for d in details), (body, details)
    assert get_sub(client, tenant, made["submissionId"]) == before


def test_every_problem_with_timestamps_is_reported(client, tenant, made):
    details = validation_error(patch(client, tenant, made["submissionId"], {
        "qualifiedAt": "x", "posting": {"postedAt": "y"}, "journeyEvents": [{"timestamp": "z"}]}), "qualifiedAt")
    assert [d.split(":")[0] for d in details] == ["qualifiedAt", "posting.postedAt", "journeyEvents[0].timestamp"]


def test_malformed_and_non_json_bodies(client, tenant, made):
    url = f"/api/v1/submissions/{made['submissionId']}"
    validation_error(client.patch(url, headers={**tenant.headers, "content-type": "application/json"},
                                  content=b"{"), "body")
    validation_error(client.patch(url, headers={**tenant.headers, "content-type": "application/json"},
                                  content=b""), "body")
    response = client.patch(url, headers={**tenant.headers, "content-type": "text/plain"}, content=b"{}")
    assert response.status_code == 415


def test_openapi_documents_the_patch_body(client):
    doc = client.get("/schema/openapi.json").json()
    operation = doc["paths"]["/api/v1/submissions/{submissionId}"]["patch"]
    assert operation["operationId"] == "updateSubmission"
    assert {"400", "401", "404"} <= operation["responses"].keys()
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    schema = doc["components"]["schemas"][body["$ref"].rsplit("/", 1)[1]]
    assert {"status", "qualification", "routing", "posting", "delivery", "result", "clientLeadId", "responseFields",
            "journeyEvents", "firstSubmissionActions", "flowType", "qualifiedAt", "postedAt"} == schema["properties"].keys()
    assert schema.get("required", []) == []
    assert doc["paths"]["/api/v1/submissions/{submissionId}"]["get"]["operationId"] == "getSubmission"
