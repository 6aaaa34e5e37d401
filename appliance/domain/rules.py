"""Condition engine for qualification rule sets and routing rules.

Facts are a plain dict shaped like the submit body (camelCase keys, questionnaire in its array
form `[{key, question, answer}]`) plus a top-level `sourceId`.

Semantics decided here:
- Paths are dotted (`address.state`, `attribution.params.utm_source`); a key that itself
  contains dots is found too. `questionnaire.<key>` is the answer of the entry with that key
  (the object form `{key: answer}` is read as well). `age` is whole years from `dateOfBirth`
  at `today`, missing when the date is absent, not YYYY-MM-DD, or in the future.
- Missing values: None, a string that is empty after trimming, an empty list and an empty
  object all count as missing. A missing value makes every operator false except
  `not_exists`, `not_equals`, `not_contains` and `not_in_value_set`, which are true.
- Strings compare trimmed and case-insensitively (`matches` too). Booleans compare as
  "true"/"false". Two values that both read as numbers ("42", 42.0) compare as numbers, so
  equality of "042" and "42" holds.
- `value` is an array. equals / contains / starts_with / ends_with / matches hold when any
  value matches (empty strings in `value` never match for the substring operators); the not_*
  operators are their negations. The ordering operators use the first value, `between` and
  `age_between` the first two as an inclusive [lo, hi]. Ordering compares numbers when both
  sides are numeric, else instants when both sides are ISO dates or timestamps (a date is
  midnight UTC, a naive timestamp is UTC), else it is false.
- A list-valued fact (a multi-select answer) satisfies a positive operator when any element
  does; a nested object never equals or contains anything, but it `exists`.
- `in_value_set` reads `value_sets[valueSetId]` (members compare like `equals`; fold them once
  with `prepare_value_sets`), or `value` itself when no id is given; an unknown id makes both
  set operators false (a missing fact still makes `not_in_value_set` true).
- An invalid regex makes `matches` false. No operator raises on any JSON value.
- A `prompt` condition is decided by the prompt evaluator; with none, a None verdict or an
  evaluator that raises, it is skipped: left out of its sub-rule's AND/OR. A sub-rule with only
  skipped conditions is left out of the rule set; a rule set with nothing left does not match.
  Empty sub-rule or condition lists do not match.
- A qualification rule set describes a disqualifying situation: when it matches, its severity
  is the highest `maxSeverity` (flag < review < disqualify) among the true conditions of the
  sub-rules that matched; those conditions are the reasons.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, date, datetime
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Final, NamedTuple

import msgspec

from appliance.domain.campaign import Condition, RuleSet, Severity, SubRule
from appliance.domain.normalize import age_on, parse_date


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()

PromptEvaluator = Callable[[Condition, dict], "bool | None"]
ValueSets = Mapping[str, Iterable[Any]]

_NO_VALUE_SETS: ValueSets = MappingProxyType({})
_SEVERITY_RANK: Final = {"flag": 0, "review": 1, "disqualify": 2}
_RANKED_SEVERITY: Final = ("flag", "review", "disqualify")
_NEGATED: Final = frozenset({"not_equals", "not_contains", "not_in_value_set", "not_exists"})
_ORDERING: Final = {
    "greater_than": lambda a, b: a > b,
    "less_than": lambda a, b: a < b,
    "greater_or_equal": lambda a, b: a >= b,
    "less_or_equal": lambda a, b: a <= b,
}

_INT = re.compile(r"[+-]?\d+", re.ASCII)
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}[T ].+", re.ASCII | re.DOTALL)
_QUESTIONNAIRE = "questionnaire."


class RuleSetResult(msgspec.Struct, kw_only=True):
    name: str | None
    matched: bool
    severity: Severity | None = None
    reasons: list[str] = []
    skipped: list[str] = []


class QualificationResult(msgspec.Struct, kw_only=True):
    passed: bool
    hold_for_review: bool
    flags: list[str]
    score: int
    reason: str | None
    results: list[RuleSetResult]


# ---- facts ------------------------------------------------------------------------------


def is_absent(value: Any) -> bool:
    """Missing for rules and mappings: None, MISSING, blank text, empty list or object."""
    if value is None or value is MISSING:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, (list, dict)):
        return not value
    return False


def _walk(node: Any, path: str) -> Any:
    # `type(...) is dict` first: facts are plain dicts, and an ABC isinstance check is slow.
    while type(node) is dict or isinstance(node, Mapping):
        if path in node:
            return node[path]
        head, dot, path = path.partition(".")
        if not dot:
            return MISSING
        node = node.get(head, MISSING)
    return MISSING


def _answer(questionnaire: Any, key: str) -> Any:
    if isinstance(questionnaire, list):
        for entry in questionnaire:
            if (type(entry) is dict or isinstance(entry, Mapping)) and entry.get("key") == key:
                return entry.get("answer", MISSING)
        return MISSING
    if isinstance(questionnaire, Mapping):
        return questionnaire.get(key, MISSING)
    return MISSING


# (date of birth text, today, age) of the last call: a campaign's age rules (a minimum and a
# maximum) read the same lead's age one after another. One tuple, swapped whole, for threads.
_last_age: tuple[str | None, date | None, int | None] = (None, None, None)


def _age_from(value: Any, today: date) -> int | None:
    global _last_age
    if not isinstance(value, str):
        return None
    last = _last_age
    if last[0] == value and last[1] == today:
        return last[2]
    dob = parse_date(value.strip())
    age = None if dob is None or dob > today else age_on(dob, today)
    _last_age = (value, today, age)
    return age


def resolve(facts: Mapping[str, Any], path: str | None, today: date) -> Any:
    """The value at `path` in `facts`, or MISSING (see the module docstring)."""
    if not path:
        return MISSING
    if path == "age":
        if isinstance(today, datetime):
            today = today.date()
        age = _age_from(facts.get("dateOfBirth"), today)
        return MISSING if age is None else age
    if path.startswith(_QUESTIONNAIRE):
        value = _answer(facts.get("questionnaire"), path[len(_QUESTIONNAIRE):])
    else:
        value = _walk(facts, path)
    return MISSING if is_absent(value) else value


# ---- scalar coercions -------------------------------------------------------------------


def as_number(x: Any) -> int | float | None:
    """A finite number, or a string that reads as one ("42", " 3.5 "); None otherwise (bools too)."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, str):
        s = x.strip()
        try:
            if _INT.fullmatch(s):
                return int(s)
            if _DECIMAL.fullmatch(s):
                f = float(s)
                return f if math.isfinite(f) else None
        except ValueError:  # int() refuses more than 4300 digits
            return None
    return None


