"""The built-in `social` pixel platform: the Meta Conversions API. One event per
call: a JSON POST to `{base_url}/{api_version}/{pixelId}/events` whose body is built by
appliance/domain/pixel_payloads.meta_payload, plus `access_token` (the pixel's token, sent in the
body as Meta's own examples do, never in the URL). `api_version` and the region used to read
national phone numbers arrive in the event's settings ([pixels.social] api_version, [defaults]
region); `timeout_seconds` may be set in `[plugins.meta_capi]`.

Success: a 2xx answer with `events_received` >= 1. Anything else is a refusal with Meta's own
message (`error.message`, `error_user_msg`, code and subcode) as the reason; an outage
(timeout, connection failure) is a failure with its cause. The token never reaches a result."""

from __future__ import annotations

import json
from typing import Any, Final
from urllib.parse import quote

import httpx

from appliance.adapters.outbound import outage_reason, post_capped, short, timeout_of
from appliance.domain.pixel_payloads import meta_payload
from appliance.sdk import PixelEvent, PixelPlatform, PixelResult, hookimpl

DEFAULT_BASE_URL: Final = "https://graph.facebook.com"
DEFAULT_API_VERSION: Final = "v21.0"


def _refusal(data: Any) -> str | None:
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return None
    parts = [short(error[k]) for k in ("message", "error_user_title", "error_user_msg") if error.get(k)]
    codes = "/".join(str(error[k]) for k in ("code", "error_subcode") if error.get(k) is not None)
    return " - ".join(parts) + (f" (code {codes})" if codes else "") or None


class MetaConversions(PixelPlatform):
    name = "social"

    async def fire(self, event: PixelEvent, http: httpx.AsyncClient) -> PixelResult:
        if not event.access_token:
            return PixelResult(success=False, reason="meta: no access token configured for this pixel")
        settings = event.settings
        version = str(settings.get("api_version") or DEFAULT_API_VERSION).strip("/")
        base = (event.base_url or DEFAULT_BASE_URL).rstrip("/")
        url = f"{base}/{quote(version, safe='')}/{quote(event.pixel_id, safe='')}/events"
        payload = meta_payload(
            lead=event.lead, event_name=event.event_name, event_id=event.event_id, event_time=event.event_time,
            action_source=event.action_source, value=event.value, currency=event.currency,
            test_event_code=event.test_event_code, region=settings.get("region"))
        content = json.dumps({**payload, "access_token": event.access_token}).encode()
        timeout = timeout_of(settings)
        try:
            answer = await post_capped(http, url, headers={"Content-Type": "application/json",
                                                           "Accept": "application/json"},
                                       content=content, timeout=timeout)
        except (TimeoutError, httpx.HTTPError) as exc:
            return PixelResult(success=False, reason=outage_reason("meta", exc, timeout))
        data = answer.json()
        data = data if isinstance(data, dict) else {}
        received = data.get("events_received")
        shown = {"statusCode": answer.status,
                 **{k: data[k] for k in ("events_received", "fbtrace_id", "messages") if k in data}}
        if 200 <= answer.status < 300 and isinstance(received, int) and received >= 1:
            return PixelResult(success=True, response=shown)
        problem = _refusal(data) or (answer.body[:200].decode("utf-8", "replace") or "no details")
        if isinstance(data.get("error"), dict) and data["error"].get("fbtrace_id"):
            shown["fbtrace_id"] = short(data["error"]["fbtrace_id"], 64)
        return PixelResult(success=False, reason=f"meta answered HTTP {answer.status}: {problem}",
                           response=shown)


@hookimpl
def appliance_pixel_platforms(settings: dict[str, Any]) -> list[PixelPlatform]:
    """The built-in Meta Conversions API platform (`social`)."""
    return [MetaConversions()]
