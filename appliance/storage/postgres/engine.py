"""PostgreSQL under the store: a pool of connections for write units, one connection per
thread for reads, and a listener that hears other processes' admin changes.

Write units: each runs in its own SERIALIZABLE transaction on a pooled connection, on a worker
thread (the event loop never waits for the network). Serializable keeps what the SQLite store
gets from its single writer: every unit behaves as if the units ran one after another, across
every process sharing the database, so caps, delivery limits, dedupe and the rotation stay exact.
A unit PostgreSQL aborts for a serialization failure or a deadlock runs again (units may run more
than once and act only through `tx`: storage/store.py). There is no group commit here: each unit
commits alone, and concurrent commits share the server's WAL flushes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
from psycopg import IsolationLevel
from psycopg_pool import ConnectionPool, PoolTimeout

from appliance.storage.db import StorageError
from appliance.storage.postgres.connection import PgConnection, configure
from appliance.storage.postgres.migrations import apply as apply_migrations
from appliance.storage.postgres.url import redact

log = logging.getLogger("appliance.storage")
T = TypeVar("T")

_RETRYABLE = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)
_MAX_RUNS = 30  # a unit aborted this many times in a row is reported, not run again
_CHANNEL = "appliance_changes"
_CONNECT_TIMEOUT = 10


def _reason(exc: BaseException) -> str:
    """The first line of a driver error (later lines may quote a statement)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class ChangeListener:
    """Other processes' admin changes, heard with LISTEN: `value()` moves when one arrives, as
    storage/change_signal.ChangeSignal's does. While the listening connection is down the value
    moves every time it is read, so the key cache reads through to the database meanwhile."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._value = 0
        self._connected = False
        self._stop = threading.Event()
        self._conn: psycopg.Connection | None = None  # the listening connection, under _conn_lock
        self._conn_lock = threading.Lock()
        self._thread = threading.Thread(target=self._listen, name="appliance-listen", daemon=True)
        self._thread.start()

    def value(self) -> int:
        if not self._connected:
            self._value += 1
        return self._value

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                conn = psycopg.connect(self._url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT)
            except psycopg.Error:
                self._stop.wait(1.0)
                continue
            with self._conn_lock:
                self._conn = conn
            try:
                conn.execute(f"LISTEN {_CHANNEL}")
                self._connected = True
                self._value += 1  # anything may have changed while it was not listening
                while not self._stop.is_set():
                    for _ in conn.notifies(timeout=0.5):
                        self._value += 1
            except psycopg.Error:
                pass
            self._connected = False
            with self._conn_lock:
                self._conn = None
                conn.close()
            self._stop.wait(1.0)

    def close(self) -> None:
        self._stop.set()
        # Every CLI command and test closes a store: rather than wait up to the poll's 0.5 s, end
        # the wait for notifications now by shutting the socket down here (no round trip to a
        # server that may be gone). The lock keeps the descriptor from being closed and reused.
        with self._conn_lock:
            if self._conn is not None:
                with contextlib.suppress(OSError, psycopg.Error), \
                        socket.socket(fileno=os.dup(self._conn.fileno())) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)


_TIMED_WORK_LOCK = 0x6170706C69616E64  # the session advisory lock the timed-work leader holds
# A leader whose machine vanished holds the lock until the server notices its connection is gone:
# keepalives make that well under a minute instead of the system's default two hours.
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}


class TimedWorkLeader:
    """Timed work (purges, settling interrupted SMS) runs in one process per database: the one
    holding a session-level advisory lock on a connection of its own. The lock ends with that
    connection, so when the leader stops, dies or loses the database, the next process to ask
    takes over. Asked only when a step is due (seconds to an hour apart)."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: psycopg.Connection | None = None
        self._held = False
        self._lock = threading.Lock()

    def holds(self) -> bool:
        with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = psycopg.connect(self._url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT,
                                                 **_KEEPALIVES)
                    self._held = False
                if self._held:
                    self._conn.execute("SELECT 1")  # still connected: still ours
                else:
                    (self._held,) = self._conn.execute("SELECT pg_try_advisory_lock(%s)",
                                                       (_TIMED_WORK_LOCK,)).fetchone()
            except psycopg.Error:
                self._drop()
            return self._held

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn, self._held = None, False

    def close(self) -> None:
        with self._lock:
            self._drop()


