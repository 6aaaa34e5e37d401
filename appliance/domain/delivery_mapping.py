"""The pure half of the built-in HTTP delivery adapter: build the body
sent to a buyer from the endpoint's field mapping, encode it, and read the buyer's answer by the
endpoint's response rules. No I/O here; appliance/adapters/http_delivery.py does the request.

Decisions:
- Field mapping: `leadField` is a path read with `rules.resolve` (dotted, `questionnaire.<key>`,
  `age`); `value` is a fixed value. A missing value (None, blank string, empty list/object) is
  left out of the body, or is the problem `fieldMapping[i] <clientKey>: required value missing`
  when the mapping is required. Every value is coerced to the mapping's `type`; a value that
  cannot be coerced is a problem (the lead's value is never echoed: it may be personal data).
  No field mapping at all sends the whole lead record as it is.
- `string` of a list of scalars is the items joined by ", "; of an object, its JSON text.
- Bodies: json; form (`application/x-www-form-urlencoded`, a list of scalars repeats the key,
  an object or nested list is sent as its JSON text); xml (`<lead><key>value</key>...</lead>`,
  objects nest, a list is `<key><item>..</item>...</key>`, null is an empty element, names are
  made valid XML names, text escaped and characters XML 1.0 forbids dropped).
- Response rules: duplicate, then failure, then success; a matcher matches when ALL the parts it
  gives match (statusCodes contains the status; the value at jsonPath is one of `values`, compared
  as trimmed case-insensitive text, numbers by value; a jsonPath without `values` needs a value
  present; bodyPattern is searched case-insensitively). A matcher that gives no part never matches.
  No rule matched: 2xx success, 3xx error "redirect not followed", 408 / 429 / 5xx error, other
  4xx failure, anything else error.
- `message` is the value at messagePath, else the short reason. `response_fields` are the
  top-level scalar fields of a JSON object body (at most 50, values cut to 500 characters).
- Nothing here raises on any body: malformed JSON is just not JSON.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from datetime import date
from functools import lru_cache
from typing import Any, Final
from urllib.parse import urlencode

import msgspec

from appliance.domain.delivery_result import DeliveryResult
from appliance.domain.endpoint import DeliveryEndpoint, FieldMapping, ResponseMatcher, ResponseRules
from appliance.domain.rules import MISSING, as_number, is_absent, resolve

MAX_RESPONSE_FIELDS: Final = 50
MAX_FIELD_CHARS: Final = 500
MAX_MESSAGE_CHARS: Final = 500

_TRUE: Final = frozenset({"true", "yes", "y", "1", "on"})
_FALSE: Final = frozenset({"false", "no", "n", "0", "off"})


class _Impossible(Exception):
    pass


# ---- building the body -------------------------------------------------------------------




def _scalar_text(x: Any) -> str | None:
    if isinstance(x, str):
        return x
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float):
        if math.isfinite(x) and x.is_integer() and abs(x) < 1e16:
            return str(int(x))
        return repr(x) if math.isfinite(x) else None
    if isinstance(x, int):
        try:
            return str(x)
        except ValueError:  # more than 4300 digits
            return None
    return None


def _number(x: Any) -> int | float:
    number = as_number(x)
    if number is None:
        raise _Impossible
    return number


def coerce(value: Any, kind: str) -> Any:
    """`value` as the mapping type `kind`; raises _Impossible when it cannot be."""
    if kind == "string":
        text = _scalar_text(value)
        if text is not None:
            return text
        if isinstance(value, list) and all(_scalar_text(v) is not None for v in value):
            return ", ".join(_scalar_text(v) for v in value)  # type: ignore[misc]
        if isinstance(value, (list, dict)):
            return msgspec.json.encode(value).decode()
        raise _Impossible
    if kind == "number":
        return _number(value)
    if kind == "integer":
        number = _number(value)
        if isinstance(number, float):
            if not number.is_integer():
                raise _Impossible
            return int(number)
        return number
    if kind == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            folded = value.strip().casefold()
            if folded in _TRUE:
                return True
            if folded in _FALSE:
                return False
        raise _Impossible
    raise _Impossible


def build_payload(endpoint: DeliveryEndpoint, lead: Mapping[str, Any], today: date) -> tuple[dict[str, Any], list[str]]:
    """The body to send (client key -> typed value) and the problems that stop the delivery."""
    if not endpoint.field_mapping:
        return dict(lead), []
    return mapped_payload(endpoint.field_mapping, lead, today)


def mapped_payload(field_mapping: Sequence[FieldMapping], lead: Mapping[str, Any],
                   today: date) -> tuple[dict[str, Any], list[str]]:
    """The values `field_mapping` takes from the lead (client key -> typed value) and the problems."""
    payload: dict[str, Any] = {}
    problems: list[str] = []
    for i, mapping in enumerate(field_mapping):
        where = f"fieldMapping[{i}] {mapping.client_key}"
        if mapping.value is not None:
            raw: Any = mapping.value
        else:
            raw = resolve(lead, mapping.lead_field, today)
        if is_absent(raw):
            if mapping.required:
                problems.append(f"{where}: required value missing")
            continue
        try:
            payload[mapping.client_key] = coerce(raw, mapping.type)
        except _Impossible:
            source = "fixed value" if mapping.value is not None else f"value of {mapping.lead_field}"
            problems.append(f"{where}: {source} cannot be converted to {mapping.type}")
    return payload, problems


# ---- encoding ----------------------------------------------------------------------------


def form_pairs(payload: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Key/value pairs for a form body or a query string (see the module docstring)."""
    pairs: list[tuple[str, str]] = []
    for key, value in payload.items():
        if value is None:
            pairs.append((str(key), ""))
            continue
        text = _scalar_text(value)
        if text is not None:
            pairs.append((str(key), text))
        elif isinstance(value, list) and all(_scalar_text(v) is not None for v in value):
            pairs.extend((str(key), _scalar_text(v)) for v in value)  # type: ignore[misc]
        else:
            pairs.append((str(key), msgspec.json.encode(value).decode()))
    return pairs


