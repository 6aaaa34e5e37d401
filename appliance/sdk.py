"""The only module plugin authors import. A plugin is a `.py` file (or package) in a plugin
folder that implements some of the hooks below with `@hookimpl`:

    from appliance.sdk import DeliveryAdapter, DeliveryRequest, DeliveryResult, hookimpl

    class Webhook(DeliveryAdapter):
        name = "webhook"
        async def deliver(self, request, http):
            response = await http.post(request.endpoint.url, json=request.lead)
            return DeliveryResult(outcome="success" if response.is_success else "error",
                                  status_code=response.status_code)

    @hookimpl
    def appliance_delivery_adapters(settings):
        return [Webhook()]

`settings` is the plugin's own `[plugins.<module name>]` table from the config file (a dict;
decode it into your own msgspec struct). Adapters carry `api_version`; one built for another
major version of this API is refused at load time. Built-in adapters register the same way.

A delivery adapter may also answer auctions (since API revision 2): implement `ping`, which asks
the buyer for a bid and returns a `PingResult`. An adapter without it still delivers; an auction
then counts its endpoint as an `error` unless the distribution gives it a fixed `bid`.

Since API revision 3 a plugin may also provide e-signature adapters (`appliance_esign_adapters`,
`EsignAdapter`): they send a campaign's documents for signature, read the provider's callbacks and
fetch the signed file. Plugins written for revision 1 or 2 load as they did.

Since API revision 4 an SMS provider may take the provider's webhooks (`verify_webhook`,
`read_webhook`, `webhook_answer`: replies and delivery reports at `POST /hooks/sms/<name>/<tenantId>`),
and a plugin may provide verifiers (`appliance_verifiers`, `Verifier`): steps that check a lead
at intake (a phone line type, an email, a litigator list) before it is qualified.
"""

from __future__ import annotations

from datetime import datetime, timezone
from collections.abc import Awaitable
from typing import Any, ClassVar, Literal

import httpx
import msgspec
import pluggy

from appliance.domain.auction import PingResult
from appliance.domain.delivery_result import DeliveryResult, Outcome
from appliance.domain.endpoint import DeliveryEndpoint

API_VERSION = 1
# Additions that keep version 1 plugins working: 2 DeliveryAdapter.ping; 3 EsignAdapter; 4 SMS webhooks, Verifier.
API_REVISION = 4
PROJECT = "appliance"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

__all__ = [
    "API_VERSION", "API_REVISION", "hookimpl", "DeliveryAdapter", "DeliveryRequest", "DeliveryResult", "Outcome",
    "PingRequest", "PingResult", "SmsProvider",
    "SmsMessage", "SmsResult", "PixelPlatform", "PixelEvent", "PixelResult", "IntakeAction",
    "EsignAdapter", "EsignRequest", "EsignSent", "EsignCallback", "EsignFetched", "ESIGN_STATUSES",
    "SmsWebhook", "SmsEvent", "SmsWebhookAnswer", "SMS_STATUSES",
    "Verifier", "VerificationRequest", "VerificationResult",
]


# ---- delivery ---------------------------------------------------------------------------------

class DeliveryRequest(msgspec.Struct, kw_only=True):
    """One attempt to hand a lead to a buyer."""

    lead: dict[str, Any]          # the lead record, as JSON values
    submission_id: str            # also the Idempotency-Key of every attempt of this submission
    attempt: int                  # 1 for the first attempt
    endpoint: DeliveryEndpoint    # the tenant's endpoint configuration, secrets removed
    secrets: dict[str, str]       # the endpoint's opened secrets: "auth.password", "auth.token"
    settings: dict[str, Any]      # this adapter's plugin table from the config file
    allow_private_addresses: bool = False
    # When the attempt is made, by the worker's clock (the date fieldMapping values are read on).
    now: datetime = msgspec.field(default_factory=lambda: datetime.now(timezone.utc))


class PingRequest(msgspec.Struct, kw_only=True):
    """One ask for a bid before a lead is sold at auction: the lead may be partial (a supplier's
    ping carries no contact fields). `endpoint.ping` says where and how; `timeout_seconds` is what
    is left of the buyer's ping timeout and the round's: an answer after it, or a TimeoutError,
    counts as `timeout`, and a ping still running when the round closes is cancelled."""

    lead: dict[str, Any]
    auction_id: str               # the round; the same for every buyer pinged in it
    endpoint: DeliveryEndpoint
    secrets: dict[str, str]
    settings: dict[str, Any]
    timeout_seconds: float
    allow_private_addresses: bool = False
    now: datetime = msgspec.field(default_factory=lambda: datetime.now(timezone.utc))


