"""The built-in `video` pixel platform: the TikTok Events API 2.0. One event per
call: a JSON POST to `{base_url}/open_api/v1.3/event/track/` with the pixel's token in the
`Access-Token` header and the body built by appliance/domain/pixel_payloads.tiktok_payload
(`event_source_id` = the pixel code). `timeout_seconds` may be set in `[plugins.tiktok_events]`.

Success is `code == 0` in the answer (TikTok answers HTTP 200 to most refusals); anything else is
a refusal with TikTok's `message` and `code` as the reason; an outage is a failure with its
cause. The token never reaches a result."""

from __future__ import annotations

import json
from typing import Any, Final

import httpx

from appliance.adapters.outbound import outage_reason, post_capped, short, timeout_of
from appliance.domain.pixel_payloads import tiktok_payload
from appliance.sdk import PixelEvent, PixelPlatform, PixelResult, hookimpl

DEFAULT_BASE_URL: Final = "https://business-api.tiktok.com"
TRACK_PATH: Final = "/open_api/v1.3/event/track/"


class TikTokEvents(PixelPlatform):
    name = "video"

    async def fire(self, event: PixelEvent, http: httpx.AsyncClient) -> PixelResult:
        if not event.access_token:
            return PixelResult(success=False, reason="tiktok: no access token configured for this pixel")
        settings = event.settings
        url = (event.base_url or DEFAULT_BASE_URL).rstrip("/") + TRACK_PATH
        payload = tiktok_payload(
            lead=event.lead, pixel_code=event.pixel_id, event_name=event.event_name, event_id=event.event_id,
            event_time=event.event_time, value=event.value, currency=event.currency,
            test_event_code=event.test_event_code, region=settings.get("region"))
        timeout = timeout_of(settings)
        try:
            answer = await post_capped(http, url, headers={"Access-Token": event.access_token,
                                                           "Content-Type": "application/json",
                                                           "Accept": "application/json"},
                                       content=json.dumps(payload).encode(), timeout=timeout)
        except (TimeoutError, httpx.HTTPError) as exc:
            return PixelResult(success=False, reason=outage_reason("tiktok", exc, timeout))
        data = answer.json()
        data = data if isinstance(data, dict) else {}
        code = data.get("code")
        shown = {"statusCode": answer.status, **{k: data[k] for k in ("code", "request_id") if k in data}}
        if 200 <= answer.status < 300 and code == 0 and not isinstance(code, bool):
            return PixelResult(success=True, response=shown)
        problem = short(data.get("message") or answer.body[:200].decode("utf-8", "replace") or "no details")
        suffix = f" (code {code})" if code is not None else ""
        return PixelResult(success=False, reason=f"tiktok answered HTTP {answer.status}: {problem}{suffix}",
                           response=shown)


@hookimpl
def appliance_pixel_platforms(settings: dict[str, Any]) -> list[PixelPlatform]:
    """The built-in TikTok Events API platform (`video`)."""
    return [TikTokEvents()]
