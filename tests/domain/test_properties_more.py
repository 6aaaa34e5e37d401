"""More property tests, beyond tests/domain/test_properties.py: hostile JSON values for every
operator, negation and missing-value laws, AND/OR laws across both levels (identity,
idempotence, absorption, De Morgan through the negated operators), prompt skipping, whole rule
sets and qualification never raising; normalizers on any input (names, emails, phones, dates)
and the submit body -> lead record path on any decodable body; the request nesting guard against
a reference implementation."""

from __future__ import annotations

import json
import re
import sys
from datetime import date

import msgspec
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from appliance.api.io import MAX_DEPTH, nesting_depth_exceeds
from appliance.domain.campaign import Condition, RuleSet, SubRule
from appliance.domain.normalize import (
    age_on, is_valid_email, normalize_email, parse_date, title_name, to_e164,
)
from appliance.domain.rules import (
    MISSING, check_condition, evaluate_rule_set, matches, prepare_value_sets, qualify, resolve,
)
from appliance.domain.submission import SubmitLead, build_lead, facts_of
from appliance.services.lead_updates import parse_iso

TODAY = date(2024, 6, 15)
OPERATORS = [
    "equals", "not_equals", "contains", "not_contains", "starts_with", "ends_with",
    "greater_than", "less_than", "greater_or_equal", "less_or_equal", "between",
    "exists", "not_exists", "in_value_set", "not_in_value_set", "matches", "age_between",
]
NEGATIONS = {"not_equals": "equals", "not_contains": "contains", "not_in_value_set": "in_value_set",
             "not_exists": "exists"}
limited = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

class Huge(int):
    """An integer past int->str's 4300 digit limit; its repr is short, so Hypothesis can print it."""

    @classmethod
    def of(cls, sign: int) -> Huge:
        return cls(sign * 10**4400)

    def __repr__(self) -> str:
        return f"Huge({'-' if self < 0 else ''}10**4400)"


# Hostile scalars: huge integers (past int->str limits), non-finite floats, lone surrogates,
# control characters, regex syntax, numeric-looking and date-looking text.
HOSTILE = (st.none() | st.booleans()
           | st.integers() | st.sampled_from([1, -1]).map(Huge.of)
           | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=20) | st.text(alphabet=st.characters(codec=None), max_size=8)
           | st.sampled_from(["", " ", "\x00", "\ud800", "9" * 5000, "1e999", "-0", "NaN", ".5", "+7",
                              "(", "[a-", "(a+)+$", "2024-02-30", "2024-06-15T10:00:00+14:00",
                              "0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-12:00", "true", "TRUE"]))
JSON = st.recursive(HOSTILE, lambda children: st.lists(children, max_size=4)
                    | st.dictionaries(st.text(max_size=5), children, max_size=4), max_leaves=16)
# What can arrive in a request body: JSON numbers within 64 bits, finite floats, valid text.
WIRE = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False,
                    allow_infinity=False) | st.text(max_size=12),
                    lambda children: st.lists(children, max_size=3)
                    | st.dictionaries(st.text(max_size=5), children, max_size=3), max_leaves=10)


def condition(field, operator, value, value_set_id=None, prompt=None):
    cond = Condition(field=field, operator=operator, value_set_id=value_set_id, prompt=prompt)
    cond.value = value  # after construction: engine must survive values config would refuse
    return cond


# ---- rule engine: never raises ---------------------------------------------------------------

@limited
@given(fact=JSON, value=st.none() | st.lists(JSON, max_size=4), operator=st.sampled_from(OPERATORS),
       members=st.none() | JSON | st.lists(JSON, max_size=4) | st.text(max_size=4),
       today=st.dates(), field=st.sampled_from(["f", "f.x", "f.0", "questionnaire.f", "age", "", None,
                                                "customFields.a.b", "dateOfBirth"]))
def test_operators_total_on_hostile_values(fact, value, operator, members, today, field):
    facts = {"f": fact, "dateOfBirth": fact, "questionnaire": {"f": fact},
             "customFields": {"a": {"b": fact}}}
    for sets in ({"s": members}, prepare_value_sets({"s": members}) if isinstance(members, list) else {}):
        for set_id in (None, "s", "missing"):
            result = check_condition(condition(field, operator, value, set_id), facts, value_sets=sets, today=today)
            assert isinstance(result, bool)


