"""A source's posting spec, GET /api/v1/sources/{sourceId}/spec (CONTRACT 9.4), through the HTTP
API: its shape, required fields and allowed values worked out from the campaign's field library,
questionnaire, consent policy, rules and value sets; which campaign it describes; who may read
it; and its curl line, run as pasted against a real `appliance serve`, stores a qualified lead."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import httpx
import pytest

from appliance.config import load_config
from appliance.runtime import create_runtime
from appliance.services import tenancy
from tests.bundles import campaign, standard_bundle
from tests.conftest import Cli, make_tenant
from tests.processes import free_port, serving
from tests.servers import write_config

SUBMIT = "/api/v1/leads/submit"


def spec_path(source: str = "A-src") -> str:
    return f"/api/v1/sources/{source}/spec"


def rules_bundle() -> dict:
    """The standard bundle whose AC01 asks two questions, requires TCPA attestation, and has rules:
    alone they demand a state of a value set, an injury, a source and a score, and rule an attorney
    out; together, at flag severity, inactive or held for review at delivery (where only
    disqualifying counts) they demand nothing of every lead."""
    bundle = standard_bundle()
    bundle["valueSets"].append({"valueSetId": "plans", "values": ["basic", "gold"]})
    bundle["questionnaires"][0]["questions"].append(
        {"key": "hasAttorney", "question": "Do you have an attorney?", "options": ["yes", "no"]})
    bundle["fieldLibrary"] += [
        {"key": "customFields.vehicleCount", "label": "Vehicles", "category": "custom", "dataType": "integer",
         "validationRules": {"required": True, "min": 1, "max": 5}},
        {"key": "customFields.referrerName", "label": "Referred by", "category": "custom"},
        {"key": "otherQuestion", "label": "Asked elsewhere", "category": "question"},
    ]

    def alone(name: str, **condition) -> dict:
        return {"name": name, "subRules": [{"conditions": [condition]}]}

    first = bundle["campaigns"][0]
    first["qualification"] = {
        "tcpaPolicy": {"ingestionPolicy": {"requireSourceAttestation": True}},
        "rules": [
            alone("Service area", field="address.state", operator="not_in_value_set", valueSetId="states"),
            alone("Injured only", field="questionnaire.injured", operator="not_equals", value=["Yes"]),
            alone("No attorney", field="questionnaire.hasAttorney", operator="equals", value=["yes"]),
            {"name": "Either", "logicalOperator": "OR", "subRules": [
                {"conditions": [{"field": "customFields.source", "operator": "not_exists"}]},
                {"conditions": [{"field": "customFields.plan", "operator": "not_in_value_set", "valueSetId": "plans"},
                                {"field": "address.state", "operator": "equals", "value": ["TX"]}]}]},
            alone("Reviewed", field="customFields.score", operator="not_exists", maxSeverity="review"),
            alone("Flagged", field="customFields.flag", operator="not_exists", maxSeverity="flag"),
            {**alone("Late", field="customFields.late", operator="not_exists", maxSeverity="review"),
             "appliesAt": "delivery"},
            {**alone("Off", field="customFields.off", operator="not_exists"), "isActive": False},
        ],
    }
    return bundle


def fields_of(spec: dict) -> dict[str, dict]:
    return {f["path"]: f for f in spec["fields"]}


def get_spec(client, tenant, query: str = "", source: str = "A-src"):
    return client.get(spec_path(source) + query, headers=tenant.headers)


# ---- shape ------------------------------------------------------------------------------------

def test_the_spec_of_the_standard_campaign(client, tenant):
    answer = get_spec(client, tenant)
    assert answer.status_code == 200, answer.text
    spec = answer.json()["data"]
    assert set(spec) == {"sourceId", "campaignId", "active", "submitUrl", "fields", "examples"}  # no pingUrl
    assert (spec["sourceId"], spec["campaignId"], spec["active"]) == ("A-src", "AC01", True)
    assert spec["submitUrl"] == "http://127.0.0.1:8080/api/v1/leads/submit"  # [server] as configured
    types = {"string", "number", "integer", "boolean", "date", "email", "phone", "object"}
    for field in spec["fields"]:
        assert {"path", "type", "required", "example"} <= set(field) and field["type"] in types, field
    fields = fields_of(spec)
    assert [f["path"] for f in spec["fields"] if f["required"]] == ["campaignId", "firstName", "lastName", "email",
                                                                      "phone"]
    assert fields["campaignId"]["allowedValues"] == ["AC01"] and fields["campaignId"]["example"] == "AC01"
    assert fields["email"]["type"] == "email" and fields["phone"]["type"] == "phone"
    assert fields["phone"]["rules"] == {"minLength": 10}
    assert fields["questionnaire.injured"]["label"] == "Were you injured?"
    assert fields["attribution.params"]["type"] == "object"
    assert fields["compliance.tcpaConsent"]["type"] == "boolean"
    # Only what a submit may carry: no server-set, derived or resubmission fields, no pingId
    # for a campaign whose pings get no offer.
    assert not {"leadId", "sourceId", "status", "createdAt", "age", "phoneE164", "pingId"} & set(fields)
    assert spec["examples"]["body"] == {
        "campaignId": "AC01", "firstName": "Maria", "lastName": "Garcia", "email": "maria.garcia@example.com",
        "phone": "+14155550142", "questionnaire": {"injured": fields["questionnaire.injured"]["example"]}}
    curl = spec["examples"]["curl"]
    assert "\n" not in curl and curl.startswith("curl ") and '-H "X-API-Key: $KEY"' in curl
    assert spec["submitUrl"] in curl and json.dumps(spec["examples"]["body"], separators=(",", ":")) in curl


def test_required_fields_and_allowed_values_follow_the_rules(client, runtime):
    tenant = make_tenant(runtime, "Rules", rules_bundle())
    spec = get_spec(client, tenant).json()["data"]
    fields = fields_of(spec)
    required = {path for path, f in fields.items() if f["required"]}
    assert required == {"campaignId", "firstName", "lastName", "email", "phone", "address.state",
                        "questionnaire.injured", "customFields.vehicleCount", "customFields.source", "customFields.score",
                        "compliance.tcpaConsent", "compliance.consentTimestamp"}
    assert [f["path"] for f in spec["fields"][:len(required)]] == [f["path"] for f in spec["fields"]
                                                                   if f["required"]]  # required ones first
    # A value set as imported (not folded for comparison), and a rule's own values.
    assert fields["address.state"]["allowedValues"] == ["CA", "TX"]
    assert fields["questionnaire.injured"] == {
        "path": "questionnaire.injured", "type": "string", "required": True, "example": "Yes",
        "allowedValues": ["Yes"], "label": "Were you injured?"}
    assert fields["compliance.tcpaConsent"]["allowedValues"] == [True]
    # The question's options, the example steered away from the answer a rule rules out.
    assert fields["questionnaire.hasAttorney"]["allowedValues"] == ["yes", "no"]
    assert fields["questionnaire.hasAttorney"]["example"] == "no" and not fields["questionnaire.hasAttorney"]["required"]
    vehicles = fields["customFields.vehicleCount"]
    assert (vehicles["type"], vehicles["rules"], vehicles["example"]) == ("integer", {"min": 1, "max": 5}, 1)
    assert not fields["customFields.referrerName"]["required"]
    # Demands made only together with another condition, at flag severity, by an inactive rule set
    # or held for review at delivery are nobody's; another questionnaire's optional question is not
    # this campaign's.
    assert not {"customFields.plan", "customFields.flag", "customFields.late", "customFields.off",
                "questionnaire.otherQuestion"} & set(fields)
    body = spec["examples"]["body"]
    assert body["address"] == {"state": "CA"} and body["customFields"] == {"vehicleCount": 1, "source": "example",
                                                              "score": "example"}
    assert body["questionnaire"] == {"injured": "Yes", "hasAttorney": "no"}
    assert body["compliance"] == {"tcpaConsent": True, "consentTimestamp": "2026-11-21T09:30:00Z"}
    assert "customFields.referrerName" not in json.dumps(body)
    # The example body passes the campaign's rules, posted with the source's key.
    source_key = tenancy.create_key(runtime, tenant.tenant_id, source_id="A-src").key
    posted = client.post(SUBMIT, json=body, headers={"X-API-Key": source_key})
    assert posted.status_code == 201 and posted.json()["data"]["status"] == "qualified", posted.text


def test_a_ping_url_when_a_ping_gets_an_offer(client, runtime):
    bundle = standard_bundle()
    bundle["campaigns"][0]["ingestion"]["sources"][0]["payout"] = 12.5
    bundle["campaigns"].append(campaign(
        "AC05", "Auctioned", ingestion={"sources": [{"sourceId": "B-src"}]},
        delivery={"distribution": {"method": "auction", "endpoints": [{"deliveryEndpointId": "A-ep", "bid": 20}]}}))
    tenant = make_tenant(runtime, "Pinging", bundle)
    for source, campaign_id in (("A-src", "AC01"), ("B-src", "AC05")):
        spec = get_spec(client, tenant, source=source).json()["data"]
        assert spec["campaignId"] == campaign_id
        assert spec["pingUrl"] == "http://127.0.0.1:8080/api/v1/leads/ping"
        ping_id = fields_of(spec)["pingId"]
        assert ping_id["type"] == "string" and not ping_id["required"]
        assert "pingId" not in spec["examples"]["body"]


# ---- which campaign ---------------------------------------------------------------------------

def test_which_campaign_the_spec_describes(client, runtime):
    bundle = standard_bundle()
    source = {"sourceId": "A-src", "name": "Web form"}
    bundle["campaigns"][1]["ingestion"] = {"sources": [source]}  # AC02, inactive
    bundle["campaigns"].append(campaign("AC05", "Second", ingestion={"sources": [{**source, "active": False}]}))
    bundle["campaigns"].append(campaign("AC06", "Only inactive", active=False,
                                        ingestion={"sources": [{"sourceId": "C-src"}]}))
    tenant = make_tenant(runtime, "Choosing", bundle)

    def chosen(query: str = "", source: str = "A-src") -> tuple[str, bool]:
        answer = get_spec(client, tenant, query, source)
        assert answer.status_code == 200, answer.text
        data = answer.json()["data"]
        return data["campaignId"], data["active"]

    # The only campaign that takes the source's leads now; another is named with campaignId.
    assert chosen() == ("AC01", True)
    assert chosen("?campaignId=AC02") == ("AC02", False)
    assert chosen("?campaignId=AC05") == ("AC05", False)  # listed, the source inactive on it
    assert chosen("?campaignId=") == ("AC01", True)  # an empty value is no value
    assert chosen(source="C-src") == ("AC06", False)  # listed by one campaign only, an inactive one
    # Named, but it does not list the source (or is unknown): a VALIDATION_ERROR naming campaignId.
    for query in ("?campaignId=AC03", "?campaignId=ZZZ"):
        answer = get_spec(client, tenant, query)
        assert answer.status_code == 400 and answer.json()["error"]["details"] == [
            "campaignId: not a campaign that lists this source"], answer.text
    # No campaign lists it: NOT_FOUND.
    missing = get_spec(client, tenant, source="nobody")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "NOT_FOUND"
    # Two campaigns take its leads now: campaignId must say which.
    bundle["campaigns"][-2]["ingestion"]["sources"][0]["active"] = True
    tenancy.import_bundle(runtime, tenant.tenant_id, json.dumps(bundle).encode(), "json")
    ambiguous = get_spec(client, tenant)
    assert ambiguous.status_code == 400 and ambiguous.json()["error"]["details"] == [
        "campaignId: required, as the source feeds several campaigns (AC01, AC05)"], ambiguous.text
    assert chosen("?campaignId=AC05") == ("AC05", True)


def test_another_tenants_source_and_campaign_are_not_found(client, tenant, other_tenant):
    assert get_spec(client, tenant, source="O-src").status_code == 404
    assert get_spec(client, other_tenant, source="A-src").status_code == 404
    crossed = get_spec(client, tenant, "?campaignId=OC01")
    assert crossed.status_code == 400 and crossed.json()["error"]["details"][0].startswith("campaignId:")
    assert get_spec(client, other_tenant, source="O-src").json()["data"]["campaignId"] == "OC01"


# ---- who may read it --------------------------------------------------------------------------

def test_a_viewer_key_reads_it_and_a_source_key_may_not(client, runtime, tenant):
    viewer = tenancy.create_key(runtime, tenant.tenant_id, name="viewer", role="viewer").key
    answer = client.get(spec_path(), headers={"X-API-Key": viewer})
    assert answer.status_code == 200 and answer.json()["data"]["campaignId"] == "AC01"
    source = tenancy.create_key(runtime, tenant.tenant_id, source_id="A-src").key
    refused = client.get(spec_path(), headers={"X-API-Key": source})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "FORBIDDEN"
    assert client.get(spec_path()).status_code == 401


# ---- the curl line, pasted --------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("curl") is None or shutil.which("bash") is None,
                    reason="the example is a curl command line for a shell")
def test_the_curl_example_works_when_pasted(tmp_path, backend_toml):
    port = free_port()
    config = write_config(tmp_path, backend=backend_toml, extra=f"\n[server]\nport = {port}\n")
    (tmp_path / "plugins").mkdir()
    Cli(config)("init")
    runtime = create_runtime(load_config(config))
    try:
        tenant = make_tenant(runtime, "Pasting", rules_bundle())
        source_key = tenancy.create_key(runtime, tenant.tenant_id, source_id="A-src").key
    finally:
        runtime.close()
    with serving(config, tmp_path / "serve.log", port):
        base = f"http://127.0.0.1:{port}"
        spec = httpx.get(base + spec_path(), headers=tenant.headers, timeout=10).json()["data"]
        assert spec["submitUrl"] == f"{base}{SUBMIT}"
        # As pasted into a shell where KEY holds the source's key; -w only prints the status after it.
        pasted = subprocess.run(["bash", "-c", spec["examples"]["curl"] + " -w '\\n%{http_code}'"],
                                env={**os.environ, "KEY": source_key}, capture_output=True, text=True, timeout=30)
        assert pasted.returncode == 0, pasted.stderr
        answer, status = pasted.stdout.rsplit("\n", 1)
        assert status == "201", pasted.stdout
        submitted = json.loads(answer)["data"]
        assert submitted["status"] == "qualified", submitted
        lead = httpx.get(f"{base}/api/v1/leads/{submitted['leadId']}", headers=tenant.headers, timeout=10)
        stored = lead.json()["data"]
        assert (stored["sourceId"], stored["campaignId"], stored["email"]) == ("A-src", "AC01",
                                                                              "maria.garcia@example.com")
        assert stored["customFields"] == spec["examples"]["body"]["customFields"]
