"""What the built-in outbound adapters share: `http_client` (the client the SMS and pixel services
hand to any adapter), `post_capped` / `get_capped` / `outage_reason` (one hard deadline over
connect, send and the whole read; adapter setting `timeout_seconds`, default 10, from the
plugin's `[plugins.<module>]` table; redirects never followed; the answer read up to 1 MiB unless
a GET asks for more), and the `Scrubber` that masks credentials in whatever a buyer, provider or
platform answers.

The scrubber is applied once, where an answer enters the appliance (the delivery worker, the SMS
and pixel services), to every adapter's result, built-in or plugin: a peer that echoes what it
was sent (an Authorization header, a query string) must not put a credential into a stored
record, a response, a log line or an exception. Each known secret is masked as sent and in the
forms it travels in: URL-encoded, JSON-escaped, base64 (alone, as `user:secret`, or inside a
longer base64 text at any offset); and whatever credentials a text carries in the open
(`Basic` with a `user:password` inside, `Bearer` tokens, `user:password@` in URLs) are masked
even when the appliance does not know them.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
import ssl
import traceback
from collections.abc import Iterable
from typing import Any, Final, NamedTuple
from urllib.parse import quote, quote_plus

import certifi
import httpx
import msgspec

from appliance.domain.lead import JourneyError

MASK: Final = "***"
DEFAULT_TIMEOUT_SECONDS: Final = 10.0
MAX_RESPONSE_BYTES: Final = 1024 * 1024
USER_AGENT: Final = "appliance"


class Answer(NamedTuple):
    status: int
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


_tls: ssl.SSLContext | None = None


def http_client() -> httpx.AsyncClient:
    """A client for one outgoing call: no proxies from the environment, no redirects, and the
    TLS context (the costly part of a new client) built once per process."""
    global _tls
    if _tls is None:
        _tls = ssl.create_default_context(cafile=certifi.where())
    return httpx.AsyncClient(verify=_tls, trust_env=False, follow_redirects=False, timeout=None)


def timeout_of(settings: dict[str, Any]) -> float:
    value = settings.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return DEFAULT_TIMEOUT_SECONDS
    return float(value)


async def post_capped(http: httpx.AsyncClient, url: str, *, headers: dict[str, str], content: bytes,
                      timeout: float) -> Answer:
    """POST under one deadline; raises TimeoutError or httpx.HTTPError (see `outage_reason`)."""
    return await _capped(http, "POST", url, headers, content, timeout, MAX_RESPONSE_BYTES)


async def get_capped(http: httpx.AsyncClient, url: str, *, headers: dict[str, str], timeout: float,
                     max_bytes: int = MAX_RESPONSE_BYTES) -> Answer:
    """GET under one deadline, the answer read up to `max_bytes` (a caller that must tell a file
    too large from one just at its limit asks for one byte more); raises like `post_capped`."""
    return await _capped(http, "GET", url, headers, None, timeout, max_bytes)


async def _capped(http: httpx.AsyncClient, method: str, url: str, headers: dict[str, str], content: bytes | None,
                  timeout: float, max_bytes: int) -> Answer:
    async with asyncio.timeout(timeout):
        request = http.build_request(method, url, headers={"User-Agent": USER_AGENT, **headers}, content=content,
                                     timeout=httpx.Timeout(timeout))
        response = await http.send(request, stream=True, follow_redirects=False)
        try:
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                chunks.append(chunk[:max_bytes - size])
                size += len(chunk)
                if size >= max_bytes:
                    break
        finally:
            await response.aclose()
    return Answer(response.status_code, b"".join(chunks))


def outage_reason(who: str, exc: BaseException, timeout: float) -> str:
    """Why a call to `who` got no answer, without the exception's text where it could hold a URL."""
    if isinstance(exc, (TimeoutError, httpx.TimeoutException)):
        return f"{who} did not answer within {timeout:g} s"
    if isinstance(exc, httpx.ConnectError):
        return f"{who} could not be reached (connection failed)"
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"{who} closed the connection without a complete answer"
    if isinstance(exc, (httpx.ReadError, httpx.WriteError)):
        return f"{who} connection error"
    return f"{who} request failed ({type(exc).__name__})"


def transient(status: int) -> bool:
    return status >= 500 or status in (408, 429)


def short(text: Any, limit: int = 300) -> str:
    return str(text).strip()[:limit]


# Shorter secrets are not masked: a three-character value would hit ordinary words.
MIN_SECRET_LENGTH: Final = 4
# A base64 fragment of a secret found inside longer base64 text is masked from this length on.
_MIN_FRAGMENT: Final = 6
_BASIC = re.compile(r"(?i)\b(basic)(\s+)([A-Za-z0-9+/_-]{4,}={0,2})")
_BEARER = re.compile(r"(?i)\b(bearer)(\s+)([A-Za-z0-9._~+/-]{8,}=*)")
# A scheme starts where no scheme character stands before it (a `\b` there would try every
# position of a long run of them: quadratic time on a long text).
_URL_USERINFO = re.compile(r"(?i)(?<![a-z0-9+.-])([a-z][a-z0-9+.-]*://)[^\s/?#@:]*:[^\s/?#@]*@")
_PERCENT_ESCAPE = re.compile(r"%[0-9A-F]{2}")
# A text cut short (an adapter keeps the first N characters of a buyer's message) may end in the
# first part of a credential: an ending of at least this many characters that begins a known
# form is masked too.
_MIN_CUT_TAIL: Final = 6