_XML_NAME_START = re.compile(r"[A-Za-z_\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u02FF\u0370-\u037D\u037F-\u1FFF"
                             r"\u200C-\u200D\u2070-\u218F\u2C00-\u2FEF\u3001-\uD7FF\uF900-\uFDCF\uFDF0-\uFFFD]")
_XML_NAME_BAD = re.compile(r"[^A-Za-z0-9_.\-\u00B7\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u037D\u037F-\u1FFF"
                           r"\u200C-\u200D\u203F-\u2040\u2070-\u218F\u2C00-\u2FEF\u3001-\uD7FF\uF900-\uFDCF\uFDF0-\uFFFD]")
# Characters XML 1.0 does not allow at all (controls other than tab / LF / CR, surrogates, FFFE/FFFF).
_XML_FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


@lru_cache(maxsize=1024)
def xml_name(key: str) -> str:
    """`key` as a valid XML element name: bad characters become `_`, a bad first one gets `_` before it."""
    name = _XML_NAME_BAD.sub("_", str(key))
    if not name or not _XML_NAME_START.match(name):
        name = "_" + name
    return name


def _xml_text(text: str) -> str:
    text = _XML_FORBIDDEN.sub("", text)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _xml_element(out: list[str], key: str, value: Any, depth: int) -> None:
    name = xml_name(key)
    if value is None or depth > 64:
        out.append(f"<{name}/>")
        return
    if isinstance(value, Mapping):
        out.append(f"<{name}>")
        for k, v in value.items():
            _xml_element(out, str(k), v, depth + 1)
        out.append(f"</{name}>")
        return
    if isinstance(value, list):
        out.append(f"<{name}>")
        for v in value:
            _xml_element(out, "item", v, depth + 1)
        out.append(f"</{name}>")
        return
    text = _scalar_text(value)
    out.append(f"<{name}>{_xml_text(text if text is not None else str(value))}</{name}>")


def encode_body(payload: Mapping[str, Any], body_format: str) -> tuple[bytes, str]:
    """(body, Content-Type) for `payload` in the endpoint's body format."""
    if body_format == "form":
        return urlencode(form_pairs(payload)).encode("ascii"), "application/x-www-form-urlencoded"
    if body_format == "xml":
        out = ['<?xml version="1.0" encoding="UTF-8"?>', "<lead>"]
        for key, value in payload.items():
            _xml_element(out, str(key), value, 1)
        out.append("</lead>")
        return "".join(out).encode("utf-8"), "application/xml; charset=utf-8"
    return msgspec.json.encode(payload), "application/json"


# ---- reading the answer ------------------------------------------------------------------


_PATH_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


@lru_cache(maxsize=512)
def _path_parts(path: str) -> tuple[str | int, ...] | None:
    path = path.strip()
    if path.startswith("$"):
        path = path[1:]
    path = path.lstrip(".")
    parts: list[str | int] = []
    pos = 0
    while pos < len(path):
        if path[pos] == "." and parts:
            pos += 1
        m = _PATH_PART.match(path, pos)
        if not m:
            return None
        parts.append(m.group(1) if m.group(1) is not None else int(m.group(2)))
        pos = m.end()
    return tuple(parts) if parts else None


