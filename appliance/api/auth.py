"""API-key authentication, source-key scope and the per-key rate limit, run for every matched
route before its handler (unknown routes answer 404 without looking at the key)."""

from __future__ import annotations

import time

from litestar.types import ASGIApp, Receive, Scope, Send

from appliance import apikeys
from appliance.errors import Forbidden, RateLimited, Unauthorized
from appliance.storage.tenants import KeyRecord, find_active_key

SUBMIT_PATH = "/api/v1/leads/submit"


class RateLimiter:
    """Fixed one-minute windows per key: O(1) per request, no background work."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._windows: dict[str, tuple[int, int]] = {}

    def check(self, key_id: str, now: float | None = None) -> None:
        if self.per_minute <= 0:
            return
        now = time.monotonic() if now is None else now
        window = int(now // 60)
        start, count = self._windows.get(key_id, (window, 0))
        if start != window:
            start, count = window, 0
        if count >= self.per_minute:
            raise RateLimited(retry_after=max(1, int((window + 1) * 60 - now) + 1))
        self._windows[key_id] = (start, count + 1)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def auth_middleware(app: ASGIApp) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        handler = scope.get("route_handler")
        if scope["type"] != "http" or (handler is not None and handler.opt.get("public")):
            await app(scope, receive, send)
            return
        runtime = scope["litestar_app"].state.runtime
        key = (_header(scope, b"x-api-key") or "").strip()
        # Imported source keys need not be in our format, so any plausible key is looked up.
        if not apikeys.MIN_LENGTH <= len(key) <= apikeys.MAX_LENGTH:
            raise Unauthorized()
        record: KeyRecord | None = find_active_key(runtime.db.reader(), apikeys.key_hash(key))
        if record is None:
            raise Unauthorized()
        state = scope["state"]
        state["principal"] = record
        if record.kind == "source" and scope.get("path_template") != SUBMIT_PATH:
            raise Forbidden()
        scope["litestar_app"].state.limiter.check(record.key_id)
        await app(scope, receive, send)

    return middleware


def principal(scope: Scope) -> KeyRecord:
    return scope["state"]["principal"]
