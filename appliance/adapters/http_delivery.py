"""The built-in `http` delivery adapter (CONTRACT 4 step 8, 5 and 6), shaped like a LeadConduit
integration: `validate` (the endpoint), request (built by appliance/domain/delivery_mapping),
response (read by the endpoint's response rules). Registered through the plugin hook like any
plugin.

One attempt, in order:
1. The body from the field mapping; a mapping problem or a missing auth secret is outcome
   `failure` and nothing is sent. GET sends the mapped fields as query parameters, no body.
2. Unless `allow_private_addresses`, the SSRF guard (netguard): a refused destination is outcome
   `failure` (retrying cannot help), a host that does not resolve is `error`. The request is
   then sent to the checked address itself with the original Host header and, for https, the
   original TLS server name (SNI, and the certificate is verified against that name), so a second
   DNS answer cannot redirect it (DNS rebinding). Remaining window: the client's connection pool
   is keyed by address, so two endpoint hosts that resolve to the SAME public address may share
   a kept-alive TLS connection whose certificate was verified for the other name.
3. Headers: the endpoint's, then auth (basic: username + secret `auth.password`; bearer and
   header: secret `auth.token`), `Idempotency-Key: <submissionId>` (always ours), Content-Type
   of the body format (unless the endpoint sets one), `Accept-Encoding: identity` by default so
   the 1 MiB cap is a cap on what we hold, not on compressed bytes.
4. Redirects are never followed: a 3xx no rule claims is outcome `error` "redirect not followed".
5. Resolution, connect, send and the whole body read run under one hard deadline
   (`timeoutSeconds`): a buyer that drips bytes forever ends at the deadline, outcome `error`.
   Connection refused / reset / closed without an answer is `error`.
6. The body is read as a stream and capped at 1 MiB: past the cap we stop reading, close the
   connection and interpret what we have (the status code is the buyer's answer; a body rule
   sees the first 1 MiB, malformed JSON counts as no JSON); the reason says it was truncated.
   Retrying instead would resend a lead the buyer may already have taken.
7. No secret reaches the result: `url` is shown without userinfo and with secret-looking query
   values masked; known secret values are masked in reason, message and response fields.
"""

from __future__ import annotations

import asyncio
import base64
import re
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import msgspec

from appliance.adapters import netguard
from appliance.domain.delivery_mapping import build_payload, encode_body, form_pairs, interpret
from appliance.domain.endpoint import DeliveryEndpoint
from appliance.sdk import DeliveryAdapter, DeliveryRequest, DeliveryResult, hookimpl

MAX_RESPONSE_BYTES: Final = 1024 * 1024
MASK: Final = "***"

