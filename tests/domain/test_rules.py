from datetime import date

import pytest

from appliance.domain.campaign import Condition, RuleSet, SubRule
from appliance.domain.rules import (
    MISSING, check_condition, evaluate_rule_set, matches, prepare_value_sets, qualify, resolve,
)

TODAY = date(2024, 6, 15)
VALUE_SETS = {"blocked_states": ["CA", "NY"], "numbers": [1, 2.5, True]}

FACTS = {
    "firstName": "Ann",
    "email": "ann@example.com",
    "phone": "555-123-4567",
    "address": {"street": "1 Main St", "city": "Austin", "state": "tx", "zip": "73301"},
    "dateOfBirth": "1990-06-16",
    "questionnaire": [
        {"key": "debt", "question": "How much debt?", "answer": "15000"},
        {"key": "products", "question": "Which?", "answer": ["Auto", "Home"]},
        {"key": "blank", "question": "Blank?", "answer": "   "},
    ],
    "attribution": {"params": {"utm_source": "Google"}},
    "customFields": {"signup": "2024-01-10", "a.b": "dotted"},
    "isTest": False,
    "sourceId": "src1",
}


def cond(field, operator, value=None, **kw):
    return Condition(field=field, operator=operator, value=value, **kw)


def check(c, facts=FACTS):
    return check_condition(c, facts, value_sets=VALUE_SETS, today=TODAY)


# ---- resolve ----------------------------------------------------------------------------


def test_resolve_paths():
    assert resolve(FACTS, "address.state", TODAY) == "tx"
    assert resolve(FACTS, "attribution.params.utm_source", TODAY) == "Google"
    assert resolve(FACTS, "questionnaire.debt", TODAY) == "15000"
    assert resolve(FACTS, "customFields.a.b", TODAY) == "dotted"
    assert resolve(FACTS, "sourceId", TODAY) == "src1"
    assert resolve(FACTS, "isTest", TODAY) is False


def test_resolve_missing_values():
    assert resolve(FACTS, "questionnaire.blank", TODAY) is MISSING
    assert resolve(FACTS, "questionnaire.nope", TODAY) is MISSING
    assert resolve(FACTS, "address.state.more", TODAY) is MISSING
    assert resolve(FACTS, "nothing", TODAY) is MISSING
    assert resolve(FACTS, None, TODAY) is MISSING
    assert resolve({"notes": None, "tags": []}, "notes", TODAY) is MISSING
    assert resolve({"notes": None, "tags": []}, "tags", TODAY) is MISSING


def test_resolve_questionnaire_object_form():
    assert resolve({"questionnaire": {"debt": 5}}, "questionnaire.debt", TODAY) == 5


def test_resolve_age():
    assert resolve(FACTS, "age", TODAY) == 33  # birthday is tomorrow
    assert resolve(FACTS, "age", date(2024, 6, 16)) == 34
    assert resolve({"dateOfBirth": "2000-02-30"}, "age", TODAY) is MISSING
    assert resolve({"dateOfBirth": "2030-01-01"}, "age", TODAY) is MISSING
    assert resolve({}, "age", TODAY) is MISSING


# ---- one test per operator: true, false, missing ----------------------------------------

