"""The built-in `twilio` SMS provider, registered through the plugin hook like any
plugin: a form POST to `{base_url}/2010-04-01/Accounts/{accountSid}/Messages.json` with `To`,
`From` and `Body`, HTTP Basic auth `accountSid:authToken`. Calls go through appliance/adapters/outbound (one deadline, the answer capped at 1 MiB, setting
`timeout_seconds` in `[plugins.twilio]`).

Results: 2xx with a message sid is accepted. Otherwise the message is not accepted and `status`
says why: `error` when the provider could not be reached or had an outage (timeout, connection
failure, 5xx, 429), `failed` when it refused the message (other 4xx, or missing credentials).
`reason` carries the provider's own words; the SMS service masks credentials in it.

Webhooks (replies and delivery reports, `POST /hooks/sms/twilio/<tenantId>`): a form POST signed
in `X-Twilio-Signature` with base64(HMAC-SHA1(authToken, URL + each parameter's name and value,
sorted by name)), as Twilio's documentation defines it; the URL is checked as given and with its
port added or removed, as Twilio's own validators do. A form with a `Body` is a reply; one with a
`MessageStatus` a delivery report. The answer is TwiML, carrying the HELP text as a `<Message>`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any, Final
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit
from xml.sax.saxutils import escape

import httpx

from appliance.adapters.outbound import outage_reason, post_capped, short, timeout_of, transient
from appliance.sdk import (
    SmsEvent, SmsMessage, SmsProvider, SmsResult, SmsStatus, SmsWebhook, SmsWebhookAnswer, hookimpl,
)

DEFAULT_BASE_URL: Final = "https://api.twilio.com"

# Twilio's MessageStatus values, as the appliance's delivery statuses (`receiving` / `received`
# describe inbound messages and are no report).
_STATUSES: Final[dict[str, SmsStatus]] = {
    "accepted": "queued", "scheduled": "queued", "queued": "queued",
    "sending": "sent", "sent": "sent",
    "delivered": "delivered", "read": "delivered",
    "undelivered": "undelivered",
    "failed": "failed", "canceled": "failed",
}
_DEFAULT_PORTS: Final = {"https": 443, "http": 80}
# Twilio's messaging webhooks have a few dozen parameters (with ten media, under fifty). More is
# no Twilio form, refused before any signature is computed: each parameter is HMAC input for every
# token and URL tried, so an unsigned body of many tiny ones would hold the event loop.
MAX_FORM_FIELDS: Final = 256


def _form(body: bytes) -> list[tuple[str, str]] | None:
    try:
        return parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False,
                         max_num_fields=MAX_FORM_FIELDS)
    except (UnicodeDecodeError, ValueError):  # ValueError: more than MAX_FORM_FIELDS
        return None


def _url_variants(url: str) -> list[str]:
    """The URL as reached, and with its port written out or left off (a proxy may do either)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a Host header such as "[::1" or "host:99999": only the URL as reached
        return [url]
    default = _DEFAULT_PORTS.get(parts.scheme)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if port is not None:
        other = host if port == default else None
    else:
        other = f"{host}:{default}" if default else None
    variants = [url]
    if other is not None:
        variants.append(urlunsplit((parts.scheme, other, parts.path, parts.query, parts.fragment)))
    return variants


def signature(auth_token: str, url: str, params: list[tuple[str, str]]) -> str:
    """Twilio's request signature of a form POST to `url`: the parameters by name, a name given
    more than once with each of its distinct values in order, as Twilio's own validators build it."""
    values: dict[str, set[str]] = {}
    for name, value in params:
        values.setdefault(name, set()).add(value)
    data = url + "".join(name + value for name in sorted(values) for value in sorted(values[name]))
    return base64.b64encode(hmac.new(auth_token.encode(), data.encode(), hashlib.sha1).digest()).decode("ascii")


class TwilioProvider(SmsProvider):
    name = "twilio"

    async def send(self, message: SmsMessage, http: httpx.AsyncClient) -> SmsResult:
        sid = message.credentials.get("accountSid") or ""
        token = message.credentials.get("authToken") or ""
        if not sid or not token:
            return SmsResult(accepted=False, status="failed",
                             reason="twilio: no accountSid and authToken configured for this provider")
        base = (message.base_url or DEFAULT_BASE_URL).rstrip("/")
        url = f"{base}/2010-04-01/Accounts/{quote(sid, safe='')}/Messages.json"
        basic = base64.b64encode(f"{sid}:{token}".encode()).decode("ascii")
        headers = {"Authorization": f"Basic {basic}", "Content-Type": "application/x-www-form-urlencoded",
                   "Accept": "application/json"}
        form = {"To": message.to, "From": message.sender, "Body": message.body}
        if message.status_callback_url:
            form["StatusCallback"] = message.status_callback_url
        content = urlencode(form).encode()
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
                         reason=reason)

    def verify_webhook(self, webhook: SmsWebhook) -> bool:
        given = webhook.headers.get("x-twilio-signature", "")
        params = _form(webhook.body)
        if not given or params is None:
            return False
        tokens = [c["authToken"] for c in webhook.credentials if c.get("authToken")]
        return any(hmac.compare_digest(signature(token, url, params).encode(), given.encode())
                   for token in tokens for url in _url_variants(webhook.url))

    def read_webhook(self, webhook: SmsWebhook) -> list[SmsEvent] | None:
        params = _form(webhook.body)
        if params is None:
            return None
        form = dict(params)
        sid = form.get("MessageSid") or form.get("SmsSid")
        if not sid:
            return None
        if "Body" in form:
            return [SmsEvent(kind="inbound", provider_message_id=sid, sender=form.get("From"), to=form.get("To"),
                             body=form["Body"])]
        reported = form.get("MessageStatus") or form.get("SmsStatus") or ""
        status = _STATUSES.get(reported)
        if status is None:
            return []
        code = form.get("ErrorCode")
        reason = f"twilio error {code}" if code and status in ("undelivered", "failed") else None
        return [SmsEvent(kind="status", provider_message_id=sid, status=status, provider_status=reported,
                         reason=reason)]

    def webhook_answer(self, reply: str | None) -> SmsWebhookAnswer:
        inner = f"<Message>{escape(reply)}</Message>" if reply else ""
        return SmsWebhookAnswer(content_type="text/xml",
                                body=f'<?xml version="1.0" encoding="UTF-8"?><Response>{inner}</Response>'.encode())


@hookimpl
def appliance_sms_providers(settings: dict[str, Any]) -> list[SmsProvider]:
    """The built-in Twilio provider."""
    return [TwilioProvider()]