def _raw_text(x: Any) -> str | None:
    if isinstance(x, str):
        return x.strip()
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float):
        if math.isfinite(x) and x.is_integer() and abs(x) < 1e16:
            return str(int(x))
        return repr(x)
    if isinstance(x, int):
        try:
            return str(x)
        except ValueError:
            return None
    return None


def _text(x: Any) -> str | None:
    raw = _raw_text(x)
    return None if raw is None else raw.casefold()


_NUMBER_START: Final = frozenset("+-.0123456789")  # what a text that reads as a number starts with


def _key(x: Any) -> int | float | str | None:
    """Equality key: numbers for numeric values, folded text otherwise, None if incomparable."""
    if type(x) is str:  # most facts: the same key as below, without the number parse for words
        text = x.strip()
        if text[:1] in _NUMBER_START:
            number = as_number(text)
            if number is not None:
                return number
        return text.casefold()
    number = as_number(x)
    return number if number is not None else _text(x)


def _instant(x: Any) -> datetime | None:
    if not isinstance(x, str):
        return None
    s = x.strip()
    day = parse_date(s)
    if day is not None:
        return datetime(day.year, day.month, day.day, tzinfo=UTC)
    if not _TIMESTAMP.fullmatch(s):
        return None
    try:
        moment = datetime.fromisoformat(s)
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    except (ValueError, OverflowError):
        return None


@lru_cache(maxsize=1024)
def _regex(pattern: str) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern, re.IGNORECASE)
    except (re.error, ValueError, OverflowError, RecursionError):
        return None


