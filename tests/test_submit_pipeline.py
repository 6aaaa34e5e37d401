"""Submit, steps 4 to 6 and 9: routing, qualification with fallback campaigns, the
first intake action, and what the submission records (snapshot, journey, delivery job)."""

from __future__ import annotations

import pytest

from tests.submit_support import (  # noqa: F401
    accepted, api, clock, condition, event_types, events_of, jobs, person, plain, read_lead, rule_set,
    setup_tenant, source_key,
)
from tests.engine import engine


def lead_and_submission(api, runtime, tenant, data):
    lead = read_lead(api, runtime, tenant, data["leadId"])
    return lead, lead["submissions"][-1]


# ---- routing ---------------------------------------------------------------------------------

def routing_rule(name, priority, target, *conditions, active=True, logic="AND"):
    return {"routeName": name, "priority": priority, "active": active, "logicalOperator": "AND",
            "subRules": [{"logicalOperator": logic, "conditions": list(conditions)}],
            "routeTo": {"campaignId": target}}


def state_is(*states):
    return condition("address.state", "equals", list(states))


@pytest.fixture
def routed(runtime):
    rules = [
        routing_rule("South west", 5, "SC3", state_is("CA", "TX", "AZ")),
        routing_rule("Disabled", 0, "SC4", state_is("CA", "TX", "AZ", "NV", "NY")),
        routing_rule("California", 1, "SC2", state_is("CA")),
        routing_rule("Nevada", 2, "SC5", state_is("NV")),       # SC5 is inactive
        routing_rule("Arizona later", 9, "SC2", state_is("AZ")),
    ]
    rules[1]["active"] = False
    return setup_tenant(
        runtime,
        plain("SC1", qualification={"autoRoutingEnabled": True, "routingRules": rules},
              ingestion={"sources": [{"sourceId": "web"},
                                     {"sourceId": "direct", "placement": {"applyRoutingRules": False}}]}),
        plain("SC2"), plain("SC3"), plain("SC4"), plain("SC5", active=False),
        plain("SC6", qualification={"routingRules": [routing_rule("Off", 1, "SC2", state_is("CA"))]}),
    )


@pytest.mark.parametrize(("state", "target", "rule_name"), [
    ("CA", "SC2", "California"),     # priority 1 beats priority 5; the inactive priority 0 is skipped
    ("TX", "SC3", "South west"),
    ("AZ", "SC3", "South west"),     # first match wins over the later AZ rule
])
def test_routing_lowest_priority_first_match_wins(api, runtime, routed, state, target, rule_name):
    data = accepted(api, routed, person(address={"state": state}))
    assert data["status"] == "qualified"
    lead, submission = lead_and_submission(api, runtime, routed, data)
    assert lead["campaignId"] == target
    assert lead["clientId"] == f"cli-{target}"
    assert submission["campaign"]["campaignId"] == target
    routing = submission["routing"]
    assert routing["wasRouted"] is True
    assert routing["routingMethod"] == "rule"
    assert routing["routingRuleName"] == rule_name
    assert routing["originalCampaignId"] == "SC1"
    assert routing["routedToCampaignId"] == target
    assert rule_name in routing["routingReason"]
    assert routing["routingEvaluatedAt"]
    routed_event = events_of(submission, "routed")
    assert routed_event and routed_event[0]["toCampaignId"] == target and routed_event[0]["reason"]
    assert [kind for kind, _ in jobs(runtime, data["submissionId"])] == ["deliver"]


def test_no_rule_matches_stays_on_the_original(api, runtime, routed):
    data = accepted(api, routed, person(address={"state": "NY"}))
    lead, submission = lead_and_submission(api, runtime, routed, data)
    assert lead["campaignId"] == "SC1"
    assert submission["routing"]["wasRouted"] is False
    assert submission["routing"]["routingMethod"] == "original"
    assert submission["routing"]["routingRuleName"] is None


def test_inactive_target_is_not_routed(api, runtime, routed):
    data = accepted(api, routed, person(address={"state": "NV"}))
    lead, submission = lead_and_submission(api, runtime, routed, data)
    assert lead["campaignId"] == "SC1"
    assert submission["routing"]["wasRouted"] is False
    assert submission["routing"]["routingMethod"] == "original"
    skipped = events_of(submission, "routing_skipped")
    assert skipped and "SC5" in skipped[0]["reason"]


