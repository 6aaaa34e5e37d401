"""The built-in `telnyx` SMS provider: a JSON POST of `{from, to, text}` to
`{base_url}/v2/messages` with `Authorization: Bearer <apiKey>`. Results as the Twilio provider's
(appliance/adapters/twilio.py): accepted on 2xx with a message id; `error` for an outage,
`failed` for a refusal, with Telnyx's own error title and detail as the reason.

Webhooks (replies and delivery reports, `POST /hooks/sms/telnyx/<tenantId>`): JSON signed with
Ed25519 over `<telnyx-timestamp>|<body>`, the signature in `telnyx-signature-ed25519` (base64),
checked with the provider's `publicKey`, as Telnyx documents it; a timestamp more than five
minutes from now is a replay and refused. `message.received` is a reply, `message.sent` and
`message.finalized` are delivery reports; other events are taken and kept nowhere. Telnyx reads
nothing from the answer: a HELP text is sent as a message of its own."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Final

import httpx
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from appliance.adapters.outbound import outage_reason, post_capped, short, timeout_of, transient
from appliance.sdk import SmsEvent, SmsMessage, SmsProvider, SmsResult, SmsStatus, SmsWebhook, hookimpl

DEFAULT_BASE_URL: Final = "https://api.telnyx.com"
REPLAY_WINDOW_SECONDS: Final = 300  # Telnyx's own libraries' tolerance

# A recipient's status in Telnyx's message events, as the appliance's delivery statuses.
_STATUSES: Final[dict[str, SmsStatus]] = {
    "queued": "queued", "sending": "queued",
    "sent": "sent", "delivery_unconfirmed": "sent",
    "delivered": "delivered",
    "delivery_failed": "undelivered", "expired": "undelivered",
    "sending_failed": "failed",
}


def _verified(public_key: str, signed: bytes, signature: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key)).verify(signature, signed)
    except (InvalidSignature, ValueError, binascii.Error):
        return False
    return True


def _phone(party: Any) -> str | None:
    number = party.get("phone_number") if isinstance(party, dict) else None
    return number if isinstance(number, str) else None


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
        body = {"from": message.sender, "to": message.to, "text": message.body}
        if message.status_callback_url:
            body["webhook_url"] = message.status_callback_url
        content = json.dumps(body).encode()
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

    def verify_webhook(self, webhook: SmsWebhook) -> bool:
        timestamp = webhook.headers.get("telnyx-timestamp", "")
        try:
            signature = base64.b64decode(webhook.headers.get("telnyx-signature-ed25519", ""), validate=True)
            late = abs(webhook.now.timestamp() - int(timestamp))
        except (binascii.Error, ValueError, OverflowError):  # OverflowError: more digits than a float holds
            return False
        if not signature or late > REPLAY_WINDOW_SECONDS:
            return False
        signed = timestamp.encode() + b"|" + webhook.body
        return any(_verified(c["publicKey"], signed, signature) for c in webhook.credentials if c.get("publicKey"))

    def read_webhook(self, webhook: SmsWebhook) -> list[SmsEvent] | None:
        try:
            data = json.loads(webhook.body)
        except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: nested too deep
            return None
        event = data.get("data") if isinstance(data, dict) else None
        payload = event.get("payload") if isinstance(event, dict) else None
        if not isinstance(payload, dict) or not isinstance(payload.get("id"), str) or not payload["id"]:
            return None
        kind = event.get("event_type")
        recipients = payload.get("to") if isinstance(payload.get("to"), list) else []
        first = recipients[0] if recipients and isinstance(recipients[0], dict) else {}
        if kind == "message.received":
            text = payload.get("text")
            return [SmsEvent(kind="inbound", provider_message_id=payload["id"], sender=_phone(payload.get("from")),
                             to=_phone(first), body=text if isinstance(text, str) else "")]
        if kind not in ("message.sent", "message.finalized"):
            return []
        reported = first.get("status") if isinstance(first.get("status"), str) else ""
        status = _STATUSES.get(reported)
        if status is None:
            return []
        reason = _problem(payload) if status in ("undelivered", "failed") else None
        return [SmsEvent(kind="status", provider_message_id=payload["id"], status=status, provider_status=reported,
                         reason=reason)]


@hookimpl
def appliance_sms_providers(settings: dict[str, Any]) -> list[SmsProvider]:
    """The built-in Telnyx provider."""
    return [TelnyxProvider()]
