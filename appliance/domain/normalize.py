"""Normalization of submitted contact data.

Every function accepts any str without raising and is idempotent where that makes sense:
`title_name`, `normalize_email` and `to_e164` give back their own output unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import date
from typing import Any

import phonenumbers

_WHITESPACE = re.compile(r"\s+")
# A letter starts a name part at the beginning, after a space, a hyphen or an apostrophe
# (U+02BC too: "\u0149".title() yields it, and the result must stay stable).
_PART_START = re.compile(r"(?<![^\s\-'\u2019\u02bc])\w")
_PHONE_CHARS = re.compile(r"[0-9+\-\s().]+")
_ISO_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_MAX_EMAIL = 254
_E164_MAX = 16  # "+" and at most 15 digits


def _title_part(m: re.Match[str]) -> str:
    # str.title() rather than upper(): "ß" becomes "Ss", which lower() maps back to "ss".
    return m.group().title()


def title_name(s: str) -> str:
    """Trim, collapse inner whitespace, title-case each part: "o'neil-smith" -> "O'Neil-Smith"."""
    if s.isascii() and s.isalpha():  # one plain word, most names: the same result, a sixth of the cost
        return s.capitalize()
    collapsed = _WHITESPACE.sub(" ", s).strip()
    return _PART_START.sub(_title_part, collapsed.lower())


def normalize_email(s: str) -> str:
    return s.strip().lower()


def is_valid_email(s: str) -> bool:
    """Pragmatic check: one @, non-empty local part, dotted domain, no whitespace, <= 254 chars."""
    if not s or len(s) > _MAX_EMAIL or s.count("@") != 1 or _WHITESPACE.search(s):
        return False
    local, domain = s.split("@")
    if not local or "." not in domain:
        return False
    return all(domain.split("."))


def to_e164(phone: str, region: str | None) -> str | None:
    """E.164 form of `phone`, or None. National numbers need `region` (ISO alpha-2).

    Possible numbers are accepted (right length for the country) even when the range is not
    assigned, so the 555 numbers used in tests and demos keep working.
    """
    if not phone or not _PHONE_CHARS.fullmatch(phone):
        return None
    if fast := _nanp_e164(phone, region):
        return fast
    try:
        number = phonenumbers.parse(phone, region.upper() if region else None)
    except phonenumbers.NumberParseException:
        return None
    if not phonenumbers.is_possible_number(number):
        return None
    formatted = phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)
    if len(formatted) > _E164_MAX:  # some national plans allow longer numbers than E.164 can carry
        return None
    if formatted == phone:
        return formatted
    # Reparsing must be stable so that normalizing a stored phoneE164 never changes it.
    try:
        again = phonenumbers.parse(formatted, None)
    except phonenumbers.NumberParseException:
        return None
    if phonenumbers.format_number(again, phonenumbers.PhoneNumberFormat.E164) != formatted:
        return None
    return formatted


_NANP_REGIONS = frozenset({"US", "CA"})
_FORMATTING = str.maketrans("", "", " -().")


def _nanp_e164(phone: str, region: str | None) -> str | None:
    """The common case without phonenumbers' full parse (about 40 us): a North American number
    whose area code starts with 2-9, written nationally for US/CA or with +1. phonenumbers gives
    the same answer for exactly these inputs; everything else goes through it."""
    digits = phone.translate(_FORMATTING)
    if digits.startswith("+1"):
        national = digits[2:]
    elif region is not None and region.upper() in _NANP_REGIONS and not digits.startswith("+"):
        national = digits[1:] if len(digits) == 11 and digits[0] == "1" else digits
    else:
        return None
    if len(national) == 10 and national.isdigit() and national.isascii() and national[0] not in "01":
        return "+1" + national
    return None


def questionnaire_entries(q: Any, labels: Mapping[str, str]) -> list[dict[str, Any]]:
    """The stored array form `[{key?, question, answer}]` of either submitted form.

    Object form: each key's question comes from `labels` (the field library), else the key.
    Array form: entries are kept; a missing question is filled the same way when a key is given.
    Anything else (None, scalars, non-object array items) contributes nothing.
    """
    if isinstance(q, Mapping):
        return [{"key": k, "question": labels.get(k) or k, "answer": v} for k, v in q.items()]
    if not isinstance(q, list):
        return []
    entries: list[dict[str, Any]] = []
    for item in q:
        if not isinstance(item, Mapping):
            continue
        key = item.get("key")
        question = item.get("question")
        if not question and isinstance(key, str):
            question = labels.get(key) or key
        entry: dict[str, Any] = {"key": key} if key is not None else {}
        entry["question"] = question
        entry["answer"] = item.get("answer")
        entries.append(entry)
    return entries


def age_on(dob: date, today: date) -> int:
    """Whole years; a 29 February birthday counts from 1 March in common years."""
    before_birthday = (today.month, today.day) < (dob.month, dob.day)
    return today.year - dob.year - before_birthday


def parse_date(s: Any) -> date | None:
    """A real calendar date written strictly as YYYY-MM-DD, else None."""
    if not isinstance(s, str) or not _ISO_DATE.fullmatch(s):
        return None
    try:
        return date.fromisoformat(s)
    except ValueError:
        return None