def test_source_placement_can_switch_routing_off(api, runtime, routed):
    web, direct = source_key(runtime, routed, "web"), source_key(runtime, routed, "direct")
    assert read_lead(api, runtime, routed, accepted(api, web, person(address={"state": "CA"}))["leadId"])[
        "campaignId"] == "SC2"
    data = accepted(api, direct, person(address={"state": "CA"}))
    lead, submission = lead_and_submission(api, runtime, routed, data)
    assert lead["campaignId"] == "SC1"
    assert submission["routing"]["wasRouted"] is False


def test_routing_needs_auto_routing_enabled(api, runtime, routed):
    data = accepted(api, routed, person("SC6", address={"state": "CA"}))
    assert read_lead(api, runtime, routed, data["leadId"])["campaignId"] == "SC6"


def test_routed_lead_is_qualified_against_the_target(api, runtime):
    tenant = setup_tenant(
        runtime,
        plain("SC1", qualification={"autoRoutingEnabled": True,
                                    "routingRules": [routing_rule("CA", 1, "SC2", state_is("CA"))]}),
        plain("SC2", qualification={"rules": [rule_set(condition("email", "ends_with", ["@spam.com"]),
                                                       name="no spam")]}),
    )
    data = accepted(api, tenant, person(address={"state": "CA"}, email="x@spam.com"))
    assert data["status"] == "disqualified"
    lead, submission = lead_and_submission(api, runtime, tenant, data)
    assert lead["campaignId"] == "SC2"
    assert "no spam" in submission["qualification"]["reason"]
    assert accepted(api, tenant, person(email="y@spam.com"))["status"] == "qualified"  # SC1 has no rule


# ---- qualification -----------------------------------------------------------------------------

CASES = [
    # (id, condition, body fields that match it, body fields that do not)
    ("equals-any-of", condition("address.state", "equals", ["CA", "TX"]),
     {"address": {"state": "tx"}}, {"address": {"state": "NY"}}),
    ("not_equals", condition("country", "not_equals", ["US"]), {"country": "GB", "phone": "+44 20 7946 0000"},
     {"country": "US"}),
    ("contains", condition("email", "contains", ["spam"]), {"email": "a.spammer@example.com"}, {}),
    ("not_contains", condition("notes", "not_contains", ["ok"]), {"notes": "bad"}, {"notes": "all OK"}),
    ("starts_with", condition("address.zip", "starts_with", ["9"]), {"address": {"zip": "94105"}},
     {"address": {"zip": "10001"}}),
    ("ends_with", condition("email", "ends_with", [".ru"]), {"email": "x@mail.ru"}, {}),
    ("greater_than", condition("questionnaire.weeks", "greater_than", [10]), {"questionnaire": {"weeks": 11}},
     {"questionnaire": {"weeks": 10}}),
    ("less_than", condition("customFields.score", "less_than", [5]), {"customFields": {"score": "4"}},
     {"customFields": {"score": 5}}),
    ("greater_or_equal", condition("questionnaire.weeks", "greater_or_equal", [10]),
     {"questionnaire": {"weeks": 10}}, {"questionnaire": {"weeks": 9}}),
    ("less_or_equal", condition("questionnaire.weeks", "less_or_equal", [10]), {"questionnaire": {"weeks": 10}},
     {"questionnaire": {"weeks": 11}}),
    ("between", condition("questionnaire.weeks", "between", [3, 5]), {"questionnaire": {"weeks": 5}},
     {"questionnaire": {"weeks": 6}}),
    ("exists", condition("attribution.gclid", "exists"), {"attribution": {"gclid": "g"}}, {}),
    ("not_exists", condition("compliance.trustedFormCertUrl", "not_exists"), {},
     {"compliance": {"trustedFormCertUrl": "https://cert.example.com/1"}}),
    ("in_value_set", condition("address.state", "in_value_set", valueSetId="banned"),
     {"address": {"state": "WA"}}, {"address": {"state": "CA"}}),
    ("not_in_value_set", condition("address.state", "not_in_value_set", valueSetId="banned"),
     {"address": {"state": "CA"}}, {"address": {"state": "OR"}}),
    ("matches", condition("phone", "matches", [r"^\+1 900"]), {"phone": "+1 900 555 0100"}, {}),
    ("age_between", condition("age", "age_between", [0, 17]), {"dateOfBirth": "2010-03-11"},
     {"dateOfBirth": "2008-03-10"}),
    ("isTest", condition("isTest", "equals", [True]), {"isTest": True}, {}),
    ("sourceId", condition("sourceId", "equals", ["bad-source"]), None, {}),
]


