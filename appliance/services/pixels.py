"""POST /api/v1/pixels/fire.

1. The body (VALIDATION_ERROR naming the field): `platform` social or video, `eventName` 1 to
   100 characters, `eventValue` a number >= 0, `currency` an ISO 4217 code in capitals,
   `actionSource` website, phone_call, chat or system_generated (default system_generated).
2. The lead and the pixel must be the caller's tenant's (NOT_FOUND otherwise); the pixel's
   configured platform must be the `platform` given (VALIDATION_ERROR otherwise).
3. A test lead is never fired: `success: false, skipped: "test_lead"`.
4. Otherwise the platform adapter (`social`: appliance/adapters/meta_capi.py, `video`:
   appliance/adapters/tiktok_events.py, or a plugin's) sends one event with the lead record,
   the pixel's access token (opened from the secret store), a stable `eventId` (SHA-256 of
   `<leadId>:<eventName>`), the event time in seconds, value, currency, action source and test
   event code. A refusal or an outage of the platform is HTTP 200 with `success: false` and the
   platform's reason.
5. Every fire (sent, refused or skipped) is appended to the lead's latest submission as a
   journey event of type `pixel_fire`; its details never hold the token.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from appliance.adapters.outbound import Scrubber, adapter_crash, http_client
from appliance.clock import iso
from appliance.domain.lead import JourneyEvent
from appliance.domain.pixel_payloads import event_id as stable_event_id
from appliance.domain.secret_refs import pixel_token_ref
from appliance.errors import NotFound, ValidationFailed
from appliance.model import Model
from appliance.plugins import Registry
from appliance.runtime import Runtime
from appliance.sdk import PixelEvent, PixelResult

ActionSource = Literal["website", "phone_call", "chat", "system_generated"]

log = logging.getLogger("appliance.services.pixels")


class FireBody(Model):
    lead_id: Annotated[str, Meta(min_length=1, max_length=64)]
    pixel_id: Annotated[str, Meta(min_length=1, max_length=128)]
    platform: Literal["social", "video"]
    event_name: Annotated[str, Meta(min_length=1, max_length=100)]
    event_value: Annotated[float, Meta(ge=0)] | None = None
    currency: Annotated[str, Meta(pattern="^[A-Z]{3}(?!\\n)$",
                                  description="a three-letter currency code in capitals, such as USD")] | None = None
    action_source: ActionSource = "system_generated"
    test_event_code: Annotated[str, Meta(min_length=1, max_length=100)] | None = None


class FireResult(Model, omit_defaults=True):
    """What a fire answers: the event sent, its `eventId`, and `reason` / `skipped` when nothing was accepted."""

    success: bool
    platform: str
    event_name: str
    pixel_id: str
    lead_id: str
    event_id: str | None = None
    reason: str | None = None
    skipped: str | None = None
    test_event_code: str | None = None


def _platform_setup(runtime: Runtime, registry: Registry, platform: str) -> tuple[str | None, dict[str, Any]]:
    """(base URL, settings) for the platform's adapter: the install's [pixels.*] values and the
    default region, then the adapter's own plugin table."""
    cfg = runtime.config.pixels
    settings: dict[str, Any] = {"region": runtime.config.defaults.region}
    base_url = None
    if platform == "social":
        base_url = cfg.social.base_url
        settings["api_version"] = cfg.social.api_version
    elif platform == "video":
        base_url = cfg.video.base_url
    settings.update(registry.adapter_settings("pixel", platform))
    return base_url or None, settings


async def _send(registry: Registry, platform: str, event: PixelEvent) -> PixelResult:
    adapter = registry.pixel_platform(platform)
    if adapter is None:
        return PixelResult(success=False, reason=f"pixel platform {platform!r} is not installed")
    try:
        async with http_client() as http:
            result = await adapter.fire(event, http)
    except Exception as exc:  # a platform adapter's bug is a failed fire, never a 500
        crash = adapter_crash(exc, Scrubber([event.access_token]))
        log.error("pixel platform %r raised %s\n%s", adapter.name, crash.message, crash.stack)
        return PixelResult(success=False, reason=f"pixel platform failed: {crash.message}")
    if not isinstance(result, PixelResult):
        return PixelResult(success=False, reason="pixel platform returned no PixelResult")
    return result


async def fire(runtime: Runtime, registry: Registry, tenant_id: str, body: FireBody) -> FireResult:
    tx = runtime.store.reader()
    with tx:  # one read transaction
        lead = tx.leads.get_lead(tenant_id, body.lead_id)
        pixel = tx.catalog.get_pixel(tenant_id, body.pixel_id) if lead is not None else None
        if lead is None or pixel is None:
            raise NotFound()
        if pixel.platform != body.platform:
            raise ValidationFailed([f"platform: pixel {pixel.pixel_id} is a {pixel.platform} pixel"])
        ref = pixel_token_ref(pixel.pixel_id)
        sealed = tx.secrets.get(tenant_id, ref)
    moment = runtime.clock.now()
    now = iso(moment)
    event_id = stable_event_id(lead.lead_id, body.event_name)
    answer = FireResult(success=False, platform=body.platform, event_name=body.event_name, pixel_id=pixel.pixel_id,
                        lead_id=lead.lead_id, event_id=event_id, test_event_code=body.test_event_code)
    details: dict[str, Any] = {
        "platform": body.platform, "pixelId": pixel.pixel_id, "eventName": body.event_name, "eventId": event_id,
        "actionSource": body.action_source,
        **{k: v for k, v in (("value", body.event_value), ("currency", body.currency),
                             ("testEventCode", body.test_event_code)) if v is not None},
    }
    if lead.is_test:
        answer = msgspec.structs.replace(answer, skipped="test_lead")
        details.update(success=False, skipped="test_lead")
        reason = "test lead: conversion event not sent"
    else:
        token = runtime.box.open_bytes(sealed, f"{tenant_id}/{ref}") if sealed is not None else None
        base_url, settings = _platform_setup(runtime, registry, body.platform)
        result = await _send(registry, body.platform, PixelEvent(
            pixel_id=pixel.pixel_id, access_token=token or "", event_name=body.event_name, event_id=event_id,
            event_time=int(moment.timestamp()), lead=msgspec.to_builtins(lead), value=body.event_value,
            currency=body.currency, action_source=body.action_source, test_event_code=body.test_event_code,
            base_url=base_url, settings=settings))
        scrubber = Scrubber([token])
        reason = None if result.success else scrubber(result.reason or "the platform did not accept the event")
        answer = msgspec.structs.replace(answer, success=result.success, reason=reason)
        details["success"] = result.success
        if result.response:
            details["response"] = scrubber.value(result.response)
    journey = JourneyEvent(timestamp=now, type="pixel_fire", reason=reason, details=details)
    await runtime.store.write(lambda tx: _record(tx, tenant_id, lead.lead_id, journey, now))
    return answer


def _record(tx: Any, tenant_id: str, lead_id: str, journey: JourneyEvent, now: str) -> None:
    submission = tx.leads.latest_submission(tenant_id, lead_id)
    if submission is None:
        return
    tx.leads.update_submission(tenant_id, msgspec.structs.replace(
        submission, journey_events=[*submission.journey_events, journey], updated_at=now))
