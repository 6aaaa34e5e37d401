"""Tenant bundles: decoding JSON and TOML, the exact problem paths, cross-checks and secrets."""

from __future__ import annotations

import copy
import json

import msgspec
import pytest

from appliance.services.bundle import BundleError, TenantBundle, format_from_filename, load_bundle, split_secrets
from appliance.domain.campaign import Campaign, public_campaign
from appliance.domain.standard_fields import STANDARD_FIELDS

RULES = {
    "logicalOperator": "AND",
    "subRules": [{
        "logicalOperator": "OR",
        "conditions": [
            {"field": "address.state", "operator": "in_value_set", "value": ["NV"], "valueSetId": "states",
             "prompt": None, "maxSeverity": "disqualify"},
            {"field": "email", "operator": "matches", "value": ["@example\\.com$"], "valueSetId": None,
             "prompt": None, "maxSeverity": "review"},
            {"field": None, "operator": "equals", "value": [True, 1, 2.5], "valueSetId": None,
             "prompt": "Is the lead a business?", "maxSeverity": "flag"},
        ],
    }],
    "appliesAt": "ingestion",
    "isActive": True,
    "name": "Excluded states",
}

FULL_CAMPAIGN = {
    "campaignId": "AUTO1",
    "name": "Auto insurance",
    "active": True,
    "offer": {"offerId": "off_1", "offerName": "Auto"},
    "client": {"clientId": "cli_1", "clientName": "Acme"},
    "managerId": "mgr_1",
    "brief": "Drivers looking for quotes",
    "disambiguationHint": "Car, not home",
    "questionnaireId": "q_auto",
    "documents": [{
        "documentId": "doc_1", "kind": "esign", "signTemplateId": "tpl_1", "staticAssetId": "asset_1",
        "type": "agreement", "name": "Agreement", "conditions": RULES,
        "fieldMappingOverrides": [{
            "id": "m1", "providerFieldName": "full_name", "providerFieldId": "f1",
            "providerFieldLabel": "Full name", "providerFieldRequired": True, "providerFieldType": "text",
            "autoFill": True, "fallbackTemplate": "{firstName} {lastName}", "sourceType": "field_library",
            "sourceValue": "firstName", "sourceLabel": "First name",
        }],
        "isActive": True, "required": True, "autoSend": False, "expiresInDays": 7, "order": 1,
    }],
    "knowledgeBaseIds": ["kb_1"],
    "campaignAiAgents": {
        "rep": {"agentId": "agent_1"},
        "repTest": {"agentId": "agent_test"},
        "overlay": {
            "persona": {"mode": "inline", "value": "Friendly"},
            "mission": {"mode": "inline", "value": "Book a call"},
            "tone": {"mode": "inline", "value": "Warm"},
            "additionalRules": [{"id": "r1", "type": "guardrail", "text": "No prices", "blockId": "b1",
                                 "order": 1, "enabled": True}],
        },
    },
    "firstIntakeAction": {
        "enabled": True, "action": "engage", "engage": {"goalId": "goal_1"},
        "humanReview": {"reason": "new buyer", "priority": "high"},
        "workflow": {"workflowDefinitionId": "wf_1"},
    },
    "recovery": {"engageOnRoute": True, "collectSequenceId": "seq_1"},
    "qualification": {
        "rules": [RULES],
        "tcpaPolicy": {
            "deliveryPolicy": {"required": True},
            "ingestionPolicy": {"requireSourceAttestation": True, "verifyCertificate": False},
            "campaignAttestation": {"enabled": True, "attestedBy": "ops", "attestedAt": "2026-11-21T09:30:00.123Z",
                                    "note": "reviewed"},
        },
        "dedupeOverride": {"enabled": True, "window": 45, "matchFields": {"email": True, "phone": False,
                                                                          "matchLogic": "AND"}},
        "autoRoutingEnabled": True,
        "routingRules": [{
            "routeName": "Texas", "active": True, "priority": 1, "logicalOperator": "AND",
            "subRules": [{"logicalOperator": "AND",
                          "conditions": [{"field": "address.state", "operator": "equals", "value": ["TX"],
                                          "valueSetId": None, "prompt": None, "maxSeverity": "disqualify"}]}],
            "routeTo": {"campaignId": "HOME1", "clientName": "Acme", "offerName": "Home"},
        }],
        "fallbackCampaigns": ["HOME1"],
        "suppressionListIds": ["sup_optouts"],
        "verifications": [{"verifier": "phone", "config": {"lineTypes": ["mobile"]}, "onFail": "review",
                           "onUnknown": "error", "sample": 0.5, "cacheSeconds": 3600, "timeoutMs": 500}],
    },
    "ingestion": {"sources": [{
        "sourceId": "src_1", "name": "Supplier A", "supplierId": "sup_1", "postingSpecId": "spec_1",
        "mode": "direct_post", "apiKey": "lss_plaintext_source_key",
        "apiKeyEncrypted": {"ciphertext": "Y3Q=", "encryptedDataKey": "ZGs=", "iv": "aXY=", "authTag": "dGFn",
                            "kmsKeyId": "local"},
        "keyPrefix": "lss_plai", "specShareHash": "h1",
        "caps": [{"active": True, "cap": 100, "type": "daily", "startDate": "2026-11-01", "endDate": "2026-12-31"}],
        "costMilestones": [{"leadStatus": "lead_ingested", "amount": 2.5, "currency": "USD",
                            "validFrom": "2026-11-01", "validTo": "2026-12-31T23:59:59Z", "conditions": RULES,
                            "notes": "base", "active": True}],
        "shortCircuitSyncEvaluation": False,
        "placement": {"applyRoutingRules": True, "applyFallbackCampaigns": False},
        "active": True, "createdAt": "2026-11-21T09:30:00Z", "updatedAt": "2026-11-21T09:30:00+02:00",
        "payout": None, "pingLimits": [],
    }]},
    "delivery": {
        "deliveryEndpointId": "ep_1",
        "distribution": {"method": "weighted", "endpoints": [
            {"deliveryEndpointId": "ep_1", "priority": 0, "weight": 3, "active": True, "deliveryLimits": [],
             "deliverySchedule": None, "conditions": None, "bid": None},
            {"deliveryEndpointId": "ep_2", "priority": 1, "weight": 1, "active": True,
             "deliveryLimits": [{"active": True, "cap": 10, "type": "daily", "action": "queue", "startDate": None,
                                 "endDate": None, "routeToCampaignId": None}],
             "deliverySchedule": None, "conditions": None, "bid": None}], "auction": None},
        "deliveryLimits": [{"active": True, "cap": 50, "type": "daily", "action": "route",
                            "startDate": "2026-11-01", "endDate": "2026-12-31", "routeToCampaignId": "HOME1"}],
        "deliverySchedule": {
            "timezone": "America/Chicago", "action": "route", "routeToCampaignId": "HOME1",
            "specificDays": [{"active": True, "day": "Monday", "startTime": "09:00", "endTime": "17:30"},
                             {"active": True, "day": "Tuesday", "startTime": "00:00", "endTime": "24:00"}],
        },
        "revenueMilestones": [{"leadStatus": "delivered", "amount": 30, "currency": "EUR", "validFrom": None,
                               "validTo": None, "conditions": None, "notes": None, "active": False}],
        "discrepancyHold": "off",
    },
    "notes": "n", "tags": ["auto"], "externalId": "ext_1",
    "createdAt": "2026-11-21T09:30:00.123Z", "updatedAt": "2026-11-21T09:30:00.123Z",
    "archivedAt": "2026-11-22T00:00:00Z", "lastLeadReceivedAt": "2026-11-21T10:00:00Z",
}