OPERATOR_CASES = [
    # operator, field, value, expected when present, expected when missing
    ("equals", "address.state", ["CA", " TX "], True, False),
    ("equals", "address.state", ["CA"], False, False),
    ("not_equals", "address.state", ["CA"], True, True),
    ("not_equals", "address.state", ["TX"], False, True),
    ("contains", "email", ["EXAMPLE"], True, False),
    ("contains", "email", ["nope"], False, False),
    ("not_contains", "email", ["nope"], True, True),
    ("not_contains", "email", ["example"], False, True),
    ("starts_with", "firstName", ["x", "an"], True, False),
    ("starts_with", "firstName", ["nn"], False, False),
    ("ends_with", "email", [".COM"], True, False),
    ("ends_with", "email", [".org"], False, False),
    ("greater_than", "questionnaire.debt", [10000], True, False),
    ("greater_than", "questionnaire.debt", ["15000"], False, False),
    ("less_than", "questionnaire.debt", ["20000.5"], True, False),
    ("less_than", "questionnaire.debt", [15000], False, False),
    ("greater_or_equal", "questionnaire.debt", [15000], True, False),
    ("greater_or_equal", "questionnaire.debt", [15001], False, False),
    ("less_or_equal", "questionnaire.debt", [15000.0], True, False),
    ("less_or_equal", "questionnaire.debt", [14999], False, False),
    ("between", "questionnaire.debt", [15000, 15000], True, False),
    ("between", "questionnaire.debt", [1, 100], False, False),
    ("exists", "email", None, True, False),
    ("not_exists", "email", None, False, True),
    ("matches", "phone", [r"^\d{3}-\d{3}-\d{4}$"], True, False),
    ("matches", "phone", [r"^\+1"], False, False),
    ("age_between", None, [18, 33], True, False),
    ("age_between", None, [34, 99], False, False),
]


@pytest.mark.parametrize(("operator", "field", "value", "present", "missing"), OPERATOR_CASES)
def test_operator(operator, field, value, present, missing):
    assert check(cond(field, operator, value)) is present
    missing_field = None if operator == "age_between" else "customFields.absent"
    facts = {k: v for k, v in FACTS.items() if k != "dateOfBirth"}
    assert check(cond(missing_field, operator, value), facts) is missing


@pytest.mark.parametrize(("operator", "set_id", "present", "missing"), [
    ("in_value_set", "blocked_states", False, False),
    ("not_in_value_set", "blocked_states", True, True),
])
def test_value_set_operators(operator, set_id, present, missing):
    assert check(cond("address.state", operator, value_set_id=set_id)) is present
    assert check(cond("address.absent", operator, value_set_id=set_id)) is missing
    ny = {"address": {"state": " ny"}}
    assert check(cond("address.state", operator, value_set_id=set_id), ny) is not present


def test_value_set_members_compare_like_equals():
    c = cond("customFields.n", "in_value_set", value_set_id="numbers")
    assert check(c, {"customFields": {"n": "2.50"}})
    assert check(c, {"customFields": {"n": "TRUE"}})
    assert not check(c, {"customFields": {"n": "3"}})


def test_prepared_value_sets_behave_like_raw_ones():
    prepared = prepare_value_sets(VALUE_SETS)
    for operator in ("in_value_set", "not_in_value_set"):
        for set_id, value in (("blocked_states", " ca"), ("blocked_states", "TX"),
                              ("numbers", "2.5"), ("numbers", "true"), ("numbers", "1.0")):
            c = cond("customFields.v", operator, value_set_id=set_id)
            facts = {"customFields": {"v": value}}
            assert check_condition(c, facts, value_sets=prepared, today=TODAY) == check(c, facts)


def test_unknown_value_set_is_false_for_both():
    assert not check(cond("address.state", "in_value_set", value_set_id="nope"))
    assert not check(cond("address.state", "not_in_value_set", value_set_id="nope"))


def test_value_set_from_value_when_no_id():
    assert check(cond("address.state", "in_value_set", ["TX"]))


def test_list_fact_matches_any_element():
    assert check(cond("questionnaire.products", "equals", ["home"]))
    assert check(cond("questionnaire.products", "contains", ["aut"]))
    assert not check(cond("questionnaire.products", "not_equals", ["home"]))
    assert check(cond("questionnaire.products", "not_equals", ["boat"]))


def test_equals_numbers_and_booleans():
    assert check(cond("customFields.n", "equals", [42]), {"customFields": {"n": "42.0"}})
    assert check(cond("isTest", "equals", [False]))
    assert check(cond("isTest", "equals", ["false"]))
    assert not check(cond("isTest", "equals", [0]))


