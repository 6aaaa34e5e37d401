"""Routing rule selection: active rules by ascending priority, first match."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date
from typing import Any

from appliance.domain.campaign import RoutingRule
from appliance.domain.rules import MISSING, Check, IdentityCache, PromptEvaluator, ValueSets, matches, plain_rules


# Routing rules are chosen on every submit: their order and matchers are worked out once per list.
_ORDERED = IdentityCache()


def _by_priority(routing_rules: Sequence[RoutingRule]) -> tuple[tuple[RoutingRule, Check | None], ...]:
    """(rule, its plain matcher or None when it has prompt conditions) of the active rules, in order."""
    ordered = _ORDERED.get(routing_rules)
    if ordered is MISSING:
        ordered = _ORDERED.put(routing_rules, None, tuple(
            (rule, plain_rules(rule.logical_operator, rule.sub_rules))
            for rule in sorted((r for r in routing_rules if r.active), key=lambda r: r.priority)))
    return ordered


def choose_route(routing_rules: Sequence[RoutingRule], facts: Mapping[str, Any], *,
                 value_sets: ValueSets, today: date,
                 prompt_evaluator: PromptEvaluator | None = None) -> RoutingRule | None:
    """The first active rule, by ascending priority, whose sub-rules match the facts.

    Ties keep list order (sorted() is stable). Prompt conditions follow the rules module:
    skipped without an evaluator, and a rule whose conditions are all skipped does not match.
    """
    for rule, plain in _by_priority(routing_rules):
        if plain(facts, today, value_sets) if plain is not None else matches(
                rule.logical_operator, rule.sub_rules, facts, value_sets=value_sets, today=today,
                prompt_evaluator=prompt_evaluator):
            return rule
    return None
