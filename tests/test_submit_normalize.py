"""Submit, step 1: normalization, field library validation rules, and resubmission
of an existing lead by leadId."""

from __future__ import annotations

import pytest

from tests.submit_support import (
    accepted, api, clock, configured, jobs, lead_count, person, plain, read_lead, setup_tenant, submit,  # noqa: F401
)
from tests.conftest import make_tenant
from tests.bundles import standard_bundle

FIELD_LIBRARY = [
    {"key": "injured", "label": "Injured", "question": "Were you injured?", "category": "question"},
    {"key": "claim_code", "label": "Claim code", "question": "What is your claim code?", "category": "question",
     "validationRules": {"pattern": "^[A-Z]{3}-[0-9]{3}$"}},
    {"key": "weeks_off", "label": "Weeks off work", "category": "question", "dataType": "number",
     "validationRules": {"min": 1, "max": 52}},
    {"key": "children", "label": "Children", "category": "question", "dataType": "integer"},
    {"key": "nickname", "label": "Nickname", "category": "question", "validationRules": {"minLength": 2,
                                                                                        "maxLength": 5}},
    {"key": "retired", "label": "Retired field", "category": "question", "active": False,
     "validationRules": {"pattern": "^never$"}},
]


@pytest.fixture
def tenant(runtime):
    return setup_tenant(runtime, plain("SC1"), plain("SC2"), fieldLibrary=FIELD_LIBRARY)


# ---- normalization ----------------------------------------------------------------------------

def test_names_trimmed_and_title_cased_email_lowercased(api, runtime, tenant):
    data = accepted(api, tenant, person(firstName="  mARY   aNN ", lastName=" o'neil-SMITH  ",
                                        email="  Mary.ONeil@Example.COM "))
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert lead["firstName"] == "Mary Ann"
    assert lead["lastName"] == "O'Neil-Smith"
    assert lead["email"] == "mary.oneil@example.com"


@pytest.mark.parametrize(("phone", "country", "e164"), [
    ("(415) 555-2671", None, "+14155552671"),       # default region US
    ("415.555.2672", None, "+14155552672"),
    ("+1 415-555-2673", None, "+14155552673"),
    ("020 7946 0958", "GB", "+442079460958"),      # national number read in the lead's country
    ("+44 20 7946 0959", "GB", "+442079460959"),
    ("+44 20 7946 0960", None, "+442079460960"),   # international form needs no region
])
def test_phone_kept_as_sent_plus_e164(api, runtime, tenant, phone, country, e164):
    body = person(phone=phone)
    if country:
        body["country"] = country
    data = accepted(api, tenant, body)
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert lead["phone"] == phone
    assert lead["phoneE164"] == e164
    assert lead["country"] == country


def test_default_region_comes_from_config(tmp_path, backend_toml):
    with configured(tmp_path, '[defaults]\nregion = "GB"', backend_toml) as (runtime, client, _clock):
        tenant = setup_tenant(runtime, plain("SC1"))
        data = accepted(client, tenant, person(phone="020 7946 0958"))
        lead = read_lead(client, runtime, tenant, data["leadId"])
        assert (lead["phone"], lead["phoneE164"]) == ("020 7946 0958", "+442079460958")
        data = accepted(client, tenant, person(phone="(415) 555-2671", country="US"))
        assert read_lead(client, runtime, tenant, data["leadId"])["phoneE164"] == "+14155552671"


def test_uk_national_number_without_country_is_read_as_us(api, runtime, tenant):
    # 020 7946 0958 is not a possible US number (11 digits with the trunk 0), so it is refused.
    response = submit(api, tenant, person(phone="020 7946 0958"), expect=400)
    assert response.json()["error"]["details"][0].startswith("phone: ")
    assert lead_count(runtime) == 0


