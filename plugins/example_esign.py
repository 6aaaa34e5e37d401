"""Example e-signature adapter plugin, for a generic provider whose API is

    POST {base_url}/documents              -> 201 {"id": "...", "signingUrl": "..."}
    GET  {base_url}/documents/{id}/file    -> 200, the signed PDF
    callbacks: POST to the appliance with a JSON body {"event", "documentId", "reason"} and the
               header X-Example-Signature = hex HMAC-SHA256 of the raw body with the shared secret

Copy this file into a plugin folder (`[plugins] dirs`, or `plugins/` next to the binary), then
name it in a campaign document with `"type": "example_esign"`. Its settings are this plugin's own
table in the config file; the first three keys are required, so the plugin does not load
without them:

    [plugins.example_esign]
    base_url = "https://api.esign.example/v1"
    api_key = "..."                 # sent as `Authorization: Bearer <api_key>`
    webhook_secret = "..."          # the secret the provider signs its callbacks with
    timeout_seconds = 10            # per request to the provider (default 10, at most 120)

and give the provider the callback URL `https://<your appliance>/hooks/esign/example_esign/<tenantId>`.

What the provider's answer to a send means:
    2xx with a document id                  -> sent
    408, 429, 5xx, timeout, no connection   -> retry (tried again later, with backoff)
    other 3xx and 4xx, a 2xx without an id  -> failed (not retried; a required document holds the lead)

It imports only modules the one-file binary promises to plugins (see plugins/README.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
from typing import Annotated, Any
from urllib.parse import quote, urlsplit

import httpx
import msgspec

from appliance.sdk import EsignAdapter, EsignCallback, EsignFetched, EsignRequest, EsignSent, hookimpl

SIGNATURE_HEADER = "x-example-signature"  # the appliance hands callback headers over in lower case

# The provider's callback events, in the SDK's words; any other event (created, sent, a reminder)
# is read with status None, which changes nothing.
STATUSES = {
    "document.opened": "viewed",
    "document.partially_signed": "in_progress",
    "document.completed": "signed",
    "document.rejected": "declined",
    "document.expired": "expired",
    "document.failed": "failed",
}


class EsignSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The `[plugins.example_esign]` table. A wrong or missing key makes the plugin fail to load
    (reported by `appliance plugins`), instead of failing every send later."""

    base_url: str
    api_key: Annotated[str, msgspec.Meta(min_length=1)]
    # Anyone can sign with an empty key: refuse it rather than accept forged callbacks.
    webhook_secret: Annotated[str, msgspec.Meta(min_length=1)]
    # The appliance reads this key itself and hands it over as `timeout_seconds` on each call.
    timeout_seconds: float = 10.0

    def __post_init__(self) -> None:
        if urlsplit(self.base_url).scheme not in ("http", "https"):
            raise ValueError("base_url must be an http or https URL")
        if not 0 < self.timeout_seconds <= 120:
            raise ValueError("timeout_seconds must be greater than 0 and at most 120")


class Created(msgspec.Struct, kw_only=True):
    """The answer to POST /documents (other keys are ignored)."""

    id: Annotated[str, msgspec.Meta(min_length=1)]
    signing_url: str | None = msgspec.field(name="signingUrl", default=None)


class ProviderCallback(msgspec.Struct, kw_only=True):
    """A callback body as the provider documents it (other keys are ignored)."""

    event: str
    document_id: Annotated[str, msgspec.Meta(min_length=1)] = msgspec.field(name="documentId")
    reason: str | None = None


async def _is_private(host: str, port: int) -> bool:
    """Whether `host` is (or resolves to) an address that is not on the public internet."""
    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port)
        addresses = [ipaddress.ip_address(info[4][0].split("%", 1)[0]) for info in infos]
    return any(not address.is_global for address in addresses)


def _unanswered(code: int) -> str:
    """The outcome of a provider answer that is not a success: what may pass is retried."""
    return "retry" if code in (408, 429) or code >= 500 else "failed"


