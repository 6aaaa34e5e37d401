"""Example delivery adapter plugin: POST the lead as JSON to a webhook.

Copy this file into a plugin folder (`[plugins] dirs`, or `plugins/` next to the binary), then
point a tenant's delivery endpoint at it with `"adapter": "example_webhook"`. Optional install-wide
settings come from this plugin's own table in the config file:

    [plugins.example_webhook]
    url = "https://hooks.example.com/leads"     # overrides every endpoint's url (default: none)
    headers = { "X-Source" = "appliance" }       # sent with every request (default: none)
    timeout_seconds = 5                          # default: the endpoint's timeoutSeconds

What the buyer's answer means (only `error` is retried, with the endpoint's backoff):
    2xx                                   -> success
    409                                   -> duplicate
    408, 429, 5xx, timeout, no connection -> error
    other 3xx and 4xx                     -> failure

It imports only modules the one-file binary promises to plugins (see plugins/README.md).
"""

from __future__ import annotations

import asyncio
import ipaddress
from urllib.parse import urlsplit

import httpx
import msgspec

from appliance.sdk import DeliveryAdapter, DeliveryRequest, DeliveryResult, hookimpl


class WebhookSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The `[plugins.example_webhook]` table. A wrong key makes the plugin fail to load
    (reported by `appliance plugins`), instead of being silently ignored."""

    url: str | None = None
    headers: dict[str, str] = {}
    timeout_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.url is not None and urlsplit(self.url).scheme not in ("http", "https"):
            raise ValueError("url must be an http or https URL")
        if self.timeout_seconds is not None and not 0 < self.timeout_seconds <= 120:
            raise ValueError("timeout_seconds must be greater than 0 and at most 120")


async def _is_private(host: str, port: int) -> bool:
    """Whether `host` is (or resolves to) an address that is not on the public internet."""
    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port)
        addresses = [ipaddress.ip_address(info[4][0].split("%", 1)[0]) for info in infos]
    return any(not address.is_global for address in addresses)


class ExampleWebhook(DeliveryAdapter):
    name = "example_webhook"
    # api_version is inherited from DeliveryAdapter: the SDK version this file was written for.

    def __init__(self, settings: WebhookSettings) -> None:
        self.settings = settings

    def validate(self, endpoint):
        if not (self.settings.url or endpoint.url):
            return ["url: required (or set url in [plugins.example_webhook])"]
        return []

    async def deliver(self, request: DeliveryRequest, http: httpx.AsyncClient) -> DeliveryResult:
        url = self.settings.url or request.endpoint.url
        if not url:
            return DeliveryResult(outcome="failure", reason="no url configured")
        sent = {"url": url, "method": "POST", "body_format": "json"}
        headers = {**self.settings.headers, **request.endpoint.headers,
                   "Idempotency-Key": request.submission_id}  # the buyer drops repeated attempts
        token = request.secrets.get("auth.token")
        if request.endpoint.auth is not None and request.endpoint.auth.type == "bearer" and token:
            headers["Authorization"] = f"Bearer {token}"
        timeout = self.settings.timeout_seconds or request.endpoint.timeout_seconds
        try:
            parts = urlsplit(url)
            if not request.allow_private_addresses and await _is_private(
                    parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)):
                return DeliveryResult(outcome="failure", reason="private address refused", **sent)
            response = await http.post(url, json=request.lead, headers=headers, timeout=timeout,
                                       follow_redirects=False)
        except httpx.TimeoutException:
            return DeliveryResult(outcome="error", reason="timeout", **sent)
        except (httpx.TransportError, OSError) as exc:  # refused, reset, DNS failure
            return DeliveryResult(outcome="error", reason=f"connection failed: {type(exc).__name__}", **sent)
        except (httpx.InvalidURL, ValueError) as exc:
            return DeliveryResult(outcome="failure", reason=f"invalid url: {exc}", **sent)

        code = response.status_code
        if 200 <= code < 300:
            outcome = "success"
        elif code == 409:
            outcome = "duplicate"
        elif code in (408, 429) or code >= 500:
            outcome = "error"
        else:
            outcome = "failure"
        client_lead_id = None
        if outcome == "success":
            try:
                body = response.json()
                if isinstance(body, dict) and body.get("id") is not None:
                    client_lead_id = str(body["id"])
            except ValueError:
                pass
        return DeliveryResult(
            outcome=outcome, status_code=code, client_lead_id=client_lead_id,
            reason=None if outcome == "success" else f"HTTP {code}",
            message=None if outcome == "success" else response.text[:200] or None, **sent)


@hookimpl
def appliance_delivery_adapters(settings):
    """`settings` is the [plugins.example_webhook] table (a dict); decode it into our struct."""
    return [ExampleWebhook(msgspec.convert(settings, WebhookSettings))]
