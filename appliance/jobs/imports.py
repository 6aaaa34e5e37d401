"""The CSV imports a server runs: tasks on its event loop (appliance/services/lead_import.py),
cancelled when it stops; imports a stopped process left `running` end `failed` at the next start."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from appliance.runtime import Runtime
from appliance.services.lead_import import end_interrupted


class ImportRunner:
    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._tasks: set[asyncio.Task] = set()

    def start(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)  # a reference, so the task is not collected while it runs
        task.add_done_callback(self._tasks.discard)

    async def begin(self) -> None:
        """At start: no import of an earlier process is running any more."""
        await end_interrupted(self._runtime)

    async def stop(self) -> None:
        """At stop: the running imports end here, `failed` with what they did."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if tasks:
            await end_interrupted(self._runtime)
