"""Routing rule selection: active rules by ascending priority, first match."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date
from typing import Any

from appliance.domain.campaign import RoutingRule
from appliance.domain.rules import MISSING, IdentityCache, PromptEvaluator, ValueSets, matches


# Routing rules are chosen on every submit: their order is worked out once per list.
_ORDERED = IdentityCache()


def _by_priority(routing_rules: Sequence[RoutingRule]) -> tuple[RoutingRule, ...]:
    ordered = _ORDERED.get(routing_rules)
    if ordered is MISSING:
        ordered = _ORDERED.put(routing_rules, None, tuple(sorted((r for r in routing_rules if r.active),
                                                                key=lambda r: r.priority)))
    return ordered


def choose_route(routing_rules: Sequence[RoutingRule], facts: Mapping[str, Any], *,
                 value_sets: ValueSets, today: date,
                 prompt_evaluator: PromptEvaluator | None = None) -> RoutingRule | None:
    """The first active rule, by ascending priority, whose sub-rules match the facts.

    Ties keep list order (sorted() is stable). Prompt conditions follow the rules module:
    skipped without an evaluator, and a rule whose conditions are all skipped does not match.
    """
    for rule in _by_priority(routing_rules):
        if matches(rule.logical_operator, rule.sub_rules, facts, value_sets=value_sets,
                   today=today, prompt_evaluator=prompt_evaluator):
            return rule
    return None
