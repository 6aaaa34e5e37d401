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
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, ClassVar, Literal

import httpx
import msgspec
import pluggy

from appliance.domain.auction import PingResult
from appliance.domain.delivery_result import DeliveryResult, Outcome
from appliance.domain.endpoint import DeliveryEndpoint

API_VERSION = 1
API_REVISION = 2  # additions that keep version 1 plugins working; 2: DeliveryAdapter.ping
PROJECT = "appliance"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

__all__ = [
    "API_VERSION", "API_REVISION", "hookimpl", "DeliveryAdapter", "DeliveryRequest", "DeliveryResult", "Outcome",
    "PingRequest", "PingResult", "SmsProvider",
    "SmsMessage", "SmsResult", "PixelPlatform", "PixelEvent", "PixelResult", "IntakeAction",
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


class SmsResult(msgspec.Struct, kw_only=True):
    accepted: bool
    provider_message_id: str | None = None
    status: str | None = None
    reason: str | None = None


class SmsProvider:
    name: ClassVar[str]
    api_version: ClassVar[int] = API_VERSION

    async def send(self, message: SmsMessage, http: httpx.AsyncClient) -> SmsResult:
        raise NotImplementedError  # abstractmethod: every provider implements it


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
    def appliance_intake_action(self, action: IntakeAction) -> None:
        """Called when a first intake action `engage` or `workflow` holds a lead."""

    @hookspec(firstresult=True)
    def appliance_evaluate_prompt(self, prompt: str, facts: dict[str, Any]) -> bool | None:
        """Decide a rule condition written as a prompt; None leaves it skipped."""

    @hookspec
    def on_lead_event(self, tenant_id: str, event: dict[str, Any]) -> None:
        """A lead event (`{type, timestamp, data}`, as webhooks get it), after the change that
        caused it is committed, in order per lead. Raising is logged and changes nothing."""