def _base64_forms(raw: bytes) -> set[str]:
    """Base64 of `raw` alone, and the part of it that is the same wherever `raw` sits inside a
    longer base64 text (the three byte alignments), in the standard and URL-safe alphabets."""
    forms: set[str] = set()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode("ascii").rstrip("=")
        start = (0, 2, 3)[offset]  # characters that also carry bits of the bytes before
        end = len(encoded) - (1 if (offset + len(raw)) % 3 else 0)  # and of the bytes after
        fragment = encoded[start:end]
        if len(fragment) >= _MIN_FRAGMENT:
            forms.add(fragment)
    forms.add(base64.b64encode(raw).decode("ascii"))
    return forms | {f.replace("+", "-").replace("/", "_") for f in forms}


def _forms(secret: str) -> set[str]:
    encoded = {quote(secret, safe=""), quote(secret), quote_plus(secret)}
    encoded |= {_PERCENT_ESCAPE.sub(lambda m: m[0].lower(), form) for form in encoded}  # %2f as some encode
    forms = {secret, *encoded, msgspec.json.encode(secret).decode()[1:-1]}
    return forms | _base64_forms(secret.encode())


class Scrubber:
    """Masks `secrets` (and `pairs` of user and secret, as basic auth sends them) in text."""

    __slots__ = ("_known", "_beginnings", "_starts", "_longest")

    def __init__(self, secrets: Iterable[str | None] = (), pairs: Iterable[tuple[str | None, str | None]] = ()) -> None:
        forms: set[str] = set()
        for secret in secrets:
            if secret and len(secret) >= MIN_SECRET_LENGTH:
                forms |= _forms(secret)
        for user, secret in pairs:
            if secret and len(secret) >= MIN_SECRET_LENGTH:
                forms |= _base64_forms(f"{user or ''}:{secret}".encode())
        # Longest first, so a form that contains another is masked whole.
        ordered = sorted((f for f in forms if len(f) >= MIN_SECRET_LENGTH), key=len, reverse=True)
        self._known = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        self._beginnings = {f[:n] for f in ordered for n in range(_MIN_CUT_TAIL, len(f))}
        # Where such an ending may start: a lookahead finds every position, overlapping ones too.
        starts = sorted({f[:_MIN_CUT_TAIL] for f in ordered if len(f) > _MIN_CUT_TAIL})
        self._starts = re.compile("(?=" + "|".join(map(re.escape, starts)) + ")") if starts else None
        self._longest = len(ordered[0]) if ordered else 0

    def __call__(self, text: str | None) -> str | None:
        if not text:
            return text
        if self._known is not None:
            text = self._known.sub(MASK, text)
            if self._starts is not None:
                window = text[-(self._longest - 1):]
                for start in self._starts.finditer(window):  # earliest first: the longest ending
                    if window[start.start():] in self._beginnings:
                        text = text[:len(text) - len(window) + start.start()] + MASK
                        break
        if "asic" in text or "ASIC" in text:
            text = _BASIC.sub(_mask_basic, text)
        if "earer" in text or "EARER" in text:
            text = _BEARER.sub(lambda m: f"{m[1]}{m[2]}{MASK}", text)
        if "@" in text:
            text = _URL_USERINFO.sub(lambda m: f"{m[1]}{MASK}@", text)
        return text

    def value(self, value: Any) -> Any:
        """`value` as plain JSON data with every string in it (keys too) scrubbed: a platform's
        answer as an adapter handed it over."""
        if isinstance(value, dict):
            return {self(str(k)): self.value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(v) for v in value]
        if isinstance(value, (int, float, bool)) or value is None:
            return value
        return self(str(value))


def _mask_basic(match: re.Match[str]) -> str:
    """`Basic <base64>` whose text decodes to `user:password` is a credential; `Basic` followed by
    an ordinary word is not."""
    token = match[3]
    try:
        decoded = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_" if "-" in token or "_" in token else None,
                                   validate=True)
    except (binascii.Error, ValueError):
        return match[0]
    return f"{match[1]}{match[2]}{MASK}" if b":" in decoded else match[0]


def stack_of(exc: BaseException, limit: int = 10) -> str:
    """Where `exc` was raised, innermost last, as `file:line in function` lines: a traceback
    without source text or values, so it carries no request data."""
    frames = traceback.extract_tb(exc.__traceback__)[-limit:]
    return "\n".join(f"{frame.filename}:{frame.lineno} in {frame.name}" for frame in frames)


def adapter_crash(exc: BaseException, scrub: Scrubber) -> JourneyError:
    """What an adapter's exception leaves in the journey and the log: its type, its message and
    where it was raised, with known credentials masked (a plugin may put one in a message)."""
    text = " ".join(str(exc)[:2000].split())
    message = scrub(f"{type(exc).__name__}: {text}".rstrip(": ")[:500]) or type(exc).__name__
    return JourneyError(code="adapter_exception", message=message, stack=scrub(stack_of(exc)))
