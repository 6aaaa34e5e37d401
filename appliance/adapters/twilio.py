"""The built-in `twilio` SMS provider (CONTRACT 5), registered through the plugin hook like any
plugin: a form POST to `{base_url}/2010-04-01/Accounts/{accountSid}/Messages.json` with `To`,
`From` and `Body`, HTTP Basic auth `accountSid:authToken`.

Also home of what the built-in SMS and pixel adapters share: `http_client` (the client the SMS
and pixel services hand to any adapter) and `post_capped` / `outage_reason`: one hard deadline
over connect, send and the whole read (adapter setting `timeout_seconds`, default 10, from the
plugin's `[plugins.<module>]` table, e.g. `[plugins.twilio]`), redirects never followed, the
answer read up to 1 MiB.

Results: 2xx with a message sid is accepted. Otherwise the message is not accepted and `status`
says why: `error` when the provider could not be reached or had an outage (timeout, connection
failure, 5xx, 429), `failed` when it refused the message (other 4xx, or missing credentials).
`reason` carries the provider's own words; known secrets are masked in it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from typing import Any, Final, NamedTuple
from urllib.parse import quote, urlencode

import certifi
import httpx

from appliance.sdk import SmsMessage, SmsProvider, SmsResult, hookimpl

DEFAULT_BASE_URL: Final = "https://api.twilio.com"
DEFAULT_TIMEOUT_SECONDS: Final = 10.0
MAX_RESPONSE_BYTES: Final = 1024 * 1024
MASK: Final = "***"
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
    async with asyncio.timeout(timeout):
        request = http.build_request("POST", url, headers={"User-Agent": USER_AGENT, **headers}, content=content,
                                     timeout=httpx.Timeout(timeout))
        response = await http.send(request, stream=True, follow_redirects=False)
        try:
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                chunks.append(chunk[:MAX_RESPONSE_BYTES - size])
                size += len(chunk)
                if size >= MAX_RESPONSE_BYTES:
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


def scrub(text: str | None, secrets: list[str]) -> str | None:
    if not text:
        return text
    for secret in sorted((s for s in secrets if s and len(s) >= 4), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def transient(status: int) -> bool:
    return status >= 500 or status in (408, 429)


def short(text: Any, limit: int = 300) -> str:
    return str(text).strip()[:limit]


class TwilioProvider(SmsProvider):
    name = "twilio"

    async def send(self, message: SmsMessage, http: httpx.AsyncClient) -> SmsResult:
        sid = message.credentials.get("accountSid") or ""
        token = message.credentials.get("authToken") or ""
        if not sid or not token:
            return SmsResult(accepted=False, status="failed",
                             reason="twilio: no accountSid and authToken configured for this provider")
        secrets = [token]
        base = (message.base_url or DEFAULT_BASE_URL).rstrip("/")
        url = f"{base}/2010-04-01/Accounts/{quote(sid, safe='')}/Messages.json"
        basic = base64.b64encode(f"{sid}:{token}".encode()).decode("ascii")
        headers = {"Authorization": f"Basic {basic}", "Content-Type": "application/x-www-form-urlencoded",
                   "Accept": "application/json"}
        content = urlencode({"To": message.to, "From": message.sender, "Body": message.body}).encode()
        timeout = timeout_of(message.settings)
        try:
            answer = await post_capped(http, url, headers=headers, content=content, timeout=timeout)
        except (TimeoutError, httpx.HTTPError) as exc:
            return SmsResult(accepted=False, status="error", reason=outage_reason("twilio", exc, timeout))
        data = answer.json()
        data = data if isinstance(data, dict) else {}
        if 200 <= answer.status < 300 and data.get("sid"):
            return SmsResult(accepted=True, provider_message_id=short(data["sid"], 64),
                             status=short(data.get("status") or "queued", 32))
        problem = data.get("message") or (answer.body[:200].decode("utf-8", "replace") or "no details")
        code = f" (code {data['code']})" if data.get("code") is not None else ""
        reason = f"twilio answered HTTP {answer.status}: {short(problem)}{code}"
        return SmsResult(accepted=False, status="error" if transient(answer.status) else "failed",
                         reason=scrub(reason, secrets))


@hookimpl
def appliance_sms_providers(settings: dict[str, Any]) -> list[SmsProvider]:
    """The built-in Twilio provider."""
    return [TwilioProvider()]