def test_questionnaire_object_form_mapped_through_field_library(api, runtime, tenant):
    data = accepted(api, tenant, person(questionnaire={"injured": "yes", "unlisted_key": 3,
                                                       "claim_code": "ABC-123", "weeks_off": 4,
                                                       "retired": "never"}))
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert lead["questionnaire"] == [
        {"key": "injured", "question": "Were you injured?", "answer": "yes"},
        {"key": "unlisted_key", "question": "unlisted_key", "answer": 3},
        {"key": "claim_code", "question": "What is your claim code?", "answer": "ABC-123"},
        {"key": "weeks_off", "question": "Weeks off work", "answer": 4},   # no question text: the label
        {"key": "retired", "question": "retired", "answer": "never"},      # inactive entry: not used
    ]


def test_questionnaire_array_form_kept(api, runtime, tenant):
    answers = [{"key": "injured", "question": "Hurt in the crash?", "answer": "no"},
               {"question": "Anything else?", "answer": ["a", "b"]}]
    data = accepted(api, tenant, person(questionnaire=answers))
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert lead["questionnaire"][0] == {"key": "injured", "question": "Hurt in the crash?", "answer": "no"}
    assert lead["questionnaire"][1]["question"] == "Anything else?"
    assert lead["questionnaire"][1]["answer"] == ["a", "b"]
    assert lead["questionnaire"][1].get("key") is None


def test_questionnaire_defaults_to_empty(api, runtime, tenant):
    data = accepted(api, tenant, person())
    assert read_lead(api, runtime, tenant, data["leadId"])["questionnaire"] == []


def test_other_fields_stored_as_sent(api, runtime, tenant):
    body = person(address={"street": "1 Main St", "city": "Springfield", "state": "IL", "zip": "62701"},
                  dateOfBirth="1990-02-28", timezone="America/Chicago", notes="call after 5",
                  customFields={"policy": "P-1", "nested": {"a": 1}},
                  attribution={"captureUrl": "https://example.com/form", "params": {"utm_source": "fb"},
                               "gclid": "g-1", "vendorKey": "kept"},
                  compliance={"tcpaConsent": True, "consentTimestamp": "2026-03-10T14:59:00Z",
                              "unknownKey": "kept"},
                  files=[{"name": "id.pdf"}], isTest=True)
    lead = read_lead(api, runtime, tenant, accepted(api, tenant, body)["leadId"])
    for key in ("address", "dateOfBirth", "timezone", "notes", "customFields", "attribution", "compliance",
                "files", "isTest"):
        assert lead[key] == body[key], key
    assert lead["status"] == "qualified"
    assert lead["campaignId"] == "SC1"
    assert lead["clientId"] == "cli-SC1"
    assert lead["offerId"] == "off-SC1"
    assert lead["sourceId"] is None
    assert lead["approval"] is None
    assert lead["submissionCount"] == 1
    assert lead["createdAt"].endswith("Z") and lead["updatedAt"] == lead["createdAt"]


def test_response_shape(api, tenant):
    response = submit(api, tenant, person())
    envelope = response.json()
    assert envelope["success"] is True
    assert set(envelope["data"]) == {"leadId", "submissionId", "status"}
    assert envelope["data"]["leadId"].startswith("lead_")
    assert envelope["data"]["submissionId"].startswith("sub_")
    assert "x-request-id" in response.headers


# ---- field library validationRules ----------------------------------------------------------------

@pytest.mark.parametrize(("answers", "detail"), [
    ({"claim_code": "abc-123"}, "questionnaire.claim_code: "),
    ({"claim_code": "ABC123"}, "questionnaire.claim_code: "),
    ({"weeks_off": 0}, "questionnaire.weeks_off: "),
    ({"weeks_off": 53}, "questionnaire.weeks_off: "),
    ({"weeks_off": "60"}, "questionnaire.weeks_off: "),
    ({"weeks_off": "many"}, "questionnaire.weeks_off: "),
    ({"weeks_off": True}, "questionnaire.weeks_off: "),
    ({"children": 1.5}, "questionnaire.children: "),
    ({"children": "two"}, "questionnaire.children: "),
    ({"nickname": "A"}, "questionnaire.nickname: "),
    ({"nickname": "Adelaide"}, "questionnaire.nickname: "),
], ids=["pattern-case", "pattern-shape", "below-min", "above-max", "above-max-as-text", "not-a-number",
        "bool-not-number", "integer-fraction", "integer-word", "too-short", "too-long"])
