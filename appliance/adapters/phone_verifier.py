"""The built-in `phone` verifier: what the phone number library (phonenumbers, offline) says of the
lead's E.164 phone. No I/O and a few microseconds, so it runs inline (`blocking = False`).

Data: `valid` (a number of an assigned range), `lineType` (the library's PhoneNumberType in lower
case: `mobile`, `fixed_line`, `fixed_line_or_mobile`, `voip`, `toll_free`, ..., `unknown` for an
invalid number) and `region` (the region the library finds for the number: ISO 3166 alpha-2, `001`
for a non-geographic one such as +800, None when it finds none; a region told by its leading
digits is found for an invalid number too).
Outcome: `pass` for a valid number, `fail` for an invalid one (the normaliser accepts numbers
that are only possible: the right length, an unassigned range), `unknown` for a lead without
a phone. Config: `lineTypes` (optional): the line types that pass; a valid number of another
type fails. Results may be cached per E.164 phone (`cache_key`).

A campaign's submit runs this for every lead, so it does the library's work once and cheaply.
The number is built straight from the E.164 text for North American numbers (what `parse`
gives, without parsing the text again). Its region is found by the library's own search
(`region_code_for_number`: the calling code's regions in order, each told by its leading digits
or, without them, by `is_valid_number_for_region`: the region's general pattern and one of its
number types' take the national number), on the library's metadata compiled once: runs of
leading digits as one pattern, each region's number types for a length as one pattern. The
library looks every region and pattern up again: about 35 us for a North American number of no
region (25 regions, two full checks), against 5 here. A number without a region is invalid
without asking further (the library's `is_valid_number` is `number_type(...) != UNKNOWN` for
the region it finds); the line type of the others is the library's `number_type`, which keeps
its compiled patterns (`enable_pattern_cache`). tests/test_verification.py holds the search to
the library's answers on every region's example numbers and their neighbours."""

from __future__ import annotations

import functools
import re
from typing import Any

import phonenumbers
from phonenumbers import COUNTRY_CODE_TO_REGION_CODE, PhoneMetadata, PhoneNumber, PhoneNumberType

from appliance import sdk
from appliance.model import Model, all_problems, invalid

# PhoneNumberType's names in lower case, by value.
LINE_TYPES: dict[int, str] = {value: name.lower() for name, value in vars(PhoneNumberType).items()
                              if name.isupper() and isinstance(value, int)}


class PhoneConfig(Model):
    line_types: list[str] = []  # empty: any valid number passes

    def __post_init__(self) -> None:
        for i, line_type in enumerate(self.line_types):
            if line_type not in LINE_TYPES.values() or line_type == "unknown":
                known = ", ".join(sorted(t for t in LINE_TYPES.values() if t != "unknown"))
                invalid(f"lineTypes[{i}]", f"unknown line type {line_type!r} (one of {known})")


class PhoneVerifier(sdk.Verifier):
    name = "phone"
    blocking = False

    def validate(self, config: dict[str, Any]) -> list[str]:
        return all_problems(config, PhoneConfig, "config")

    def cache_key(self, request: sdk.VerificationRequest) -> str | None:
        phone = request.lead.get("phoneE164")
        return phone if isinstance(phone, str) and phone else None

    def verify(self, request: sdk.VerificationRequest, http: Any) -> sdk.VerificationResult:
        phone = request.lead.get("phoneE164")
        if not isinstance(phone, str) or not phone:
            return sdk.VerificationResult(outcome="unknown", reason="the lead has no phone")
        number = _number(phone)
        if number is None:
            return sdk.VerificationResult(outcome="unknown", reason="the phone is not an E.164 number")
        region = _region(number)
        kind = phonenumbers.number_type(number) if region is not None else PhoneNumberType.UNKNOWN
        line_type = LINE_TYPES.get(kind, "unknown")
        data = {"valid": kind != PhoneNumberType.UNKNOWN, "lineType": line_type, "region": region}
        if kind == PhoneNumberType.UNKNOWN:
            return sdk.VerificationResult(outcome="fail", data=data, reason="not a valid phone number")
        allowed = request.config.get("lineTypes")
        if allowed and line_type not in allowed:
            return sdk.VerificationResult(outcome="fail", data=data,
                                          reason=f"line type {line_type} is not one of {', '.join(allowed)}")
        return sdk.VerificationResult(outcome="pass", data=data)