class ExampleEsign(EsignAdapter):
    name = "example_esign"
    # api_version is inherited from EsignAdapter: the SDK version this file was written for.

    def __init__(self, settings: EsignSettings) -> None:
        # The same table also comes with each call (`request.settings`, `settings`); this adapter
        # uses the copy decoded and checked at load time.
        self.settings = settings

    async def _call(self, http: httpx.AsyncClient, method: str, path: str, *, timeout: float,
                    allow_private_addresses: bool, headers: dict[str, str] | None = None,
                    json: Any = None) -> httpx.Response | tuple[str, str]:
        """The provider's answer, or (outcome, reason) when there is none: `retry` for what may
        pass (timeout, no connection), `failed` for what will not (a private address, a bad URL)."""
        url = self.settings.base_url.rstrip("/") + path
        try:
            parts = urlsplit(url)
            if not allow_private_addresses and await _is_private(
                    parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)):
                return "failed", "private address refused"
            return await http.request(
                method, url, json=json, timeout=timeout, follow_redirects=False,
                headers={**(headers or {}), "Authorization": f"Bearer {self.settings.api_key}"})
        except httpx.TimeoutException:
            return "retry", "timeout"
        except (httpx.TransportError, OSError) as exc:  # refused, reset, DNS failure
            return "retry", f"connection failed: {type(exc).__name__}"
        except (httpx.InvalidURL, ValueError) as exc:
            return "failed", f"invalid url: {exc}"

    async def send(self, request: EsignRequest, http: httpx.AsyncClient) -> EsignSent:
        body = {"templateId": request.template_id, "title": request.title, "externalId": request.external_id,
                "recipient": {"email": request.recipient_email, "name": request.recipient_name},
                "fields": request.fields}
        # external_id is the same for every attempt at this lead's document: a provider that
        # honours Idempotency-Key does not make a second document when a send is repeated.
        answer = await self._call(http, "POST", "/documents", json=body, timeout=request.timeout_seconds,
                                  allow_private_addresses=request.allow_private_addresses,
                                  headers={"Idempotency-Key": request.external_id})
        if isinstance(answer, tuple):
            outcome, reason = answer
            return EsignSent(outcome=outcome, reason=reason)
        if not answer.is_success:
            # The status only: an error body may echo what was sent, and reasons are shown to tenants.
            return EsignSent(outcome=_unanswered(answer.status_code), reason=f"HTTP {answer.status_code}")
        try:
            created = msgspec.json.decode(answer.content, type=Created)
        except msgspec.DecodeError:  # the document may exist, but without its id it cannot be followed
            return EsignSent(outcome="failed", reason=f"HTTP {answer.status_code} without a document id")
        return EsignSent(outcome="sent", provider_document_id=created.id, signing_url=created.signing_url)

    def verify_callback(self, headers: dict[str, str], body: bytes, settings: dict[str, Any]) -> bool:
        expected = hmac.new(self.settings.webhook_secret.encode(), body, hashlib.sha256).hexdigest()
        # compare_digest takes as long for a near miss as for a wild guess; bytes, so that a
        # non-ASCII header is a mismatch rather than a TypeError.
        return hmac.compare_digest(expected.encode(), headers.get(SIGNATURE_HEADER, "").strip().lower().encode())

    def read_callback(self, body: bytes) -> EsignCallback | None:
        try:
            callback = msgspec.json.decode(body, type=ProviderCallback)
        except msgspec.DecodeError:  # not JSON, or not the documented shape: answered 400
            return None
        return EsignCallback(provider_document_id=callback.document_id, status=STATUSES.get(callback.event),
                             reason=callback.reason[:200] if callback.reason else None)

    async def fetch_signed(self, provider_document_id: str, settings: dict[str, Any], http: httpx.AsyncClient, *,
                           timeout_seconds: float = 10.0, allow_private_addresses: bool = False) -> EsignFetched:
        # The id came in a callback: quoted, so that it cannot reach another path of the API.
        answer = await self._call(http, "GET", f"/documents/{quote(provider_document_id, safe='')}/file",
                                  timeout=timeout_seconds, allow_private_addresses=allow_private_addresses)
        if isinstance(answer, tuple):
            outcome, reason = answer
            return EsignFetched(outcome=outcome, reason=reason)
        if not answer.is_success:
            return EsignFetched(outcome=_unanswered(answer.status_code), reason=f"HTTP {answer.status_code}")
        content_type = answer.headers.get("content-type", "").split(";", 1)[0].strip()
        return EsignFetched(outcome="fetched", content=answer.content, content_type=content_type or "application/pdf")


@hookimpl
def appliance_esign_adapters(settings):
    """`settings` is the [plugins.example_esign] table (a dict); decode it into our struct. No
    table: the provider is not set up here, so the plugin offers nothing (and still loads)."""
    if not settings:
        return []
    return [ExampleEsign(msgspec.convert(settings, EsignSettings))]