@pytest.fixture
def operators(runtime):
    campaigns = [plain(f"Q{i:02d}", qualification={"rules": [rule_set(case[1], name=f"rule {case[0]}")]})
                 for i, case in enumerate(CASES)]
    campaigns[-1]["ingestion"] = {"sources": [{"sourceId": "bad-source"}]}
    return setup_tenant(runtime, *campaigns, valueSets=[{"valueSetId": "banned", "values": ["WA", "OR"]}])


@pytest.mark.parametrize(("index", "hit", "miss"), [(i, c[2], c[3]) for i, c in enumerate(CASES)],
                         ids=[c[0] for c in CASES])
def test_operators_through_submit(api, runtime, operators, index, hit, miss):
    code = f"Q{index:02d}"
    if hit is None:  # sourceId: the lead takes the source of its key
        hit_data = accepted(api, source_key(runtime, operators, "bad-source"), person(code))
    else:
        hit_data = accepted(api, operators, person(code, **hit))
    assert hit_data["status"] == "disqualified"
    submission = read_lead(api, runtime, operators, hit_data["leadId"])["submissions"][0]
    assert f"rule {CASES[index][0]}" in submission["qualification"]["reason"]
    assert submission["qualification"]["passed"] is False
    assert submission["qualification"]["score"] == 0
    assert accepted(api, operators, person(code, **miss))["status"] == "qualified"


def logic_tenant(runtime, outer, inner):
    rules = {"rules": [{"name": "combo", "logicalOperator": outer, "subRules": [
        {"logicalOperator": inner, "conditions": [state_is("CA"), condition("questionnaire.injured", "equals",
                                                                            ["no"])]},
        {"logicalOperator": inner, "conditions": [condition("country", "equals", ["CA"]),
                                                  condition("notes", "contains", ["fraud"])]},
    ]}]}
    return setup_tenant(runtime, plain("SC1", qualification=rules))


@pytest.mark.parametrize(("outer", "inner", "fields", "status"), [
    ("AND", "AND", {"address": {"state": "CA"}, "questionnaire": {"injured": "no"}}, "qualified"),
    ("AND", "AND", {"address": {"state": "CA"}, "questionnaire": {"injured": "no"}, "country": "CA",
                    "notes": "fraud", "phone": "+1 416 555 0100"}, "disqualified"),
    ("AND", "OR", {"address": {"state": "CA"}, "notes": "fraud"}, "disqualified"),
    ("AND", "OR", {"address": {"state": "CA"}}, "qualified"),
    ("OR", "AND", {"address": {"state": "CA"}, "questionnaire": {"injured": "no"}}, "disqualified"),
    ("OR", "AND", {"address": {"state": "CA"}, "notes": "fraud"}, "qualified"),
    ("OR", "OR", {"notes": "possible fraud"}, "disqualified"),
    ("OR", "OR", {"address": {"state": "NY"}}, "qualified"),
])
def test_and_or_at_both_levels(api, runtime, outer, inner, fields, status):
    tenant = logic_tenant(runtime, outer, inner)
    assert accepted(api, tenant, person(**fields))["status"] == status


def severity_tenant(runtime):
    def rules(*sets):
        return {"qualification": {"rules": list(sets)}}
    ca = state_is("CA")
    return setup_tenant(
        runtime,
        plain("DIS", **rules(rule_set(ca, name="dis"))),                                  # default disqualify
        plain("REV", **rules(rule_set({**ca, "maxSeverity": "review"}, name="rev"))),
        plain("FLG", **rules(rule_set({**ca, "maxSeverity": "flag"}, name="flg"))),
        plain("MIX", **rules(rule_set({**ca, "maxSeverity": "flag"},
                                      {**condition("email", "exists"), "maxSeverity": "review"}, name="mix"))),
        plain("TWO", **rules(rule_set(ca, name="first"), rule_set(condition("notes", "exists"), name="second"),
                             rule_set(condition("country", "equals", ["MX"]), name="third"),
                             rule_set({**condition("email", "exists"), "maxSeverity": "flag"}, name="fourth"))),
        plain("OFF", **rules(rule_set(ca, name="inactive", isActive=False),
                             rule_set(ca, name="at delivery", appliesAt="delivery"))),
    )


def test_severity_disqualify(api, runtime):
    tenant = severity_tenant(runtime)
    data = accepted(api, tenant, person("DIS", address={"state": "CA"}))
    assert data["status"] == "disqualified"
    lead, submission = lead_and_submission(api, runtime, tenant, data)
    assert lead["approval"] is None
    assert submission["qualification"]["passed"] is False
    assert submission["qualification"]["method"] == "rules"
    assert 'Disqualified by rule set "dis"' in submission["qualification"]["reason"]
    assert submission["qualifiedAt"] is None
    assert jobs(runtime, data["submissionId"]) == []


