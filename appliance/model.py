"""Base struct for every request, response, config and bundle shape, and the translation of
msgspec's validation messages into the contract's `"<field path>: <what is wrong>"` strings."""

from __future__ import annotations

import re
from typing import NoReturn

import msgspec


class _KeywordOnly(msgspec.StructMeta):
    # msgspec does not inherit kw_only; every model wants it so required fields may follow defaults.
    def __new__(mcls, name, bases, namespace, **options):
        options.setdefault("kw_only", True)
        return super().__new__(mcls, name, bases, namespace, **options)


class Model(msgspec.Struct, metaclass=_KeywordOnly, rename="camel", forbid_unknown_fields=True):
    """Wire names are camelCase (the interface's), attributes snake_case; unknown fields are errors."""


class Settings(msgspec.Struct, metaclass=_KeywordOnly, forbid_unknown_fields=True):
    """Config file tables: keys are snake_case as written in the TOML; unknown keys are errors."""


# Marker that lets a __post_init__ check name the field it failed on; msgspec only knows the
# path of the struct that raised, so the field is carried inside the message.
_FIELD_MARK = re.compile(r"^@(?P<field>[^@]+)@ (?P<problem>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_AT = re.compile(r"^(?P<problem>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`$")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<field>[^`]+)`$")


def invalid(field: str, problem: str) -> NoReturn:
    """Raise from a struct's __post_init__; the error comes out as `<path>.<field>: <problem>`."""
    raise ValueError(f"@{field}@ {problem}")


def join_path(path: str, field: str) -> str:
    if not path:
        return field
    if not field:
        return path
    if field.startswith("["):
        return path + field
    return f"{path}.{field}"


def _clean_path(raw: str | None) -> str:
    return (raw or "").lstrip(".")


def describe_validation_error(exc: msgspec.MsgspecError | str, prefix: str = "") -> str:
    """One `"<field path>: <problem>"` string for a msgspec error message."""
    text = str(exc)
    marked = _FIELD_MARK.match(text)
    if marked:
        path = join_path(_clean_path(marked["path"]), marked["field"])
        return f"{join_path(prefix, path) or 'body'}: {marked['problem']}"
    at = _AT.match(text)
    problem, path = (at["problem"], _clean_path(at["path"])) if at else (text, "")
    if m := _MISSING.match(problem):
        path, problem = join_path(path, m["field"]), "required field missing"
    elif m := _UNKNOWN.match(problem):
        path, problem = join_path(path, m["field"]), "unknown field"
    else:
        problem = problem.replace("`", "")
        problem = problem[:1].lower() + problem[1:]
    return f"{join_path(prefix, path) or 'body'}: {problem}"