HOME = {"campaignId": "HOME1", "name": "Home insurance"}

BUNDLE = {
    "campaigns": [FULL_CAMPAIGN, HOME],
    "questionnaires": [{"questionnaireId": "q_auto", "name": "Auto", "questions": [
        {"key": "vehicle_year", "question": "What year is your car?", "instructions": "4 digits",
         "options": []}]}],
    "fieldLibrary": [{"key": "vehicle_year", "label": "Vehicle year", "category": "question",
                      "dataType": "integer", "validationRules": {"min": 1950, "max": 2030}}],
    "valueSets": [{"valueSetId": "states", "name": "Excluded", "values": ["NY", "CA"]}],
    "deliveryEndpoints": [{
        "deliveryEndpointId": "ep_1", "url": "https://buyer.example.com/leads",
        "headers": {"X-Source": "appliance"},
        "auth": {"type": "basic", "username": "u", "password": "endpoint-password"},
        "fieldMapping": [{"clientKey": "email", "leadField": "email", "required": True},
                         {"clientKey": "vendor", "value": "acme"}],
        "responseRules": {"success": {"statusCodes": [200, 201], "jsonPath": "status", "values": ["ok"]},
                          "duplicate": {"bodyPattern": "(?i)duplicate"}, "clientLeadIdPath": "id"},
    }, {
        "deliveryEndpointId": "ep_2", "url": "http://other.example.com/",
        "auth": {"type": "bearer", "token": "endpoint-token"},
    }],
    "sms": {
        "providers": [{"providerId": "tw", "type": "twilio", "accountSid": "AC1", "authToken": "sms-auth-token"},
                      {"providerId": "tx", "type": "telnyx", "apiKey": "sms-api-key",
                       "baseUrl": "https://api.telnyx.com"}],
        "numbers": [{"number": "+14155552671", "smsCapable": True, "campaignIds": ["AUTO1"]}],
        "agents": [{"agentId": "agent_1", "number": "+14155552671"}],
        "defaultProviderId": "tw",
        "campaignProviders": {"HOME1": "tx"},
    },
    "pixels": [{"pixelId": "px_1", "platform": "social", "accessToken": "pixel-token", "name": "Meta"}],
}

