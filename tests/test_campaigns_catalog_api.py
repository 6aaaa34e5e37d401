"""GET /api/v1/campaigns, questionnaires and the field library through HTTP."""

from __future__ import annotations

import pytest


def data(response) -> dict:
    body = response.json()
    assert body["success"] is True, body
    return body["data"]


def test_campaigns_default_hides_archived_and_shows_pagination(client, tenant):
    result = data(client.get("/api/v1/campaigns", headers=tenant.headers))
    assert [c["campaignId"] for c in result["campaigns"]] == ["AC01", "AC02"]
    assert result["pagination"] == {"total": 2, "page": 1, "limit": 50}


def test_campaigns_include_archived(client, tenant):
    result = data(client.get("/api/v1/campaigns?includeArchived=true", headers=tenant.headers))
    assert {c["campaignId"] for c in result["campaigns"]} == {"AC01", "AC02", "AC03"}
    archived = next(c for c in result["campaigns"] if c["campaignId"] == "AC03")
    assert archived["archivedAt"] == "2026-01-01T00:00:00.000Z"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("active=true", ["AC01"]),
        ("active=false", ["AC02"]),
        ("clientId=cli-2", ["AC02"]),
        ("offerId=off-1", ["AC01"]),
        ("search=solar", ["AC02"]),          # name, case-insensitive
        ("search=ac01", ["AC01"]),           # campaignId
        ("search=smith", ["AC01"]),          # clientName
        ("search=Auto", ["AC01"]),           # name and offerName
        ("search=100%25", []),               # LIKE wildcards are literal
        ("clientId=cli-1&includeArchived=true", ["AC01", "AC03"]),
    ],
)
def test_campaign_filters(client, tenant, query, expected):
    result = data(client.get(f"/api/v1/campaigns?{query}", headers=tenant.headers))
    assert [c["campaignId"] for c in result["campaigns"]] == expected
    assert result["pagination"]["total"] == len(expected)


def test_campaign_paging_and_limit_clamp(client, tenant):
    first = data(client.get("/api/v1/campaigns?limit=1&page=1", headers=tenant.headers))
    second = data(client.get("/api/v1/campaigns?limit=1&page=2", headers=tenant.headers))
    assert [c["campaignId"] for c in first["campaigns"]] == ["AC01"]
    assert [c["campaignId"] for c in second["campaigns"]] == ["AC02"]
    assert second["pagination"] == {"total": 2, "page": 2, "limit": 1}
    clamped = data(client.get("/api/v1/campaigns?limit=1000", headers=tenant.headers))
    assert clamped["pagination"]["limit"] == 100


