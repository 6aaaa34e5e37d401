"""The built-in `http` delivery adapter, shaped like a LeadConduit
integration: `validate` (the endpoint), request (built by appliance/domain/delivery_mapping),
response (read by the endpoint's response rules). Registered through the plugin hook like any
plugin. It answers auctions too: `ping` sends the endpoint's `ping` request the same way (its
own URL, method, body format, headers and field mapping; the endpoint's auth and sealed headers)
and reads the bid with appliance/domain/auction.read_ping_answer.

One attempt, in order:
1. The body from the field mapping; a mapping problem or a missing auth secret is outcome
   `failure` and nothing is sent. GET sends the mapped fields as query parameters, no body.
2. Unless `allow_private_addresses`, the SSRF guard (netguard): a refused destination is outcome
   `failure` (retrying cannot help), a host that does not resolve is `error`. The request is
   then sent to the checked address itself with the original Host header and, for https, the
   original TLS server name (SNI, and the certificate is verified against that name), so a second
   DNS answer cannot redirect it (DNS rebinding). Kept-alive connections are pooled by scheme,
   address, port and TLS server name, so two endpoint hosts that resolve to the same address
   never share a TLS connection whose certificate was verified for the other name.
3. Headers: the endpoint's, then auth (basic: username + secret `auth.password`; bearer and
   header: secret `auth.token`), `Idempotency-Key: <submissionId>` (always ours), Content-Type
   of the body format (unless the endpoint sets one), `Accept-Encoding: identity` by default so
   the 1 MiB cap is a cap on what we hold, not on compressed bytes (a gzip or deflate answer sent
   anyway is inflated to at most 1 MiB before the rules read it). Credentials in the URL are
   sent as basic auth (as httpx did). A header value with a line break or a non-ASCII character
   (a secret can carry one) is outcome `failure` and nothing is sent: a line break would let a
   value add headers, and the framing headers (Content-Length, Transfer-Encoding) are ours.
4. Redirects are never followed: a 3xx no rule claims is outcome `error` "redirect not followed".
5. Resolution, connect, send and the whole body read run under one hard deadline
   (`timeoutSeconds`): a buyer that drips bytes forever ends at the deadline, outcome `error`.
   Connection refused / reset / closed without an answer is `error`.
6. The body is read as a stream and capped at 1 MiB: past the cap we stop reading, close the
   connection and interpret what we have (the status code is the buyer's answer; a body rule
   sees the first 1 MiB, malformed JSON counts as no JSON); the reason says it was truncated.
   Retrying instead would resend a lead the buyer may already have taken.
7. `url` is shown without userinfo and with credential-looking query values masked. The worker
   masks every credential of the endpoint in the rest of the result (adapters/outbound.Scrubber),
   as it does for any adapter. The endpoint arrives with its credentials (headers, URL) filled
   in from the secret store.

The exchange runs on appliance/adapters/http1, a small HTTP/1.1 keep-alive client of this
adapter's own (httpx cost most of the delivery worker's time); the `http` client that `deliver`
is given is not used. It retries once, on a new connection, a request that a kept-alive
connection lost before any byte of the answer: safe because of the Idempotency-Key.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import ssl
import zlib
from datetime import datetime
from typing import Any, Final, NamedTuple
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import msgspec

from appliance.adapters import http1, netguard
from appliance.domain.delivery_mapping import (
    build_payload,
    encode_body,
    form_pairs,
    interpret,
)
from appliance.domain.endpoint import DeliveryEndpoint, looks_like_credential
from appliance.domain.auction import read_ping_answer
from appliance.sdk import DeliveryAdapter, DeliveryRequest, DeliveryResult, PingRequest, PingResult, hookimpl

MAX_RESPONSE_BYTES: Final = 1024 * 1024
MASK: Final = "***"

_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


@functools.lru_cache(maxsize=1024)  # every delivery records it: parsed once per URL, as parse_target
def display_url(url: str | None) -> str | None:
    """`url` as it may be recorded: no userinfo, no fragment, secret-looking query values masked."""
    if not url:
        return url
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return None
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port is not None else host
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, MASK if looks_like_credential(k) else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _auth_headers(endpoint: DeliveryEndpoint, secrets: dict[str, str]) -> tuple[dict[str, str], str | None]:
    """(headers, problem) for the endpoint's auth."""
    auth = endpoint.auth
    if auth is None or auth.type == "none":
        return {}, None
    if auth.type == "basic":
        password = secrets.get("auth.password", auth.password or "")
        token = base64.b64encode(f"{auth.username or ''}:{password}".encode()).decode("ascii")
        return {"Authorization": f"Basic {token}"}, None
    token = secrets.get("auth.token") or auth.token
    if not token:
        return {}, f"auth: the {auth.type} auth token secret is missing"
    if auth.type == "bearer":
        return {"Authorization": f"Bearer {token}"}, None
    return {auth.header_name or "Authorization": token}, None


