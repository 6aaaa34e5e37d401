from datetime import date

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.domain.normalize import (
    age_on, is_valid_email, normalize_email, parse_date, questionnaire_entries, title_name,
    to_e164,
)


@pytest.mark.parametrize(("raw", "expected"), [
    ("o'neil-smith", "O'Neil-Smith"),
    ("MARY   ann", "Mary Ann"),
    ("  jean-luc  ", "Jean-Luc"),
    ("d\u2019angelo", "D\u2019Angelo"),
    ("mcDONALD", "Mcdonald"),
    ("", ""),
    ("   ", ""),
    ("élodie", "Élodie"),
])
def test_title_name(raw, expected):
    assert title_name(raw) == expected


def test_normalize_email():
    assert normalize_email("  Ann.Lee@Example.COM ") == "ann.lee@example.com"


@pytest.mark.parametrize(("email", "valid"), [
    ("ann@example.com", True),
    ("a+tag@sub.example.co.uk", True),
    ("ann@example", False),
    ("@example.com", False),
    ("ann@@example.com", False),
    ("an n@example.com", False),
    ("ann@example.", False),
    ("ann@.example.com", False),
    ("ann@exa..mple.com", False),
    ("", False),
    ("a" * 250 + "@x.com", False),
])
def test_is_valid_email(email, valid):
    assert is_valid_email(email) is valid


@pytest.mark.parametrize(("phone", "region", "expected"), [
    ("(555) 123-4567", "US", "+15551234567"),
    ("555.123.4567", "us", "+15551234567"),
    ("+1 555 123 4567", None, "+15551234567"),
    ("+15551234567", "GB", "+15551234567"),
    ("020 7946 0958", "GB", "+442079460958"),
    ("555-123-4567", None, None),
    ("123", "US", None),
    ("555-CALL-NOW", "US", None),
    ("", "US", None),
    ("5551234567", "ZZ", None),
])
def test_to_e164(phone, region, expected):
    assert to_e164(phone, region) == expected


def test_questionnaire_object_form_uses_labels():
    entries = questionnaire_entries({"debt": 5000, "own_home": True}, {"debt": "How much debt?"})
    assert entries == [
        {"key": "debt", "question": "How much debt?", "answer": 5000},
        {"key": "own_home", "question": "own_home", "answer": True},
    ]


def test_questionnaire_array_form_passes_through():
    entries = questionnaire_entries(
        [{"question": "Why?", "answer": "because"}, {"key": "debt", "answer": 1}, "junk"],
        {"debt": "How much debt?"},
    )
    assert entries == [
        {"question": "Why?", "answer": "because"},
        {"key": "debt", "question": "How much debt?", "answer": 1},
    ]
    assert questionnaire_entries(entries, {}) == entries


def test_questionnaire_other_shapes():
    assert questionnaire_entries(None, {}) == []
    assert questionnaire_entries("text", {}) == []


@pytest.mark.parametrize(("dob", "today", "age"), [
    (date(1990, 6, 16), date(2024, 6, 15), 33),
    (date(1990, 6, 15), date(2024, 6, 15), 34),
    (date(2000, 2, 29), date(2023, 2, 28), 22),
    (date(2000, 2, 29), date(2023, 3, 1), 23),
    (date(2000, 2, 29), date(2024, 2, 29), 24),
])
def test_age_on(dob, today, age):
    assert age_on(dob, today) == age


@pytest.mark.parametrize(("text", "expected"), [
    ("2024-02-29", date(2024, 2, 29)),
    ("2023-02-29", None),
    ("2024-13-01", None),
    ("20240101", None),
    ("2024-1-01", None),
    ("2024-01-01\n", None),
    ("2024-01-01T00:00:00", None),
    ("", None),
    (None, None),
])
def test_parse_date(text, expected):
    assert parse_date(text) == expected


@settings(max_examples=300, deadline=None)
@given(st.from_regex(r"\A(\+1|1)?[ (]?[2-9][0-9]{2}[) -.]?[0-9]{3}[ -.]?[0-9]{4}\Z", fullmatch=True),
       st.sampled_from(["US", "CA", "GB", None]))
def test_north_american_fast_path_agrees_with_phonenumbers(phone, region):
    import phonenumbers

    from appliance.domain.normalize import _nanp_e164

    fast = _nanp_e164(phone, region)
    if fast is None:
        return
    parsed = phonenumbers.parse(phone, region)
    assert phonenumbers.is_possible_number(parsed)
    assert fast == phonenumbers.format_number(parsed, phonenumbers.PhoneNumberFormat.E164)


def test_numbers_longer_than_e164_allows_are_refused():
    from appliance.domain.normalize import to_e164

    assert to_e164("+4910000000000000", None) is None  # 16 digits: a German plan allows it, E.164 does not
