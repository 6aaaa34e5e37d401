"""PostgreSQL under the store: a pool of connections for write units, one connection per
thread for reads, and a listener that hears other processes' admin changes.

Write units: each runs in its own transaction on a pooled connection, on a worker thread (the
event loop never waits for the network), and takes the database's one writer lock (a transaction
advisory lock) before anything else. That is the SQLite store's model across every process
sharing the database: units run one after another, and at READ COMMITTED each statement sees
every unit committed before it, so caps, delivery limits, dedupe and the rotation stay exact.
SERIALIZABLE without the lock was measured first (bench/HISTORY.md): every submit of a campaign
updates the same report rollup row and every delivery its endpoint's hour and its limit's counter,
so most units were aborted and run again, some gave up after 30 runs (a 500, or a delivery sent
twice), and throughput was half of the lock's. A unit PostgreSQL still aborts (a deadlock) runs
again (units may run more than once and act only through `tx`: storage/store.py). There is no
group commit here: each unit commits alone, so a commit's WAL flush is paid per unit.

Units an event loop issues take the writer lock in the order it issued them (IssueOrder), as
SQLite's writer runs them: the delivery worker reserves delivery-limit slots for the jobs it
claimed together oldest first, and separate threads would otherwise reach the lock in any order."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
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

from appliance.storage.db import StorageError, StorageUnavailable
from appliance.storage.postgres.connection import (
    PgConnection,
    configure,
    lost,
    reason,
    unavailable,
)
from appliance.storage.postgres.migrations import apply as apply_migrations
from appliance.storage.postgres.url import redact

log = logging.getLogger("appliance.storage")
# The pool warns at every failed attempt to reconnect: during an outage that is a line a second.
# The outage itself is said once, by the store and the job loops (appliance/jobs/outage.py).
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
T = TypeVar("T")

_RETRYABLE = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)
_MAX_RUNS = 30  # a unit aborted this many times in a row is reported, not run again
_WRITER_LOCK = 0x6170706C69616E77  # "appliancw": the transaction advisory lock every write unit takes first
_CHANNEL = "appliance_changes"
_CONNECT_TIMEOUT = 10
_POOL_WAIT = 10.0  # seconds a unit waits for a pooled connection while the database answers
_POOL_WAIT_IN_OUTAGE = 0.5  # ... and while it does not: a request answers 503 at once rather than hang


def application_name() -> str:
    """Every connection's name in pg_stat_activity: the process it comes from, so `appliance
    doctor` can count the processes sharing the database."""
    return f"appliance:{socket.gethostname()}:{os.getpid()}"[:63]  # PostgreSQL keeps 63 bytes


# A database machine that vanishes (rather than refusing) ends a connection within about 25 s
# instead of the system's default two hours: a read waiting on it fails and is answered 503.
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}


def connect(url: str, **kwargs) -> psycopg.Connection:
    return psycopg.connect(url, connect_timeout=_CONNECT_TIMEOUT, application_name=application_name(),
                           **_KEEPALIVES, **kwargs)


def open_error(url: str, exc: psycopg.Error) -> StorageError:
    """Why `url` could not be opened: an outage (worth retrying) or a refusal (credentials, name)."""
    message = f"cannot open database {redact(url)}: {reason(exc)}"
    return StorageUnavailable(message) if unavailable(exc) else StorageError(message)


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

    def bump(self) -> None:
        """This process made the change: its own caches see it now, not when its NOTIFY comes back."""
        self._value += 1

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                conn = connect(self._url, autocommit=True)
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

class TimedWorkLeader:
    """Timed work (purges, settling interrupted SMS) and the webhook sender run in one process per database: the one
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
                    self._conn = connect(self._url, autocommit=True)
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


class IssueOrder:
    """Tickets handed out on the event loop, in the order `write` is called; a unit's thread
    waits for its ticket's turn before it asks for the writer lock, and its ticket is done once
    it holds the lock (or ended without it), so the next unit queues at the lock meanwhile. At
    most two ordered units hold a pooled connection at a time: the one holding the lock and the
    next, waiting for it. The wait is bounded (a unit stuck on a vanished server must not hold
    every later one), and none waits while `unordered` (an outage: each unit fails alone)."""

    def __init__(self) -> None:
        self._turn = threading.Condition()
        self._issued = 0
        self._serving = 0  # the lowest ticket not done
        self._done: set[int] = set()  # tickets done out of turn
        self._unordered = False

    def ticket(self) -> int:
        with self._turn:
            self._issued += 1
            return self._issued - 1

    def wait(self, ticket: int, timeout: float) -> None:
        with self._turn:
            self._turn.wait_for(lambda: self._serving >= ticket or self._unordered, timeout)

    def done(self, ticket: int) -> None:
        with self._turn:
            self._done.add(ticket)
            while self._serving in self._done:
                self._done.remove(self._serving)
                self._serving += 1
            self._turn.notify_all()

    def set_unordered(self, unordered: bool) -> None:
        with self._turn:
            self._unordered = unordered
            self._turn.notify_all()


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
        self._outage = False  # the last unit found the database unreachable (cleared by one that commits)
        self._order = IssueOrder()

    # ---- life cycle -------------------------------------------------------------------------

    def open(self, *, create: bool = False) -> PgDatabase:
        """Connects and applies the pending migrations, as SQLite's open does. A database without
        the appliance's tables is refused unless `create` (`appliance init`): a mistyped URL must
        not start an empty install. Raises StorageUnavailable when the server cannot be reached."""
        try:
            with connect(self.url, autocommit=True) as raw:
                (table,) = raw.execute("SELECT to_regclass('migrations')").fetchone()
                if table is None and not create:
                    raise StorageError(f"no appliance database at {redact(self.url)}: run `appliance init` first, "
                                       "or point [storage] url at the appliance's database")
                self.migrated_on_open = apply_migrations(raw)
        except psycopg.Error as exc:
            raise open_error(self.url, exc) from None
        self._pool = ConnectionPool(self.url, min_size=1, max_size=self.pool_size, configure=self._configure,
                                    kwargs={"connect_timeout": _CONNECT_TIMEOUT, "application_name": application_name(), **_KEEPALIVES},
                                    open=True, name="appliance")
        self.changes = ChangeListener(self.url)
        return self

    @staticmethod
    def _configure(raw: psycopg.Connection) -> None:
        configure(raw)
        raw.isolation_level = IsolationLevel.READ_COMMITTED
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
        if self.changes is not None:
            self.changes.bump()
        try:
            # Not under the writer lock: it writes nothing, and it is sent from request handlers.
            self.write_sync(lambda conn: conn.execute(f"NOTIFY {_CHANNEL}"), writer_lock=False)
        except StorageError:
            log.warning("could not signal the change to running servers: they see it within a second")

    # ---- writes -----------------------------------------------------------------------------

    def write_sync(self, unit: Callable[[PgConnection], T], *, writer_lock: bool = True,
                   wait: bool = True, ticket: int | None = None) -> T | None:
        """`unit(conn)` in one transaction holding the writer lock, run again when PostgreSQL
        aborts it (a deadlock). With a `ticket` (IssueOrder), it takes the lock in its turn."""
        if ticket is not None:
            self._order.wait(ticket, _POOL_WAIT)
        try:
            pool = self._pool
            if pool is None:
                raise StorageError("the database is closed")
            for run in range(1, _MAX_RUNS + 1):
                try:
                    with pool.connection(_POOL_WAIT_IN_OUTAGE if self._outage else _POOL_WAIT) as raw, \
                            raw.transaction():
                        if not writer_lock:  # renewing this process's own job leases (leases.py), a NOTIFY
                            result = unit(PgConnection(raw))
                        elif wait:
                            raw.execute("SELECT pg_advisory_xact_lock(%s)", (_WRITER_LOCK,))
                            if ticket is not None:
                                self._order.done(ticket)
                                ticket = None
                            result = unit(PgConnection(raw))
                        elif raw.execute("SELECT pg_try_advisory_xact_lock(%s)", (_WRITER_LOCK,)).fetchone()[0]:
                            result = unit(PgConnection(raw))
                        else:  # `wait=False`: the lock is taken, the unit is not run (None)
                            result = None
                    if self._outage:
                        self._end_outage(pool)
                    return result
                except StorageUnavailable:
                    self._begin_outage()
                    raise
                except _RETRYABLE:
                    if run == _MAX_RUNS:
                        raise StorageError(f"write failed: still conflicting after {run} runs") from None
                    # Randomized, growing waits: the transactions that collided do not meet again.
                    time.sleep(random.uniform(0, min(0.001 * 2 ** run, 0.05)))
                except PoolTimeout:
                    self._begin_outage()
                    raise StorageUnavailable("write failed: no connection to the database") from None
                except psycopg.OperationalError as exc:
                    if unavailable(exc):  # the connection was lost at COMMIT: the unit is answered as not done
                        self._begin_outage()
                        raise lost(exc) from None
                    raise StorageError(f"write failed: {reason(exc)}") from None
            raise AssertionError("unreachable")
        finally:
            if ticket is not None:  # it ended before it held the lock: the next unit's turn
                self._order.done(ticket)

    def _begin_outage(self) -> None:
        self._outage = True
        self._order.set_unordered(True)  # queued units fail each on its own, not one after another

    def _end_outage(self, pool: ConnectionPool) -> None:
        self._outage = False
        self._order.set_unordered(False)
        # Connections pooled before the outage are dead, each would fail one unit: replaced off
        # this caller's thread (checking them is a round trip each).
        threading.Thread(target=self._replace_dead_connections, args=(pool,), daemon=True,
                         name="appliance-pool-check").start()

    @staticmethod
    def _replace_dead_connections(pool: ConnectionPool) -> None:
        with contextlib.suppress(Exception):  # a pool closing meanwhile, the database gone again
            pool.check()

    async def write(self, unit: Callable[[PgConnection], T]) -> T:
        ticket = self._order.ticket()
        run = functools.partial(contextvars.copy_context().run, self.write_sync, unit, ticket=ticket)
        try:
            running = asyncio.get_running_loop().run_in_executor(None, run)
        except BaseException:  # never to run (the executor shut down): the next unit's turn
            self._order.done(ticket)
            raise
        # Shielded: a unit whose ticket was handed out runs (as one already on its thread does
        # when its caller is cancelled), or every unit after it would wait for its turn.
        return await asyncio.shield(running)

    # ---- reads ------------------------------------------------------------------------------

    def reader(self) -> PgConnection:
        """This thread's read connection: each statement its own snapshot; `with` for one
        REPEATABLE READ transaction (every read as of the same commit)."""
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.raw.closed:
            try:
                raw = connect(self.url, autocommit=True)
            except psycopg.Error as exc:
                if unavailable(exc):
                    raise StorageUnavailable(f"cannot read the database: {reason(exc)}") from None
                raise StorageError(f"cannot read the database: {reason(exc)}") from None
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

    def describe(self) -> dict[str, object]:
        """What `appliance doctor` shows: the server's version, how long a round trip takes, the
        migrations applied and how many other appliance processes are connected."""
        conn = self.reader()
        started = time.perf_counter()
        conn.execute("SELECT 1")
        latency = time.perf_counter() - started
        version, applied, others = conn.execute(
            "SELECT current_setting('server_version'), (SELECT count(*) FROM migrations),"
            " (SELECT count(DISTINCT application_name) FROM pg_stat_activity"
            "  WHERE datname = current_database() AND application_name LIKE ? AND application_name <> ?)",
            ("appliance:%", application_name())).fetchone()
        return {"url": redact(self.url), "version": version, "latency_ms": round(latency * 1000, 2),
                "migrations": applied, "other_processes": others}

    def health(self) -> tuple[str, int]:
        """('ok' when the server answers, migrations applied): PostgreSQL checks its own pages."""
        (applied,) = self.reader().execute("SELECT count(*) FROM migrations").fetchone()
        return "ok", applied
