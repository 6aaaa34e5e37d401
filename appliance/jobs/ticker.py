"""Periodic housekeeping on monotonic ticks: flush the activity log, purge its (and the webhook
attempts', suppliers' pings' and the audit log's) old rows, settle SMS messages whose provider call was interrupted, refresh planner statistics.
Missed ticks are skipped, not replayed; every step logs its failure and the loop goes on. Purges
and settling run in one process per database (`Store.runs_timed_work`)."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from appliance.clock import Clock, iso
from appliance.jobs.outage import Outage
from appliance.runtime import Runtime
from appliance.storage import StorageUnavailable
from appliance.services import audit, users
from appliance.services.endpoints import hour_of

log = logging.getLogger("appliance.ticker")

TICK_SECONDS = 1.0
OPTIMIZE_EVERY = 300.0
PURGE_EVERY = 3600.0  # SQLite checkpoints the WAL itself on commit; the planner stats need a refresh
SMS_SETTLE_EVERY = 60.0
# Far beyond any provider call (built-in adapters give up after timeout_seconds, default 10 s).
SMS_INTERRUPTED_AFTER = timedelta(minutes=10)
INTERRUPTED_SMS_REASON = ("interrupted: the service stopped, or the provider call never ended, while the message "
                          "was being handed to the provider; whether the provider sent it is unknown")


async def flush_activity(runtime: Runtime) -> int:
    rows, runtime.activity[:] = list(runtime.activity), []
    if rows:
        try:
            # New rows only, every second in every process: scoped, naming nothing (storage/locks.py).
            await runtime.store.write_off_loop(lambda tx: tx.activity.append(rows), locks=())
        except StorageUnavailable:  # nothing was written: the rows go first in the next flush
            runtime.activity[:0] = rows
            raise
    return len(rows)


async def purge_old_activity(runtime: Runtime) -> int:
    """The activity log, the webhook attempts log and the endpoints' answers per hour keep
    `[storage] activity_log_days` days."""
    days = runtime.config.storage.activity_log_days
    if days <= 0:
        return 0
    cutoff = runtime.clock.now() - timedelta(days=days)
    before, hour = iso(cutoff), hour_of(cutoff)
    return await runtime.store.write(lambda tx: tx.activity.purge(before) + tx.webhooks.purge_attempts(before)
                                     + tx.endpoints.purge_answers(hour))


async def purge_old_pings(runtime: Runtime) -> int:
    """Suppliers' pings keep `[retention] ping_days` days."""
    before = iso(runtime.clock.now() - timedelta(days=runtime.config.retention.ping_days))
    return await runtime.store.write(lambda tx: tx.pings.purge(before))


async def settle_interrupted_sms(runtime: Runtime) -> int:
    now = runtime.clock.now()
    before = iso(now - SMS_INTERRUPTED_AFTER)
    return await runtime.store.write(
        lambda tx: tx.messages.settle_interrupted(before, INTERRUPTED_SMS_REASON, iso(now)))


class _Every:
    """A step that is due every `seconds` on the clock's monotonic time (`first_now`: due at once).
    Missed ticks are skipped, not replayed."""

    def __init__(self, clock: Clock, seconds: float, *, first_now: bool = False) -> None:
        self.clock = clock
        self.seconds = seconds
        self.last = clock.monotonic() - (seconds if first_now else 0.0)

    def due(self) -> bool:
        now = self.clock.monotonic()
        if now - self.last < self.seconds:
            return False
        self.last = now
        return True


async def run_ticker(runtime: Runtime, stop: asyncio.Event) -> None:
    clock = runtime.clock
    planner_stats = _Every(clock, OPTIMIZE_EVERY)
    purge = _Every(clock, PURGE_EVERY, first_now=True)  # purge once soon after start
    sms_settle = _Every(clock, SMS_SETTLE_EVERY, first_now=True)
    outage = Outage(log, "housekeeping")
    wait = TICK_SECONDS
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=wait)
        except asyncio.TimeoutError:
            pass
        try:
            await flush_activity(runtime)
            # Purges and settling run once per database (processes sharing a PostgreSQL one elect a
            # leader); the activity flush is each process's own buffer.
            if purge.due() and await runtime.store.runs_timed_work():
                await purge_old_activity(runtime)
                await purge_old_pings(runtime)
                await audit.purge_old(runtime)
                await runtime.store.write(lambda tx: users.purge_stale(tx, runtime.clock.now()))
            if sms_settle.due() and await runtime.store.runs_timed_work() \
                    and (settled := await settle_interrupted_sms(runtime)):
                log.warning("%d SMS messages were left sending by an interrupted provider call: now error", settled)
            if planner_stats.due():
                await runtime.store.optimize()
            outage.succeeded()
            wait = TICK_SECONDS
        except StorageUnavailable as exc:  # the activity buffer is kept and flushed once it answers
            wait = max(outage.failed(exc), TICK_SECONDS)
        except Exception as exc:  # housekeeping must never stop the loop
            log.error("ticker step failed: %s", type(exc).__name__)
