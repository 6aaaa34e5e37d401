"""PostgreSQL under the store: a writer thread per process that commits write units in groups,
one connection per thread for reads, and a listener that hears other processes' admin changes.

Write units queue for this process's writer thread, which runs them in the order they were
issued, as many as are waiting in one transaction (group commit, as the SQLite store does: one
WAL flush and one lock hand-over for the whole group), on a pooled connection, so the event loop
never waits for the network. Exactness across processes comes from advisory locks, each held to
the end of its transaction:

- A scoped unit names the locks of what it must be exact about (a campaign's or source's cap
  counter, a dedupe key, a lead, a campaign's delivery state: storage/locks.py) and takes the
  install-wide writer lock shared, so scoped units of different campaigns and leads commit in
  parallel across processes. A unit that names no locks takes the writer lock exclusively and
  runs alone, as every unit once did: the rare ones (configuration, purges) stay exact against
  everything without each naming what it touches.
- The first unit of a group waits for its locks; the group holds none yet, so two groups never
  wait for each other through them. Every later unit only tries its new locks, and when another
  transaction holds one the group ends before that unit, which leads the next group.
- At READ COMMITTED each statement sees every transaction committed before it, so a unit that
  holds its locks reads what the last holder committed: caps, dedupe, delivery limits and the
  rotation stay exact. Counters every unit adds to (report rollups, endpoint outcomes) are kept
  per database connection (migration pg03), so no two transactions wait for one row.

SERIALIZABLE without locks was measured first (bench/HISTORY.md): the hot rows aborted most units.
A group PostgreSQL still aborts (a deadlock through rows no lock covers) runs again whole: units
may run more than once and act only through `tx` (storage/store.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import os
import queue
import random
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, NoReturn, TypeVar

import psycopg
from psycopg import IsolationLevel
from psycopg_pool import ConnectionPool, PoolTimeout

from appliance.storage.db import StorageError, StorageUnavailable, _resolve
from appliance.storage.postgres.connection import (
    LockBusy,
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
_MAX_RUNS = 30  # a group aborted this many times in a row is reported, not run again
# "appliancw": the transaction advisory lock every group takes first, shared by groups of scoped
# units, exclusive for a unit that declares no locks.
_WRITER_LOCK = 0x6170706C69616E77
_MAX_GROUP = 256
# Under load, wait this long for more units before starting a group: a commit (its WAL flush) costs
# far more than a unit. Light load (the previous group held fewer than _BUSY_GROUP) starts at once.
_LINGER_SECONDS = 0.002
_BUSY_GROUP = 4
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


class _Unit(NamedTuple):
    fn: Callable[[PgConnection], Any]
    done: Any  # an asyncio.Future or a concurrent.futures.Future
    locks: frozenset[int] | None  # None: the unit excludes every other
    may_refuse: bool


class _RunAgain(Exception):
    """A unit that may not refuse raised: its group runs again with a savepoint per unit."""


class _Outage(Exception):
    """A group met an outage (its units have their answer): the units queued with it fail too."""

    def __init__(self, error: StorageUnavailable) -> None:
        self.error = error
        self.ran = 0  # how many of the batch the failed group took


def _take_locks(raw: psycopg.Connection, conn: PgConnection, item: _Unit, position: int, held: set[int],
                first_also: set[int], *, exclusive: bool) -> None:
    """The locks `item` names, before it runs: waited for by the group's first unit (in key
    order: two first units that wait never wait for each other), only tried by a later one
    (answered at the unit's first read, or LockBusy)."""
    named = item.locks or frozenset()
    needed = sorted((named | first_also if position == 0 and not exclusive else named) - held)
    if position == 0:
        raw.execute(f"SELECT pg_advisory_xact_lock{'' if exclusive else '_shared'}(%s)", (_WRITER_LOCK,))
        if needed:
            raw.execute("SELECT count(pg_advisory_xact_lock(k)) FROM"
                        " (SELECT k FROM unnest(%s::bigint[]) AS k ORDER BY k) AS keys", (needed,))
    elif needed:
        conn.try_locks(needed, position)
    held.update(needed)


def _try_in_unit(conn: PgConnection, held: set[int], position: int, key: int) -> None:
    if key not in held:
        conn.try_locks([key], position)
        held.add(key)


_GROUP_FAILURES = (*_RETRYABLE, StorageUnavailable, LockBusy)  # what ends a whole group, not one unit
_STOP = object()


def _answer_sent(conn: PgConnection) -> None:
    """Wait for the answers to what the group's units sent; an error among them that is no unit's
    own yet runs the group again with a savepoint per unit, which tells whose it was."""
    try:
        conn.sync()
    except _GROUP_FAILURES:
        raise
    except Exception:  # noqa: BLE001 - see above
        raise _RunAgain from None


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
        self._outage = False  # the last group found the database unreachable (cleared by one that commits)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._accepting = threading.Lock()  # held to queue a unit; `_closed` set under it
        self._closed = False
        # The row this process adds to in the counters every unit adds to (pg03): its own, so
        # processes never wait for each other's row, and one per process start, not per connection.
        self.shard = secrets.randbelow(2**31)

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
        self._pool = ConnectionPool(self.url, min_size=1, max_size=self.pool_size, configure=functools.partial(
                                        self._configure, shard=self.shard),
                                    kwargs={"connect_timeout": _CONNECT_TIMEOUT, "application_name": application_name(), **_KEEPALIVES},
                                    open=True, name="appliance")
        self.changes = ChangeListener(self.url)
        self._writer = threading.Thread(target=self._write_loop, name="appliance-pg-writer", daemon=True)
        self._writer.start()
        return self

    @staticmethod
    def _configure(raw: psycopg.Connection, *, shard: int) -> None:
        configure(raw)
        raw.isolation_level = IsolationLevel.READ_COMMITTED
        raw.execute("SELECT set_config('appliance.shard', %s, false)", (str(shard),))
        raw.commit()  # the pool hands out idle connections

    def close(self) -> None:
        with self._accepting:  # no unit queued after the stop: each is run or answered
            self._closed = True
            self._queue.put(_STOP)
        if self._writer is not None:
            self._writer.join(timeout=30)
            self._writer = None
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

    async def write(self, unit: Callable[[PgConnection], T], *, locks: Iterable[int] | None = None,
                    may_refuse: bool = False) -> T:
        """`unit(conn)` in the next group transaction of this process's writer; returns once it
        is committed. `locks`: the advisory lock keys of what the unit must be exact about (a
        scoped unit, run with others); None: the unit excludes every other (run alone)."""
        future = asyncio.get_running_loop().create_future()
        self._enqueue(unit, future, locks, may_refuse)
        return await future

    def write_sync(self, unit: Callable[[PgConnection], T], *, locks: Iterable[int] | None = None,
                   may_refuse: bool = False, writer_lock: bool = True, wait: bool = True) -> T | None:
        """`write` for threads without an event loop. `writer_lock=False` (renewing this
        process's own leases, a NOTIFY) and `wait=False` (an exclusive unit run only if no other
        unit of any process runs now; else None) run at once on the calling thread."""
        if not writer_lock or not wait:
            return self._run_on_caller(unit, writer_lock=writer_lock, shared=locks is not None)
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._enqueue(unit, future, locks, may_refuse)
        return future.result()

    def _enqueue(self, unit: Callable[[PgConnection], T], future, locks: Iterable[int] | None,
                 may_refuse: bool) -> None:
        # In its caller's context on the writer thread: the audit log's request id, log lines.
        run = functools.partial(contextvars.copy_context().run, unit)
        with self._accepting:
            if self._pool is None or self._closed:
                raise StorageError("the database is closed")
            self._queue.put(_Unit(run, future, None if locks is None else frozenset(locks), may_refuse))

    def _write_loop(self) -> None:
        busy = False
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            batch = [item]
            # Under load, a moment's wait for more: one commit for many units (as SQLite's group).
            deadline = time.monotonic() + _LINGER_SECONDS if busy else 0.0
            stopping = False
            while len(batch) < _MAX_GROUP:
                wait = deadline - time.monotonic()
                try:
                    item = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stopping = True
                    break
                batch.append(item)
            busy = len(batch) >= _BUSY_GROUP
            while batch:
                try:
                    batch = self._run_next(batch)
                except _Outage as outage:
                    # The units queued with the group that met the outage would meet it too, one
                    # pool wait each: they fail with it now. The next ones try again.
                    _resolve([(item.done, None, outage.error) for item in batch[outage.ran:]])
                    batch = []
                except BaseException as exc:  # noqa: BLE001 - a bug here fails these units, never the writer thread
                    log.error("write group failed: %s", type(exc).__name__)
                    _resolve([(item.done, None, StorageError(f"write failed: {type(exc).__name__}")) for item in batch])
                    batch = []
            if stopping:
                break
        while True:  # queued after the stop: nothing runs them any more
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                _resolve([(item.done, None, StorageError("the database is closed"))])

    def _run_next(self, batch: list[_Unit]) -> list[_Unit]:
        """Runs the next group of `batch` (an exclusive unit alone, else the scoped units up to
        the next exclusive one) and returns the units still to run."""
        end = 1 if batch[0].locks is None else \
            next((i for i, item in enumerate(batch) if item.locks is None), len(batch))
        try:
            return self._run_group(batch[:end], exclusive=batch[0].locks is None) + batch[end:]
        except _Outage as outage:
            outage.ran = end
            raise

    def _run_group(self, group: list[_Unit], *, exclusive: bool) -> list[_Unit]:
        """One transaction for `group`, committed; returns the units cut off because another
        process held a lock they need (they start the next group). A unit that raises without
        `may_refuse` sends the group round again with a savepoint per unit; a deadlock or a
        serialization failure sends it round again whole."""
        savepoints = False
        first_also: set[int] = set()  # locks the first unit met while running: taken up front next run
        conflicts = 0
        while True:
            pool = self._pool
            if pool is None:
                _resolve([(item.done, None, StorageError("the database is closed")) for item in group])
                return []
            try:
                with pool.connection(_POOL_WAIT_IN_OUTAGE if self._outage else _POOL_WAIT) as raw, \
                        raw.transaction():
                    outcomes = self._run_units(raw, group, exclusive=exclusive, savepoints=savepoints,
                                               first_also=first_also)
            except _RunAgain:
                if not savepoints:
                    savepoints = True
                    continue
                if len(group) == 1:  # alone and still no unit's own: answered, not run again forever
                    _resolve([(group[0].done, None, StorageError("write failed: the transaction failed"))])
                    return []
                return self._one_by_one(group, exclusive=exclusive)  # an error no unit owned
            except LockBusy as busy:
                # A unit met a lock another transaction holds: the first unit waits for it next
                # run; a later one, and those after it, go to the next group.
                if busy.position == 0:
                    first_also.add(busy.key)
                    continue
                try:
                    left = self._run_group(group[:busy.position], exclusive=exclusive)
                except _Outage as outage:
                    _resolve([(item.done, None, outage.error) for item in group[busy.position:]])
                    raise
                return left + group[busy.position:]
            except _RETRYABLE:
                conflicts += 1
                if conflicts == _MAX_RUNS:
                    _resolve([(item.done, None, StorageError(f"write failed: still conflicting after {conflicts} runs"))
                              for item in group])
                    return []
                # Randomized, growing waits: the transactions that collided do not meet again.
                time.sleep(random.uniform(0, min(0.001 * 2 ** conflicts, 0.05)))
                continue
            except StorageUnavailable as exc:
                self._outage_met(group, exc)
            except PoolTimeout:
                self._outage_met(group, StorageUnavailable("write failed: no connection to the database"))
            except psycopg.OperationalError as exc:
                if unavailable(exc):  # lost at COMMIT: every unit of the group is answered as not done
                    self._outage_met(group, lost(exc))
                _resolve([(item.done, None, StorageError(f"write failed: {reason(exc)}")) for item in group])
                return []
            except psycopg.Error as exc:
                # COMMIT refused the group (a deferred constraint): each unit alone finds whose it was.
                if len(group) == 1:
                    _resolve([(group[0].done, None, exc)])
                    return []
                return self._one_by_one(group, exclusive=exclusive)
            if self._outage:
                self._end_outage(pool)
            _resolve(outcomes)
            return group[len(outcomes):]

    def _one_by_one(self, group: list[_Unit], *, exclusive: bool) -> list[_Unit]:
        """Each unit of `group` in a transaction of its own: which one a failure belongs to."""
        left: list[_Unit] = []
        for position, item in enumerate(group):
            try:
                left += self._run_group([item], exclusive=exclusive)
            except _Outage as outage:
                _resolve([(later.done, None, outage.error) for later in group[position + 1:]])
                raise
        return left

    @staticmethod
    def _run_units(raw: psycopg.Connection, group: list[_Unit], *, exclusive: bool, savepoints: bool,
                   first_also: set[int]) -> list[tuple[Any, Any, BaseException | None]]:
        """Each unit of `group` in the open transaction, in order, each after taking its locks:
        the first unit waits for its locks (the transaction holds none yet, so no two groups can
        wait for each other), every later one only tries, and the group ends before the first
        whose locks another transaction holds (LockBusy, see _run_group), as is a lock a unit
        takes while it runs (PgConnection.lock)."""
        conn = PgConnection(raw)
        held: set[int] = set()
        outcomes: list[tuple[Any, Any, BaseException | None]] = []
        # Scoped units in pipeline mode: a statement waits for no answer until a read needs one.
        # An exclusive unit (a CLI command, a bulk change, COPY) runs as plain statements.
        with contextlib.nullcontext() if exclusive else raw.pipeline() as pipeline:
            conn.pipeline = pipeline
            try:
                for position, item in enumerate(group):
                    holding = set(held)
                    _take_locks(raw, conn, item, position, held, first_also, exclusive=exclusive)
                    # An exclusive unit runs alone: nothing else to lock out.
                    conn.lock_hook = None if exclusive else functools.partial(_try_in_unit, conn, held, position)
                    if not (savepoints or item.may_refuse):
                        try:
                            outcomes.append((item.done, item.fn(conn), None))
                        except _GROUP_FAILURES:
                            raise
                        except Exception:  # noqa: BLE001 - run again with a savepoint per unit, where it fails alone
                            raise _RunAgain from None
                        continue
                    # What earlier units sent is answered before this unit's savepoint opens
                    # (which would wait for it and take an earlier unit's error for its own).
                    _answer_sent(conn)
                    try:
                        with raw.transaction():
                            try:
                                result = item.fn(conn)
                                conn.sync()  # its statements' errors are its own
                            except Exception:
                                # The error's Sync, or the database would pass over the rollback
                                # to the savepoint as part of the failed batch.
                                if pipeline is not None:
                                    with contextlib.suppress(psycopg.Error):
                                        pipeline.sync()
                                    conn.forget_pending()  # its checks and lock tries went with its savepoint
                                raise
                    except _GROUP_FAILURES:
                        raise
                    except Exception as exc:  # noqa: BLE001 - the caller's answer
                        held.intersection_update(holding)  # its locks may be unconfirmed, or let go with its savepoint
                        outcomes.append((item.done, None, exc))
                    else:
                        outcomes.append((item.done, result, None))
                _answer_sent(conn)  # the answers to the last units' statements
                if raw.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
                    # An error answered where no unit saw it: COMMIT would roll back without a word
                    # and every unit be told it committed.
                    raise _RunAgain
            finally:
                conn.pipeline = None
        return outcomes

    def _run_on_caller(self, unit: Callable[[PgConnection], T], *, writer_lock: bool, shared: bool) -> T | None:
        """A unit run on the calling thread in a transaction of its own: without the writer lock
        (`writer_lock=False`), or holding it (`shared`: as a scoped unit naming nothing, else
        exclusively) only if that can be had now (else None)."""
        pool = self._pool
        if pool is None:
            raise StorageError("the database is closed")
        for run in range(1, _MAX_RUNS + 1):
            try:
                with pool.connection(_POOL_WAIT_IN_OUTAGE if self._outage else _POOL_WAIT) as raw, \
                        raw.transaction():
                    if writer_lock and not raw.execute(
                            f"SELECT pg_try_advisory_xact_lock{'_shared' if shared else ''}(%s)",
                            (_WRITER_LOCK,)).fetchone()[0]:
                        return None
                    return unit(PgConnection(raw))
            except StorageUnavailable:
                self._begin_outage()
                raise
            except _RETRYABLE:
                if run == _MAX_RUNS:
                    raise StorageError(f"write failed: still conflicting after {run} runs") from None
                time.sleep(random.uniform(0, min(0.001 * 2 ** run, 0.05)))
            except PoolTimeout:
                self._begin_outage()
                raise StorageUnavailable("write failed: no connection to the database") from None
            except psycopg.OperationalError as exc:
                if unavailable(exc):
                    self._begin_outage()
                    raise lost(exc) from None
                raise StorageError(f"write failed: {reason(exc)}") from None
        raise AssertionError("unreachable")

    def _outage_met(self, group: list[_Unit], error: StorageUnavailable) -> NoReturn:
        self._begin_outage()
        _resolve([(item.done, None, error) for item in group])
        raise _Outage(error)

    def _begin_outage(self) -> None:
        self._outage = True

    def _end_outage(self, pool: ConnectionPool) -> None:
        self._outage = False
        # Connections pooled before the outage are dead, each would fail one group: replaced off
        # the writer thread (checking them is a round trip each).
        threading.Thread(target=self._replace_dead_connections, args=(pool,), daemon=True,
                         name="appliance-pool-check").start()

    @staticmethod
    def _replace_dead_connections(pool: ConnectionPool) -> None:
        with contextlib.suppress(Exception):  # a pool closing meanwhile, the database gone again
            pool.check()

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
