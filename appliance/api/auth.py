"""API-key authentication, source-key scope and the per-key rate limit, run for every matched
route before its handler (unknown routes answer 404 without looking at the key; the console's
/admin pages are signed in with a session instead, appliance/console/session.py)."""

from __future__ import annotations

import time
from typing import Any

from litestar.types import ASGIApp, Receive, Scope, Send

from appliance import apikeys
from appliance.domain import permissions
from appliance.errors import Forbidden, RateLimited, Unauthorized
from appliance.storage import Principal, Store

SUBMIT_PATH = "/api/v1/leads/submit"
PING_PATH = "/api/v1/leads/ping"
SOURCE_PATHS = frozenset((SUBMIT_PATH, PING_PATH))  # all a source key may call


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


class KeyCache:
    """Active keys by hash, so a request does not read the database to authenticate. Entries are
    dropped whenever the database's change signal moves (an admin command committed a key or
    configuration change, storage/change_signal.py) and after `ttl` seconds in any case (a
    command that could not signal, or was killed between its commit and its signal). Unknown
    keys are never cached: a new key works at once, and guessed keys cannot fill the cache."""

    def __init__(self, store: Store, ttl: float = 1.0, max_entries: int = 10_000) -> None:
        self.store = store
        self.ttl = ttl
        self.max_entries = max_entries
        self._epoch: int | None = None
        self._entries: dict[bytes, tuple[Principal, float]] = {}

    def lookup(self, key_hash: bytes) -> Principal | None:
        signal = self.store.changes
        if signal is None:
            return self.store.reader().tenants.find_active_key(key_hash)
        epoch = signal.value()  # read before the database, so a change after it is seen next time
        if epoch != self._epoch:
            self._entries.clear()
            self._epoch = epoch
        now = time.monotonic()
        hit = self._entries.get(key_hash)
        if hit is not None and now - hit[1] < self.ttl:
            return hit[0]
        record = self.store.reader().tenants.find_active_key(key_hash)
        if record is not None:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key_hash] = (record, now)
        return record


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of a request header (`name` lower-case), as sent."""
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


def authenticate(scope: Scope, app_state: Any, path_template: str | None, operation: str) -> Principal:
    """The key of the request, checked: known and live (401), a source key only on submit and ping,
    a tenant key's role enough for the operation (403), within its rate limit (429). Also records
    it as the request's principal."""
    key = (header(scope, b"x-api-key") or b"").decode("latin-1").strip()
    # Imported source keys need not be in our format, so any plausible key is looked up.
    if not apikeys.MIN_LENGTH <= len(key) <= apikeys.MAX_LENGTH:
        raise Unauthorized()
    record = app_state["key_cache"].lookup(apikeys.key_hash(key))  # an item: cheaper than State's attributes
    if record is None:
        raise Unauthorized()
    scope["state"]["principal"] = record  # also what the log context reads the tenant from
    if record.kind == "source":
        if path_template not in SOURCE_PATHS:
            raise Forbidden()
    else:
        check_role(record, operation)
    app_state["limiter"].check(record.id)
    return record


def check_role(who: Principal, operation: str) -> None:
    """403 naming the role needed when `who`'s role is short of what `operation` needs."""
    needed = permissions.needed_for(operation)
    if not permissions.allows(who.role, needed):
        raise Forbidden([f"role: {needed} or above is needed; the caller is {who.role}"],
                        message=f"This needs the {needed} role (or above); the caller's role is {who.role}")


def auth_middleware(app: ASGIApp) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        handler = scope.get("route_handler")
        # Console pages (opt `console`, only the /admin router's) check their session cookie instead.
        if scope["type"] == "http" and not (handler is not None and (handler.opt.get("public")
                                                                     or handler.opt.get("console"))):
            operation = handler.operation_id if handler is not None else None
            if not isinstance(operation, str):
                # Litestar's own OPTIONS answers tell only a route's methods: any role. Any other
                # handler without an operation id is in no row of the table: owners only.
                operation = "options" if scope["method"] == "OPTIONS" else ""
            authenticate(scope, scope["litestar_app"].state, scope.get("path_template"), operation)
        await app(scope, receive, send)

    return middleware


def principal(scope: Scope) -> Principal:
    return scope["state"]["principal"]