def test_dates_compare_as_dates():
    assert check(cond("customFields.signup", "greater_than", ["2023-12-31"]))
    assert check(cond("customFields.signup", "between", ["2024-01-01", "2024-01-31T00:00:00Z"]))
    assert not check(cond("customFields.signup", "greater_than", [5]))


def test_numeric_operator_false_on_non_numeric():
    assert not check(cond("firstName", "greater_than", [1]))
    assert not check(cond("firstName", "less_than", ["zzz"]))


def test_invalid_regex_is_false():
    # Config validation rejects bad patterns; the engine must still survive one set directly.
    c = cond("email", "matches", ["x"])
    c.value = ["(unclosed"]
    assert not check(c)
    c.value = ["(unclosed", "ANN@"]
    assert check(c)


def test_age_between_on_explicit_date_field():
    assert check(cond("dateOfBirth", "age_between", [33, 33]))


def test_empty_values_never_match():
    assert not check(cond("email", "equals", []))
    assert not check(cond("email", "contains", [""]))
    assert not check(cond("email", "greater_than", []))
    assert not check(cond("email", "between", [1]))


# ---- combination ------------------------------------------------------------------------

T = cond("address.state", "equals", ["TX"])
F = cond("address.state", "equals", ["CA"])
PROMPT = Condition(prompt="Does the lead sound unsure?")


def rule_set(op, *subs, name="rs"):
    return RuleSet(logical_operator=op, name=name,
                   sub_rules=[SubRule(logical_operator=o, conditions=list(cs)) for o, cs in subs])


@pytest.mark.parametrize(("outer", "subs", "expected"), [
    ("AND", [("AND", [T, T])], True),
    ("AND", [("AND", [T, F])], False),
    ("AND", [("OR", [T, F])], True),
    ("AND", [("OR", [F, F])], False),
    ("OR", [("AND", [T, F]), ("OR", [F, T])], True),
    ("OR", [("AND", [T, F]), ("OR", [F, F])], False),
    ("AND", [("AND", [T]), ("OR", [F, T])], True),
    ("AND", [("AND", [T]), ("OR", [F, F])], False),
    ("AND", [], False),
    ("OR", [("AND", [])], False),
    ("AND", [("AND", [T]), ("AND", [])], False),
])
def test_nested_and_or(outer, subs, expected):
    rs = rule_set(outer, *subs)
    result = evaluate_rule_set(rs, FACTS, value_sets=VALUE_SETS, today=TODAY)
    assert result.matched is expected
    assert matches(outer, rs.sub_rules, FACTS, value_sets=VALUE_SETS, today=TODAY) is expected


def test_prompt_without_evaluator_is_skipped():
    result = evaluate_rule_set(rule_set("AND", ("AND", [T, PROMPT])), FACTS,
                               value_sets=VALUE_SETS, today=TODAY)
    assert result.matched and result.skipped == ['prompt "Does the lead sound unsure?"']
    assert result.reasons == ["address.state equals [TX]"]


def test_all_skipped_sub_rule_is_ignored():
    rs = rule_set("AND", ("AND", [PROMPT]), ("AND", [T]))
    assert evaluate_rule_set(rs, FACTS, value_sets=VALUE_SETS, today=TODAY).matched
    only_prompts = rule_set("OR", ("AND", [PROMPT]))
    result = evaluate_rule_set(only_prompts, FACTS, value_sets=VALUE_SETS, today=TODAY)
    assert not result.matched and len(result.skipped) == 1


def test_prompt_evaluator_decides():
    def evaluator(condition, facts):
        return facts["firstName"] == "Ann"

    rs = rule_set("AND", ("AND", [PROMPT]))
    result = evaluate_rule_set(rs, FACTS, value_sets=VALUE_SETS, today=TODAY,
                               prompt_evaluator=evaluator)
    assert result.matched and not result.skipped
    assert not evaluate_rule_set(rs, FACTS, value_sets=VALUE_SETS, today=TODAY,
                                 prompt_evaluator=lambda c, f: False).matched
    assert evaluate_rule_set(rs, FACTS, value_sets=VALUE_SETS, today=TODAY,
                             prompt_evaluator=lambda c, f: None).skipped