def test_field_library_rules_enforced(api, runtime, tenant, answers, detail):
    response = submit(api, tenant, person(questionnaire=answers), expect=400)
    error = response.json()["error"]
    assert error["code"] == "VALIDATION_ERROR"
    assert any(d.startswith(detail) for d in error["details"]), error["details"]
    assert lead_count(runtime) == 0


def test_field_library_rules_apply_to_the_array_form_too(api, runtime, tenant):
    response = submit(api, tenant, person(questionnaire=[{"key": "weeks_off", "question": "Weeks?", "answer": 99}]),
                      expect=400)
    assert any(d.startswith("questionnaire.weeks_off: ") for d in response.json()["error"]["details"])
    assert lead_count(runtime) == 0


def test_field_library_every_violation_listed(api, tenant):
    response = submit(api, tenant, person(questionnaire={"claim_code": "x", "weeks_off": 0}), expect=400)
    details = response.json()["error"]["details"]
    assert any(d.startswith("questionnaire.claim_code: ") for d in details)
    assert any(d.startswith("questionnaire.weeks_off: ") for d in details)


@pytest.mark.parametrize("answers", [
    {"claim_code": "ABC-123", "weeks_off": 1, "children": 2, "nickname": "Ada"},
    {"weeks_off": 52},
    {"weeks_off": "12.5"},
    {"children": "3"},
    {"retired": "anything"},  # inactive entry: its rules are not enforced
    {},
])
def test_field_library_valid_values_pass(api, tenant, answers):
    assert accepted(api, tenant, person(questionnaire=answers))["status"] == "qualified"


def test_required_field_library_entry(api, runtime):
    tenant = setup_tenant(runtime, plain("SC1"), fieldLibrary=[
        {"key": "accident_date", "label": "Accident date", "category": "question", "dataType": "date",
         "validationRules": {"required": True}}])
    response = submit(api, tenant, person(), expect=400)
    assert any(d.startswith("questionnaire.accident_date: ") for d in response.json()["error"]["details"])
    response = submit(api, tenant, person(questionnaire={"accident_date": "2026-02-30"}), expect=400)
    assert any(d.startswith("questionnaire.accident_date: ") for d in response.json()["error"]["details"])
    assert lead_count(runtime) == 0
    assert accepted(api, tenant, person(questionnaire={"accident_date": "2026-02-28"}))["status"] == "qualified"


# ---- resubmission by leadId -------------------------------------------------------------------------

def test_resubmission_reuses_stored_data(api, runtime, tenant):
    first = accepted(api, tenant, person(firstName="grace", lastName="hopper", email="Grace@Navy.mil",
                                         phone="(202) 555-0101", notes="first", questionnaire={"injured": "yes"},
                                         customFields={"a": 1}))
    second = accepted(api, tenant, {"leadId": first["leadId"], "campaignId": "SC2", "notes": "second",
                                    "customFields": {"b": 2}})
    assert second["leadId"] == first["leadId"]
    assert second["submissionId"] != first["submissionId"]
    assert second["status"] == "qualified"  # the same email and phone exist: dedupe is skipped
    assert lead_count(runtime) == 1
    lead = read_lead(api, runtime, tenant, first["leadId"])
    assert (lead["firstName"], lead["lastName"], lead["email"]) == ("Grace", "Hopper", "grace@navy.mil")
    assert (lead["phone"], lead["phoneE164"]) == ("(202) 555-0101", "+12025550101")
    assert lead["questionnaire"] == [{"key": "injured", "question": "Were you injured?", "answer": "yes"}]
    assert lead["notes"] == "second"
    assert lead["customFields"] == {"a": 1, "b": 2}
    assert lead["campaignId"] == "SC2"
    assert lead["submissionCount"] == 2
    assert [s["submissionNumber"] for s in lead["submissions"]] == [1, 2]
    assert [s["submissionId"] for s in lead["submissions"]] == [first["submissionId"], second["submissionId"]]
    assert lead["submissions"][1]["campaign"]["campaignId"] == "SC2"
    assert lead["submissions"][1]["flowType"] == "standard"
    received = lead["submissions"][1]["journeyEvents"][0]
    assert received["type"] == "received" and received["details"]["resubmission"] is True
    assert not any(e["type"] == "dedupe" for e in lead["submissions"][1]["journeyEvents"])


