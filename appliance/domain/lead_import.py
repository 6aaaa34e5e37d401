"""CSV lead import, the pure part: which submit field each column of a file fills (by header
name, or as the caller maps it), and one data row as a submit body.

Targets are the submit body's fields (appliance/domain/submission.SubmitLead) by their wire
names, less `campaignId` (the import names it once), `leadId` (an import creates leads) and
`files` (a list); object fields take dotted paths: `address.<street|city|state|zip>`, and any key
under `questionnaire`, `attribution`, `compliance` and `customFields`."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from appliance.domain.lead import Address
from appliance.domain.standard_fields import STANDARD_FIELDS
from appliance.domain.submission import SubmitLead

_LEFT_OUT = ("campaignId", "leadId", "files")
FIELDS: tuple[str, ...] = tuple(f.encode_name for f in msgspec.structs.fields(SubmitLead)
                                if f.encode_name not in _LEFT_OUT)
ADDRESS_FIELDS: tuple[str, ...] = tuple(f.encode_name for f in msgspec.structs.fields(Address))
OPEN_OBJECTS = ("questionnaire", "attribution", "compliance", "customFields")
# Fields a submit body takes as JSON true/false: a CSV cell holds them as a person writes them.
BOOLEAN_TARGETS = frozenset(entry.key for entry in STANDARD_FIELDS if entry.data_type == "boolean")
_BOOLEAN_WORDS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
_SEPARATORS = re.compile(r"[\s_\-.]+")
# Header names people use for a field besides its own (compared squashed, see _squash).
_ALIASES = {
    "phonenumber": "phone", "mobile": "phone", "cell": "phone", "emailaddress": "email", "dob": "dateOfBirth",
    "birthdate": "dateOfBirth", "zipcode": "address.zip", "postalcode": "address.zip", "postcode": "address.zip",
    "streetaddress": "address.street", "address1": "address.street", "note": "notes",
}


def _squash(name: str) -> str:
    """"First Name", "first_name", "FIRSTNAME" and "first-name" all become "firstname"."""
    return _SEPARATORS.sub("", name).lower()


_BY_SQUASHED = {_squash(name): name for name in FIELDS if name not in ("address", *OPEN_OBJECTS)} | {
    _squash(name): f"address.{name}" for name in ADDRESS_FIELDS} | {
    _squash(f"address{name}"): f"address.{name}" for name in ADDRESS_FIELDS} | _ALIASES
_OBJECT_BY_SQUASHED = {_squash(name): name for name in ("address", *OPEN_OBJECTS)}


def target_problem(target: str) -> str | None:
    """Why `target` is not a field a column may fill (None: it is one)."""
    head, dot, rest = target.partition(".")
    if not dot:
        return None if head in FIELDS and head not in ("address", *OPEN_OBJECTS) else \
            f"unknown submit field {target!r}" + (f" (give a key under it: {head}.<key>)" if head in FIELDS else "")
    if head == "address":
        return None if rest in ADDRESS_FIELDS else f"unknown address field {rest!r} ({', '.join(ADDRESS_FIELDS)})"
    if head in OPEN_OBJECTS:
        return None if rest and "." not in rest else f"give one key under {head}: {head}.<key>"
    return f"unknown submit field {target!r}"


def auto_target(header: str) -> str | None:
    """The field a column named `header` fills, or None: the submit field with that name, spaces,
    underscores, hyphens and case aside ("First Name" -> firstName, "State" -> address.state), or
    a dotted path written out ("questionnaire.injured", "Address.Zip")."""
    name = header.strip()
    head, dot, rest = name.partition(".")
    if dot and (obj := _OBJECT_BY_SQUASHED.get(_squash(head))) is not None:
        key = _BY_SQUASHED.get(_squash(f"address{rest}"), "").partition(".")[2] if obj == "address" else rest.strip()
        return f"{obj}.{key}" if key and target_problem(f"{obj}.{key}") is None else None
    return _BY_SQUASHED.get(_squash(name))


def resolve_columns(header: Sequence[str], mapping: Mapping[str, str | None]) -> tuple[list[tuple[int, str]], list[str]]:
    """(column index, target) of each column that fills a field, and the problems: `mapping`
    (CSV column -> target, or None to leave a column out) overrides the names' own meaning."""
    problems = []
    names = [cell.strip() for cell in header]
    for column, target in mapping.items():
        if column.strip() not in names:
            problems.append(f"mapping.{column}: no column {column!r} in the file's header")
        elif target is not None and (problem := target_problem(target)) is not None:
            problems.append(f"mapping.{column}: {problem}")
    given = {column.strip(): target for column, target in mapping.items()}
    columns: list[tuple[int, str]] = []
    seen: dict[str, str] = {}
    for index, name in enumerate(names):
        target = given[name] if name in given else auto_target(name)
        if target is None:
            continue
        if target in seen:
            problems.append(f"mapping: the columns {seen[target]!r} and {name!r} both fill {target}")
            continue
        seen[target] = name
        columns.append((index, target))
    if not columns and not problems:
        problems.append("file: no column of the header maps to a submit field (name the columns after the fields,"
                        " or give a mapping)")
    return columns, problems


def row_body(cells: Sequence[str], columns: Sequence[tuple[int, str]], campaign_id: str,
             header: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """A data row as a submit body (JSON-shaped): each mapped, non-blank cell at its target, and
    the problems of cells that cannot be read as their field's type (naming the column)."""
    body: dict[str, Any] = {"campaignId": campaign_id}
    problems: list[str] = []
    for index, target in columns:
        if index >= len(cells):
            continue
        value: Any = cells[index].strip()
        if not value:
            continue
        if target in BOOLEAN_TARGETS:
            value = _BOOLEAN_WORDS.get(value.lower(), value)
            if not isinstance(value, bool):
                problems.append(f"{target}: column {header[index].strip()!r} must read true/false, yes/no or 1/0,"
                                f" not {value!r}")
                continue
        head, dot, rest = target.partition(".")
        if dot:
            body.setdefault(head, {})[rest] = value
        else:
            body[head] = value
    return body, problems