class DeliveryAdapter:
    name: ClassVar[str]
    api_version: ClassVar[int] = API_VERSION

    @property
    def can_ping(self) -> bool:
        """Whether this adapter answers auctions (it overrides `ping`)."""
        return type(self).ping is not DeliveryAdapter.ping

    async def ping(self, request: PingRequest, http: httpx.AsyncClient) -> PingResult:
        """Ask the buyer for a bid (optional; see the module's docstring). An adapter that does not
        answer auctions loses every round it is pinged in, with this reason."""
        return PingResult(outcome="error", reason=f"delivery adapter {self.name!r} cannot ping")

    def validate(self, endpoint: DeliveryEndpoint) -> list[str]:
        """Problems with an endpoint's configuration for this adapter, as `"<field>: <problem>"`."""
        return []

    async def deliver(self, request: DeliveryRequest, http: httpx.AsyncClient) -> DeliveryResult:
        raise NotImplementedError  # abstractmethod: every adapter implements it

    async def aclose(self) -> None:
        """Release what the adapter holds itself (its own connections, ...); awaited once when the
        delivery worker stops."""


# ---- SMS --------------------------------------------------------------------------------------

class SmsMessage(msgspec.Struct, kw_only=True):
    to: str
    sender: str
    body: str
    credentials: dict[str, str]   # accountSid, authToken or apiKey, as the provider needs
    base_url: str | None = None
    settings: dict[str, Any] = {}
    # Where the provider should report the message's delivery (`[server] public_url` +
    # /hooks/sms/<name>/<tenantId>); None when the server's public address is not configured.
    status_callback_url: str | None = None


class SmsResult(msgspec.Struct, kw_only=True):
    accepted: bool
    provider_message_id: str | None = None
    status: str | None = None
    reason: str | None = None


# What a delivery report may say of an outbound message. A status never goes back: a late
# `sent` after `delivered` changes nothing.
SmsStatus = Literal["queued", "sent", "delivered", "undelivered", "failed"]
SMS_STATUSES: tuple[str, ...] = SmsStatus.__args__  # type: ignore[attr-defined]


class SmsWebhook(msgspec.Struct, kw_only=True):
    """One call the provider made to `POST /hooks/sms/<name>/<tenantId>`, as it was received."""

    url: str                      # the URL it reached (`[server] public_url` + path when that is set)
    headers: dict[str, str]       # names in lower case
    body: bytes
    # The credentials to check it with: one set per provider of this type the tenant configured
    # (accountSid, authToken, apiKey, publicKey as each has them), or the install-wide set.
    credentials: list[dict[str, str]]
    settings: dict[str, Any]      # this provider's plugin table from the config file
    now: datetime                 # for a replay window


class SmsEvent(msgspec.Struct, kw_only=True):
    """What a verified webhook says: a message a lead sent (`inbound`: `sender` the lead's number,
    `to` the tenant's, `body` the text) or a delivery report of an outbound message (`status`)."""

    kind: Literal["inbound", "status"]
    provider_message_id: str
    sender: str | None = None
    to: str | None = None
    body: str | None = None
    status: SmsStatus | None = None
    provider_status: str | None = None   # the provider's own word for it
    reason: str | None = None            # why it was not delivered, in the provider's words


class SmsWebhookAnswer(msgspec.Struct, kw_only=True):
    """The HTTP answer a webhook gets (Twilio reads TwiML from it)."""

    content_type: str
    body: bytes


class SmsProvider:
    name: ClassVar[str]
    api_version: ClassVar[int] = API_VERSION

    async def send(self, message: SmsMessage, http: httpx.AsyncClient) -> SmsResult:
        raise NotImplementedError  # abstractmethod: every provider implements it

    def verify_webhook(self, webhook: SmsWebhook) -> bool:
        """Whether a webhook really comes from the provider, signed with one of
        `webhook.credentials`. The default refuses every webhook (403): a provider that takes
        them must say how they are verified."""
        return False

    def read_webhook(self, webhook: SmsWebhook) -> list[SmsEvent] | None:
        """A verified webhook's events; an empty list for one that says nothing to keep (a
        provider's other notices), None for a body this provider cannot read (answered 400)."""
        return None

    def webhook_answer(self, reply: str | None) -> SmsWebhookAnswer | None:
        """The answer to a webhook, carrying `reply` (the tenant's HELP text) when the provider
        sends replies from it. None: the appliance answers `{"received": true}` and sends any
        reply through `send`."""
        return None


