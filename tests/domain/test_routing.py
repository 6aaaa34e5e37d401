from datetime import date

from appliance.domain.campaign import Condition, RouteTarget, RoutingRule, SubRule
from appliance.domain.routing import choose_route

TODAY = date(2024, 6, 15)
FACTS = {"address": {"state": "TX"}, "questionnaire": [{"key": "debt", "answer": "20000"}]}


def rule(name, priority, condition, *, active=True):
    return RoutingRule(route_name=name, priority=priority, active=active,
                       sub_rules=[SubRule(conditions=[condition])],
                       route_to=RouteTarget(campaign_id=name.upper()))


TEXAS = Condition(field="address.state", operator="equals", value=["tx"])
DEBT = Condition(field="questionnaire.debt", operator="greater_than", value=[10000])
NEVER = Condition(field="address.state", operator="equals", value=["CA"])


def route(rules):
    chosen = choose_route(rules, FACTS, value_sets={}, today=TODAY)
    return chosen.route_name if chosen else None


def test_lowest_priority_first():
    assert route([rule("b", 5, TEXAS), rule("a", 1, DEBT)]) == "a"


def test_ties_keep_list_order():
    assert route([rule("first", 2, TEXAS), rule("second", 2, DEBT)]) == "first"


def test_inactive_rules_are_skipped():
    assert route([rule("off", 0, TEXAS, active=False), rule("on", 9, DEBT)]) == "on"


def test_first_match_wins_over_non_matching_lower_priority():
    assert route([rule("no", 0, NEVER), rule("yes", 3, TEXAS)]) == "yes"


def test_no_match():
    assert route([rule("no", 0, NEVER)]) is None
    assert route([]) is None


def test_rule_without_sub_rules_never_matches():
    empty = RoutingRule(route_name="empty", priority=0, route_to=RouteTarget(campaign_id="E"))
    assert route([empty, rule("x", 1, TEXAS)]) == "x"


def test_prompt_only_rule_without_evaluator_does_not_match():
    prompt = rule("prompt", 0, Condition(prompt="Is this a business?"))
    assert route([prompt, rule("x", 1, TEXAS)]) == "x"
    chosen = choose_route([prompt], FACTS, value_sets={}, today=TODAY,
                          prompt_evaluator=lambda c, f: True)
    assert chosen is prompt