SECRETS = ["lss_plaintext_source_key", "endpoint-password", "endpoint-token", "sms-auth-token",
           "sms-api-key", "pixel-token"]


def load_json(data, **known) -> TenantBundle:
    return load_bundle(json.dumps(data).encode(), "json", **known)


def problems_of(data, **known) -> list[str]:
    with pytest.raises(BundleError) as caught:
        load_json(data, **known)
    return caught.value.problems


def bundle_with(**changes):
    data = copy.deepcopy(BUNDLE)
    data.update(changes)
    return data


def test_full_bundle_round_trips_through_json():
    bundle = load_json(BUNDLE)
    assert msgspec.to_builtins(bundle.campaigns[0]) == FULL_CAMPAIGN
    encoded = msgspec.json.encode(bundle)
    assert load_bundle(encoded, "json") == bundle
    assert msgspec.json.decode(encoded, type=TenantBundle) == bundle


def to_toml(value) -> str:
    """Inline TOML for JSON-like data; TOML has no null, so None (every such field's default) is left out."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {to_toml(v)}" for k, v in value.items() if v is not None) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(to_toml(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def test_full_bundle_round_trips_through_toml():
    text = "\n".join(f"{key} = {to_toml(value)}" for key, value in BUNDLE.items())
    assert load_bundle(text.encode(), "toml") == load_json(BUNDLE)


def test_minimal_campaign_gets_defaults():
    campaign = load_json({"campaigns": [HOME]}).campaigns[0]
    assert campaign.active and campaign.ingestion.sources == [] and campaign.delivery.delivery_endpoint_id is None
    assert campaign.qualification.dedupe_override is None


TOML = """
[[campaigns]]
campaignId = "AUTO1"
name = "Auto"
createdAt = 2026-11-21T09:30:00Z

[campaigns.delivery.deliverySchedule]
timezone = "Europe/Berlin"
specificDays = [{ day = "Monday", startTime = 09:00:00, endTime = "17:00" }]

[[campaigns.ingestion.sources]]
sourceId = "src_1"
caps = [{ cap = 10, startDate = 2026-11-01 }]

