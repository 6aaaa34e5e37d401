"""POST /api/v1/leads/submit refuses bad input with 400 VALIDATION_ERROR, one detail per problem
starting with the field path, and stores nothing when it does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from litestar.testing import TestClient

from appliance.app import create_app
from appliance.config import load_config
from appliance.runtime import create_runtime
from tests.bundles import standard_bundle
from tests.conftest import make_tenant
from tests.submit_support import SUBMIT, lead_count, person, table_count


@pytest.fixture(scope="module")
def env(tmp_path_factory, module_backend_toml) -> Iterator[tuple]:
    """One data folder for the module: nothing below may store anything, so it stays empty."""
    tmp: Path = tmp_path_factory.mktemp("submit-validation")
    config_file = tmp / "appliance.toml"
    config_file.write_text(f'[storage]\npath = "{tmp / "data"}"\n{module_backend_toml()}\n[security]\nrate_limit_per_minute = 0\n\n'
                           f'[plugins]\ndirs = ["{tmp / "plugins"}"]\n')
    runtime = create_runtime(load_config(config_file))
    tenant = make_tenant(runtime, "Validation", standard_bundle())
    other = make_tenant(runtime, "Other", standard_bundle(prefix="O"))
    try:
        with TestClient(create_app(runtime, background=False), raise_server_exceptions=False) as client:
            yield runtime, client, tenant, other
    finally:
        runtime.close()


def body(**fields):
    return person("AC01", **fields)


def refused(env, payload=None, *, content: bytes | None = None, headers: dict | None = None, status: int = 400):
    runtime, client, tenant, _ = env
    all_headers = {**tenant.headers, **(headers or {})}
    if content is not None:
        response = client.post(SUBMIT, content=content, headers=all_headers)
    else:
        response = client.post(SUBMIT, json=payload, headers=all_headers)
    assert response.status_code == status, response.text
    envelope = response.json()
    assert envelope["success"] is False
    assert lead_count(runtime) == 0
    assert table_count(runtime, "submissions") == 0
    assert table_count(runtime, "jobs") == 0
    return envelope["error"]


def assert_detail(error: dict, prefix: str) -> str:
    assert error["code"] == "VALIDATION_ERROR"
    assert error["message"] == "Invalid input data"
    matching = [d for d in error["details"] if d.startswith(prefix)]
    assert matching, f"no detail starting with {prefix!r}: {error['details']}"
    return matching[0]


BAD_FIELDS = [
    # (case id, field overrides, detail prefix)
    ("email-format", {"email": "not-an-email"}, "email: "),
    ("email-no-dot", {"email": "ada@localhost"}, "email: "),
    ("email-space", {"email": "ada lovelace@example.com"}, "email: "),
    ("email-type", {"email": 42}, "email: "),
    ("phone-short", {"phone": "415-555"}, "phone: "),
    ("phone-letters", {"phone": "415-555-CALL"}, "phone: "),
    ("phone-impossible", {"phone": "+1 000 000 0000 000"}, "phone: "),
    ("phone-type", {"phone": 4155552671}, "phone: "),
    ("address-zip-type", {"address": {"zip": 94105}}, "address.zip: "),
    ("address-unknown-key", {"address": {"zip": "94105", "planet": "Earth"}}, "address.planet: "),
    ("address-not-object", {"address": "1 Main St"}, "address: "),
    ("country-lowercase", {"country": "us"}, "country: "),
    ("country-three-letters", {"country": "USA"}, "country: "),
    ("dob-impossible-day", {"dateOfBirth": "2023-02-30"}, "dateOfBirth: "),
    ("dob-not-a-date", {"dateOfBirth": "not-a-date"}, "dateOfBirth: "),
    ("dob-us-format", {"dateOfBirth": "02/03/1990"}, "dateOfBirth: "),
    ("timezone-unknown", {"timezone": "Mars/Base"}, "timezone: "),
    ("questionnaire-string", {"questionnaire": "yes"}, "questionnaire: "),
    ("questionnaire-item-without-question", {"questionnaire": [{"key": "injured", "answer": "yes"}]},
     "questionnaire[0].question: "),
    ("questionnaire-item-unknown-key", {"questionnaire": [{"question": "Q?", "answer": "yes", "extra": 1}]},
     "questionnaire[0].extra: "),
    ("files-string", {"files": "resume.pdf"}, "files"),
    ("files-item-not-object", {"files": ["resume.pdf"]}, "files"),
    ("files-too-many", {"files": [{"n": i} for i in range(51)]}, "files: "),
    ("isTest-string", {"isTest": "true"}, "isTest: "),
    ("notes-type", {"notes": 12}, "notes: "),
    ("customFields-array", {"customFields": ["a"]}, "customFields: "),
    ("attribution-params", {"attribution": {"params": "utm_source=x"}}, "attribution.params: "),
    ("attribution-gclid", {"attribution": {"gclid": 12345}}, "attribution.gclid: "),
    ("compliance-consent-type", {"compliance": {"tcpaConsent": "yes"}}, "compliance.tcpaConsent: "),
    ("compliance-timestamp", {"compliance": {"tcpaConsent": True, "consentTimestamp": "yesterday"}},
     "compliance.consentTimestamp: "),
    ("unknown-field", {"favouriteColour": "blue"}, "favouriteColour: "),
    ("mass-assignment-tenantId", {"tenantId": "tnt_someone_else"}, "tenantId: "),
    ("mass-assignment-status", {"status": "delivered"}, "status: "),
    ("mass-assignment-createdAt", {"createdAt": "2020-01-01T00:00:00.000Z"}, "createdAt: "),
    ("mass-assignment-sourceId", {"sourceId": "A-src"}, "sourceId: "),
    ("missing-campaignId", {"campaignId": ...}, "campaignId: "),
    ("empty-campaignId", {"campaignId": ""}, "campaignId: "),
    ("null-campaignId", {"campaignId": None}, "campaignId: "),
    ("unknown-campaign", {"campaignId": "ZZZ"}, "campaignId: "),
    ("inactive-campaign", {"campaignId": "AC02"}, "campaignId: "),
    ("archived-campaign", {"campaignId": "AC03"}, "campaignId: "),
    ("other-tenants-campaign", {"campaignId": "OC01"}, "campaignId: "),
    ("unknown-leadId", {"leadId": "lead_01JDNOTALEADATALL0000000000"}, "leadId: "),
    ("empty-leadId", {"leadId": ""}, "leadId: "),
    ("missing-firstName", {"firstName": ...}, "firstName: "),
    ("blank-firstName", {"firstName": "   "}, "firstName: "),
    ("missing-lastName", {"lastName": ...}, "lastName: "),
    ("missing-email", {"email": ...}, "email: "),
    ("missing-phone", {"phone": ...}, "phone: "),
]


@pytest.mark.parametrize(("overrides", "prefix"), [case[1:] for case in BAD_FIELDS],
                         ids=[case[0] for case in BAD_FIELDS])
def test_bad_field_is_a_validation_error_naming_it(env, overrides, prefix):
    error = refused(env, body(**overrides))
    detail = assert_detail(error, prefix)
    assert len(detail) > len(prefix), "the detail says what is wrong"


def test_every_problem_is_reported_at_once(env):
    error = refused(env, body(email="nope", phone="call-me-maybe", dateOfBirth="1990-13-01",
                              timezone="Mars/Base"))
    for prefix in ("email: ", "phone: ", "dateOfBirth: ", "timezone: "):
        assert_detail(error, prefix)


def test_a_bad_email_and_a_short_phone_are_two_details(env):
    error = refused(env, body(email="nope", phone="415-55"))
    assert error["details"] == ["email: must be a valid email address",
                                "phone: must be a valid phone number (digits, +, dashes, spaces, parentheses)"]


def test_every_wrongly_typed_field_is_listed_with_nested_paths(env):
    error = refused(env, body(email=5, firstName=["x"], address={"zip": 94105, "state": "CA", "city": 7},
                              isTest="yes", surprise=1))
    assert sorted(error["details"]) == sorted([
        "surprise: unknown field", "firstName: expected str, got array", "email: expected str, got int",
        "address.city: expected str, got int", "address.zip: expected str, got int",
        "isTest: expected bool, got str"])


def test_details_say_what_a_field_takes_in_plain_words(env):
    error = refused(env, body(firstName="x" * 101))
    assert error["details"] == ["firstName: must be at most 100 characters"]
    error = refused(env, body(country="usa"))
    assert error["details"] == ["country: must be a two-letter country code in capitals, such as US"]


def test_all_contact_fields_missing_are_listed(env):
    error = refused(env, {"campaignId": "AC01"})
    for prefix in ("firstName: ", "lastName: ", "email: ", "phone: "):
        assert_detail(error, prefix)


@pytest.mark.parametrize("content", [b'{"campaignId": "AC01", ', b"{'campaignId': 'AC01'}", b"nul",
                                     b'{"campaignId": "AC01"} trailing'],
                         ids=["truncated", "single-quotes", "bare-word", "trailing-garbage"])
def test_malformed_json(env, content):
    error = refused(env, content=content, headers={"Content-Type": "application/json"})
    assert_detail(error, "body: ")


@pytest.mark.parametrize("content", [b"", b"   "], ids=["empty", "whitespace"])
def test_empty_body(env, content):
    error = refused(env, content=content, headers={"Content-Type": "application/json"})
    assert_detail(error, "body: ")


@pytest.mark.parametrize("content", [b"[]", b'"lead"', b"null", b"42"])
def test_body_that_is_not_an_object(env, content):
    error = refused(env, content=content, headers={"Content-Type": "application/json"})
    assert error["code"] == "VALIDATION_ERROR"
    assert error["details"]


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "application/xml"])
def test_wrong_content_type_is_415(env, content_type):
    import json

    error = refused(env, content=json.dumps(body()).encode(), headers={"Content-Type": content_type}, status=415)
    assert error["code"] == "UNSUPPORTED_MEDIA_TYPE"


def test_missing_content_type_is_415(env):
    runtime, client, tenant, _ = env
    response = client.post(SUBMIT, content=b'{"campaignId": "AC01"}', headers={**tenant.headers, "Content-Type": ""})
    assert response.status_code == 415
    assert lead_count(runtime) == 0


def test_json_with_charset_is_accepted_as_json(env):
    # Content type parameters do not matter: the body is read as JSON (and refused for its content).
    error = refused(env, content=b'{"campaignId": "AC01"}',
                    headers={"Content-Type": "application/json; charset=utf-8"})
    assert_detail(error, "firstName: ")


def test_body_over_one_mebibyte_is_413(env):
    runtime, client, tenant, _ = env
    payload = body(customFields={"blob": "x" * (1024 * 1024)})
    response = client.post(SUBMIT, json=payload, headers=tenant.headers)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert lead_count(runtime) == 0


def test_without_a_key_nothing_is_stored(env):
    runtime, client, _, _ = env
    response = client.post(SUBMIT, json=body())
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "UNAUTHORIZED"
    assert lead_count(runtime) == 0


def test_the_module_stored_nothing_at_all(env):
    runtime, *_ = env
    assert lead_count(runtime) == 0
    assert table_count(runtime, "ledger_entries") == 0


def test_rejected_time_zones_are_not_retained(env):
    from appliance.domain import submission as module

    before = len(module._VALID_ZONES)
    for i in range(20):
        assert_detail(refused(env, body(timezone=f"Mars/Base{i}")), "timezone: ")
    for i in range(3000):  # the same path, without the HTTP round trip
        assert module.valid_zone(f"Nowhere/Zone{i}") is False
    assert len(module._VALID_ZONES) - before < 1000