@limited
@given(facts=st.dictionaries(st.text(max_size=6), JSON, max_size=5), path=st.text(max_size=12))
def test_resolve_total_and_never_returns_an_absent_value(facts, path):
    value = resolve(facts, path, TODAY)
    assert value is MISSING or value not in (None, "", [], {})


# ---- rule engine: laws -----------------------------------------------------------------------

FIELDS = ["a", "b", "nested.c", "missing"]
POOL = ["TX", " tx ", "ca", "1", 1, 1.0, "01", 2.5, "2024-01-01", "2023-12-31T23:00:00Z", True, "true",
        None, "", "x", "foo bar"]
CONDITIONS = st.builds(condition, field=st.sampled_from(FIELDS), operator=st.sampled_from(OPERATORS),
                       value=st.lists(st.sampled_from(POOL), max_size=3))
FACTS = st.fixed_dictionaries({
    "a": st.sampled_from(POOL) | st.lists(st.sampled_from(POOL), max_size=3),
    "b": st.sampled_from(POOL),
    "nested": st.fixed_dictionaries({"c": st.sampled_from(POOL)}),
    "dateOfBirth": st.sampled_from(["1990-06-15", "2010-02-29", "2000-02-29", "", None, "x"]),
})


def holds(cond, facts):
    return check_condition(cond, facts, today=TODAY)


def sub(op, conds):
    return SubRule(logical_operator=op, conditions=list(conds))


@limited
@given(field=st.sampled_from(FIELDS), negated=st.sampled_from(sorted(NEGATIONS)),
       value=st.lists(st.sampled_from(POOL), max_size=3), facts=FACTS)
def test_negated_operator_is_the_negation_on_present_values(field, negated, value, facts):
    positive = condition(field, NEGATIONS[negated], value)
    negative = condition(field, negated, value)
    if resolve(facts, field, TODAY) is MISSING:
        assert holds(negative, facts) is True
        assert holds(positive, facts) is False
    else:
        assert holds(negative, facts) == (not holds(positive, facts))


@limited
@given(operator=st.sampled_from([op for op in OPERATORS if op not in NEGATIONS and op != "age_between"]),
       value=st.lists(st.sampled_from(POOL), max_size=3))
def test_missing_value_fails_every_positive_operator(operator, value):
    for facts in ({}, {"a": None}, {"a": "   "}, {"a": []}, {"a": {}}):
        assert holds(condition("a", operator, value), facts) is False


@limited
@given(fact=st.sampled_from([p for p in POOL if p not in (None, "")]))
def test_equals_is_reflexive_and_in_value_set_agrees(fact):
    assert holds(condition("a", "equals", [fact]), {"a": fact})
    for value in ([fact], [fact, "other"], ["other"]):
        assert holds(condition("a", "in_value_set", value), {"a": fact}) == holds(condition("a", "equals", value),
                                                                                   {"a": fact})


@limited
@given(fact=st.sampled_from(POOL), lo=st.sampled_from(POOL), hi=st.sampled_from(POOL))
def test_between_is_both_bounds(fact, lo, hi):
    facts = {"a": fact}
    both = holds(condition("a", "greater_or_equal", [lo]), facts) and holds(condition("a", "less_or_equal", [hi]),
                                                                            facts)
    assert holds(condition("a", "between", [lo, hi]), facts) == both


@limited
@given(conds=st.lists(CONDITIONS, min_size=1, max_size=4), facts=FACTS, op=st.sampled_from(["AND", "OR"]))
def test_idempotence_of_and_or(conds, facts, op):
    once = matches("AND", [sub(op, conds)], facts, today=TODAY)
    assert matches("AND", [sub(op, conds + conds)], facts, today=TODAY) == once
    assert matches(op, [sub(op, conds)] * 3, facts, today=TODAY) == once


@limited
@given(a=CONDITIONS, b=CONDITIONS, facts=FACTS)
def test_absorption_across_levels(a, b, facts):
    # a OR (a AND b) == a ; a AND (a OR b) == a   (sub-rules combined at the rule-set level)
    assert matches("OR", [sub("AND", [a]), sub("AND", [a, b])], facts, today=TODAY) == holds(a, facts)
    assert matches("AND", [sub("AND", [a]), sub("OR", [a, b])], facts, today=TODAY) == holds(a, facts)


