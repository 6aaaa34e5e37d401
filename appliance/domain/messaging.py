"""Tenant SMS configuration and ad-platform pixels."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Literal

import phonenumbers
from msgspec import Meta

from appliance.domain.campaign import redacted_repr
from appliance.domain.endpoint import check_http_url
from appliance.model import Model, invalid


def check_ed25519_public_key(field: str, key: str) -> None:
    """Telnyx gives its webhook signing key as base64 of the raw 32-byte Ed25519 public key."""
    try:
        raw = base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        invalid(field, "must be the base64 of a 32-byte Ed25519 public key (Telnyx: Portal > Keys & Credentials)")


def check_e164(field: str, number: str) -> None:
    try:
        parsed = phonenumbers.parse(number, None)
    except phonenumbers.NumberParseException:
        invalid(field, "must be an E.164 phone number, e.g. +14155552671")
    e164 = phonenumbers.format_number(parsed, phonenumbers.PhoneNumberFormat.E164)
    if e164 != number or not phonenumbers.is_valid_number(parsed):
        invalid(field, "must be an E.164 phone number, e.g. +14155552671")


class SmsProvider(Model):
    provider_id: str
    type: str  # twilio, telnyx, or a plugin provider's name
    account_sid: str | None = None
    auth_token: str | None = None
    api_key: str | None = None
    base_url: str | None = None  # None: the provider's public API (or the install's [sms.<type>])
    public_key: str | None = None  # Telnyx: checks its webhooks' signatures (public, not a secret)

    def __post_init__(self) -> None:
        if not self.provider_id.strip():
            invalid("providerId", "must not be empty")
        if not self.type:
            invalid("type", "must not be empty")
        check_http_url("baseUrl", self.base_url)
        if self.public_key is not None:
            check_ed25519_public_key("publicKey", self.public_key)

    def __repr__(self) -> str:
        return redacted_repr(self, ("auth_token", "api_key"))


class SmsNumber(Model):
    number: str
    sms_capable: bool = True
    campaign_ids: list[str] = []  # campaigns that send from this number

    def __post_init__(self) -> None:
        check_e164("number", self.number)


class SmsAgent(Model):
    agent_id: str  # matched against a campaign's campaignAiAgents.rep.agentId
    number: str

    def __post_init__(self) -> None:
        check_e164("number", self.number)


class SmsConfig(Model):
    providers: list[SmsProvider] = []
    numbers: list[SmsNumber] = []
    agents: list[SmsAgent] = []
    default_provider_id: str | None = None
    campaign_providers: dict[str, str] = {}  # campaign code -> providerId
    help_text: Annotated[str, Meta(min_length=1, max_length=1600)] | None = None  # the answer to HELP / INFO

    def __post_init__(self) -> None:
        known = {p.provider_id for p in self.providers}
        if self.default_provider_id is not None and self.default_provider_id not in known:
            invalid("defaultProviderId", "unknown provider")
        for code, provider_id in self.campaign_providers.items():
            if provider_id not in known:
                invalid(f"campaignProviders.{code}", "unknown provider")


class Pixel(Model):
    pixel_id: str
    platform: Literal["social", "video"]  # social: Meta Conversions API; video: TikTok Events API
    access_token: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if not self.pixel_id.strip():
            invalid("pixelId", "must not be empty")

    def __repr__(self) -> str:
        return redacted_repr(self, ("access_token",))
