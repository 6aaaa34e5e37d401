"""The built-in `telnyx` SMS provider: a JSON POST of `{from, to, text}` to
`{base_url}/v2/messages` with `Authorization: Bearer <apiKey>`. Results as the Twilio provider's
(appliance/adapters/twilio.py): accepted on 2xx with a message id; `error` for an outage,
`failed` for a refusal, with Telnyx's own error title and detail as the reason."""

from __future__ import annotations

import json
from typing import Any, Final

import httpx

from appliance.adapters.outbound import outage_reason, post_capped, short, timeout_of, transient
from appliance.sdk import SmsMessage, SmsProvider, SmsResult, hookimpl

DEFAULT_BASE_URL: Final = "https://api.telnyx.com"


def _problem(data: Any) -> str | None:
    errors = data.get("errors") if isinstance(data, dict) else None
    if not isinstance(errors, list) or not errors or not isinstance(errors[0], dict):
        return None
    first = errors[0]
    text = " - ".join(short(first[k]) for k in ("title", "detail") if first.get(k))
    if first.get("code") is not None:
        text += f" (code {first['code']})"
    return text or None


class TelnyxProvider(SmsProvider):
    name = "telnyx"

    async def send(self, message: SmsMessage, http: httpx.AsyncClient) -> SmsResult:
        api_key = message.credentials.get("apiKey") or ""
        if not api_key:
            return SmsResult(accepted=False, status="failed", reason="telnyx: no apiKey configured for this provider")
        url = (message.base_url or DEFAULT_BASE_URL).rstrip("/") + "/v2/messages"
        headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json",
                   "Accept": "application/json"}
        content = json.dumps({"from": message.sender, "to": message.to, "text": message.body}).encode()
        timeout = timeout_of(message.settings)
        try:
            answer = await post_capped(http, url, headers=headers, content=content, timeout=timeout)
        except (TimeoutError, httpx.HTTPError) as exc:
            return SmsResult(accepted=False, status="error", reason=outage_reason("telnyx", exc, timeout))
        data = answer.json()
        record = data.get("data") if isinstance(data, dict) else None
        if 200 <= answer.status < 300 and isinstance(record, dict) and record.get("id"):
            recipients = record.get("to")
            status = None
            if isinstance(recipients, list) and recipients and isinstance(recipients[0], dict):
                status = recipients[0].get("status")
            return SmsResult(accepted=True, provider_message_id=short(record["id"], 64),
                             status=short(status or "queued", 32))
        problem = _problem(data) or (answer.body[:200].decode("utf-8", "replace") or "no details")
        reason = f"telnyx answered HTTP {answer.status}: {problem}"
        return SmsResult(accepted=False, status="error" if transient(answer.status) else "failed",
                         reason=reason)


@hookimpl
def appliance_sms_providers(settings: dict[str, Any]) -> list[SmsProvider]:
    """The built-in Telnyx provider."""
    return [TelnyxProvider()]
