"""PATCH /api/v1/leads/{leadId} through HTTP: contact fields normalized as a submit normalizes
them, the bulk-update keys, a status change that follows through (journey, milestones, events),
another tenant's lead, and every VALIDATION_ERROR path."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from litestar.testing import TestClient

from appliance.runtime import Runtime
from tests.api_helpers import data, validation_error
from tests.buyer_server import BuyerServer, wait_until
from tests.bundles import campaign
from tests.conftest import make_tenant
from tests.submit_support import FakeClock
from tests.worker_helpers import lead_body, live_app, submit


def patch(client, tenant, lead_id: str, body: dict):
    return client.patch(f"/api/v1/leads/{lead_id}", json=body, headers=tenant.headers)


@pytest.fixture
def lead(client, tenant) -> dict:
    return submit(client, tenant, {"campaignId": "AC01", "firstName": "jan", "lastName": "doe",
                                   "email": "jan@example.com", "phone": "+14155550100",
                                   "questionnaire": {"injured": "no", "other": "kept"}, "customFields": {"a": 1}})


def test_contact_fields_are_normalized_as_a_submit_does(client, tenant, lead):
    changed = data(patch(client, tenant, lead["leadId"], {
        "firstName": "  mary   ann ", "lastName": "o'neil-smith", "email": "  Mary.Ann@Example.COM ",
        "phone": "(415) 555-0199", "address": {"city": "Austin", "state": "TX"}, "dateOfBirth": "1980-02-29"}))
    assert (changed["firstName"], changed["lastName"], changed["email"]) == ("Mary Ann", "O'Neil-Smith",
                                                                            "mary.ann@example.com")
    assert (changed["phone"], changed["phoneE164"]) == ("(415) 555-0199", "+14155550199")
    assert changed["address"] == {"street": None, "city": "Austin", "state": "TX", "zip": None}
    assert changed["dateOfBirth"] == "1980-02-29" and changed["status"] == lead["status"]
    # the answer is the lead record as GET shows it, submissions included
    assert changed == data(client.get(f"/api/v1/leads/{lead['leadId']}", headers=tenant.headers))
    assert [s["submissionId"] for s in changed["submissions"]] == [lead["submissionId"]]
    # searches see the new name, email and phone, not the old ones
    for query, found in (("search=mary%20ann", True), ("search=jan%20doe", False),
                         ("search=mary.ann@example.com", True), ("search=4155550199", True),
                         ("search=4155550100", False)):
        leads = data(client.get(f"/api/v1/leads?{query}", headers=tenant.headers))["leads"]
        assert ([x["leadId"] for x in leads] == [lead["leadId"]]) is found, query


def test_country_renormalizes_the_phone(client, tenant, lead):
    changed = data(patch(client, tenant, lead["leadId"], {"phone": "020 7946 0018", "country": "GB"}))
    assert changed["phoneE164"] == "+442079460018" and changed["country"] == "GB"


def test_bulk_update_keys(client, tenant, lead):
    changed = data(patch(client, tenant, lead["leadId"], {
        "notes": "called", "timezone": "America/Chicago", "isTest": True, "customFields": {"b": 2},
        "questionnaire": {"injured": "yes", "newKey": 3}}))
    assert (changed["notes"], changed["timezone"], changed["isTest"]) == ("called", "America/Chicago", True)
    assert changed["customFields"] == {"a": 1, "b": 2}
    answers = {q["key"]: (q["question"], q["answer"]) for q in changed["questionnaire"]}
    assert answers == {"injured": ("Were you injured?", "yes"), "other": ("other", "kept"), "newKey": ("newKey", 3)}
    cleared = data(patch(client, tenant, lead["leadId"], {"notes": None, "timezone": None}))
    assert cleared["notes"] is None and cleared["timezone"] is None


def test_an_empty_body_changes_nothing(client, tenant, lead):
    before = data(client.get(f"/api/v1/leads/{lead['leadId']}", headers=tenant.headers))
    assert data(patch(client, tenant, lead["leadId"], {})) == before


def test_a_status_change_follows_through_to_the_latest_submission(client, tenant, lead):
    changed = data(patch(client, tenant, lead["leadId"], {"status": "rejected"}))
    assert changed["status"] == "rejected"
    submission = changed["submissions"][-1]
    assert submission["status"] == "rejected"
    last = submission["journeyEvents"][-1]
    assert last["type"] == "status_changed" and last["details"] == {"previous": lead["status"],
                                                                    "status": "rejected", "actor": f"key:{tenant.key_id}"}
    # the same status again adds no event
    again = data(patch(client, tenant, lead["leadId"], {"status": "rejected"}))
    assert len(again["submissions"][-1]["journeyEvents"]) == len(submission["journeyEvents"])


def test_filters_find_the_lead_by_its_new_values_and_by_those_it_kept(client, tenant, lead):
    # The update names only the indexed columns that changed: each filter must see the change,
    # and the columns left alone must still be found.
    data(patch(client, tenant, lead["leadId"], {"status": "rejected", "email": "new@example.com"}))

    def found(query: str) -> bool:
        leads = data(client.get(f"/api/v1/leads?{query}", headers=tenant.headers))["leads"]
        return [x["leadId"] for x in leads] == [lead["leadId"]]

    assert found("status=rejected") and not found(f"status={lead['status']}")
    assert found("search=new@example.com") and not found("search=jan@example.com")
    assert found("search=4155550100") and found("campaignIds=AC01")
    assert found("status=rejected&campaignIds=AC01")


def test_another_tenants_lead_is_not_found_and_unchanged(client, tenant, other_tenant, lead):
    for lead_id in (lead["leadId"], "lead_NOPE"):
        answer = patch(client, other_tenant, lead_id, {"notes": "mine now"})
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "NOT_FOUND"
        assert answer.json()["error"]["message"] == "Resource not found"
    assert data(client.get(f"/api/v1/leads/{lead['leadId']}", headers=tenant.headers))["notes"] is None


@pytest.mark.parametrize("body, field", [
    ({"email": "not-an-email"}, "email"),
    ({"phone": "call me"}, "phone"),
    ({"firstName": ""}, "firstName"),
    ({"dateOfBirth": "1981-02-29"}, "dateOfBirth"),
    ({"country": "usa"}, "country"),
    ({"timezone": "Mars/Olympus"}, "timezone"),
    ({"address": {"planet": "Mars"}}, "address.planet"),
    ({"address": {"zip": 94110}}, "address.zip"),
    ({"isTest": "yes"}, "isTest"),
    ({"status": "returned"}, "status"),
    ({"status": "sold"}, "status"),
    ({"tenantId": "tnt_X"}, "tenantId"),
    ({"phoneE164": "+14155550000"}, "phoneE164"),
    ({"createdAt": "2020-01-01T00:00:00.000Z"}, "createdAt"),
    ({"submissionCount": 3}, "submissionCount"),
])
def test_bad_fields_are_a_validation_error_naming_the_field(client, tenant, lead, body, field):
    before = data(client.get(f"/api/v1/leads/{lead['leadId']}", headers=tenant.headers))
    validation_error(patch(client, tenant, lead["leadId"], {"notes": "x", **body}), field)
    assert data(client.get(f"/api/v1/leads/{lead['leadId']}", headers=tenant.headers)) == before


def test_an_unknown_key_lists_the_allowed_ones(client, tenant, lead):
    details = validation_error(patch(client, tenant, lead["leadId"], {"nickname": "JJ"}), "nickname")
    assert any("allowed:" in d and "firstName" in d and "customFields" in d for d in details), details


def test_returned_is_refused_as_bulk_update_refuses_it(client, tenant, lead):
    one = patch(client, tenant, lead["leadId"], {"status": "returned"}).json()["error"]["details"]
    many = client.patch("/api/v1/leads/bulk", json={"leadIds": [lead["leadId"]], "updates": {"status": "returned"}},
                        headers=tenant.headers).json()["error"]["details"]
    assert one == [d.removeprefix("updates.") for d in many]


def test_field_library_rules_apply_to_patched_fields(client, runtime):
    tenant = make_tenant(runtime, "Rules", {
        "fieldLibrary": [{"key": "age", "label": "Age", "category": "question", "dataType": "integer",
                          "validationRules": {"min": 18}},
                         {"key": "email", "label": "Email", "category": "contact",
                          "validationRules": {"pattern": "@example\\.com$"}}],
        "campaigns": [campaign("RUL1", "Rules")]})
    made = submit(client, tenant, {"campaignId": "RUL1", "firstName": "A", "lastName": "B",
                                   "email": "a@example.com", "phone": "+14155550111"})
    validation_error(patch(client, tenant, made["leadId"], {"questionnaire": {"age": 12}}), "questionnaire.age")
    validation_error(patch(client, tenant, made["leadId"], {"email": "a@elsewhere.org"}), "email")
    assert data(patch(client, tenant, made["leadId"], {"email": "b@example.com"}))["email"] == "b@example.com"


# ---- milestones and events, with the job loop running ----------------------------------------

@pytest.fixture
def config_file(config_file: Path) -> Path:
    with config_file.open("a") as f:  # the webhook receiver is on loopback
        f.write("\n[delivery]\nallow_private_addresses = true\n")
    return config_file


@pytest.fixture
def live(runtime: Runtime, tmp_path) -> Iterator[TestClient]:
    runtime.clock = FakeClock(datetime(2026, 3, 10, 15, 0, tzinfo=UTC))
    with live_app(runtime, tmp_path) as client:
        yield client


def test_a_status_change_earns_milestones_and_sends_events(live, runtime):
    tenant = make_tenant(runtime, "T", {"campaigns": [campaign("NB1", "No buyer", delivery={
        "revenueMilestones": [{"leadStatus": "disqualified", "amount": 7, "currency": "USD"}]})]})
    with BuyerServer() as receiver:
        receiver.route("/hooks", status=204)
        assert live.post("/api/v1/webhooks", json={"url": receiver.url("/hooks"), "events": ["lead.disqualified"]},
                         headers=tenant.headers).status_code == 201
        made = submit(live, tenant, lead_body("NB1"))
        for status in ("disqualified", "qualified", "disqualified"):  # the milestone pays once
            assert patch(live, tenant, made["leadId"], {"status": status}).status_code == 200
        assert wait_until(lambda: len(receiver.requests_to("/hooks")) >= 2, 10)
        events = [(r.json()["type"], r.json()["data"]["leadId"]) for r in receiver.requests_to("/hooks")]
        assert events == [("lead.disqualified", made["leadId"])] * 2
    entries = data(live.get(f"/api/v1/ledger?leadId={made['leadId']}", headers=tenant.headers))["items"]
    assert [(e["kind"], e["leadStatus"], e["amount"]) for e in entries] == [("revenue", "disqualified", 7.0)]