@pytest.mark.parametrize(
    ("query", "field"),
    [("limit=abc", "limit"), ("page=0", "page"), ("page=-1", "page"), ("active=yes", "active"),
     ("includeArchived=1", "includeArchived")],
)
def test_campaign_bad_query_is_validation_error(client, tenant, query, field):
    response = client.get(f"/api/v1/campaigns?{query}", headers=tenant.headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "VALIDATION_ERROR"
    assert error["message"] == "Invalid input data"
    assert error["details"][0].startswith(f"{field}: ")


def test_campaign_never_shows_source_keys(client, tenant):
    response = client.get("/api/v1/campaigns", headers=tenant.headers)
    source = data(response)["campaigns"][0]["ingestion"]["sources"][0]
    assert source["apiKey"] is None and source["apiKeyEncrypted"] is None
    assert source["keyPrefix"] == "import"  # first 6 characters of the imported key
    assert "imported-source-key" not in response.text
    assert "ciphertext" not in response.text


def test_campaign_shape_has_every_interface_field(client, tenant):
    campaign = data(client.get("/api/v1/campaigns", headers=tenant.headers))["campaigns"][0]
    for name in ("campaignId", "name", "active", "offer", "client", "managerId", "brief", "disambiguationHint",
                 "questionnaireId", "documents", "knowledgeBaseIds", "campaignAiAgents", "firstIntakeAction",
                 "recovery", "qualification", "ingestion", "delivery", "notes", "tags", "externalId",
                 "createdAt", "updatedAt", "archivedAt", "lastLeadReceivedAt"):
        assert name in campaign, name
    assert campaign["createdAt"].endswith("Z") and len(campaign["createdAt"]) == 24


def test_questionnaires_list_all_with_pagination(client, tenant):
    result = data(client.get("/api/v1/questionnaires", headers=tenant.headers))
    assert [q["questionnaireId"] for q in result["questionnaires"]] == ["A-q1"]
    assert result["questionnaires"][0]["questions"][0]["key"] == "injured"
    assert result["pagination"] == {"total": 1, "page": 1, "limit": 1}


def test_field_library_has_standard_and_custom_entries(client, tenant):
    fields = data(client.get("/api/v1/field-library", headers=tenant.headers))["fields"]
    by_key = {f["key"]: f for f in fields}
    assert by_key["email"]["isStandard"] is True and by_key["email"]["category"] == "contact"
    assert by_key["attribution.gclid"]["category"] == "attribution"
    assert by_key["compliance.tcpaConsent"]["category"] == "compliance"
    assert by_key["injured"]["isStandard"] is False


@pytest.mark.parametrize(
    ("query", "must_include", "must_exclude"),
    [
        ("category=question", {"injured"}, {"email"}),
        ("search=INJ", {"injured"}, {"email"}),       # over key, case-insensitive
        ("search=e-mail", set(), {"injured"}),
        ("search=zip code", {"address.zip"}, {"email"}),  # over label
        ("active=true", {"email", "injured"}, set()),
        ("active=false", set(), {"email", "injured"}),
    ],
)
def test_field_library_filters(client, tenant, query, must_include, must_exclude):
    keys = {f["key"] for f in data(client.get(f"/api/v1/field-library?{query}", headers=tenant.headers))["fields"]}
    assert must_include <= keys
    assert not (must_exclude & keys)


def test_field_library_bad_category(client, tenant):
    response = client.get("/api/v1/field-library?category=nope", headers=tenant.headers)
    assert response.status_code == 400
    assert response.json()["error"]["details"][0].startswith("category: ")


def test_field_library_get_one_and_missing(client, tenant):
    entry = data(client.get("/api/v1/field-library/injured", headers=tenant.headers))
    assert entry["label"] == "Injured"
    missing = client.get("/api/v1/field-library/nope", headers=tenant.headers)
    assert missing.status_code == 404
    assert missing.json() == {"success": False, "error": {"code": "NOT_FOUND", "message": "Resource not found"}}


def test_tenant_isolation_on_every_catalog_route(client, runtime, tenant, other_tenant):
    from appliance.services import tenancy
    import msgspec

    tenancy.import_bundle(runtime, other_tenant.tenant_id, msgspec.json.encode({
        "fieldLibrary": [{"key": "other_secret_field", "label": "Only theirs", "category": "custom"}]}), "json")
    mine = data(client.get("/api/v1/campaigns?includeArchived=true", headers=tenant.headers))
    theirs = data(client.get("/api/v1/campaigns?includeArchived=true", headers=other_tenant.headers))
    assert {c["campaignId"] for c in mine["campaigns"]} == {"AC01", "AC02", "AC03"}
    assert {c["campaignId"] for c in theirs["campaigns"]} == {"OC01", "OC02", "OC03"}
    assert data(client.get("/api/v1/campaigns?search=OC0", headers=tenant.headers))["campaigns"] == []
    assert [q["questionnaireId"] for q in data(client.get("/api/v1/questionnaires", headers=tenant.headers))["questionnaires"]] == ["A-q1"]
    keys = {f["key"] for f in data(client.get("/api/v1/field-library", headers=tenant.headers))["fields"]}
    assert "other_secret_field" not in keys
    assert client.get("/api/v1/field-library/other_secret_field", headers=tenant.headers).status_code == 404
    assert client.get("/api/v1/field-library/other_secret_field", headers=other_tenant.headers).status_code == 200


def test_rendered_pages_follow_key_changes(client, runtime, tenant):
    from appliance.services import tenancy

    def prefix() -> str:
        campaigns = data(client.get("/api/v1/campaigns", headers=tenant.headers))["campaigns"]
        return campaigns[0]["ingestion"]["sources"][0]["keyPrefix"]

    assert prefix() == "import"
    made = tenancy.create_key(runtime, tenant.tenant_id, source_id="A-src")
    assert prefix() == made.prefix
    tenancy.revoke_key(runtime, made.key_id)
    assert prefix() == "import"
