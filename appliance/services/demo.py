"""The embedded demo: one tenant with sample campaigns, a questionnaire, a value set and a
delivery endpoint, so a fresh install answers real requests at once."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urlsplit

import msgspec

from appliance.services import tenancy, users
from appliance.runtime import Runtime

DEMO_TENANT = "Demo Agency"

_QUALIFY_ADULTS = {
    "name": "Adults in served states",
    "logicalOperator": "OR",
    "subRules": [
        {"logicalOperator": "AND", "conditions": [
            {"field": "age", "operator": "less_than", "value": [18], "maxSeverity": "disqualify"}]},
        {"logicalOperator": "AND", "conditions": [
            {"field": "address.state", "operator": "not_in_value_set", "valueSetId": "served-states",
             "maxSeverity": "disqualify"}]},
    ],
}

DEMO_BUNDLE = {
    "valueSets": [{"valueSetId": "served-states", "name": "States we serve",
                   "values": ["CA", "TX", "FL", "NY", "AZ"]}],
    "questionnaires": [{
        "questionnaireId": "auto-accident",
        "name": "Auto accident intake",
        "questions": [
            {"key": "accident_date", "question": "When did the accident happen?"},
            {"key": "injured", "question": "Were you injured?", "options": ["yes", "no"]},
            {"key": "at_fault", "question": "Were you at fault?", "options": ["yes", "no"]},
        ],
    }],
    "fieldLibrary": [
        {"key": "accident_date", "label": "Accident date", "question": "When did the accident happen?",
         "category": "question", "dataType": "date"},
        {"key": "injured", "label": "Injured", "question": "Were you injured?", "category": "question"},
        {"key": "at_fault", "label": "At fault", "question": "Were you at fault?", "category": "question"},
    ],
    "deliveryEndpoints": [{
        "deliveryEndpointId": "demo-buyer",
        "adapter": "demo",  # the buyer inside the appliance: every lead it gets is delivered
        # Test leads (isTest) go to a buyer's test address only; the demo buyer, which posts
        # nowhere, takes them there too (a reserved name: nothing is ever sent to it).
        "testUrl": "https://demo-buyer.invalid/test",
        "fieldMapping": [
            {"clientKey": "first_name", "leadField": "firstName", "required": True},
            {"clientKey": "last_name", "leadField": "lastName", "required": True},
            {"clientKey": "email", "leadField": "email", "required": True},
            {"clientKey": "phone", "leadField": "phoneE164", "required": True},
            {"clientKey": "vendor", "value": "demo-agency"},
        ],
        "responseRules": {"success": {"statusCodes": [200, 201]}, "clientLeadIdPath": "id"},
    }],
    "campaigns": [
        {
            "campaignId": "AUTO1", "name": "Auto accident - California",
            "offer": {"offerId": "off-auto", "offerName": "Auto Accident"},
            "client": {"clientId": "cli-smith", "clientName": "Smith & Partners"},
            "questionnaireId": "auto-accident",
            "qualification": {
                "rules": [_QUALIFY_ADULTS],
                "autoRoutingEnabled": True,
                "routingRules": [{
                    "routeName": "Texas leads to the Texas campaign", "priority": 1,
                    "subRules": [{"conditions": [{"field": "address.state", "operator": "equals", "value": ["TX"]}]}],
                    "routeTo": {"campaignId": "AUTO2", "clientName": "Lone Star Law", "offerName": "Auto Accident"},
                }],
                "fallbackCampaigns": ["AUTO2"],
            },
            "ingestion": {"sources": [{"sourceId": "src-web", "name": "Website form"}]},
            "delivery": {"deliveryEndpointId": "demo-buyer",
                         "deliveryLimits": [{"cap": 500, "type": "daily", "action": "queue"}],
                         "deliverySchedule": {"timezone": "America/Los_Angeles", "specificDays": [
                             {"day": d, "startTime": "08:00", "endTime": "18:00"}
                             for d in ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")]}},
            "tags": ["auto", "demo"],
        },
        {
            "campaignId": "AUTO2", "name": "Auto accident - Texas",
            "offer": {"offerId": "off-auto", "offerName": "Auto Accident"},
            "client": {"clientId": "cli-lonestar", "clientName": "Lone Star Law"},
            "questionnaireId": "auto-accident",
            # The banner's curl line posts the same lead here on every demo start: without
            # dedupe it is delivered each time, not answered `duplicate` from the second on.
            "qualification": {"rules": [_QUALIFY_ADULTS], "dedupeOverride": {"enabled": False}},
            "delivery": {"deliveryEndpointId": "demo-buyer"},
            "tags": ["auto", "demo"],
        },
        {
            "campaignId": "SOLAR", "name": "Residential solar",
            "offer": {"offerId": "off-solar", "offerName": "Solar Savings"},
            "client": {"clientId": "cli-sun", "clientName": "Sunny Installers"},
            "firstIntakeAction": {"enabled": True, "action": "human_review",
                                  "humanReview": {"reason": "New buyer: check every lead", "priority": "high"}},
            "delivery": {"deliveryEndpointId": "demo-buyer"},
            "tags": ["solar", "demo"],
        },
    ],
}


# A lead the demo's curl line submits: AUTO2 has no delivery window, and the lead passes its rules.
DEMO_LEAD = {"campaignId": "AUTO2", "firstName": "Ada", "lastName": "Lovelace", "email": "ada@example.com",
             "phone": "+15125550100", "address": {"state": "TX"}}


DEMO_OWNER = "owner@demo.example"


@dataclass(frozen=True)
class Demo:
    tenant_id: str
    key: str         # a fresh tenant key: keys are shown once
    owner: str       # the demo owner's email, for the console
    setup_path: str  # where the owner chooses a password (a fresh one-time link each run)


def ensure_demo_tenant(runtime: Runtime) -> Demo:
    """The demo tenant, its sample bundle imported again (an upsert: a demo made by an earlier
    version gets the current one), a fresh key for it, and a fresh setup link for its owner
    (every run prints new ones: both are shown once)."""
    existing = [tid for tid, name, _ in runtime.store.reader().tenants.list_tenants() if name == DEMO_TENANT]
    tenant_id = existing[0] if existing else tenancy.create_tenant(runtime, DEMO_TENANT)
    tenancy.import_bundle(runtime, tenant_id, msgspec.json.encode(DEMO_BUNDLE), "json")
    key = tenancy.create_key(runtime, tenant_id, name="demo").key
    owner = runtime.store.reader().users.by_email(tenant_id, DEMO_OWNER)
    if owner is None:
        url = asyncio.run(users.create(runtime, tenant_id, "cli", None,
                                       users.NewUser(email=DEMO_OWNER, name="Demo owner", role="owner"))).setup_url
    else:
        url = asyncio.run(users.reset_password(runtime, tenant_id, "cli", None, user_id=owner.user_id)).setup_url
    return Demo(tenant_id, key, DEMO_OWNER, urlsplit(url).path)