@limited
@given(field=st.sampled_from(FIELDS), ops=st.lists(st.sampled_from(sorted(NEGATIONS)), min_size=1, max_size=3),
       values=st.lists(st.lists(st.sampled_from(POOL), max_size=2), min_size=3, max_size=3), facts=FACTS)
def test_de_morgan_through_negated_operators(field, ops, values, facts):
    assume(resolve(facts, field, TODAY) is not MISSING)
    positives = [condition(field, NEGATIONS[op], values[i]) for i, op in enumerate(ops)]
    negatives = [condition(field, op, values[i]) for i, op in enumerate(ops)]
    # not (p1 OR p2 ...) == (not p1) AND (not p2) ...
    assert (not matches("AND", [sub("OR", positives)], facts, today=TODAY)) == matches(
        "AND", [sub("AND", negatives)], facts, today=TODAY)
    assert (not matches("AND", [sub("AND", positives)], facts, today=TODAY)) == matches(
        "AND", [sub("OR", negatives)], facts, today=TODAY)


@limited
@given(conds=st.lists(CONDITIONS, min_size=1, max_size=3), facts=FACTS, op=st.sampled_from(["AND", "OR"]),
       outer=st.sampled_from(["AND", "OR"]), verdict=st.sampled_from([None, "raise"]))
def test_undecided_prompt_conditions_are_left_out(conds, facts, op, outer, verdict):
    def evaluator(cond, facts):
        if verdict == "raise":
            raise RuntimeError("evaluator down")
        return None

    prompt = condition(None, "equals", None, prompt="Is this a real person?")
    plain = matches(outer, [sub(op, conds)], facts, today=TODAY)
    for evaluate in (None, evaluator):
        assert matches(outer, [sub(op, [prompt, *conds, prompt])], facts, today=TODAY,
                       prompt_evaluator=evaluate) == plain
        # a sub-rule of prompts only is left out of the rule set
        assert matches(outer, [sub(op, [prompt]), sub(op, conds)], facts, today=TODAY,
                       prompt_evaluator=evaluate) == plain
        assert matches(outer, [sub(op, [prompt])], facts, today=TODAY, prompt_evaluator=evaluate) is False


@limited
@given(conds=st.lists(CONDITIONS, min_size=1, max_size=3), facts=FACTS, verdict=st.booleans())
def test_decided_prompt_is_an_ordinary_condition(conds, facts, verdict):
    prompt = condition(None, "equals", None, prompt="p")
    expected_and = verdict and all(holds(c, facts) for c in conds)
    expected_or = verdict or any(holds(c, facts) for c in conds)
    kw = {"today": TODAY, "prompt_evaluator": lambda cond, facts: verdict}
    assert matches("AND", [sub("AND", [prompt, *conds])], facts, **kw) == expected_and
    assert matches("AND", [sub("OR", [prompt, *conds])], facts, **kw) == expected_or


SEVERITY = st.sampled_from(["flag", "review", "disqualify"])
RULE_SETS = st.lists(st.builds(
    lambda subs, op, sev, active, at, name: RuleSet(
        logical_operator=op, is_active=active, applies_at=at, name=name,
        sub_rules=[SubRule(logical_operator=o, conditions=[
            msgspec.structs.replace(c, max_severity=sev) for c in cs]) for o, cs in subs]),
    subs=st.lists(st.tuples(st.sampled_from(["AND", "OR"]), st.lists(CONDITIONS, max_size=3)), max_size=3),
    op=st.sampled_from(["AND", "OR"]), sev=SEVERITY, active=st.booleans(),
    at=st.sampled_from(["ingestion", "delivery"]), name=st.none() | st.text(max_size=5)), max_size=5)