def _short_error(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text[:200]


class Target(NamedTuple):
    """What sending to an endpoint URL needs, parsed once per URL."""

    scheme: str
    host: str                   # ASCII (IDNA) host; an IPv6 address without brackets
    port: int
    authority: str              # the Host header: host, and port unless it is the default
    raw_path: str               # path and query, percent-encoded
    path: str
    query: str
    host_is_address: bool       # written as an IP address: the TLS name is then the address
    basic_auth: str | None      # from credentials in the URL


@functools.lru_cache(maxsize=1024)
def parse_target(url: str) -> Target | None:
    """None when `url` is not an http or https URL with a host."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError):
        return None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        return None
    host = parsed.raw_host.decode("ascii")
    raw_path = parsed.raw_path.decode("ascii")
    path, _, query = raw_path.partition("?")
    basic_auth = None
    if parsed.username or parsed.password:
        basic_auth = "Basic " + base64.b64encode(f"{parsed.username}:{parsed.password}".encode()).decode("ascii")
    return Target(parsed.scheme, host, parsed.port or _DEFAULT_PORTS[parsed.scheme], parsed.netloc.decode("ascii"),
                   raw_path, path, query, netguard.literal_address(host) is not None, basic_auth)


def _merged_query(query: str, pairs: list[tuple[str, str]]) -> str:
    """The URL's query with `pairs` added; a key in `pairs` replaces the URL's values for it."""
    merged: dict[str, list[str]] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        merged.setdefault(key, []).append(value)
    added: dict[str, list[str]] = {}
    for key, value in pairs:
        added.setdefault(key, []).append(value)
    merged.update(added)
    return urlencode([(key, value) for key, values in merged.items() for value in values])


class Refused(NamedTuple):
    """No answer to read: the request was not sent (`failure`) or the exchange failed (`error`)."""

    outcome: str
    reason: str
    timed_out: bool = False  # the endpoint's deadline passed before an answer


class HttpDelivery(DeliveryAdapter):
    name = "http"

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None) -> None:
        """`ssl_context`: TLS settings and trusted CAs for https endpoints (default: certifi's CAs)."""
        self._client = http1.Client(ssl_context=ssl_context)
        self._asking_kept: dict[tuple[int, float], tuple[DeliveryEndpoint, DeliveryEndpoint]] = {}

    def validate(self, endpoint: DeliveryEndpoint) -> list[str]:
        problems: list[str] = []
        if not endpoint.url:
            problems.append("url: required for the http adapter")
        elif parse_target(endpoint.url) is None:
            problems.append("url: must be an http or https URL with a host")
        auth = endpoint.auth
        if auth is not None and auth.type == "basic" and not auth.username:
            problems.append("auth.username: required for basic auth")
        if auth is not None and auth.type == "header" and not auth.header_name:
            problems.append("auth.headerName: required for header auth")
        return problems

    async def deliver(self, request: DeliveryRequest, http: httpx.AsyncClient) -> DeliveryResult:
        endpoint = request.endpoint
        shown = {"url": display_url(endpoint.url), "method": endpoint.method, "body_format": endpoint.body_format}
        answer = await self._exchange(endpoint, request.lead, request.now, request.secrets,
                                      request.allow_private_addresses, request.submission_id)
        if isinstance(answer, Refused):
            return DeliveryResult(outcome=answer.outcome, reason=answer.reason, **shown)  # type: ignore[arg-type]
        body, truncated = _decoded(answer)
        result = interpret(endpoint.response_rules, answer.status, body, answer.header("content-type"))
        if truncated:
            reason = f"{result.reason}; response body truncated at {MAX_RESPONSE_BYTES // (1024 * 1024)} MiB"
            message = reason if result.message == result.reason else result.message
            result = msgspec.structs.replace(result, reason=reason, message=message)
        return msgspec.structs.replace(result, **shown)

    async def ping(self, request: PingRequest, http: httpx.AsyncClient) -> PingResult:
        """The endpoint's `ping` request, sent like a delivery (the same guard, pool and
        deadline) with the endpoint's auth and sealed headers; the answer read by the ping's rules."""
        endpoint, ping = request.endpoint, request.endpoint.ping
        if ping is None or ping.response_rules is None:
            return PingResult(outcome="error", reason="the endpoint has no ping")
        asking = self._asking(endpoint, request.secrets, max(request.timeout_seconds, 0.001))
        answer = await self._exchange(asking, request.lead, request.now, request.secrets,
                                      request.allow_private_addresses, None)
        if isinstance(answer, Refused):
            if answer.timed_out:  # the caller records a ping without an answer in time as `timeout`
                raise TimeoutError(answer.reason)
            return PingResult(outcome="error", reason=answer.reason)
        body, _ = _decoded(answer)
        return read_ping_answer(ping.response_rules, answer.status, body, answer.header("content-type"))

    def _asking(self, endpoint: DeliveryEndpoint, secrets: dict[str, str], timeout: float) -> DeliveryEndpoint:
        """The endpoint as its ping is sent (its URL, method, format, mapping; the endpoint's auth and
        sealed headers with the ping's own), made once per endpoint and timeout: the worker and the
        ping desk keep one endpoint object per config revision, and building it validates it."""
        key = (id(endpoint), timeout)
        kept = self._asking_kept.get(key)
        if kept is not None and kept[0] is endpoint:
            return kept[1]
        ping = endpoint.ping
        assert ping is not None
        sealed = {field.removeprefix("headers.") for field in secrets if field.startswith("headers.")}
        headers = {name: value for name, value in endpoint.headers.items() if name.lower() in sealed}
        asking = msgspec.structs.replace(
            endpoint, url=ping.url, method=ping.method, body_format=ping.body_format,
            headers={**headers, **ping.headers}, field_mapping=ping.field_mapping, timeout_seconds=timeout)
        if len(self._asking_kept) >= 1024:
            self._asking_kept.clear()
        self._asking_kept[key] = (endpoint, asking)  # the endpoint held: its id is not reused meanwhile
        return asking

    async def _exchange(self, endpoint: DeliveryEndpoint, lead: dict[str, Any], now: datetime,
                        secrets: dict[str, str], allow_private_addresses: bool,
                        idempotency_key: str | None) -> http1.Response | Refused:
        """One request to `endpoint` as the module's docstring says, under its timeout: the
        buyer's response, or why there is none."""
        problems = self.validate(endpoint)
        if problems:
            return Refused("failure", "; ".join(problems))
        payload, problems = build_payload(endpoint, lead, now.date())
        auth_headers, auth_problem = _auth_headers(endpoint, secrets)
        if auth_problem:
            problems.append(auth_problem)
        if problems:
            return Refused("failure", "; ".join(problems))

        target = parse_target(endpoint.url or "")
        assert target is not None  # validate checked it
        # By lower-cased name: a later value replaces an earlier one whatever its case.
        headers = {"host": ("Host", target.authority), "user-agent": ("User-Agent", "appliance"),
                   "accept": ("Accept", "*/*"), "accept-encoding": ("Accept-Encoding", "identity")}
        headers.update((name.lower(), (name, value)) for name, value in endpoint.headers.items())
        content: bytes | None = None
        path = target.raw_path
        if endpoint.method == "GET":
            query = _merged_query(target.query, form_pairs(payload))
            path = f"{target.path}?{query}" if query else target.path
        else:
            content, content_type = encode_body(payload, endpoint.body_format)
            headers.setdefault("content-type", ("Content-Type", content_type))
        headers.update((name.lower(), (name, value)) for name, value in auth_headers.items())
        if idempotency_key is not None:
            headers["idempotency-key"] = ("Idempotency-Key", idempotency_key)
        if target.basic_auth is not None:
            headers["authorization"] = ("Authorization", target.basic_auth)
        try:
            outgoing = http1.build_request(endpoint.method, path, headers.values(), content)
        except http1.InvalidRequest as exc:
            return Refused("failure", f"request refused: {exc}")

        deadline = endpoint.timeout_seconds
        try:
            async with asyncio.timeout(deadline):
                destination = await netguard.resolve_destination(
                    endpoint.url or "", allow_private_addresses,
                    timeout=min(deadline, netguard.RESOLVE_TIMEOUT_SECONDS))
                if destination.reason:
                    return Refused("error" if destination.transient else "failure", destination.reason)
                # Connect to the checked address; keep the name for Host and TLS (see the docstring).
                address = destination.ip or target.host
                server_name = None
                if target.scheme == "https":
                    server_name = address if target.host_is_address else target.host
                origin = http1.Origin(target.scheme, address, target.port, server_name)
                return await self._client.send(origin, outgoing, max_body=MAX_RESPONSE_BYTES)
        except TimeoutError:
            return Refused("error", f"timed out after {deadline:g} s", timed_out=True)
        except http1.ConnectFailed as exc:
            return Refused("error", f"connection failed: {_short_error(exc)}")
        except http1.ProtocolError as exc:
            return Refused("error", f"connection closed without a complete response: {_short_error(exc)}")
        except http1.TransportError as exc:
            return Refused("error", f"connection error: {_short_error(exc)}")
        except Exception as exc:  # an adapter bug is an error outcome (retried), never a crash of the worker
            return Refused("error", f"adapter error: {type(exc).__name__}")

    async def aclose(self) -> None:
        await self._client.aclose()


def _decoded(response: http1.Response) -> tuple[bytes, bool]:
    """The body as the rules should see it, and whether it was cut at MAX_RESPONSE_BYTES. We ask
    for `identity`, yet some buyers compress anyway: gzip and deflate are inflated, to at most
    MAX_RESPONSE_BYTES (a small bomb cannot grow past it); a body that does not inflate is left
    as it came (body rules see bytes, JSON rules no JSON)."""
    encoding = (response.header("content-encoding") or "").strip().lower()
    if encoding not in ("gzip", "x-gzip", "deflate") or not response.body:
        return response.body, response.truncated
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib header, told apart by zlib
    try:
        body = inflater.decompress(response.body, MAX_RESPONSE_BYTES)
    except zlib.error:
        if encoding != "deflate":
            return response.body, response.truncated
        try:  # "deflate" is often sent raw, without the zlib header
            inflater = zlib.decompressobj(-zlib.MAX_WBITS)
            body = inflater.decompress(response.body, MAX_RESPONSE_BYTES)
        except zlib.error:
            return response.body, response.truncated
    return body, response.truncated or (not inflater.eof and len(body) >= MAX_RESPONSE_BYTES)


@hookimpl
def appliance_delivery_adapters(settings: dict[str, Any]) -> list[DeliveryAdapter]:
    """The built-in http delivery adapter."""
    return [HttpDelivery()]
