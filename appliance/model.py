"""Base struct for every request, response, config and bundle shape, and the translation of
msgspec's validation messages into the contract's `"<field path>: <what is wrong>"` strings."""

from __future__ import annotations

import re
import types
import typing
from typing import Any, NoReturn

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
        problem = _plain_words(problem.replace("`", ""))
    return f"{join_path(prefix, path) or 'body'}: {problem}"


# msgspec's constraint messages, said in plain words; the type names stay where they say it best
# ("expected str, got int").
_PLAIN = [
    (re.compile(r"^Expected str of length >= 1$"), "must not be empty"),
    (re.compile(r"^Expected str of length >= (\d+)$"), "must be at least {} characters"),
    (re.compile(r"^Expected str of length <= (\d+)$"), "must be at most {} characters"),
    (re.compile(r"^Expected array of length >= 1$"), "must not be empty"),
    (re.compile(r"^Expected array of length >= (\d+)$"), "must have at least {} items"),
    (re.compile(r"^Expected array of length <= (\d+)$"), "must have at most {} items"),
    (re.compile(r"^Expected object of length >= (\d+)$"), "must have at least {} keys"),
    (re.compile(r"^Expected object of length <= (\d+)$"), "must have at most {} keys"),
    (re.compile(r"^Expected (?:int|float) >= (\S+)$"), "must be at least {}"),
    (re.compile(r"^Expected (?:int|float) <= (\S+)$"), "must be at most {}"),
    (re.compile(r"^Expected (?:int|float) > (\S+)$"), "must be greater than {}"),
    (re.compile(r"^Expected (?:int|float) < (\S+)$"), "must be less than {}"),
    (re.compile(r"^Expected str matching regex .*$", re.S), "is not in the expected format"),
    (re.compile(r"^Invalid enum value (.*)$", re.S), "{} is not one of the allowed values"),
]


def _plain_words(problem: str) -> str:
    for pattern, words in _PLAIN:
        matched = pattern.match(problem)
        if matched:
            return words.format(*(_number(g) for g in matched.groups()))
    problem = problem.replace(" | null", "")
    return problem[:1].lower() + problem[1:]


def _number(text: str) -> str:
    return text[:-2] if text.endswith(".0") else text


def all_problems(value: Any, kind: Any, path: str = "") -> list[str]:
    """Every problem of `value` (a decoded JSON document) as `kind`, field by field, where msgspec
    stops at the first. Only on the error path: a body that failed to decode as `kind`."""
    struct = _struct_for(kind, value)
    if struct is not None:
        problems = _struct_problems(value, struct, path)
        if problems:
            return problems
    else:
        item_kind = _list_item_kind(kind)
        if item_kind is not None and isinstance(value, list) and _struct_in(item_kind):
            problems = [p for i, item in enumerate(value) for p in all_problems(item, item_kind, f"{path}[{i}]")]
            if problems:
                return problems
    try:
        msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        return [_with_meaning(describe_validation_error(exc, path), kind)]
    return []


def _struct_problems(value: dict, struct: type[msgspec.Struct], path: str) -> list[str]:
    fields = msgspec.structs.fields(struct)
    known = {f.encode_name for f in fields}
    problems = []
    if struct.__struct_config__.forbid_unknown_fields:
        problems += [f"{join_path(path, key)}: unknown field" for key in value if key not in known]
    for field in fields:
        where = join_path(path, field.encode_name)
        if field.encode_name in value:
            problems += all_problems(value[field.encode_name], field.type, where)
        elif field.required:
            problems.append(f"{where}: required field missing")
    return problems


def _members(kind: Any) -> list[Any]:
    """The types a field may hold: Annotated unwrapped, unions spread."""
    if typing.get_origin(kind) is typing.Annotated:
        return _members(typing.get_args(kind)[0])
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(kind) for m in _members(arg)]
    return [kind]


def _struct_for(kind: Any, value: Any) -> type[msgspec.Struct] | None:
    if not isinstance(value, dict):
        return None
    found = [m for m in _members(kind) if isinstance(m, type) and issubclass(m, msgspec.Struct)]
    return found[0] if len(found) == 1 else None


def _list_item_kind(kind: Any) -> Any:
    lists = [m for m in _members(kind) if typing.get_origin(m) is list]
    return typing.get_args(lists[0])[0] if len(lists) == 1 else None


def _struct_in(kind: Any) -> bool:
    return any(isinstance(m, type) and issubclass(m, msgspec.Struct) for m in _members(kind))


def _with_meaning(problem: str, kind: Any) -> str:
    """A format or choice problem said with what the field takes: its Meta description, or the
    values of its Literal."""
    if problem.endswith(": is not in the expected format"):
        descriptions = [meta.description for meta in _metas(kind) if meta.pattern and meta.description]
        if descriptions:
            return problem.replace("is not in the expected format", f"must be {descriptions[0]}")
    if problem.endswith("is not one of the allowed values"):
        choices = [v for m in _members(kind) if typing.get_origin(m) is typing.Literal for v in typing.get_args(m)]
        if choices:
            return f"{problem.split(': ', 1)[0]}: must be one of {', '.join(map(str, choices))}"
    return problem


def _metas(kind: Any) -> list[msgspec.Meta]:
    if typing.get_origin(kind) is typing.Annotated:
        return [a for a in typing.get_args(kind)[1:] if isinstance(a, msgspec.Meta)] + _metas(typing.get_args(kind)[0])
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(kind) for m in _metas(arg)]
    return []