@lru_cache(maxsize=256)
def _key_set(members: tuple[Any, ...], _types: tuple[type, ...]) -> frozenset[Any]:
    # The types are part of the cache key only: True == 1, yet they fold to "true" and 1.
    return frozenset(k for k in map(_key, members) if k is not None)


class ValueSetKeys(frozenset):
    """A value set already folded to its comparison keys (see `prepare_value_sets`)."""


def prepare_value_sets(value_sets: ValueSets) -> dict[str, ValueSetKeys]:
    """Fold every value set to its comparison keys once, e.g. when campaign config is loaded.

    Passing the result as `value_sets` makes a set lookup one hash probe; raw sets work too but
    are re-read (and hashed for the cache) on every evaluation.
    """
    return {name: ValueSetKeys(k for k in map(_key, members) if k is not None)
            for name, members in value_sets.items()}


def _member_keys(members: Iterable[Any]) -> frozenset[Any] | list[Any]:
    if isinstance(members, ValueSetKeys):
        return members
    members = tuple(members)
    try:
        return _key_set(members, tuple(map(type, members)))
    except TypeError:  # unhashable members (nested lists or objects) cannot be cached
        return [k for k in map(_key, members) if k is not None]


# ---- operators --------------------------------------------------------------------------


def _any(fact: Any, predicate: Callable[[Any], bool]) -> bool:
    if isinstance(fact, list):
        return any(predicate(item) for item in fact)
    return predicate(fact)


def _bound(value: Any) -> tuple[int | float | None, datetime | None]:
    """An ordering operand read once: as a number and as an instant (either may be None)."""
    return as_number(value), _instant(value)


def _pair(x: Any, bound: tuple[int | float | None, datetime | None]) -> tuple[Any, Any] | None:
    """(x, b) as numbers when both read as numbers, else as instants when both are ISO dates or
    timestamps, else None; `b` read beforehand by `_bound`."""
    number, instant = bound
    if number is not None:
        nx = as_number(x)
        if nx is not None:
            return nx, number
    if instant is not None:
        ix = _instant(x)
        if ix is not None:
            return ix, instant
    return None


def _between_bounds(x: Any, lo: tuple, hi: tuple) -> bool:
    low, high = _pair(x, lo), _pair(x, hi)
    return low is not None and high is not None and low[1] <= low[0] and high[0] <= high[1]


Predicate = Callable[[Any], bool]


def _always(x: Any) -> bool:
    return True


def _substring_predicate(values: Sequence[Any], test: Callable[[str, str], bool]) -> Predicate | None:
    needles = [t for t in map(_text, values) if t]
    if not needles:
        return None

    def predicate(x: Any) -> bool:
        text = _text(x)
        return text is not None and any(test(text, n) for n in needles)

    return predicate


def _regex_predicate(values: Sequence[Any]) -> Predicate | None:
    patterns = [p for p in (_regex(t) for t in map(_raw_text, values) if t is not None) if p]
    if not patterns:
        return None

    def predicate(x: Any) -> bool:
        text = _raw_text(x)
        return text is not None and any(p.search(text) for p in patterns)

    return predicate


def _keys_predicate(keys: frozenset[Any] | list[Any]) -> Predicate | None:
    return (lambda x: _key(x) in keys) if keys else None


def _positive_predicate(op: str, values: Sequence[Any]) -> Predicate | None:
    """The positive form of `op` for one present value, its operands read once; None: it never
    holds. (`in_value_set` naming a set is not decided here: the set is read per evaluation.)"""
    if op == "equals":
        return _keys_predicate(frozenset(k for k in map(_key, values) if k is not None))
    if op == "contains":
        return _substring_predicate(values, lambda text, needle: needle in text)
    if op == "starts_with":
        return _substring_predicate(values, str.startswith)
    if op == "ends_with":
        return _substring_predicate(values, str.endswith)
    if op in _ORDERING:
        if not values:
            return None
        compare, bound = _ORDERING[op], _bound(values[0])

        def ordered(x: Any) -> bool:
            pair = _pair(x, bound)
            return pair is not None and compare(*pair)

        return ordered
    if op == "between":
        if len(values) < 2:
            return None
        lo, hi = _bound(values[0]), _bound(values[1])
        return lambda x: _between_bounds(x, lo, hi)
    if op == "exists":
        return _always
    if op == "in_value_set":  # no set named: `value` is the set
        return _keys_predicate(_member_keys(values))
    if op == "matches":
        return _regex_predicate(values)
    return None