def test_failing_prompt_evaluator_skips():
    def broken(condition, facts):
        raise RuntimeError("plugin down")

    rs = rule_set("AND", ("AND", [PROMPT, T]))
    result = evaluate_rule_set(rs, FACTS, value_sets=VALUE_SETS, today=TODAY,
                               prompt_evaluator=broken)
    assert result.matched and result.skipped


# ---- severity and qualification ---------------------------------------------------------


def sev(severity, condition=T):
    return Condition(field=condition.field, operator=condition.operator, value=condition.value,
                     max_severity=severity)


def test_severity_is_highest_of_true_conditions():
    rs = rule_set("AND", ("OR", [sev("flag"), sev("review"), sev("disqualify", F)]))
    result = evaluate_rule_set(rs, FACTS, value_sets=VALUE_SETS, today=TODAY)
    assert result.severity == "review"
    assert len(result.reasons) == 2
    rs = rule_set("AND", ("AND", [sev("flag"), sev("disqualify")]))
    assert evaluate_rule_set(rs, FACTS, value_sets=VALUE_SETS, today=TODAY).severity == "disqualify"


def test_severity_ignores_sub_rules_that_did_not_match():
    rs = rule_set("OR", ("AND", [sev("flag")]), ("AND", [sev("disqualify"), F]))
    assert evaluate_rule_set(rs, FACTS, value_sets=VALUE_SETS, today=TODAY).severity == "flag"


def test_unmatched_rule_set_has_no_severity():
    result = evaluate_rule_set(rule_set("AND", ("AND", [F])), FACTS, value_sets=VALUE_SETS,
                               today=TODAY)
    assert result.severity is None and result.reasons == []


def q(rule_sets, **kw):
    return qualify(rule_sets, FACTS, value_sets=VALUE_SETS, today=TODAY, **kw)


def test_qualify_passes_with_no_rule_sets():
    result = q([])
    assert result.passed and not result.hold_for_review and result.score == 100
    assert result.reason is None and result.results == []


def test_qualify_disqualify_review_flag_and_score():
    rule_sets = [
        rule_set("AND", ("AND", [sev("flag")]), name="flagged"),
        rule_set("AND", ("AND", [sev("review")]), name="needs review"),
        rule_set("AND", ("AND", [F]), name="clean"),
        rule_set("AND", ("AND", [sev("disqualify")]), name="blocked"),
    ]
    result = q(rule_sets)
    assert not result.passed and not result.hold_for_review
    assert result.flags == ["flagged"]
    assert result.score == 50
    assert result.reason == 'Disqualified by rule set "blocked": address.state equals [TX]'
    assert [r.matched for r in result.results] == [True, True, False, True]


def test_qualify_review_holds_without_disqualify():
    result = q([rule_set("AND", ("AND", [F])),
                rule_set("AND", ("AND", [sev("review")]), name=None)])
    assert result.passed and result.hold_for_review
    assert result.score == 50
    assert result.reason == 'Held for review by rule set "rule set 2": address.state equals [TX]'


def test_qualify_flag_does_not_fail():
    result = q([rule_set("AND", ("AND", [sev("flag")]), name="f")])
    assert result.passed and not result.hold_for_review and result.score == 100
    assert result.flags == ["f"] and result.reason is None


def test_qualify_filters_inactive_and_applies_at():
    inactive = rule_set("AND", ("AND", [T]), name="off")
    inactive.is_active = False
    delivery = rule_set("AND", ("AND", [T]), name="at delivery")
    delivery.applies_at = "delivery"
    result = q([inactive, delivery])
    assert result.passed and result.results == []
    result = q([inactive, delivery], applies_at="delivery")
    assert [r.name for r in result.results] == ["at delivery"] and not result.passed


def test_score_rounds():
    rule_sets = [rule_set("AND", ("AND", [T]))] + [rule_set("AND", ("AND", [F]))] * 2
    assert q(rule_sets).score == 67
