"""Periodic housekeeping on monotonic ticks: flush the activity log, refresh planner statistics.
Missed ticks are skipped, not replayed; every step logs its failure and the loop goes on."""

from __future__ import annotations

import asyncio
import logging
import time

from appliance.runtime import Runtime
from appliance.storage.activity import append_activity

log = logging.getLogger("appliance.ticker")

TICK_SECONDS = 1.0
OPTIMIZE_EVERY = 300.0  # SQLite checkpoints the WAL itself on commit; the planner stats need a refresh


async def flush_activity(runtime: Runtime) -> int:
    rows, runtime.activity[:] = list(runtime.activity), []
    if rows:
        await runtime.db.write(lambda conn: append_activity(conn, rows))
    return len(rows)


async def run_ticker(runtime: Runtime, stop: asyncio.Event) -> None:
    last_optimize = time.monotonic()
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=TICK_SECONDS)
        except asyncio.TimeoutError:
            pass
        try:
            await flush_activity(runtime)
            if time.monotonic() - last_optimize >= OPTIMIZE_EVERY:
                last_optimize = time.monotonic()
                await runtime.db.write(lambda conn: conn.execute("PRAGMA optimize"))
        except Exception as exc:  # housekeeping must never stop the loop
            log.error("ticker step failed: %s", type(exc).__name__)