@limited
@given(rule_sets=RULE_SETS, facts=FACTS)
def test_qualification_is_consistent(rule_sets, facts):
    result = qualify(rule_sets, facts, today=TODAY)
    assert 0 <= result.score <= 100
    evaluated = [r for r in rule_sets if r.is_active and r.applies_at == "ingestion"]
    assert len(result.results) == len(evaluated)
    for rule_set, outcome in zip(evaluated, result.results):
        again = evaluate_rule_set(rule_set, facts, today=TODAY)
        assert again.matched == outcome.matched
        assert outcome.matched == matches(rule_set.logical_operator, rule_set.sub_rules, facts, today=TODAY)
    severities = {r.severity for r in result.results if r.matched}
    assert result.passed == ("disqualify" not in severities)
    assert result.hold_for_review == (result.passed and "review" in severities)
    assert (result.reason is None) == (severities <= {"flag"})
    if not evaluated:
        assert result.score == 100 and result.passed


# ---- normalization ---------------------------------------------------------------------------

ANY_TEXT = st.text() | st.text(alphabet=st.characters(codec=None)) | st.sampled_from(
    ["\u0149", "ß", "İstanbul", "o'neil-smith", "  MARY   ann  ", "\u02bcx", "ǅ", "ﬃ", "\u0301a", "a\u0345"])


@limited
@given(s=ANY_TEXT)
def test_title_name_is_idempotent_trimmed_and_collapsed(s):
    out = title_name(s)
    assert title_name(out) == out
    assert out == out.strip()
    assert "  " not in out
    assert title_name(f" \t{s}\n ") == out


@limited
@given(s=ANY_TEXT)
def test_email_normalization_total_and_idempotent(s):
    out = normalize_email(s)
    assert normalize_email(out) == out
    assert is_valid_email(out) in (True, False)
    if is_valid_email(out):
        assert out.count("@") == 1 and len(out) <= 254


@limited
@given(email=st.emails())
def test_real_emails_are_valid_after_normalization(email):
    assume(len(email) <= 254)
    assert is_valid_email(normalize_email(email))
    assert is_valid_email(normalize_email(f"  {email.upper()} ")) == is_valid_email(normalize_email(email.upper()))


E164 = re.compile(r"\+[1-9][0-9]{1,14}")  # E.164 sets no minimum; phonenumbers admits short ones


@limited
@given(phone=ANY_TEXT | st.text(alphabet="0123456789+-() .", max_size=40),
       region=st.none() | st.text(max_size=3) | st.sampled_from(["US", "us", "CA", "GB", "DE", "", "ZZ", "001"]))
def test_phone_total_and_output_is_e164(phone, region):
    out = to_e164(phone, region)
    assert out is None or E164.fullmatch(out), out
    if out is not None:
        assert to_e164(out, None) == out


@limited
@given(area=st.integers(200, 999), exchange=st.integers(0, 999), line=st.integers(0, 9999),
       layout=st.sampled_from(["{a}{e}{l}", "({a}) {e}-{l}", "{a}-{e}-{l}", "1{a}{e}{l}", "+1 {a} {e} {l}",
                               "{a}.{e}.{l}", " +1({a}){e}-{l} "]))
def test_north_american_layouts_agree(area, exchange, line, layout):
    a, e, l = f"{area:03d}", f"{exchange:03d}", f"{line:04d}"
    text = layout.format(a=a, e=e, l=l)
    assert to_e164(text, "US") in (None, f"+1{a}{e}{l}")
    assert to_e164(text.strip(), "US") == to_e164(f"+1{a}{e}{l}", None) or to_e164(text.strip(), "US") is None


@limited
@given(value=JSON)
def test_parse_date_total_and_round_trips(value):
    out = parse_date(value)
    assert out is None or (isinstance(value, str) and out.isoformat() == value)


@limited
@given(day=st.dates())
def test_parse_date_accepts_every_real_date(day):
    assert parse_date(day.isoformat()) == day


@limited
@given(days=st.lists(st.dates(), min_size=3, max_size=3))
def test_age_is_whole_years_and_monotone(days):
    dob, today, later = sorted(days)
    age = age_on(dob, today)
    assert 0 <= age <= today.year - dob.year
    assert age <= age_on(dob, later)


@limited
@given(text=ANY_TEXT | st.sampled_from(["0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-23:59",
                                        "2024-01-01T10", "2024-13-01", "z", "Z", "2024-06-15Z"]))
def test_parse_iso_total(text):
    out = parse_iso(text)
    assert out is None or (out[0].tzinfo is not None and isinstance(out[1], bool))


# ---- the submit body -> lead record path on any decodable body ---------------------------------

