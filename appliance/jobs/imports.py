"""The CSV imports a server runs: tasks on its event loop (appliance/services/lead_import.py),
cancelled when it stops; imports a stopped process left `running` end `failed` at the next start."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from appliance.jobs.outage import Outage
from appliance.runtime import Runtime
from appliance.services.lead_import import end_interrupted
from appliance.storage import StorageUnavailable

log = logging.getLogger("appliance.imports")


class ImportRunner:
    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._tasks: set[asyncio.Task] = set()
        self._retry: asyncio.Task | None = None  # `begin`'s work, while the database does not answer

    def start(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)  # a reference, so the task is not collected while it runs
        task.add_done_callback(self._tasks.discard)

    async def begin(self) -> None:
        """At start: no import of an earlier process is running any more (once the database
        answers, when a server starts while it does not)."""
        try:
            await end_interrupted(self._runtime)
        except StorageUnavailable:
            self._retry = asyncio.create_task(Outage(log, "ending interrupted imports").retry(
                lambda: end_interrupted(self._runtime), asyncio.Event()))

    async def stop(self) -> None:
        """At stop: the running imports end here, `failed` with what they did."""
        if self._retry is not None:
            self._retry.cancel()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if tasks:
            try:
                await end_interrupted(self._runtime)
            except StorageUnavailable:  # they stay `running` in the database: the next start ends them
                log.error("the imports this server ran could not be marked failed: the database does not answer")