def _set_members(value_set_id: str, value_sets: ValueSets) -> frozenset[Any] | list[Any] | None:
    """The named set's comparison keys; None when there is no usable set of that name."""
    members = value_sets.get(value_set_id)
    if isinstance(members, ValueSetKeys):  # folded when the config was loaded
        return members
    if not isinstance(members, Iterable) or isinstance(members, (str, bytes, Mapping)):
        return None
    return _member_keys(members)


def _age_fact(cond: Condition, facts: Mapping[str, Any], today: date) -> Any:
    if not cond.field or cond.field == "age":
        return resolve(facts, "age", today)
    value = resolve(facts, cond.field, today)
    if isinstance(value, str) and parse_date(value.strip()):
        age = _age_from(value, today.date() if isinstance(today, datetime) else today)
        return MISSING if age is None else age
    return value


Check = Callable[[Mapping[str, Any], date, ValueSets], bool]


def _fact_reader(path: str | None) -> Callable[[Mapping[str, Any], date], Any]:
    """`resolve` for one path, its branch chosen once."""
    if not path or path == "age":
        return lambda facts, today: resolve(facts, path, today)
    # Facts are mostly text: a string is told absent here without the call to is_absent.
    if path.startswith(_QUESTIONNAIRE):
        key = path[len(_QUESTIONNAIRE):]

        def answer(facts: Mapping[str, Any], today: date) -> Any:
            value = _answer(facts.get("questionnaire"), key)
            if type(value) is str:
                return value if value.strip() else MISSING
            return MISSING if is_absent(value) else value

        return answer

    def walk(facts: Mapping[str, Any], today: date) -> Any:
        value = _walk(facts, path)
        if type(value) is str:
            return value if value.strip() else MISSING
        return MISSING if is_absent(value) else value

    return walk


def _never_holds(facts: Mapping[str, Any], today: date, value_sets: ValueSets) -> bool:
    return False


def _always_holds(facts: Mapping[str, Any], today: date, value_sets: ValueSets) -> bool:
    return True


def _compile(cond: Condition) -> Check:
    op = cond.operator
    values = tuple(cond.value or ())
    if op == "age_between":
        if len(values) < 2:
            return _never_holds
        lo, hi = _bound(as_number(values[0])), _bound(as_number(values[1]))
        if lo[0] is None or hi[0] is None:
            return _never_holds

        def age_between(facts: Mapping[str, Any], today: date, value_sets: ValueSets) -> bool:
            age = _age_fact(cond, facts, today)
            return age is not MISSING and _any(age, lambda x: _between_bounds(x, lo, hi))

        return age_between
    read = _fact_reader(cond.field)
    negated = op in _NEGATED
    positive = op[4:] if negated else op
    # One closure per shape, the list case written out: this runs for every condition of every
    # rule on every submit, and each call level saved is measurable there.
    if positive == "in_value_set" and cond.value_set_id:
        value_set_id = cond.value_set_id

        def in_named_set(facts: Mapping[str, Any], today: date, value_sets: ValueSets) -> bool:
            fact = read(facts, today)
            if fact is MISSING:
                return negated
            keys = _set_members(value_set_id, value_sets)
            if keys is None:
                # An unknown set makes both operators false; a set that is not a list of values
                # holds nothing (so not_in_value_set is true).
                return negated and value_set_id in value_sets
            if isinstance(fact, list):
                return any(_key(item) in keys for item in fact) != negated
            return (_key(fact) in keys) != negated

        return in_named_set
    predicate = _positive_predicate(positive, values)
    if predicate is None:  # nothing can hold it, so its negation always holds, missing or not
        return _always_holds if negated else _never_holds

    def check(facts: Mapping[str, Any], today: date, value_sets: ValueSets) -> bool:
        fact = read(facts, today)
        if fact is MISSING:
            return negated
        if isinstance(fact, list):
            return any(predicate(item) for item in fact) != negated
        return predicate(fact) != negated

    return check


