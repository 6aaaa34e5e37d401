"""Example SMS provider plugin that takes two-way webhooks (replies and delivery reports).

Copy this file into a plugin folder (`[plugins] dirs`, or `plugins/` next to the binary), then give
a tenant an SMS provider of this type in its bundle:

    [[sms.providers]]
    providerId = "ex"
    type = "example_sms"
    apiKey = "a long shared secret"          # sealed at import, like every SMS credential
    baseUrl = "https://sms.example.com/api"  # where texts are sent

Sending: `POST {baseUrl}/messages` with `Authorization: Bearer <apiKey>` and the JSON
`{"from", "to", "text", "statusUrl"}`; a 2xx answer `{"id": "..."}` is accepted, another 4xx a
refusal (`failed`), a 5xx, 429 or no answer an outage (`error`).

Webhooks: the provider posts JSON to `<public address>/hooks/sms/example_sms/<tenantId>` with the
same secret in the `X-Example-Secret` header:

    {"id": "m-1", "from": "+14155550123", "to": "+14155552671", "text": "Hi"}   a reply
    {"id": "m-1", "status": "delivered", "error": null}                         a delivery report

A missing or wrong secret is refused (403) before anything is read; a body that is neither is a
400. This provider reads nothing from the webhook's answer, so the appliance sends a HELP answer
through `send` just after it. It imports only `appliance.sdk` and the standard library.
"""

from __future__ import annotations

import hmac
import json

import httpx

from appliance.sdk import SMS_STATUSES, SmsEvent, SmsMessage, SmsProvider, SmsResult, SmsWebhook, hookimpl

SECRET_HEADER = "x-example-secret"  # header names reach the plugin in lower case


class ExampleSms(SmsProvider):
    name = "example_sms"

    async def send(self, message: SmsMessage, http: httpx.AsyncClient) -> SmsResult:
        api_key = message.credentials.get("apiKey")
        if not api_key or not message.base_url:
            return SmsResult(accepted=False, status="failed", reason="example_sms: apiKey and baseUrl are required")
        body = {"from": message.sender, "to": message.to, "text": message.body}
        if message.status_callback_url:
            body["statusUrl"] = message.status_callback_url
        try:
            answer = await http.post(message.base_url.rstrip("/") + "/messages", json=body,
                                     headers={"Authorization": f"Bearer {api_key}"},
                                     timeout=float(message.settings.get("timeout_seconds", 10)))
        except httpx.HTTPError as exc:
            return SmsResult(accepted=False, status="error", reason=f"example_sms unreachable: {type(exc).__name__}")
        if answer.is_success:
            message_id = answer.json().get("id")
            if isinstance(message_id, str) and message_id:
                return SmsResult(accepted=True, provider_message_id=message_id, status="queued")
        outage = answer.status_code >= 500 or answer.status_code == 429
        return SmsResult(accepted=False, status="error" if outage else "failed",
                         reason=f"example_sms answered HTTP {answer.status_code}")

    def verify_webhook(self, webhook: SmsWebhook) -> bool:
        # One set of the tenant's credentials at a time: its apiKey is the shared secret.
        given = webhook.headers.get(SECRET_HEADER, "").encode()
        return any(c.get("apiKey") and hmac.compare_digest(given, c["apiKey"].encode())
                   for c in webhook.credentials)

    def read_webhook(self, webhook: SmsWebhook) -> list[SmsEvent] | None:
        try:
            data = json.loads(webhook.body)
        except ValueError:  # not JSON, or not UTF-8
            return None
        if not isinstance(data, dict) or not isinstance(data.get("id"), str) or not data["id"]:
            return None
        if isinstance(data.get("text"), str):
            return [SmsEvent(kind="inbound", provider_message_id=data["id"], sender=data.get("from"),
                             to=data.get("to"), body=data["text"])]
        status = data.get("status")
        if status not in SMS_STATUSES:
            return []  # a notice this provider sends that says nothing to keep
        error = data.get("error")
        return [SmsEvent(kind="status", provider_message_id=data["id"], status=status, provider_status=status,
                         reason=error if isinstance(error, str) else None)]


@hookimpl
def appliance_sms_providers(settings):
    return [ExampleSms()]
