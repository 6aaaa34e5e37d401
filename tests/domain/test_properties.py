"""Property tests: the engine and normalizers never raise, and AND/OR behave like logic."""

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.domain.campaign import Condition, DeliverySchedule, ScheduleDay, SubRule
from appliance.domain.caps import period_bounds
from appliance.domain.normalize import (
    is_valid_email, normalize_email, parse_date, questionnaire_entries, title_name, to_e164,
)
from appliance.domain.rules import check_condition, matches
from appliance.domain.schedule import is_open, next_open

TODAY = date(2024, 6, 15)
OPERATORS = [
    "equals", "not_equals", "contains", "not_contains", "starts_with", "ends_with",
    "greater_than", "less_than", "greater_or_equal", "less_or_equal", "between",
    "exists", "not_exists", "in_value_set", "not_in_value_set", "matches", "age_between",
]
SCALARS = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
           | st.sampled_from(["2024-01-01", "42", " 3.5 ", "TX", "(", "2024-06-15T10:00:00Z"]))
JSON = st.recursive(SCALARS, lambda children: st.lists(children, max_size=4)
                    | st.dictionaries(st.text(max_size=5), children, max_size=4), max_leaves=12)
limited = settings(max_examples=200, deadline=None)


def condition(field, operator, value, value_set_id=None):
    # Assigned after construction: config validation would reject some of these values, and
    # the engine must survive them anyway.
    cond = Condition(field=field, operator=operator, value_set_id=value_set_id)
    cond.value = value
    return cond


@limited
@given(fact=JSON, value=st.none() | st.lists(JSON, max_size=4), operator=st.sampled_from(OPERATORS),
       members=JSON, dob=JSON, field=st.sampled_from(["f", "f.x", "questionnaire.f", None, "age"]))
def test_no_operator_raises(fact, value, operator, members, dob, field):
    facts = {"f": fact, "dateOfBirth": dob, "questionnaire": [{"key": "f", "answer": fact}]}
    for set_id in (None, "s", "unknown"):
        cond = condition(field, operator, value, set_id)
        result = check_condition(cond, facts, value_sets={"s": members}, today=TODAY)
        assert isinstance(result, bool)


FIELDS = ["a", "b", "address.state", "missing"]
POOL = ["TX", "ca", "1", 1, 2.5, "2024-01-01", True, None, "x"]
CONDITIONS = st.builds(
    condition,
    field=st.sampled_from(FIELDS),
    operator=st.sampled_from(OPERATORS),
    value=st.lists(st.sampled_from(POOL), max_size=3),
)
FACTS = st.fixed_dictionaries({
    "a": st.sampled_from(POOL) | st.lists(st.sampled_from(POOL), max_size=3),
    "b": st.sampled_from(POOL),
    "address": st.fixed_dictionaries({"state": st.sampled_from(POOL)}),
})


def holds(cond, facts):
    return check_condition(cond, facts, today=TODAY)


def rule(outer, inner, conditions, facts):
    return matches(outer, [SubRule(logical_operator=inner, conditions=conditions)], facts,
                   today=TODAY)


@limited
@given(cond=CONDITIONS, facts=FACTS, outer=st.sampled_from(["AND", "OR"]))
def test_single_condition_is_the_condition(cond, facts, outer):
    assert rule(outer, "AND", [cond], facts) == holds(cond, facts)
    assert rule(outer, "OR", [cond], facts) == holds(cond, facts)


@limited
@given(conds=st.lists(CONDITIONS, min_size=1, max_size=5), facts=FACTS, data=st.data())
def test_or_and_are_any_all_and_commutative(conds, facts, data):
    shuffled = data.draw(st.permutations(conds))
    truth = [holds(c, facts) for c in conds]
    assert rule("AND", "OR", conds, facts) == any(truth) == rule("AND", "OR", shuffled, facts)
    assert rule("AND", "AND", conds, facts) == all(truth) == rule("AND", "AND", shuffled, facts)


@limited
@given(groups=st.lists(st.lists(CONDITIONS, min_size=1, max_size=3), min_size=1, max_size=3),
       facts=FACTS)
def test_rule_set_level_combines_sub_rules(groups, facts):
    subs = [SubRule(logical_operator="AND", conditions=g) for g in groups]
    sub_truth = [all(holds(c, facts) for c in g) for g in groups]
    assert matches("OR", subs, facts, today=TODAY) == any(sub_truth)
    assert matches("AND", subs, facts, today=TODAY) == all(sub_truth)


@limited
@given(st.text())
def test_normalizers_idempotent_and_total(s):
    assert title_name(title_name(s)) == title_name(s)
    assert normalize_email(normalize_email(s)) == normalize_email(s)
    assert isinstance(is_valid_email(s), bool)
    parse_date(s)
    assert to_e164(s, "US") is None or to_e164(s, "US").startswith("+")


REGIONS = st.sampled_from(["US", "GB", "DE", "IN", "FR", "BR", "IT", "AU", "us", "ZZ", None])


@limited
@given(phone=st.text(alphabet="0123456789+-() .", max_size=20), region=REGIONS,
       other=REGIONS)
def test_e164_output_is_stable(phone, region, other):
    out = to_e164(phone, region)
    if out is not None:
        assert to_e164(out, None) == out
        assert to_e164(out, other) == out


@limited
@given(q=JSON)
def test_questionnaire_entries_total(q):
    entries = questionnaire_entries(q, {"k": "Question?"})
    assert all("question" in e and "answer" in e for e in entries)


ZONES = [ZoneInfo(z) for z in ("America/New_York", "Australia/Lord_Howe", "Asia/Kolkata",
                               "Europe/London", "America/Santiago", "Pacific/Chatham", "UTC")]
INSTANTS = st.datetimes(min_value=datetime(2000, 1, 2), max_value=datetime(2037, 12, 1),
                        timezones=st.just(UTC))


@limited
@given(now=INSTANTS, tz=st.sampled_from(ZONES),
       kind=st.sampled_from(["hourly", "daily", "weekly", "monthly"]))
def test_period_contains_now(now, tz, kind):
    start, end = period_bounds(kind, now, tz)
    assert start <= now < end
    assert end - start <= timedelta(days=32)


@limited
@given(now=INSTANTS, tz=st.sampled_from(["America/New_York", "Australia/Lord_Howe", "UTC"]),
       days=st.lists(st.tuples(
           st.sampled_from(["Monday", "Wednesday", "Saturday", "Sunday"]),
           st.integers(0, 23), st.sampled_from([0, 30]),
           st.integers(0, 24), st.booleans()), min_size=1, max_size=3))
def test_next_open_is_open(now, tz, days):
    schedule = DeliverySchedule(timezone=tz, specific_days=[
        ScheduleDay(day=d, start_time=f"{h:02d}:{m:02d}",
                    end_time=f"{e:02d}:00", active=a) for d, h, m, e, a in days])
    opening = next_open(schedule, now)
    if opening is None:
        assert not is_open(schedule, now)
        return
    assert opening >= now
    assert is_open(schedule, opening)
    assert (opening == now) == is_open(schedule, now)