[[deliveryEndpoints]]
deliveryEndpointId = "ep_1"
url = "https://buyer.example.com"
"""


def test_toml_bundle_with_native_dates_and_times():
    campaign = load_bundle(TOML.encode(), "toml").campaigns[0]
    assert campaign.created_at == "2026-11-21T09:30:00+00:00"
    assert campaign.delivery.delivery_schedule.specific_days[0].start_time == "09:00"
    assert campaign.ingestion.sources[0].caps[0].start_date == "2026-11-01"


def test_toml_problem_paths():
    text = TOML.replace('"Europe/Berlin"', '"Mars/Olympus"').replace("cap = 10", 'cap = "ten"')
    with pytest.raises(BundleError) as caught:
        load_bundle(text.encode(), "toml")
    # every problem of the campaign at once, where msgspec alone stops at the first
    assert caught.value.problems == ["campaigns[0].ingestion.sources[0].caps[0].cap: expected int, got str",
                                     "campaigns[0].delivery.deliverySchedule.timezone: unknown time zone"]
    text = TOML.replace("cap = 10", 'cap = "ten"')
    with pytest.raises(BundleError) as caught:
        load_bundle(text.encode(), "toml")
    assert caught.value.problems == ["campaigns[0].ingestion.sources[0].caps[0].cap: expected int, got str"]


def test_bad_timezone_at_third_campaign():
    campaigns = [HOME, {"campaignId": "CC2", "name": "two"},
                 {"campaignId": "CC3", "name": "three", "delivery": {"deliverySchedule": {"timezone": "Nowhere/Land"}}}]
    assert problems_of({"campaigns": campaigns}) == [
        "campaigns[2].delivery.deliverySchedule.timezone: unknown time zone"]


def test_every_bad_item_is_reported():
    campaigns = [{"campaignId": "A", "name": "x"}, HOME, {"campaignId": "BBB", "name": "y", "color": "red"}, "x"]
    assert problems_of({"campaigns": campaigns, "extra": 1}) == [
        "extra: unknown field",
        "campaigns[0].campaignId: must be 3 to 5 letters, digits, underscores or hyphens",
        "campaigns[2].color: unknown field",
        "campaigns[3]: expected object, got str",
    ]


@pytest.mark.parametrize(("change", "problem"), [
    ({"fieldLibrary": [{"key": "k", "label": "K", "validationRules": {"pattern": "(["}}]},
     "fieldLibrary[0].validationRules.pattern: invalid regular expression: "
     "unterminated character set at position 1"),
    ({"fieldLibrary": [{"key": "k", "label": "K", "dataType": "text"}]},
     "fieldLibrary[0].dataType: must be one of string, number, integer, boolean, date, email, phone, url, "
     "file, json"),
    ({"deliveryEndpoints": [{"deliveryEndpointId": "e", "url": "ftp://x"}]},
     "deliveryEndpoints[0].url: must be an http or https URL with a host"),
    ({"deliveryEndpoints": [{"deliveryEndpointId": "e", "url": "https://x", "timeoutSeconds": 0}]},
     "deliveryEndpoints[0].timeoutSeconds: must be greater than 0 and at most 120"),
    ({"deliveryEndpoints": [{"deliveryEndpointId": "e", "url": "https://x", "returnWindowDays": -1}]},
     "deliveryEndpoints[0].returnWindowDays: must be between 0 and 3650 days"),
    ({"deliveryEndpoints": [{"deliveryEndpointId": "e", "url": "https://x",
                             "fieldMapping": [{"clientKey": "a", "leadField": "email", "value": 1}]}]},
     "deliveryEndpoints[0].fieldMapping[0].leadField: exactly one of leadField or value is required"),
    ({"deliveryEndpoints": [{"deliveryEndpointId": "e", "url": "https://x",
                             "responseRules": {"failure": {"bodyPattern": "a)"}}}]},
     "deliveryEndpoints[0].responseRules.failure.bodyPattern: invalid regular expression: "
     "unbalanced parenthesis at position 1"),
    ({"sms": {"numbers": [{"number": "415-555-2671"}]}},
     "sms.numbers[0].number: must be an E.164 phone number, e.g. +14155552671"),
    ({"sms": {"providers": [{"providerId": "tw", "type": "twilio"}], "defaultProviderId": "nope"}},
     "sms.defaultProviderId: unknown provider"),
    ({"pixels": [{"pixelId": "p", "platform": "radio"}]}, "pixels[0].platform: must be one of social, video"),
    ({"campaigns": {"campaignId": "ABC"}}, "campaigns: expected array, got object"),
])
def test_item_problem_paths(change, problem):
    assert problems_of(change) == [problem]


def campaign_problem(patch: dict) -> list[str]:
    campaign = copy.deepcopy(HOME)
    for path, value in patch.items():
        *parents, last = path.split(".")
        node = campaign
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return problems_of({"campaigns": [campaign]})


@pytest.mark.parametrize(("patch", "problem"), [
    ({"delivery.deliverySchedule": {"specificDays": [{"day": "Monday", "startTime": "9:00", "endTime": "17:00"}]}},
     "campaigns[0].delivery.deliverySchedule.specificDays[0].startTime: must be a time HH:MM between 00:00 and 23:59"),
    ({"delivery.deliverySchedule": {"specificDays": [{"day": "Monday", "startTime": "24:00", "endTime": "24:00"}]}},
     "campaigns[0].delivery.deliverySchedule.specificDays[0].startTime: must be a time HH:MM between 00:00 and 23:59"),
    ({"delivery.deliverySchedule": {"specificDays": [{"day": "Monday", "startTime": "09:00", "endTime": "24:01"}]}},
     "campaigns[0].delivery.deliverySchedule.specificDays[0].endTime: must be a time HH:MM between 00:00 and 24:00"),
    ({"delivery.deliverySchedule": {"specificDays": [{"day": "Funday", "startTime": "09:00", "endTime": "10:00"}]}},
     "campaigns[0].delivery.deliverySchedule.specificDays[0].day: must be one of Monday, Tuesday, "
     "Wednesday, Thursday, Friday, Saturday, Sunday"),
    ({"delivery.deliverySchedule": {"action": "route"}},
     "campaigns[0].delivery.deliverySchedule.routeToCampaignId: required when action is route"),
    ({"delivery.deliveryLimits": [{"cap": 5, "action": "route"}]},
     "campaigns[0].delivery.deliveryLimits[0].routeToCampaignId: required when action is route"),
    ({"delivery.deliveryLimits": [{"cap": -1}]}, "campaigns[0].delivery.deliveryLimits[0].cap: must be at least 0"),
    ({"delivery.deliveryLimits": [{"cap": "5"}]},
     "campaigns[0].delivery.deliveryLimits[0].cap: expected int, got str"),
    ({"ingestion.sources": [{"sourceId": "s", "caps": [{"cap": 1, "endDate": "next week"}]}]},
     "campaigns[0].ingestion.sources[0].caps[0].endDate: must be an ISO 8601 date or timestamp"),
    ({"ingestion.sources": [{"name": "no id"}]},
     "campaigns[0].ingestion.sources[0].sourceId: required field missing"),
    ({"delivery.revenueMilestones": [{"leadStatus": "delivered", "amount": 1, "currency": "usd"}]},
     "campaigns[0].delivery.revenueMilestones[0].currency: must be a three-letter ISO 4217 code in capitals"),
    ({"qualification.routingRules": [{"routeTo": {"campaignId": " "}}]},
     "campaigns[0].qualification.routingRules[0].routeTo.campaignId: must not be empty"),
    ({"qualification.rules": [{"subRules": [{"conditions": [{"field": "email", "operator": "matches",
                                                             "value": ["("]}]}]}]},
     "campaigns[0].qualification.rules[0].subRules[0].conditions[0].value[0]: invalid regular expression: "
     "missing ), unterminated subpattern at position 0"),
    ({"firstIntakeAction": {"enabled": True, "action": "workflow"}},
     "campaigns[0].firstIntakeAction.workflow: required when action is workflow"),
    ({"firstIntakeAction": {"action": "call"}},
     "campaigns[0].firstIntakeAction.action: must be one of human_review, engage, workflow"),
    ({"createdAt": "2026-11-21"}, "campaigns[0].createdAt: must be an ISO 8601 timestamp"),
    ({"delivery.distribution": {"method": "weighted", "endpoints": []}},
     "campaigns[0].delivery.distribution.endpoints: must name at least one active delivery endpoint"),
    ({"delivery.distribution": {"endpoints": [{"deliveryEndpointId": "ep_1", "active": False}]}},
     "campaigns[0].delivery.distribution.endpoints: must name at least one active delivery endpoint"),
    ({"delivery.distribution": {"endpoints": [{"deliveryEndpointId": "ep_1", "weight": 0}]}},
     "campaigns[0].delivery.distribution.endpoints[0].weight: must be greater than 0 and at most 1,000,000"),
    ({"delivery.distribution": {"endpoints": [{"deliveryEndpointId": "ep_1", "weight": -2.5}]}},
     "campaigns[0].delivery.distribution.endpoints[0].weight: must be greater than 0 and at most 1,000,000"),
    ({"delivery.distribution": {"endpoints": [{"deliveryEndpointId": "ep_1", "weight": 1e308}]}},
     "campaigns[0].delivery.distribution.endpoints[0].weight: must be greater than 0 and at most 1,000,000"),
    ({"delivery.distribution": {"endpoints": [{"deliveryEndpointId": "ep_1"}, {"deliveryEndpointId": "ep_1"}]}},
     "campaigns[0].delivery.distribution.endpoints: names 'ep_1' twice"),
    ({"delivery.distribution": {"method": "random", "endpoints": [{"deliveryEndpointId": "ep_1"}]}},
     "campaigns[0].delivery.distribution.method: must be one of priority, round_robin, weighted, auction"),
    ({"delivery.distribution": {"endpoints": [{"deliveryEndpointId": "ep_1",
                                               "deliveryLimits": [{"cap": 5, "action": "next_priority"}]}]}},
     "campaigns[0].delivery.distribution.endpoints[0].deliveryLimits: a buyer's own limits can only queue"
     " (the lead moves on to the next buyer)"),
])
def test_campaign_problem_paths(patch, problem):
    assert campaign_problem(patch) == [problem]


def test_cross_checks_report_every_problem():
    data = bundle_with(
        campaigns=[FULL_CAMPAIGN, copy.deepcopy(FULL_CAMPAIGN)],
        valueSets=[], deliveryEndpoints=[BUNDLE["deliveryEndpoints"][1], BUNDLE["deliveryEndpoints"][1]],
        questionnaires=[{"questionnaireId": "other", "name": "Other"}],
        pixels=BUNDLE["pixels"] * 2,
    )
    data["campaigns"][1]["ingestion"]["sources"].append({"sourceId": "src_1"})
    problems = problems_of(data)
    assert "campaigns[1].campaignId: duplicate of campaigns[0]" in problems
    assert "deliveryEndpoints[1].deliveryEndpointId: duplicate of deliveryEndpoints[0]" in problems
    assert "pixels[1].pixelId: duplicate of pixels[0]" in problems
    assert ("campaigns[1].ingestion.sources[1].sourceId: duplicate of campaigns[1].ingestion.sources[0]"
            in problems)
    assert "campaigns[0].questionnaireId: unknown questionnaire" in problems
    assert "campaigns[0].delivery.deliveryEndpointId: unknown delivery endpoint" in problems
    assert "campaigns[0].qualification.fallbackCampaigns[0]: unknown campaign" in problems
    assert "campaigns[0].qualification.routingRules[0].routeTo.campaignId: unknown campaign" in problems
    assert "campaigns[0].delivery.deliveryLimits[0].routeToCampaignId: unknown campaign" in problems
    assert "campaigns[0].qualification.rules[0].subRules[0].conditions[0].valueSetId: unknown value set" in problems
    assert ("campaigns[0].ingestion.sources[0].costMilestones[0].conditions.subRules[0].conditions[0]"
            ".valueSetId: unknown value set") in problems
    assert "campaigns[0].documents[0].conditions.subRules[0].conditions[0].valueSetId: unknown value set" in problems
    assert "sms.campaignProviders.HOME1: unknown campaign" in problems
    assert "campaigns[0].delivery.distribution.endpoints[0].deliveryEndpointId: unknown delivery endpoint" in problems
    assert len(problems) == 2 * 10 + 5  # per campaign: 10 dangling references


def test_duplicate_keys_in_catalog():
    entry = {"key": "k", "label": "K"}
    data = {"fieldLibrary": [entry, entry], "valueSets": [{"valueSetId": "v"}, {"valueSetId": "v"}],
            "questionnaires": [{"questionnaireId": "q", "name": "Q", "questions": [
                {"key": "a", "question": "A?"}, {"key": "a", "question": "A again?"}]}]}
    assert problems_of(data) == [
        "fieldLibrary[1].key: duplicate of fieldLibrary[0]",
        "valueSets[1].valueSetId: duplicate of valueSets[0]",
        "questionnaires[0].questions[1].key: duplicate of questionnaires[0].questions[0]",
    ]


def test_references_may_name_stored_items():
    data = bundle_with(campaigns=[FULL_CAMPAIGN], valueSets=[], deliveryEndpoints=[], questionnaires=[],
                       sms=None)
    bundle = load_json(data, known_value_sets=frozenset({"states"}), known_endpoints=frozenset({"ep_1", "ep_2"}),
                       known_campaigns=frozenset({"HOME1"}))
    assert bundle.campaigns[0].campaign_id == "AUTO1"
    problems = problems_of(data, known_value_sets=frozenset({"states"}), known_endpoints=frozenset({"ep_1", "ep_2"}),
                           known_campaigns=frozenset({"HOME1"}), known_questionnaires=frozenset({"q_x"}))
    assert problems == ["campaigns[0].questionnaireId: unknown questionnaire"]


def test_malformed_json_names_line_and_column():
    with pytest.raises(BundleError) as caught:
        load_bundle(b'{\n  "campaigns": [\n    {"campaignId": x}\n  ]\n}', "json")
    assert caught.value.problems == ["bundle: malformed JSON: invalid character (at line 3, column 20)"]


def test_malformed_toml_names_line_and_column():
    with pytest.raises(BundleError) as caught:
        load_bundle(b'[[campaigns]]\ncampaignId = "ABC"\nname =\n', "toml")
    assert caught.value.problems == ["bundle: malformed TOML: invalid value (at line 3, column 7)"]


def test_bundle_that_is_not_an_object():
    assert problems_of([1, 2]) == ["bundle: expected object, got array"]


def test_format_from_filename():
    assert format_from_filename("tenant.JSON") == "json"
    assert format_from_filename("/etc/x/tenant.toml") == "toml"
    with pytest.raises(BundleError):
        format_from_filename("tenant.yaml")


def test_split_secrets_clears_every_secret_and_names_it():
    stripped, secrets = split_secrets(load_json(BUNDLE))
    assert secrets == {
        "source:AUTO1:src_1:apiKey": "lss_plaintext_source_key",
        "endpoint:ep_1:auth.password": "endpoint-password",
        "endpoint:ep_2:auth.token": "endpoint-token",
        "sms:tw:authToken": "sms-auth-token",
        "sms:tx:apiKey": "sms-api-key",
        "pixel:px_1:accessToken": "pixel-token",
    }
    encoded = msgspec.json.encode(stripped).decode()
    assert not [s for s in SECRETS if s in encoded]
    assert stripped.campaigns[0].ingestion.sources[0].api_key_encrypted is not None
    assert stripped.delivery_endpoints[0].auth.username == "u"
    assert msgspec.json.decode(encoded, type=TenantBundle) == stripped


def test_secrets_stay_out_of_repr_and_problems():
    bundle = load_json(BUNDLE)
    shown = repr(bundle)
    assert not [s for s in SECRETS if s in shown]
    bad = bundle_with(pixels=[{"pixelId": "px", "platform": "social", "accessToken": 12345}])
    bad["deliveryEndpoints"][0]["auth"] = {"type": "header", "token": "endpoint-password"}
    problems = problems_of(bad)
    assert problems == ["deliveryEndpoints[0].auth.headerName: required for header auth, as a valid header name",
                        "pixels[0].accessToken: expected str, got int"]
    assert "endpoint-password" not in str(problems) and "12345" not in str(problems)


def test_public_campaign_strips_keys_and_keeps_prefix():
    campaign = load_json(BUNDLE).campaigns[0]
    shown = public_campaign(campaign)
    source = shown.ingestion.sources[0]
    assert source.api_key is None and source.api_key_encrypted is None and source.key_prefix == "lss_plai"
    assert campaign.ingestion.sources[0].api_key == "lss_plaintext_source_key"
    assert isinstance(shown, Campaign) and shown.name == campaign.name


def test_standard_fields_are_valid_and_unique():
    keys = [f.key for f in STANDARD_FIELDS]
    assert len(keys) == len(set(keys)) and all(f.is_standard for f in STANDARD_FIELDS)
    assert {"address.state", "attribution.gclid", "compliance.tcpaConsent", "age"} <= set(keys)
    load_json({"fieldLibrary": msgspec.to_builtins(STANDARD_FIELDS)})
