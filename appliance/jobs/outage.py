"""A background loop's view of a database outage: one log line when the database stops
answering and one when it answers again, however many attempts fail in between, and a wait
before the next attempt that doubles up to a ceiling (an unreachable server is not hammered)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from appliance.storage import StorageUnavailable

T = TypeVar("T")

FIRST_WAIT, LAST_WAIT = 0.5, 10.0


class Outage:
    def __init__(self, log: logging.Logger, what: str) -> None:
        self.log = log
        self.what = what  # the loop, for the log line: "delivery", "webhooks", "housekeeping"
        self.wait = 0.0  # 0: no outage

    def failed(self, exc: StorageUnavailable) -> float:
        """Seconds to wait before trying again."""
        if not self.wait:
            self.log.error("%s paused: %s (retrying with backoff until it answers)", self.what, exc)
            self.wait = FIRST_WAIT
        else:
            self.wait = min(self.wait * 2, LAST_WAIT)
        return self.wait

    def succeeded(self) -> None:
        if self.wait:
            self.log.warning("%s resumed: the database answers again", self.what)
            self.wait = 0.0

    async def retry(self, work: Callable[[], Awaitable[T]], stop: asyncio.Event | None) -> T | None:
        """`await work()` until it gets through (None when `stop` is set first; without `stop`,
        until it gets through or the task is cancelled)."""
        while stop is None or not stop.is_set():
            try:
                result = await work()
            except StorageUnavailable as exc:
                wait = self.failed(exc)
            else:
                self.succeeded()
                return result
            if stop is None:
                await asyncio.sleep(wait)
                continue
            try:
                await asyncio.wait_for(stop.wait(), timeout=wait)
            except TimeoutError:
                pass
        return None
