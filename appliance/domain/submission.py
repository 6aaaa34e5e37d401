"""A submit body turned into a lead record: checks every field the types
cannot (email format, phone, dates, zones, field library rules) and normalizes. Collects every
problem, each as `"<field path>: <what is wrong>"`."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import date
from typing import Annotated, Any
from zoneinfo import ZoneInfo

import msgspec
from msgspec import Meta

from appliance.domain.catalog import FieldLibraryEntry
from appliance.domain.lead import Address, LeadRecord, QuestionAnswer
from appliance.domain.normalize import (
    is_valid_email, normalize_email, parse_date, questionnaire_entries, title_name, to_e164,
)
from appliance.domain.rules import MISSING, resolve
from appliance.model import Model

MAX_FILES = 50
MAX_QUESTIONNAIRE = 200
MAX_OBJECT_KEYS = 200

Text = Annotated[str, Meta(max_length=1000)]


class LeadData(Model):
    """The lead's own fields of a submit body (also a repost's modifiedPayload)."""

    first_name: Annotated[str, Meta(max_length=100)] | None = None
    last_name: Annotated[str, Meta(max_length=100)] | None = None
    email: Annotated[str, Meta(max_length=254)] | None = None
    phone: Annotated[str, Meta(max_length=32)] | None = None  # checked by build_lead, with the others
    address: Address | None = None
    date_of_birth: Annotated[str, Meta(max_length=10)] | None = None
    country: Annotated[str, Meta(max_length=64)] | None = None  # checked by build_lead
    files: Annotated[list[dict[str, Any]], Meta(max_length=MAX_FILES)] | None = None
    questionnaire: (Annotated[dict[str, Any], Meta(max_length=MAX_QUESTIONNAIRE)]
                    | Annotated[list[QuestionAnswer], Meta(max_length=MAX_QUESTIONNAIRE)]) = {}
    attribution: Annotated[dict[str, Any], Meta(max_length=MAX_OBJECT_KEYS)] | None = None
    compliance: Annotated[dict[str, Any], Meta(max_length=MAX_OBJECT_KEYS)] | None = None
    is_test: bool | None = None  # None: a resubmission keeps the stored flag
    timezone: Annotated[str, Meta(max_length=64)] | None = None
    notes: Annotated[str, Meta(max_length=10_000)] | None = None
    custom_fields: Annotated[dict[str, Any], Meta(max_length=MAX_OBJECT_KEYS)] | None = None


class SubmitLead(LeadData):
    """POST /api/v1/leads/submit."""

    lead_id: Annotated[str, Meta(min_length=1, max_length=64)] | None = None
    campaign_id: Annotated[str, Meta(min_length=1, max_length=64)]
    ping_id: Annotated[str, Meta(min_length=1, max_length=64)] | None = None  # sold as that ping was offered


Sha256Hex = Annotated[str, Meta(pattern="^[0-9a-f]{64}$",
                                description="the lowercase hex SHA-256 of the value (64 characters)")]


class PingLead(LeadData):
    """POST /api/v1/leads/ping: a submit body whose contact fields may be left out, with the
    SHA-256 (lowercase hex) of the normalized email or of the E.164 phone for the duplicate check."""

    campaign_id: Annotated[str, Meta(min_length=1, max_length=64)]
    email_hash: Sha256Hex | None = None
    phone_hash: Sha256Hex | None = None


_COUNTRY = re.compile(r"[A-Z]{2}\Z")
_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:?\d{2})?$")
_ATTRIBUTION_TEXT = ("captureUrl", "referrer", "ipAddress", "userAgent", "gclid", "gbraid", "wbraid", "fbclid",
                     "fbc", "fbp", "ttclid", "ttp", "msclkid")
_COMPLIANCE_TEXT = ("consentText", "trustedFormCertUrl", "jornayaLeadId", "ipAddress", "userAgent")
_VALID_ZONES: set[str] = set()  # only names that loaded: bounded by the tz database


def valid_zone(name: str) -> bool:
    if name in _VALID_ZONES:
        return True
    if "/" not in name and name != "UTC":  # region/city names only, as IANA zones of leads are
        return False
    try:
        ZoneInfo(name)
    except (ValueError, KeyError, OSError):
        return False
    _VALID_ZONES.add(name)
    return True


def is_timestamp(value: Any) -> bool:
    if not isinstance(value, str) or not _TIMESTAMP.match(value):
        return False
    try:
        date.fromisoformat(value[:10])
    except ValueError:
        return False
    return True


def _check_objects(body: SubmitLead, problems: list[str]) -> None:
    # `key in` before reading: most known keys are absent, and a test costs less than a get() call.
    attribution = body.attribution or {}
    for key in _ATTRIBUTION_TEXT:
        if key in attribution:
            value = attribution[key]
            if value is not None and not isinstance(value, str):
                problems.append(f"attribution.{key}: expected str")
    params = attribution.get("params")
    if params is not None and not isinstance(params, dict):
        problems.append("attribution.params: expected object")
    compliance = body.compliance or {}
    if "tcpaConsent" in compliance and not isinstance(compliance["tcpaConsent"], bool):
        problems.append("compliance.tcpaConsent: expected bool")
    stamp = compliance.get("consentTimestamp")
    if stamp is not None and not is_timestamp(stamp):
        problems.append("compliance.consentTimestamp: must be an ISO 8601 timestamp")
    if "trustedForm" in compliance:  # the claim's outcome: written by the appliance only
        problems.append("compliance.trustedForm: set by the appliance when it verifies the certificate")
    for key in _COMPLIANCE_TEXT:
        if key in compliance:
            value = compliance[key]
            if value is not None and not isinstance(value, str):
                problems.append(f"compliance.{key}: expected str")


def _field_rule_problems(entry: FieldLibraryEntry, value: Any, path: str) -> list[str]:
    rules = entry.validation_rules
    if value is MISSING:
        return [f"{path}: required"] if rules.required else []
    problems = []
    kind = entry.data_type
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind in ("number", "integer"):
        if isinstance(value, str):
            try:
                value = float(value) if kind == "number" else int(value)
                numeric = True
            except ValueError:
                return [f"{path}: must be {'a number' if kind == 'number' else 'a whole number'}"]
        if not numeric or (kind == "integer" and float(value) != int(value)):
            return [f"{path}: must be {'a number' if kind == 'number' else 'a whole number'}"]
    elif kind == "boolean" and not isinstance(value, bool) and str(value).lower() not in ("true", "false", "yes", "no"):
        return [f"{path}: must be true or false"]
    elif kind == "date" and parse_date(value) is None:
        return [f"{path}: must be a date YYYY-MM-DD"]
    elif kind == "email" and not (isinstance(value, str) and is_valid_email(normalize_email(value))):
        return [f"{path}: must be a valid email address"]
    if numeric:
        if rules.min is not None and value < rules.min:
            problems.append(f"{path}: must be at least {rules.min:g}")
        if rules.max is not None and value > rules.max:
            problems.append(f"{path}: must be at most {rules.max:g}")
    if isinstance(value, str):
        if rules.min_length is not None and len(value) < rules.min_length:
            problems.append(f"{path}: must be at least {rules.min_length:g} characters")
        if rules.max_length is not None and len(value) > rules.max_length:
            problems.append(f"{path}: must be at most {rules.max_length:g} characters")
        if rules.pattern and re.search(rules.pattern, value) is None:
            problems.append(f"{path}: does not match the required pattern")
    return problems


def field_library_problems(facts: Mapping[str, Any], entries: Sequence[FieldLibraryEntry], today: date) -> list[str]:
    """Field library `validationRules` and `dataType` of active entries, on the values present."""
    problems: list[str] = []
    for entry in entries:
        path = f"questionnaire.{entry.key}" if entry.category == "question" else entry.key
        problems.extend(_field_rule_problems(entry, resolve(facts, path, today), path))
    return problems


def with_field_library_problems(problems: list[str], facts: Mapping[str, Any], entries: Sequence[FieldLibraryEntry],
                                today: date) -> list[str]:
    """`problems` (build_lead's) and the field library's, one say per field: a field build_lead
    already refused is not reported again."""
    checked = field_library_problems(facts, entries, today)
    if not checked:
        return problems
    reported = {problem.split(":", 1)[0] for problem in problems}
    return problems + [p for p in checked if p.split(":", 1)[0] not in reported]


def build_lead(body: SubmitLead | PingLead, *, lead_id: str, existing: LeadRecord | None, labels: Mapping[str, str],
               region: str, now: str, partial: bool = False) -> tuple[LeadRecord, list[str]]:
    """The normalized lead record (status `pending`) and the problems found. A resubmission
    (existing given) keeps stored values for fields the body leaves out; a `partial` lead (a
    ping's) may leave out its contact fields."""
    problems: list[str] = []
    base = existing
    first = title_name(body.first_name) if body.first_name is not None else (base.first_name if base else None)
    last = title_name(body.last_name) if body.last_name is not None else (base.last_name if base else None)
    email = normalize_email(body.email) if body.email is not None else (base.email if base else None)
    phone = body.phone if body.phone is not None else (base.phone if base else None)
    country = body.country or (base.country if base else None)
    if body.country is not None and not _COUNTRY.match(body.country):
        problems.append("country: must be a two-letter country code in capitals, such as US")
        country = base.country if base else None
    if base is None and not partial:
        for name, value in (("firstName", first), ("lastName", last), ("email", email), ("phone", phone)):
            if not value:
                problems.append(f"{name}: required for a new lead")
    if body.email is not None and not is_valid_email(email or ""):
        problems.append("email: must be a valid email address")
    phone_e164 = base.phone_e164 if base and body.phone is None and body.country is None else None
    if phone and phone_e164 is None:
        phone_e164 = to_e164(phone, country or region)
        if phone_e164 is None:
            problems.append("phone: must be a valid phone number (digits, +, dashes, spaces, parentheses)")
    if body.date_of_birth is not None and parse_date(body.date_of_birth) is None:
        problems.append("dateOfBirth: must be a real date written YYYY-MM-DD")
    if body.timezone is not None and not valid_zone(body.timezone):
        problems.append("timezone: unknown IANA time zone")
    _check_objects(body, problems)

    submitted = [QuestionAnswer(**entry) for entry in questionnaire_entries(
        body.questionnaire if isinstance(body.questionnaire, dict)
        else [msgspec.to_builtins(item) for item in body.questionnaire], labels)]
    questionnaire = submitted
    if base is not None and base.questionnaire:
        replaced = {entry.key for entry in submitted if entry.key}
        questionnaire = [e for e in base.questionnaire if not e.key or e.key not in replaced] + submitted

    def merged(new: dict | None, old: dict | None) -> dict:
        return {**(old or {}), **(new or {})}

    lead = LeadRecord(
        lead_id=lead_id, status="pending",
        first_name=first, last_name=last, email=email, phone=phone, phone_e164=phone_e164,
        address=body.address if body.address is not None else (base.address if base else None),
        date_of_birth=body.date_of_birth if body.date_of_birth is not None else (base.date_of_birth if base else None),
        country=country,
        files=body.files if body.files is not None else (base.files if base else []),
        questionnaire=questionnaire,
        attribution=merged(body.attribution, base.attribution if base else None),
        compliance=merged(body.compliance, base.compliance if base else None),
        is_test=body.is_test if body.is_test is not None else (base.is_test if base else False),
        timezone=body.timezone if body.timezone is not None else (base.timezone if base else None),
        notes=body.notes if body.notes is not None else (base.notes if base else None),
        custom_fields=merged(body.custom_fields, base.custom_fields if base else None),
        verification=base.verification if base else {},
        approval=base.approval if base else None,
        submission_count=base.submission_count if base else 0,
        source_id=base.source_id if base else None,
        created_at=base.created_at if base else now,
        updated_at=now,
    )
    return lead, problems


def facts_of(lead: LeadRecord) -> dict[str, Any]:
    """The lead as rule conditions see it: submit body names, plus `sourceId` (and `age`, which
    the engine derives from dateOfBirth)."""
    return msgspec.to_builtins(lead)