def _number(e164: str) -> PhoneNumber | None:
    national = e164[2:]
    if e164.startswith("+1") and len(national) == 10 and national.isascii() and national.isdigit() \
            and national[0] in "23456789":
        return PhoneNumber(country_code=1, national_number=int(national))
    try:
        return phonenumbers.parse(e164, None)
    except phonenumbers.NumberParseException:
        return None


def _region(number: PhoneNumber) -> str | None:
    """`phonenumbers.region_code_for_number(number)`, by the same search (see the module docstring)."""
    regions = COUNTRY_CODE_TO_REGION_CODE.get(number.country_code)
    if regions is None:
        return None
    if len(regions) == 1:
        return regions[0]
    national = phonenumbers.national_significant_number(number)
    for region, leading, by_group in _searched(number.country_code):
        if leading is None:
            if _valid_in(region, national):
                return region
        elif (found := leading.match(national)) is not None:
            return by_group[found.lastgroup]
    return None


@functools.cache  # one entry per calling code shared by several regions: a few dozen
def _searched(country_code: int) -> tuple[tuple[str, re.Pattern[str] | None, dict[str, str]], ...]:
    """The calling code's regions in the library's order: (region, None, {}) for a region told by a
    full check; ("", pattern, {group: region}) for a run of regions told by their leading digits,
    each a named group of one pattern (the first that matches wins, as in the library's loop)."""
    probes: list[tuple[str, re.Pattern[str] | None, dict[str, str]]] = []
    run: list[tuple[str, str]] = []
    for region in COUNTRY_CODE_TO_REGION_CODE[country_code]:
        metadata = PhoneMetadata.metadata_for_region(region.upper(), None)
        if metadata is None:
            continue
        if metadata.leading_digits is not None:
            run.append((region, metadata.leading_digits))
            continue
        if run:
            probes.append(_leading_run(run))
            run = []
        probes.append((region, None, {}))
    if run:
        probes.append(_leading_run(run))
    return tuple(probes)


def _leading_run(run: list[tuple[str, str]]) -> tuple[str, re.Pattern[str], dict[str, str]]:
    pattern = re.compile("|".join(f"(?P<r{i}>{leading})" for i, (_, leading) in enumerate(run)))
    return "", pattern, {f"r{i}": region for i, (region, _) in enumerate(run)}


# PhoneMetadata's number types, as `number_type` tries them (any one of them makes a number valid).
_TYPE_DESCS = ("premium_rate", "toll_free", "shared_cost", "voip", "personal_number", "pager", "uan", "voicemail",
               "fixed_line", "mobile")


def _valid_in(region: str, national: str) -> bool:
    """`phonenumbers.is_valid_number_for_region` of a number of the region's calling code: the
    region's general pattern and one of its number types' patterns take the whole national number."""
    general, types = _full_check(region, len(national))
    return general is not None and types is not None and general.fullmatch(national) is not None \
        and types.fullmatch(national) is not None


@functools.cache  # per region and length: a few hundred at most
def _full_check(region: str, length: int) -> tuple[re.Pattern[str] | None, re.Pattern[str] | None]:
    metadata = PhoneMetadata.metadata_for_region(region.upper(), None)
    # The library does not try `mobile` when its pattern is the fixed line's (whose lengths may differ).
    kinds = _TYPE_DESCS[:-1] if metadata.same_mobile_and_fixed_line_pattern else _TYPE_DESCS
    return _one_pattern([metadata.general_desc], length), _one_pattern([getattr(metadata, k) for k in kinds], length)


def _one_pattern(descs: list[Any], length: int) -> re.Pattern[str] | None:
    """The descriptions that take numbers of `length` (one that lists no lengths takes any), as one
    pattern; None when none does."""
    patterns = [desc.national_number_pattern for desc in descs if desc is not None and desc.national_number_pattern
                and (not desc.possible_length or length in desc.possible_length)]
    return re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None


@sdk.hookimpl
def appliance_verifiers(settings: dict[str, Any]) -> list[sdk.Verifier]:
    """The built-in phone verifier."""
    phonenumbers.enable_pattern_cache()
    return [PhoneVerifier()]