def test_rule_disqualification_reason_is_the_submission_result(api, runtime):
    tenant = severity_tenant(runtime)
    data = accepted(api, tenant, person("DIS", address={"state": "CA"}))
    submission = lead_and_submission(api, runtime, tenant, data)[1]
    assert submission["result"] == submission["qualification"]["reason"]
    assert "dis" in submission["result"]


def test_severity_review_holds_for_approval(api, runtime):
    tenant = severity_tenant(runtime)
    data = accepted(api, tenant, person("REV", address={"state": "CA"}))
    assert data["status"] == "pending_action"
    lead, submission = lead_and_submission(api, runtime, tenant, data)
    assert lead["approval"]["status"] == "pending"
    assert lead["approval"]["campaignId"] == "REV"
    assert "rev" in lead["approval"]["reason"]
    assert submission["qualification"]["passed"] is True
    assert submission["status"] == "pending_action"
    assert events_of(submission, "held_for_review")
    assert jobs(runtime, data["submissionId"]) == []


def test_severity_flag_records_only(api, runtime):
    tenant = severity_tenant(runtime)
    data = accepted(api, tenant, person("FLG", address={"state": "CA"}))
    assert data["status"] == "qualified"
    lead, submission = lead_and_submission(api, runtime, tenant, data)
    assert lead["approval"] is None
    assert submission["qualification"]["score"] == 100
    assert events_of(submission, "qualification")[0]["details"]["flags"] == ["flg"]
    assert [kind for kind, _ in jobs(runtime, data["submissionId"])] == ["deliver"]


def test_highest_severity_of_matched_conditions_wins(api, runtime):
    tenant = severity_tenant(runtime)
    assert accepted(api, tenant, person("MIX", address={"state": "CA"}))["status"] == "pending_action"


def test_score_counts_rule_sets_not_failed(api, runtime):
    tenant = severity_tenant(runtime)
    data = accepted(api, tenant, person("TWO", address={"state": "CA"}, notes="n"))
    assert data["status"] == "disqualified"
    submission = lead_and_submission(api, runtime, tenant, data)[1]
    assert submission["qualification"]["score"] == 50  # 2 of 4 failed; the flag does not fail
    assert '"first"' in submission["qualification"]["reason"]  # the first disqualifying rule set
    data = accepted(api, tenant, person("TWO", address={"state": "NY"}))
    assert lead_and_submission(api, runtime, tenant, data)[1]["qualification"]["score"] == 100


def test_inactive_and_delivery_rule_sets_do_not_apply_at_ingestion(api, runtime):
    tenant = severity_tenant(runtime)
    assert accepted(api, tenant, person("OFF", address={"state": "CA"}))["status"] == "qualified"


def test_missing_value_makes_positive_operators_false(api, runtime):
    tenant = setup_tenant(runtime, plain("SC1", qualification={"rules": [
        rule_set(condition("questionnaire.weeks", "less_than", [100]), name="few weeks"),
        rule_set(condition("address.zip", "not_equals", ["12345"]), name="zip")]}))
    data = accepted(api, tenant, person())  # no weeks (false), no zip (not_equals true)
    assert data["status"] == "disqualified"
    assert '"zip"' in read_lead(api, runtime, tenant, data["leadId"])["submissions"][0]["qualification"]["reason"]


# ---- fallback campaigns --------------------------------------------------------------------------

@pytest.fixture
def fallback(runtime):
    block_all = {"rules": [rule_set(condition("email", "exists"), name="nobody")]}
    block_ca = {"rules": [rule_set(state_is("CA"), name="no CA")]}
    return setup_tenant(
        runtime,
        plain("SC1", qualification={**block_ca, "fallbackCampaigns": ["FB0", "FB1", "FB2", "FB3"]},
              ingestion={"sources": [{"sourceId": "web"},
                                     {"sourceId": "strict", "placement": {"applyFallbackCampaigns": False}}]}),
        plain("FB0", active=False),
        plain("FB1", qualification=block_all),
        plain("FB2"),
        plain("FB3"),
    )