class _Compiled(NamedTuple):
    cond: Condition
    field: str | None
    operator: str
    value: list | None
    value_set_id: str | None
    check: Check


# Conditions live as long as their tenant's config revision and are checked on every submit, so
# each is compiled once (operands folded, regexes built, the path's branch chosen). Keyed by
# identity; the entry keeps its condition alive (so the id cannot be reused) and remembers the
# attributes it was compiled from, so a condition whose attributes were replaced is compiled anew.
_COMPILED: dict[int, _Compiled] = {}
_COMPILED_MAX: Final = 8192


class IdentityCache:
    """Values worked out once per configuration object (a rule list, a routing list), keyed by
    the object's identity plus a second key compared by equality. An entry keeps its object
    alive, so the id cannot be reused while the entry exists. This relies on what the rest of the
    service does: configuration objects are never changed in place (an import makes new ones
    under a new config revision)."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[int, tuple[Any, Any, Any]] = {}

    def get(self, obj: Any, extra: Any = None) -> Any:
        """The value stored for (obj, extra), or MISSING."""
        entry = self._entries.get(id(obj))
        if entry is not None and entry[0] is obj and entry[1] == extra:
            return entry[2]
        return MISSING

    def put(self, obj: Any, extra: Any, value: Any) -> Any:
        if len(self._entries) >= _COMPILED_MAX:
            self._entries.clear()
        self._entries[id(obj)] = (obj, extra, value)
        return value


def _check_of(cond: Condition) -> Check:
    entry = _COMPILED.get(id(cond))
    if (entry is not None and entry.cond is cond and entry.field is cond.field and entry.operator is cond.operator
            and entry.value is cond.value and entry.value_set_id is cond.value_set_id):
        return entry.check
    check = _compile(cond)
    if len(_COMPILED) >= _COMPILED_MAX:
        _COMPILED.clear()
    _COMPILED[id(cond)] = _Compiled(cond, cond.field, cond.operator, cond.value, cond.value_set_id, check)
    return check


def check_condition(cond: Condition, facts: Mapping[str, Any], *,
                    value_sets: ValueSets = _NO_VALUE_SETS,
                    today: date) -> bool:
    """Whether a field condition holds; prompt conditions are not decided here."""
    return _check_of(cond)(facts, today, value_sets)


# ---- combination ------------------------------------------------------------------------


def _outcome(cond: Condition, facts: Mapping[str, Any], value_sets: ValueSets,
             today: date, prompt_evaluator: PromptEvaluator | None) -> bool | None:
    """True, False, or None when the condition is skipped."""
    if cond.prompt:
        if prompt_evaluator is None:
            return None
        try:
            verdict = prompt_evaluator(cond, facts)
        except Exception:  # a failing evaluator plugin must not fail the submission
            return None
        return None if verdict is None else bool(verdict)
    return check_condition(cond, facts, value_sets=value_sets, today=today)


def _is_or(logical_operator: str) -> bool:
    return logical_operator == "OR" or (logical_operator != "AND" and logical_operator.upper() == "OR")


def _combine(is_or: bool, outcomes: Iterable[bool | None]) -> bool | None:
    """AND/OR over the decided outcomes, short-circuiting; None when every one was skipped."""
    decided = False
    for outcome in outcomes:
        if outcome is None:
            continue
        if outcome == is_or:
            return is_or
        decided = True
    return (not is_or) if decided else None


def _sub_rule_matches(sub: SubRule, facts: Mapping[str, Any],
                      value_sets: ValueSets, today: date,
                      prompt_evaluator: PromptEvaluator | None) -> bool | None:
    if not sub.conditions:
        return False
    return _combine(_is_or(sub.logical_operator),
                    (_outcome(c, facts, value_sets, today, prompt_evaluator)
                     for c in sub.conditions))


# Rule sets and routing rules are checked on every submit and most do not match; without prompt
# conditions nothing can be skipped, so whether they match is plain AND/OR over compiled checks,
# built once per sub-rule list into one callable (None for rules with prompt conditions: they
# take the general path).
_PLAIN = IdentityCache()


def _all_of(checks: tuple[Check, ...]) -> Check:
    if len(checks) == 1:
        return checks[0]
    return lambda facts, today, value_sets: all(check(facts, today, value_sets) for check in checks)


def _any_of(checks: tuple[Check, ...]) -> Check:
    if len(checks) == 1:
        return checks[0]
    return lambda facts, today, value_sets: any(check(facts, today, value_sets) for check in checks)


def _plain_matcher(logical_operator: str, sub_rules: Sequence[SubRule]) -> Check:
    """`matches` for prompt-free rules: an empty sub-rule is false, no sub-rules match nothing."""
    subs = tuple(
        (_any_of if _is_or(sub.logical_operator) else _all_of)(tuple(_check_of(c) for c in sub.conditions))
        if sub.conditions else _never_holds
        for sub in sub_rules)
    if not subs:
        return _never_holds
    return _any_of(subs) if _is_or(logical_operator) else _all_of(subs)


def plain_rules(logical_operator: str, sub_rules: Sequence[SubRule]) -> Check | None:
    """`matches` of these sub-rules as one callable, made once per list; None when a condition
    is a prompt (those take `matches`' general path)."""
    match = _PLAIN.get(sub_rules, logical_operator)
    if match is MISSING:
        prompted = any(cond.prompt for sub in sub_rules for cond in sub.conditions)
        match = _PLAIN.put(sub_rules, logical_operator,
                           None if prompted else _plain_matcher(logical_operator, sub_rules))
    return match


def matches(logical_operator: str, sub_rules: Sequence[SubRule], facts: Mapping[str, Any], *,
            value_sets: ValueSets = _NO_VALUE_SETS, today: date,
            prompt_evaluator: PromptEvaluator | None = None) -> bool:
    """Whether the sub-rules combined by `logical_operator` match (routing rules share the
    shape of a rule set); the same skipping rules apply, with no severities."""
    plain = plain_rules(logical_operator, sub_rules)
    if plain is not None:
        return plain(facts, today, value_sets)
    return bool(_combine(_is_or(logical_operator),
                         (_sub_rule_matches(s, facts, value_sets, today, prompt_evaluator)
                          for s in sub_rules)))


def _render(value: Any) -> str:
    if value is None:
        return "null"
    return _raw_text(value) or str(value)


def describe(cond: Condition) -> str:
    """Human-readable condition, e.g. "address.state equals [CA]"."""
    if cond.prompt:
        return f'prompt "{cond.prompt}"'
    field = cond.field or ("age" if cond.operator == "age_between" else "(no field)")
    if cond.operator in ("exists", "not_exists"):
        return f"{field} {cond.operator}"
    if cond.operator in ("in_value_set", "not_in_value_set") and cond.value_set_id:
        return f"{field} {cond.operator} {cond.value_set_id}"
    return f"{field} {cond.operator} [{', '.join(map(_render, cond.value or ()))}]"


def _evaluate(rule_set: RuleSet, name: str | None, facts: Mapping[str, Any],
              value_sets: ValueSets, today: date,
              prompt_evaluator: PromptEvaluator | None) -> RuleSetResult:
    plain = plain_rules(rule_set.logical_operator, rule_set.sub_rules)
    if plain is not None and not plain(facts, today, value_sets):
        return RuleSetResult(name=name, matched=False)  # the usual case: no reasons to collect
    skipped: list[str] = []
    sub_outcomes: list[bool | None] = []
    contributing: list[Condition] = []
    for sub in rule_set.sub_rules:
        if not sub.conditions:
            sub_outcomes.append(False)
            continue
        true_conditions: list[Condition] = []
        outcomes: list[bool | None] = []
        for cond in sub.conditions:
            outcome = _outcome(cond, facts, value_sets, today, prompt_evaluator)
            outcomes.append(outcome)
            if outcome is None:
                skipped.append(describe(cond))
            elif outcome:
                true_conditions.append(cond)
        sub_outcome = _combine(_is_or(sub.logical_operator), outcomes)
        sub_outcomes.append(sub_outcome)
        if sub_outcome:
            contributing.extend(true_conditions)
    if not _combine(_is_or(rule_set.logical_operator), sub_outcomes):
        return RuleSetResult(name=name, matched=False, skipped=skipped)
    rank = max(_SEVERITY_RANK.get(c.max_severity, 2) for c in contributing)
    return RuleSetResult(name=name, matched=True, severity=_RANKED_SEVERITY[rank],
                         reasons=[describe(c) for c in contributing], skipped=skipped)


def evaluate_rule_set(rule_set: RuleSet, facts: Mapping[str, Any], *,
                      value_sets: ValueSets = _NO_VALUE_SETS, today: date,
                      prompt_evaluator: PromptEvaluator | None = None) -> RuleSetResult:
    """Evaluate one rule set regardless of its isActive / appliesAt."""
    return _evaluate(rule_set, rule_set.name, facts, value_sets, today, prompt_evaluator)


# A campaign's rule sets are qualified on every submit: which of them apply, their report names
# and their matchers are worked out once per list.
_APPLICABLE = IdentityCache()


def _applicable(rule_sets: Iterable[RuleSet],
                applies_at: str) -> tuple[tuple[str, Check | None, RuleSet, RuleSetResult], ...]:
    """(report name, plain matcher or None, rule set, its result when it does not match) of the
    active rule sets at `applies_at`. The not-matched result is made once and shared by every
    evaluation (results are never changed in place): most rule sets do not match most leads."""
    entries = _APPLICABLE.get(rule_sets, applies_at)
    if entries is not MISSING:
        return entries
    entries = tuple(
        (name, plain_rules(rule_set.logical_operator, rule_set.sub_rules), rule_set,
         RuleSetResult(name=name, matched=False))
        for position, rule_set in enumerate(rule_sets, 1)
        if rule_set.is_active and rule_set.applies_at == applies_at
        for name in (rule_set.name or f"rule set {position}",))
    if not isinstance(rule_sets, (list, tuple)):  # a one-off iterable: nothing to key a cache by
        return entries
    return _APPLICABLE.put(rule_sets, applies_at, entries)


def qualify(rule_sets: Iterable[RuleSet], facts: Mapping[str, Any], *,
            applies_at: str = "ingestion",
            value_sets: ValueSets = _NO_VALUE_SETS, today: date,
            prompt_evaluator: PromptEvaluator | None = None) -> QualificationResult:
    """Qualify facts against the active rule sets that apply at `applies_at`.

    An unnamed rule set is reported as "rule set N" (1-based position in `rule_sets`). The reason
    names the first disqualifying rule set, else the first one holding for review.
    """
    results: list[RuleSetResult] = []
    flags: list[str] = []
    failed = 0
    disqualified: RuleSetResult | None = None
    review: RuleSetResult | None = None
    for name, plain, rule_set, unmatched in _applicable(rule_sets, applies_at):
        if plain is not None and not plain(facts, today, value_sets):
            results.append(unmatched)  # the usual case
            continue
        result = _evaluate(rule_set, name, facts, value_sets, today, prompt_evaluator)
        results.append(result)
        if not result.matched:
            continue
        if result.severity == "flag":
            flags.append(result.name)
            continue
        failed += 1
        if result.severity == "disqualify":
            disqualified = disqualified or result
        else:
            review = review or result
    score = round(100 * (len(results) - failed) / len(results)) if results else 100
    failing = disqualified or review
    reason = None
    if failing:
        verb = "Disqualified by" if failing is disqualified else "Held for review by"
        reason = f'{verb} rule set "{failing.name}": {"; ".join(failing.reasons)}'
    return QualificationResult(passed=disqualified is None,
                               hold_for_review=disqualified is None and review is not None,
                               flags=flags, score=score, reason=reason, results=results)