def test_resubmission_to_the_same_campaign_is_not_a_duplicate_of_itself(api, runtime, tenant):
    first = accepted(api, tenant, person())
    for number in (2, 3):
        again = accepted(api, tenant, {"leadId": first["leadId"], "campaignId": "SC1"})
        assert again["status"] == "qualified"
        assert read_lead(api, runtime, tenant, first["leadId"])["submissionCount"] == number


def test_resubmission_may_change_contact_fields_and_renormalizes(api, runtime, tenant):
    first = accepted(api, tenant, person())
    accepted(api, tenant, {"leadId": first["leadId"], "campaignId": "SC1", "firstName": " ada  byron ",
                           "email": "ADA@BYRON.ORG", "phone": "020 7946 0111", "country": "GB",
                           "questionnaire": {"claim_code": "XYZ-999"}})
    lead = read_lead(api, runtime, tenant, first["leadId"])
    assert lead["firstName"] == "Ada Byron"
    assert lead["lastName"] == "Lovelace"
    assert lead["email"] == "ada@byron.org"
    assert lead["phoneE164"] == "+442079460111"
    assert [q["key"] for q in lead["questionnaire"]] == ["claim_code"]


def test_resubmission_still_validates_what_is_sent(api, runtime, tenant):
    first = accepted(api, tenant, person())
    response = submit(api, tenant, {"leadId": first["leadId"], "campaignId": "SC1", "email": "broken"}, expect=400)
    assert response.json()["error"]["details"] == ["email: must be a valid email address"]
    response = submit(api, tenant, {"leadId": first["leadId"], "campaignId": "SC1",
                                    "questionnaire": {"weeks_off": 0}}, expect=400)
    assert response.json()["error"]["details"][0].startswith("questionnaire.weeks_off: ")
    assert read_lead(api, runtime, tenant, first["leadId"])["submissionCount"] == 1


def test_resubmission_of_another_tenants_lead_is_an_unknown_lead(api, runtime, tenant):
    other = make_tenant(runtime, "Other Agency", standard_bundle(prefix="O"))
    theirs = accepted(api, other, person("OC01"))
    response = submit(api, tenant, {"leadId": theirs["leadId"], "campaignId": "SC1"}, expect=400)
    assert response.json()["error"]["details"] == ["leadId: unknown lead"]
    assert read_lead(api, runtime, other, theirs["leadId"])["submissionCount"] == 1
    assert lead_count(runtime) == 1


def test_resubmission_can_clear_is_test(api, runtime, tenant):
    first = accepted(api, tenant, person(isTest=True))
    accepted(api, tenant, {"leadId": first["leadId"], "campaignId": "SC1", "isTest": False})
    assert read_lead(api, runtime, tenant, first["leadId"])["isTest"] is False


def test_resubmission_without_is_test_keeps_it(api, runtime, tenant):
    first = accepted(api, tenant, person(isTest=True))
    accepted(api, tenant, {"leadId": first["leadId"], "campaignId": "SC1"})
    assert read_lead(api, runtime, tenant, first["leadId"])["isTest"] is True