def test_fallback_first_that_qualifies_wins(api, runtime, fallback):
    data = accepted(api, fallback, person(address={"state": "CA"}))
    assert data["status"] == "qualified"
    lead, submission = lead_and_submission(api, runtime, fallback, data)
    assert lead["campaignId"] == "FB2"
    assert submission["campaign"]["campaignId"] == "FB2"
    routing = submission["routing"]
    assert routing["routingMethod"] == "fallback"
    assert routing["wasRouted"] is True
    assert routing["originalCampaignId"] == "SC1"
    assert routing["routedToCampaignId"] == "FB2"
    alternatives = [(a["campaignId"], a["qualified"], a["priority"]) for a in routing["alternativeCampaigns"]]
    assert alternatives == [("FB0", False, 1), ("FB1", False, 2), ("FB2", True, 3)]  # FB3 never tried
    assert all(a["reason"] for a in routing["alternativeCampaigns"])
    assert submission["qualification"]["passed"] is True
    assert submission["qualification"]["originalCampaignQualified"] is False
    assert events_of(submission, "fallback")[0]["toCampaignId"] == "FB2"
    assert [kind for kind, _ in jobs(runtime, data["submissionId"])] == ["deliver"]


def test_no_fallback_when_the_campaign_qualifies(api, runtime, fallback):
    data = accepted(api, fallback, person(address={"state": "NY"}))
    lead, submission = lead_and_submission(api, runtime, fallback, data)
    assert lead["campaignId"] == "SC1"
    assert submission["routing"]["alternativeCampaigns"] == []
    assert submission["qualification"]["originalCampaignQualified"] is True


def test_placement_can_switch_fallback_off(api, runtime, fallback):
    strict = source_key(runtime, fallback, "strict")
    data = accepted(api, strict, person(address={"state": "CA"}))
    assert data["status"] == "disqualified"
    lead, submission = lead_and_submission(api, runtime, fallback, data)
    assert lead["campaignId"] == "SC1"
    assert submission["routing"]["alternativeCampaigns"] == []
    web = source_key(runtime, fallback, "web")
    assert accepted(api, web, person(address={"state": "CA"}))["status"] == "qualified"


def test_every_fallback_failing_is_disqualified(api, runtime):
    block_all = {"rules": [rule_set(condition("email", "exists"), name="nobody")]}
    tenant = setup_tenant(runtime, plain("SC1", qualification={**block_all, "fallbackCampaigns": ["FB1"]}),
                          plain("FB1", qualification=block_all))
    data = accepted(api, tenant, person())
    assert data["status"] == "disqualified"
    lead, submission = lead_and_submission(api, runtime, tenant, data)
    assert lead["campaignId"] == "SC1"
    assert [a["qualified"] for a in submission["routing"]["alternativeCampaigns"]] == [False]


# ---- first intake action ----------------------------------------------------------------------

@pytest.fixture
def actions(runtime):
    return setup_tenant(
        runtime,
        plain("HR1", firstIntakeAction={"enabled": True, "action": "human_review",
                                        "humanReview": {"reason": "new buyer", "priority": "high"}}),
        plain("EN1", firstIntakeAction={"enabled": True, "action": "engage", "engage": {"goalId": "goal-1"}}),
        plain("WF1", firstIntakeAction={"enabled": True, "action": "workflow",
                                        "workflow": {"workflowDefinitionId": "wf-1"}}),
        plain("OFF", firstIntakeAction={"enabled": False, "action": "human_review"}),
    )


def test_human_review_holds_with_pending_approval(api, runtime, actions):
    data = accepted(api, actions, person("HR1"))
    assert data["status"] == "pending_action"
    lead, submission = lead_and_submission(api, runtime, actions, data)
    assert lead["status"] == "pending_action"
    assert lead["approval"]["status"] == "pending"
    assert lead["approval"]["campaignId"] == "HR1"
    assert lead["approval"]["reason"] == "new buyer"
    assert submission["status"] == "pending_action"
    assert submission["firstSubmissionActions"][0]["action"] == "human_review"
    assert events_of(submission, "first_intake_action")
    assert jobs(runtime, data["submissionId"]) == []


@pytest.mark.parametrize(("code", "action"), [("EN1", "engage"), ("WF1", "workflow")])
def test_engage_and_workflow_hold_without_approval(api, runtime, actions, code, action):
    data = accepted(api, actions, person(code))
    assert data["status"] == "pending_action"
    lead, submission = lead_and_submission(api, runtime, actions, data)
    assert lead["approval"] is None
    assert submission["firstSubmissionActions"][0]["action"] == action
    assert events_of(submission, "first_intake_action")[0]["details"]["action"] == action
    assert jobs(runtime, data["submissionId"]) == []