SUBMIT_FIELDS = st.fixed_dictionaries({"campaignId": st.just("C1")}, optional={
    "leadId": st.text(min_size=1, max_size=8),
    "firstName": ANY_TEXT, "lastName": ANY_TEXT, "email": ANY_TEXT | st.emails(),
    "phone": st.text(alphabet="0123456789+-() .x", min_size=10, max_size=32),
    "dateOfBirth": st.text(max_size=10) | st.dates().map(str),
    "country": st.sampled_from(["US", "GB", "ZZ", "DE"]),
    "timezone": st.sampled_from(["America/New_York", "Mars/Base", "UTC", "", "../../etc/passwd", "EST"]),
    "questionnaire": st.dictionaries(st.text(max_size=5), WIRE, max_size=3)
    | st.lists(st.fixed_dictionaries({"question": st.text(max_size=5)}, optional={"key": st.text(max_size=3),
                                                                                  "answer": WIRE}), max_size=3),
    "attribution": st.dictionaries(st.sampled_from(["params", "gclid", "captureUrl", "x"]), WIRE, max_size=3),
    "compliance": st.dictionaries(st.sampled_from(["tcpaConsent", "consentTimestamp", "ipAddress", "y"]), WIRE,
                                  max_size=3),
    "customFields": st.dictionaries(st.text(max_size=5), WIRE, max_size=3),
    "isTest": st.booleans(), "notes": ANY_TEXT,
    "address": st.fixed_dictionaries({}, optional={"state": st.text(max_size=3), "zip": st.text(max_size=5)}),
})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=SUBMIT_FIELDS, region=st.sampled_from(["US", "GB", "ZZ"]), rule_sets=RULE_SETS)
def test_any_decodable_submit_body_builds_a_lead_or_names_its_problems(doc, region, rule_sets):
    try:
        body = msgspec.json.decode(msgspec.json.encode(doc), type=SubmitLead)
    except (msgspec.ValidationError, UnicodeEncodeError):
        return  # refused by the type: a 400 naming the field
    lead, problems = build_lead(body, lead_id="lead_X", existing=None, labels={"injured": "Injured?"},
                                region=region, now="2026-01-01T00:00:00.000Z")
    assert all(isinstance(p, str) and ": " in p for p in problems)
    if problems:
        return
    assert lead.first_name == title_name(lead.first_name) and lead.email == normalize_email(lead.email)
    assert lead.phone_e164 is not None and E164.fullmatch(lead.phone_e164)
    facts = facts_of(lead)
    msgspec.json.encode(lead)
    qualify(rule_sets, facts, today=TODAY)
    # normalizing again changes nothing (a resubmission of the stored values)
    again, again_problems = build_lead(
        msgspec.convert({"campaignId": "C1", "firstName": lead.first_name, "lastName": lead.last_name,
                         "email": lead.email, "phone": lead.phone_e164}, SubmitLead),
        lead_id="lead_X", existing=None, labels={}, region=region, now="2026-01-01T00:00:00.000Z")
    assert not again_problems
    assert (again.first_name, again.last_name, again.email, again.phone_e164) == (
        lead.first_name, lead.last_name, lead.email, lead.phone_e164)


# ---- the request nesting guard ----------------------------------------------------------------

def reference_depth(doc) -> int:
    if isinstance(doc, list):
        return 1 + max((reference_depth(d) for d in doc), default=0)
    if isinstance(doc, dict):
        return 1 + max((reference_depth(d) for d in doc.values()), default=0)
    return 0


TRICKY_TEXT = st.text(alphabet='[]{}"\\ab', max_size=8)
NESTED = st.recursive(st.none() | st.integers() | TRICKY_TEXT,
                      lambda children: st.lists(children, max_size=3)
                      | st.dictionaries(TRICKY_TEXT, children, max_size=3), max_leaves=30)


@limited
@given(doc=NESTED, wrap=st.integers(0, 70), limit=st.integers(1, 80))
def test_nesting_guard_agrees_with_a_parser(doc, wrap, limit):
    for _ in range(wrap):
        doc = [doc] if wrap % 2 else {"k": doc}
    text = json.dumps(doc).encode()
    assert nesting_depth_exceeds(text, limit) == (reference_depth(doc) > limit)
    assert sys.getrecursionlimit() > MAX_DEPTH * 4  # the guard keeps decoding far from the limit