class PgDatabase:
    def __init__(self, url: str, *, pool_size: int = 8) -> None:
        self.url = url
        self.pool_size = pool_size
        self._pool: ConnectionPool | None = None
        self._local = threading.local()
        self._readers: list[psycopg.Connection] = []
        self._readers_lock = threading.Lock()
        self.changes: ChangeListener | None = None
        self.leader = TimedWorkLeader(url)
        self.migrated_on_open: list[str] = []  # the migrations `open` applied (init: created or up to date)

    # ---- life cycle -------------------------------------------------------------------------

    def open(self) -> PgDatabase:
        try:
            with psycopg.connect(self.url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT) as raw:
                self.migrated_on_open = apply_migrations(raw)
        except psycopg.Error as exc:
            raise StorageError(f"cannot open database {redact(self.url)}: {_reason(exc)}") from None
        self._pool = ConnectionPool(self.url, min_size=1, max_size=self.pool_size, configure=self._configure,
                                    kwargs={"connect_timeout": _CONNECT_TIMEOUT}, open=True, name="appliance")
        self.changes = ChangeListener(self.url)
        return self

    @staticmethod
    def _configure(raw: psycopg.Connection) -> None:
        configure(raw)
        raw.isolation_level = IsolationLevel.SERIALIZABLE
        raw.commit()  # the pool hands out idle connections

    def close(self) -> None:
        if self.changes is not None:
            self.changes.close()
            self.changes = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        with self._readers_lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()
        self._local = threading.local()
        self.leader.close()

    def announce_admin_change(self) -> None:
        """Tell every process on this database that keys or tenant configuration changed."""
        try:
            self.write_sync(lambda conn: conn.execute(f"NOTIFY {_CHANNEL}"))
        except StorageError:
            log.warning("could not signal the change to running servers: they see it within a second")

    # ---- writes -----------------------------------------------------------------------------

    def write_sync(self, unit: Callable[[PgConnection], T]) -> T:
        """`unit(conn)` in one serializable transaction, run again when PostgreSQL aborts it for
        a serialization failure or a deadlock."""
        if self._pool is None:
            raise StorageError("the database is closed")
        for run in range(1, _MAX_RUNS + 1):
            try:
                with self._pool.connection() as raw, raw.transaction():
                    return unit(PgConnection(raw))
            except _RETRYABLE:
                if run == _MAX_RUNS:
                    raise StorageError(f"write failed: still conflicting after {run} runs") from None
                # Randomized, growing waits: the transactions that collided do not meet again.
                time.sleep(random.uniform(0, min(0.001 * 2 ** run, 0.05)))
            except (psycopg.OperationalError, PoolTimeout) as exc:
                raise StorageError(f"write failed: {_reason(exc)}") from None
        raise AssertionError("unreachable")

    async def write(self, unit: Callable[[PgConnection], T]) -> T:
        if self._pool is None:
            raise StorageError("the database is closed")
        return await asyncio.to_thread(self.write_sync, unit)

    # ---- reads ------------------------------------------------------------------------------

    def reader(self) -> PgConnection:
        """This thread's read connection: each statement its own snapshot; `with` for one
        REPEATABLE READ transaction (every read as of the same commit)."""
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.raw.closed:
            try:
                raw = psycopg.connect(self.url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT)
            except psycopg.Error as exc:
                raise StorageError(f"cannot read the database: {_reason(exc)}") from None
            configure(raw)
            raw.isolation_level = IsolationLevel.REPEATABLE_READ
            raw.read_only = True
            conn = self._local.conn = PgConnection(raw)
            with self._readers_lock:
                self._readers.append(raw)
        return conn

    def row(self, sql: str, params: tuple = ()) -> tuple | None:
        """One row of a read (`?` parameters), as Database.row."""
        return self.reader().execute(sql, params).fetchone()

    def ping(self) -> None:
        self.row("SELECT 1")

    def health(self) -> tuple[str, int]:
        """('ok' when the server answers, migrations applied): PostgreSQL checks its own pages."""
        (applied,) = self.reader().execute("SELECT count(*) FROM migrations").fetchone()
        return "ok", applied
