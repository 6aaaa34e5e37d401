"""Job leases: on a database several processes share, a `running` job belongs to the process that
claimed it only while that process keeps renewing its lease. A job whose lease ran out (its
process died, or lost the database for that long) goes back to the queue for any process to
claim, its delivery-limit slots given back. The SQLite store needs none of this: one process
owns its file, and the jobs it finds running at start are its own interrupted ones.

Leases are timed by the database server's clock (`clock_timestamp()`), one clock for every
machine, whatever their own clocks say."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable

from appliance.storage.db import StorageError

log = logging.getLogger("appliance.storage")

# A dead process's jobs are claimable this long after its last renewal ([storage]
# job_lease_seconds), and found within a quarter of it more (the renewal period): with 60 s,
# taken over within 75 s (contract: 2 min).
LEASE_SECONDS = 60.0


class JobLeases:
    """This process's leases. `keep()` (called by the first claim) starts the thread that renews
    them and requeues other processes' expired ones every `every` seconds; a process that never
    claims a job (a CLI command) runs no thread. `close()` hands this process's running jobs back
    at once (a clean stop: a restart or another process takes them without waiting out the lease)."""

    def __init__(self, write: Callable[..., object], *, seconds: float = LEASE_SECONDS) -> None:
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.seconds = seconds
        self.every = seconds / 4  # three renewals may fail before a live process loses a job
        self._write = write  # runs `fn(PgJobs)` in a write unit (store.py)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def keep(self) -> None:
        if self._thread is not None or self._stop.is_set():
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="appliance-leases", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        failing = False  # said once per outage, not every round
        while not self._stop.wait(self.every):
            try:
                # Without the writer lock: it touches only this process's own running jobs, and a
                # long unit holding the lock (a large purge) must not let its leases run out.
                self._write(lambda jobs: jobs.renew_leases(), writer_lock=False)
                # Scoped, naming nothing (the rows it takes are locked SKIP LOCKED, the slots it
                # gives back are subtracted in place), and not waiting: only a unit holding every
                # write out (a configuration change, a purge) makes it wait for the next round.
                taken = self._write(lambda jobs: jobs.requeue_expired(), wait=False, locks=()) or 0
            except Exception as exc:  # noqa: BLE001 - the thread must live on: its end would let other processes take live jobs
                if not failing:
                    said = exc if isinstance(exc, StorageError) else type(exc).__name__
                    log.warning("renewing job leases failed (tried again every %g s): %s", self.every, said)
                failing = True
                continue
            if failing:
                log.warning("job leases renewed again")
                failing = False
            if taken:
                log.warning("%d running jobs of a process that stopped renewing them are queued again", taken)

    def close(self) -> None:
        """Stop renewing; this process's running jobs (left by a stop) are claimable at once."""
        self._stop.set()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        thread.join(timeout=self.every + 5)
        try:
            self._write(lambda jobs: jobs.hand_back())
        except StorageError as exc:
            log.warning("handing back running jobs failed (taken over when their leases end): %s", exc)