# ---- pixels -----------------------------------------------------------------------------------

class PixelEvent(msgspec.Struct, kw_only=True):
    pixel_id: str
    access_token: str
    event_name: str
    event_id: str
    event_time: int               # seconds since the epoch
    lead: dict[str, Any]
    value: float | None = None
    currency: str | None = None
    action_source: str = "system_generated"
    test_event_code: str | None = None
    base_url: str | None = None
    settings: dict[str, Any] = {}


class PixelResult(msgspec.Struct, kw_only=True):
    success: bool
    reason: str | None = None
    response: dict[str, Any] | None = None


class PixelPlatform:
    name: ClassVar[str]
    api_version: ClassVar[int] = API_VERSION

    async def fire(self, event: PixelEvent, http: httpx.AsyncClient) -> PixelResult:
        raise NotImplementedError  # abstractmethod: every platform implements it


# ---- e-signature ------------------------------------------------------------------------------

# What a provider's callback may say of a document. A status never goes back: a late `viewed`
# after `signed` changes nothing (services/esign keeps the order).
EsignStatus = Literal["viewed", "in_progress", "signed", "declined", "expired", "failed"]
ESIGN_STATUSES: tuple[str, ...] = EsignStatus.__args__  # type: ignore[attr-defined]


class EsignRequest(msgspec.Struct, kw_only=True):
    """Send one campaign document to a lead for signature."""

    template_id: str              # the document's `signTemplateId` (the provider's template)
    title: str                    # the document's name
    # Unique per sending of a document to a lead (`<leadId>/<fileKey>`, plus `/<submissionId>` when
    # a later submission sends it again): give it to a provider that keeps an external reference
    # or an idempotency key, so what was sent can be told apart (and found) on its side.
    external_id: str
    recipient_email: str
    recipient_name: str | None
    fields: dict[str, str]        # template field name -> value, from fieldMappingOverrides
    settings: dict[str, Any]      # this adapter's plugin table from the config file
    # Set when an earlier try created the document at the provider but could not confirm it was
    # sent (its `retry` carried this id): finish sending that one, never create another.
    provider_document_id: str | None = None
    timeout_seconds: float = 10.0
    allow_private_addresses: bool = False


class EsignSent(msgspec.Struct, kw_only=True):
    """What became of a send (or a fetch's outcome, for `EsignFetched`):

    - `sent`: the provider has the document; `provider_document_id` names it, `signing_url` is
      where the lead signs (when the provider gives one);
    - `retry`: the provider could not be reached or answered 5xx/429/timeout: tried again later
      with backoff, the lead waits. When the document was already created at the provider (only
      sending it failed), carry its `provider_document_id`: the next try gets it back in
      `EsignRequest.provider_document_id`;
    - `failed`: the provider refused or answered something its API does not document (`reason`
      says what, in the adapter's words, never a secret): not retried; the lead is held."""

    outcome: Literal["sent", "retry", "failed"]
    provider_document_id: str | None = None
    signing_url: str | None = None
    reason: str | None = None


class EsignCallback(msgspec.Struct, kw_only=True):
    """A provider callback, read: the document it is about and what it says. `status` None: an
    event that changes nothing here (created, sent, a reminder ...)."""

    provider_document_id: str
    status: EsignStatus | None = None
    reason: str | None = None


class EsignFetched(msgspec.Struct, kw_only=True):
    """The signed file: `outcome` `fetched` with its bytes, or `retry` / `failed` with a reason."""

    outcome: Literal["fetched", "retry", "failed"]
    content: bytes | None = None
    content_type: str = "application/pdf"
    reason: str | None = None


class EsignAdapter:
    """An e-signature provider. Tenants name it in a campaign document's `type` (no `type`: the
    built-in `documenso`); its callbacks come to `POST /hooks/esign/<name>/<tenantId>`."""

    name: ClassVar[str]
    api_version: ClassVar[int] = API_VERSION

    async def send(self, request: EsignRequest, http: httpx.AsyncClient) -> EsignSent:
        raise NotImplementedError  # abstractmethod: every adapter implements it

    def verify_callback(self, headers: dict[str, str], body: bytes, settings: dict[str, Any]) -> bool:
        """Whether a callback really comes from the provider (headers in lower case). The default
        refuses every callback: an adapter that takes callbacks must say how they are verified."""
        return False

    def read_callback(self, body: bytes) -> EsignCallback | None:
        """A verified callback's document and status; None when the body is not one this
        adapter understands (answered 400, nothing changes)."""
        return None

    async def fetch_signed(self, provider_document_id: str, settings: dict[str, Any], http: httpx.AsyncClient, *,
                           timeout_seconds: float = 10.0, allow_private_addresses: bool = False) -> EsignFetched:
        """The signed file of a document the provider reported signed."""
        return EsignFetched(outcome="failed", reason=f"e-signature adapter {self.name!r} cannot fetch signed files")