_SECRET_NAME = re.compile(r"(?i)(key|token|secret|pass|pwd|auth|sig|credential|session|cookie)")
_MIN_SECRET_LEN: Final = 4


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
        query = urlencode([(k, MASK if _SECRET_NAME.search(k) else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _secret_values(request: DeliveryRequest) -> list[str]:
    endpoint = request.endpoint
    found = list(request.secrets.values())
    if endpoint.auth is not None:
        found += [endpoint.auth.password or "", endpoint.auth.token or ""]
    found += [v for k, v in endpoint.headers.items() if _SECRET_NAME.search(k)]
    if endpoint.url:
        try:
            parts = urlsplit(endpoint.url)
            found += [parts.password or "", parts.username or ""]
            found += [v for k, v in parse_qsl(parts.query) if _SECRET_NAME.search(k)]
        except ValueError:
            pass
    # Longest first, so a secret that contains another is masked whole.
    return sorted({s for s in found if len(s) >= _MIN_SECRET_LEN}, key=len, reverse=True)


def _scrub(text: str | None, secrets: list[str]) -> str | None:
    if not text:
        return text
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def _scrubbed(result: DeliveryResult, secrets: list[str]) -> DeliveryResult:
    if not secrets:
        return result
    return msgspec.structs.replace(
        result,
        reason=_scrub(result.reason, secrets),
        message=_scrub(result.message, secrets),
        client_lead_id=_scrub(result.client_lead_id, secrets),
        response_fields={k: _scrub(v, secrets) or "" for k, v in result.response_fields.items()},
    )


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


class _Answer(msgspec.Struct):
    status: int
    content_type: str | None
    body: bytes
    truncated: bool


class HttpDelivery(DeliveryAdapter):
    name = "http"

    def validate(self, endpoint: DeliveryEndpoint) -> list[str]:
        problems: list[str] = []
        if not endpoint.url:
            problems.append("url: required for the http adapter")
        else:
            try:
                parsed = httpx.URL(endpoint.url)
                if parsed.scheme not in ("http", "https") or not parsed.host:
                    problems.append("url: must be an http or https URL with a host")
            except (httpx.InvalidURL, ValueError, TypeError):
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
        secrets = _secret_values(request)

        def outcome(kind: str, reason: str) -> DeliveryResult:
            return DeliveryResult(outcome=kind, reason=_scrub(reason, secrets), **shown)  # type: ignore[arg-type]

        problems = self.validate(endpoint)
        if problems:
            return outcome("failure", "; ".join(problems))
        payload, problems = build_payload(endpoint, request.lead, datetime.now(UTC).date())
        auth_headers, auth_problem = _auth_headers(endpoint, request.secrets)
        if auth_problem:
            problems.append(auth_problem)
        if problems:
            return outcome("failure", "; ".join(problems))

        url = httpx.URL(endpoint.url or "")
        headers = httpx.Headers({"User-Agent": "appliance", "Accept-Encoding": "identity"})
        headers.update(endpoint.headers)
        content: bytes | None = None
        if endpoint.method == "GET":
            url = url.copy_merge_params(form_pairs(payload))
        else:
            content, content_type = encode_body(payload, endpoint.body_format)
            if "content-type" not in headers:
                headers["Content-Type"] = content_type
        headers.update(auth_headers)
        headers["Idempotency-Key"] = request.submission_id

        deadline = endpoint.timeout_seconds
        try:
            async with asyncio.timeout(deadline):
                destination = await netguard.resolve_destination(
                    str(url), request.allow_private_addresses, timeout=min(deadline, netguard.RESOLVE_TIMEOUT_SECONDS))
                if destination.reason:
                    return outcome("error" if destination.transient else "failure", destination.reason)
                extensions: dict[str, Any] = {}
                if destination.ip is not None and destination.ip != url.host:
                    # Pin the checked address; keep the name for Host and TLS (see the docstring).
                    if "host" not in headers:
                        headers["Host"] = url.netloc.decode("ascii")
                    if url.scheme == "https" and netguard.literal_address(url.host) is None:
                        extensions["sni_hostname"] = url.raw_host.decode("ascii")
                    url = url.copy_with(host=destination.ip)
                answer = await self._exchange(http, endpoint.method, url, headers, content, extensions, deadline)
        except TimeoutError:
            return outcome("error", f"timed out after {deadline:g} s")
        except httpx.TimeoutException:
            return outcome("error", f"timed out after {deadline:g} s")
        except httpx.ConnectError as exc:
            return outcome("error", f"connection failed: {_short_error(exc)}")
        except httpx.RemoteProtocolError as exc:
            return outcome("error", f"connection closed without a complete response: {_short_error(exc)}")
        except (httpx.ReadError, httpx.WriteError) as exc:
            return outcome("error", f"connection error: {_short_error(exc)}")
        except httpx.HTTPError as exc:
            return outcome("error", f"request failed: {type(exc).__name__}")
        except Exception as exc:  # an adapter bug is an error outcome (retried), never a crash of the worker
            return outcome("error", f"adapter error: {type(exc).__name__}")

        result = interpret(endpoint.response_rules, answer.status, answer.body, answer.content_type)
        if answer.truncated:
            reason = f"{result.reason}; response body truncated at {MAX_RESPONSE_BYTES // (1024 * 1024)} MiB"
            message = reason if result.message == result.reason else result.message
            result = msgspec.structs.replace(result, reason=reason, message=message)
        return _scrubbed(msgspec.structs.replace(result, **shown), secrets)

    @staticmethod
    async def _exchange(http: httpx.AsyncClient, method: str, url: httpx.URL, headers: httpx.Headers,
                        content: bytes | None, extensions: dict[str, Any], deadline: float) -> _Answer:
        built = http.build_request(method, url, headers=headers, content=content,
                                   timeout=httpx.Timeout(deadline), extensions=extensions)
        response = await http.send(built, stream=True, follow_redirects=False)
        try:
            chunks: list[bytes] = []
            size = 0
            truncated = False
            async for chunk in response.aiter_bytes():
                room = MAX_RESPONSE_BYTES - size
                if len(chunk) > room:
                    chunks.append(chunk[:room])
                    truncated = True
                    break
                chunks.append(chunk)
                size += len(chunk)
        finally:
            await response.aclose()
        return _Answer(response.status_code, response.headers.get("content-type"), b"".join(chunks), truncated)


@hookimpl
def appliance_delivery_adapters(settings: dict[str, Any]) -> list[DeliveryAdapter]:
    """The built-in http delivery adapter."""
    return [HttpDelivery()]