def json_path(document: Any, path: str | None) -> Any:
    """The value at a dotted path with `[n]` indexes (`result.items[0].id`, a leading `$.` is
    allowed), or MISSING."""
    if not path:
        return MISSING
    parts = _path_parts(path)
    if parts is None:
        return MISSING
    node = document
    for part in parts:
        if isinstance(part, int):
            if isinstance(node, list) and part < len(node):
                node = node[part]
            elif isinstance(node, Mapping) and str(part) in node:
                node = node[str(part)]
            else:
                return MISSING
        elif isinstance(node, Mapping) and part in node:
            node = node[part]
        else:
            return MISSING
    return node


def _fold(x: Any) -> Any:
    """Comparison key: numbers by value, text trimmed and case-folded, None when incomparable."""
    if not isinstance(x, bool):
        try:
            return _number(x)
        except _Impossible:
            pass
    text = _scalar_text(x)
    return None if text is None else text.strip().casefold()


@lru_cache(maxsize=256)
def _body_regex(pattern: str) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern, re.IGNORECASE)
    except (re.error, ValueError, OverflowError, RecursionError):
        return None


def response_matches(matcher: ResponseMatcher | None, status: int, document: Any, text: str) -> bool:
    if matcher is None:
        return False
    given = False
    if matcher.status_codes:
        given = True
        if status not in matcher.status_codes:
            return False
    if matcher.json_path:
        given = True
        found = json_path(document, matcher.json_path)
        if found is MISSING or found is None:
            return False
        if matcher.values:
            wanted = {_fold(v) for v in matcher.values}
            candidates = found if isinstance(found, list) else [found]  # a list matches by any item
            if not any((key := _fold(c)) is not None and key in wanted for c in candidates):
                return False
    if matcher.body_pattern:
        given = True
        regex = _body_regex(matcher.body_pattern)
        if regex is None or regex.search(text) is None:
            return False
    return given


_CHARSET = re.compile(r"charset\s*=\s*\"?([A-Za-z0-9_.:\-]+)", re.IGNORECASE)


def body_text(body: bytes, content_type: str | None) -> str:
    charset = "utf-8"
    if content_type:
        m = _CHARSET.search(content_type)
        if m:
            charset = m.group(1)
    try:
        return body.decode(charset, errors="replace")
    except LookupError:
        return body.decode("utf-8", errors="replace")


def parse_json(body: bytes) -> Any:
    """The JSON document in `body`, or MISSING when it is not JSON (never raises)."""
    stripped = body.strip()
    if not stripped or stripped[:1] not in b"{[\"-0123456789tfn":
        return MISSING
    try:
        return msgspec.json.decode(stripped)
    except (msgspec.DecodeError, ValueError, RecursionError):
        return MISSING


def short_text(value: Any, limit: int) -> str | None:
    if value is MISSING or value is None:
        return None
    text = _scalar_text(value)
    if text is None:
        text = msgspec.json.encode(value).decode()
    text = text.strip()
    return text[:limit] if text else None


def response_fields(document: Any) -> dict[str, str]:
    if not isinstance(document, dict):
        return {}
    fields: dict[str, str] = {}
    for key, value in document.items():
        if len(fields) >= MAX_RESPONSE_FIELDS:
            break
        text = _scalar_text(value)
        if text is not None:
            fields[str(key)[:MAX_FIELD_CHARS]] = text[:MAX_FIELD_CHARS]
    return fields


def _default_outcome(status: int) -> tuple[str, str]:
    if 200 <= status < 300:
        return "success", f"HTTP {status}"
    if 300 <= status < 400:
        return "error", f"redirect not followed (HTTP {status})"
    if status in (408, 429) or 500 <= status < 600:
        return "error", f"HTTP {status}"
    if 400 <= status < 500:
        return "failure", f"HTTP {status}"
    return "error", f"unexpected HTTP status {status}"


def interpret(rules: ResponseRules, status_code: int, body: bytes, content_type: str | None = None) -> DeliveryResult:
    """The outcome of a buyer's answer (url, method and body_format are left for the adapter)."""
    document = parse_json(body)
    text = body_text(body, content_type)
    for outcome, matcher in (("duplicate", rules.duplicate), ("failure", rules.failure), ("success", rules.success)):
        if response_matches(matcher, status_code, document, text):
            reason = f"HTTP {status_code}: {outcome} rule matched"
            break
    else:
        outcome, reason = _default_outcome(status_code)
    client_lead_id = short_text(json_path(document, rules.client_lead_id_path), MAX_FIELD_CHARS) \
        if rules.client_lead_id_path else None
    message = short_text(json_path(document, rules.message_path), MAX_MESSAGE_CHARS) if rules.message_path else None
    return DeliveryResult(
        outcome=outcome,  # type: ignore[arg-type]
        reason=reason,
        status_code=status_code,
        client_lead_id=client_lead_id,
        message=message or reason,
        response_fields=response_fields(document),
    )
