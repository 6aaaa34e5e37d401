"""The built-in `twilio` SMS provider, registered through the plugin hook like any
plugin: a form POST to `{base_url}/2010-04-01/Accounts/{accountSid}/Messages.json` with `To`,
`From` and `Body`, HTTP Basic auth `accountSid:authToken`. Calls go through appliance/adapters/outbound (one deadline, the answer capped at 1 MiB, setting
`timeout_seconds` in `[plugins.twilio]`).

Results: 2xx with a message sid is accepted. Otherwise the message is not accepted and `status`
says why: `error` when the provider could not be reached or had an outage (timeout, connection
failure, 5xx, 429), `failed` when it refused the message (other 4xx, or missing credentials).
`reason` carries the provider's own words; the SMS service masks credentials in it.
"""

from __future__ import annotations

import base64
from typing import Any, Final
from urllib.parse import quote, urlencode

import httpx

from appliance.adapters.outbound import outage_reason, post_capped, short, timeout_of, transient
from appliance.sdk import SmsMessage, SmsProvider, SmsResult, hookimpl

DEFAULT_BASE_URL: Final = "https://api.twilio.com"


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
                         reason=reason)


@hookimpl
def appliance_sms_providers(settings: dict[str, Any]) -> list[SmsProvider]:
    """The built-in Twilio provider."""
    return [TwilioProvider()]