# ---- verification -----------------------------------------------------------------------------

class VerificationRequest(msgspec.Struct, kw_only=True):
    """Check one lead: `config` is the campaign's `qualification.verifications[].config`."""

    lead: dict[str, Any]          # the lead as rules see it (the submit body's names)
    config: dict[str, Any]
    settings: dict[str, Any]      # this verifier's plugin table from the config file
    timeout_seconds: float        # the step's `timeoutMs`: past it the step is `unknown`
    allow_private_addresses: bool = False
    # When the lead is checked, by the appliance's clock (the date `age` and other paths are read on).
    now: datetime = msgspec.field(default_factory=lambda: datetime.now(timezone.utc))


class VerificationResult(msgspec.Struct, kw_only=True):
    """`pass`, `fail` or `unknown` (could not tell), with what was learnt (`data`, stored on the
    lead at `verification.<name>.data` and readable by rules) and why (`reason`)."""

    outcome: Literal["pass", "fail", "unknown"]
    data: dict[str, Any] = {}
    reason: str | None = None


class Verifier:
    """A verification step. Campaigns name it in `qualification.verifications[].verifier`."""

    name: ClassVar[str]
    api_version: ClassVar[int] = API_VERSION
    # A `verify` that is a plain function runs in a worker thread, so a slow one never holds the
    # event loop; one that only computes a few microseconds (no I/O) may say False to run inline.
    blocking: ClassVar[bool] = True

    def validate(self, config: dict[str, Any]) -> list[str]:
        """Problems with a campaign's `config` for this verifier, as `"<field>: <problem>"`
        (refused at import)."""
        return []

    def cache_key(self, request: VerificationRequest) -> str | None:
        """The normalized value a result may be cached under (a step's `cacheSeconds`), e.g. the
        E.164 phone; None: this lead's result is not cached."""
        return None

    def verify(self, request: VerificationRequest,
               http: httpx.AsyncClient) -> VerificationResult | Awaitable[VerificationResult]:
        raise NotImplementedError  # abstractmethod: every verifier implements it (sync or async)


# ---- intake actions and prompts ----------------------------------------------------------------

class IntakeAction(msgspec.Struct, kw_only=True):
    action: Literal["engage", "workflow"]
    lead: dict[str, Any]
    campaign_id: str
    submission_id: str
    config: dict[str, Any]        # the campaign's firstIntakeAction.engage / .workflow object


class HookSpecs:
    """What a plugin may implement. Each returns a list, so one plugin can bring several."""

    @hookspec
    def appliance_delivery_adapters(self, settings: dict[str, Any]) -> list[DeliveryAdapter]:
        """Delivery adapters this plugin provides."""

    @hookspec
    def appliance_sms_providers(self, settings: dict[str, Any]) -> list[SmsProvider]:
        """SMS providers this plugin provides."""

    @hookspec
    def appliance_pixel_platforms(self, settings: dict[str, Any]) -> list[PixelPlatform]:
        """Conversion-event platforms this plugin provides."""

    @hookspec
    def appliance_esign_adapters(self, settings: dict[str, Any]) -> list[EsignAdapter]:
        """E-signature adapters this plugin provides (since API revision 3)."""

    @hookspec
    def appliance_verifiers(self, settings: dict[str, Any]) -> list[Verifier]:
        """Verification steps this plugin provides (since API revision 4)."""

    @hookspec
    def appliance_intake_action(self, action: IntakeAction) -> None:
        """Called when a first intake action `engage` or `workflow` holds a lead."""

    @hookspec(firstresult=True)
    def appliance_evaluate_prompt(self, prompt: str, facts: dict[str, Any]) -> bool | None:
        """Decide a rule condition written as a prompt; None leaves it skipped."""

    @hookspec
    def on_lead_event(self, tenant_id: str, event: dict[str, Any]) -> None:
        """A lead event (`{type, timestamp, data}`, as webhooks get it), after the change that
        caused it is committed, in order per lead. Raising is logged and changes nothing."""