def test_disabled_intake_action_does_nothing(api, runtime, actions):
    data = accepted(api, actions, person("OFF"))
    assert data["status"] == "qualified"
    assert read_lead(api, runtime, actions, data["leadId"])["approval"] is None


def test_intake_action_does_not_apply_to_disqualified_leads(api, runtime):
    tenant = setup_tenant(runtime, plain("HR1", firstIntakeAction={"enabled": True, "action": "human_review"},
                                         qualification={"rules": [rule_set(state_is("CA"))]}))
    data = accepted(api, tenant, person("HR1", address={"state": "CA"}))
    assert data["status"] == "disqualified"
    assert read_lead(api, runtime, tenant, data["leadId"])["approval"] is None


# ---- what the submission records -----------------------------------------------------------------

def test_submission_record_of_a_qualified_lead(api, runtime, clock):
    tenant = setup_tenant(runtime, plain("SC1", name="Auto Accident West", client=("cli-9", "Smith & Partners Law"),
                                         offer=("off-9", "Auto Injury")))
    data = accepted(api, tenant, person())
    lead, submission = lead_and_submission(api, runtime, tenant, data)
    assert submission["submissionId"] == data["submissionId"]
    assert submission["leadId"] == data["leadId"]
    assert submission["submissionNumber"] == 1
    assert submission["flowType"] == "standard"
    assert submission["status"] == "qualified"
    campaign = submission["campaign"]
    assert {k: campaign[k] for k in ("campaignId", "name", "clientId", "clientName", "offerId", "offerName")} == {
        "campaignId": "SC1", "name": "Auto Accident West", "clientId": "cli-9", "clientName": "Smith & Partners Law",
        "offerId": "off-9", "offerName": "Auto Injury"}
    assert campaign["clientAbbrev"] and campaign["offerAbbrev"]
    assert submission["submittedAt"] == "2026-03-10T15:00:00.000Z"
    assert submission["qualifiedAt"] == "2026-03-10T15:00:00.000Z"
    assert submission["qualification"] == {"passed": True, "originalCampaignQualified": True, "score": 100,
                                           "method": "rules", "reason": None,
                                           "qualifiedAt": "2026-03-10T15:00:00.000Z"}
    types = event_types(submission)
    assert types[0] == "received"
    assert "qualification" in types
    assert types[-1] == "delivery_scheduled"
    for journey_event in submission["journeyEvents"]:
        assert journey_event["timestamp"] == "2026-03-10T15:00:00.000Z"
        if journey_event["type"] != "delivery_scheduled":
            assert journey_event["reason"], journey_event
    assert jobs(runtime, data["submissionId"]) == [("deliver", "ready")]
    assert lead["createdAt"] == "2026-03-10T15:00:00.000Z"


def test_journey_events_name_each_step(api, runtime, fallback):
    data = accepted(api, fallback, person(address={"state": "CA"}))
    submission = lead_and_submission(api, runtime, fallback, data)[1]
    types = event_types(submission)
    assert types.index("received") < types.index("qualification") < types.index("fallback") < types.index(
        "delivery_scheduled")
    assert "no CA" in events_of(submission, "qualification")[0]["reason"]


def test_delivery_job_exists_exactly_for_qualified_leads(api, runtime):
    tenant = setup_tenant(
        runtime,
        plain("SC1", qualification={"rules": [rule_set(state_is("CA"), name="no CA"),
                                              rule_set({**state_is("TX"), "maxSeverity": "review"}, name="TX")]}),
        plain("EN1", firstIntakeAction={"enabled": True, "action": "engage", "engage": {"goalId": "g"}}),
    )
    original = person()
    outcomes = {
        "qualified": accepted(api, tenant, original),
        "disqualified": accepted(api, tenant, person(address={"state": "CA"})),
        "duplicate": accepted(api, tenant, {**person(), "email": original["email"]}),
        "pending_action": accepted(api, tenant, person(address={"state": "TX"})),
        "engaged": accepted(api, tenant, person("EN1")),
    }
    for expected, data in outcomes.items():
        assert data["status"] == ("pending_action" if expected == "engaged" else expected)
        kinds = [kind for kind, _ in jobs(runtime, data["submissionId"])]
        assert kinds == (["deliver"] if expected == "qualified" else []), expected
    total = engine(runtime.store).reader().execute("SELECT count(*) FROM jobs WHERE kind = 'deliver'").fetchone()[0]
    assert total == 1
