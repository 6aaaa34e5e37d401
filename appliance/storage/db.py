"""SQLite in WAL mode: one writer thread owns the only write connection and commits whatever is
queued in one transaction (group commit); reads use per-thread connections.

Measured on this machine class (DESIGN.md): group commit keeps `synchronous=FULL` affordable,
while one commit per request does not."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import apsw

from appliance.storage import migrations
from appliance.storage.change_signal import ChangeSignal, open_signal

log = logging.getLogger("appliance.storage")
T = TypeVar("T")
# A write unit: it may run more than once before its group commits (see Database._run_together),
# and only its last run's writes are kept, so it reads and writes through the connection only.
WriteFn = Callable[[apsw.Connection], T]

_MAX_BATCH = 512
# Under load, wait this long for more work before committing: a commit costs far more than a
# unit (measured here: ~300 us of CPU at FULL), so bigger groups mean more leads per second.
# Light load (the previous group held fewer than _BUSY_GROUP units) is committed at once.
# 2 ms, not 4: the same submits/s at saturation (bench.submit), while a delivery, which waits for
# two or three commits, reached its buyer in 11.5-12.4 ms instead of 17.6-19.2 ms at 1,000
# leads/s (bench.delivery, p50).
_LINGER_SECONDS = 0.002
_BUSY_GROUP = 4
_STOP = object()


class StorageError(Exception):
    """The database could not be opened or written; the message carries no row data."""


def _configure(conn: apsw.Connection, synchronous: str) -> None:
    conn.setbusytimeout(10_000)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA temp_store=MEMORY")
    conn.execute("PRAGMA cache_size=-32000")


class Database:
    def __init__(self, path: Path, *, synchronous: str = "FULL") -> None:
        self.path = Path(path)
        self.synchronous = synchronous.upper()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._local = threading.local()
        self._readers: list[apsw.Connection] = []
        self._readers_lock = threading.Lock()
        self._writer: threading.Thread | None = None
        self._write_conn: apsw.Connection | None = None
        self.changes: ChangeSignal | None = None

    # ---- life cycle -------------------------------------------------------------------------

    def open(self) -> "Database":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = apsw.Connection(str(self.path))
            _configure(conn, self.synchronous)
            migrations.apply(conn)
        except apsw.Error as exc:
            raise StorageError(f"cannot open database {self.path}: {exc}") from None
        self._write_conn = conn
        self.changes = open_signal(self.path)
        self._writer = threading.Thread(target=self._write_loop, name="appliance-writer", daemon=True)
        self._writer.start()
        return self

    def close(self) -> None:
        if self._writer is not None:
            self._queue.put(_STOP)
            self._writer.join()
            self._writer = None
        if self._write_conn is not None:
            self._write_conn.execute("PRAGMA optimize")
            self._write_conn.close()
            self._write_conn = None
        with self._readers_lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()
        self._local = threading.local()
        if self.changes is not None:
            self.changes.close()
            self.changes = None

    def announce_admin_change(self) -> None:
        """Tell every process using this database that keys or tenant configuration changed
        (call after the change is committed; see storage/change_signal.py)."""
        if self.changes is not None:
            self.changes.bump()
        else:
            log.warning("could not signal the change to running servers (%s-changes is not writable): "
                        "they see it within a second", self.path.name)

    def __enter__(self) -> "Database":
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- writes -----------------------------------------------------------------------------

    async def write(self, fn: WriteFn[T], *, may_refuse: bool = False) -> T:
        """Run `fn(conn)` inside the next group transaction; returns once it is committed.

        `may_refuse`: fn raises for ordinary reasons (not found, a conflict, a bad value), so it
        runs under a savepoint of its own and its refusal leaves the rest of the group as it is.
        Without it, a unit that raises sends its whole group round again (see `_run_together`)."""
        future = asyncio.get_running_loop().create_future()
        self._queue.put((fn, future, may_refuse))
        return await future

    def write_sync(self, fn: WriteFn[T], *, may_refuse: bool = False) -> T:
        """The same for threads without an event loop (CLI, tests, job helpers)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((fn, future, may_refuse))
        return future.result()

    def _write_loop(self) -> None:
        conn = self._write_conn
        assert conn is not None
        stopping = False
        busy = False
        while not stopping:
            item = self._queue.get()
            if item is _STOP:
                break
            batch = [item]
            deadline = time.monotonic() + _LINGER_SECONDS if busy else 0.0
            while len(batch) < _MAX_BATCH:
                try:
                    wait = deadline - time.monotonic()
                    item = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stopping = True
                    break
                batch.append(item)
            busy = len(batch) >= _BUSY_GROUP
            self._commit_batch(conn, batch)

    @classmethod
    def _commit_batch(cls, conn: apsw.Connection, batch: list) -> None:
        while batch:  # a loop, not recursion: a group rolled back by the database may go round many times
            try:
                batch = [] if cls._run_together(conn, batch) else cls._run_batch(conn, batch)
            except BaseException as exc:  # a bug here must fail this group, never kill the writer thread
                if not conn.getautocommit():
                    conn.execute("ROLLBACK")
                _resolve([(done, None, StorageError(f"write failed: {type(exc).__name__}")) for _, done, _ in batch])
                return

    @staticmethod
    def _run_together(conn: apsw.Connection, batch: list) -> bool:
        """The usual case: every unit succeeds, so the group runs without a savepoint per unit (a
        savepoint copies every page its unit changes: about a third of a submit's write cost);
        only units that may refuse get one. When another unit raises (or the commit fails),
        nothing of the group is kept and False sends it to `_run_batch`, which runs it again unit
        by unit; that second run is why a unit must not act outside `conn`. True: every caller
        has its answer."""
        try:
            conn.execute("BEGIN IMMEDIATE")
        except apsw.Error as exc:
            _resolve([(done, None, StorageError(f"cannot start a write transaction: {exc}")) for _, done, _ in batch])
            return True
        outcomes: list[tuple[Any, Any, BaseException | None]] = []
        for fn, done, may_refuse in batch:
            if may_refuse:
                conn.execute("SAVEPOINT unit")
            try:
                outcomes.append((done, fn(conn), None))
            except BaseException as exc:
                if not may_refuse or conn.getautocommit():
                    break
                conn.execute("ROLLBACK TO unit")
                outcomes.append((done, None, exc))
            if conn.getautocommit():  # the database rolled back by itself: nothing of the group is left
                break
            if may_refuse:
                conn.execute("RELEASE unit")
        else:
            try:
                conn.execute("COMMIT")
            except apsw.Error:
                pass  # the group goes round again unit by unit, which reports the failure if it recurs
            else:
                _resolve(outcomes)
                return True
        if not conn.getautocommit():
            conn.execute("ROLLBACK")
        return False

    @staticmethod
    def _run_batch(conn: apsw.Connection, batch: list) -> list:
        """The group unit by unit, each under a savepoint. Returns the units still to run: those
        after one during which the database rolled the whole transaction back."""
        outcomes: list[tuple[Any, Any, BaseException | None]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
        except apsw.Error as exc:
            _resolve([(done, None, StorageError(f"cannot start a write transaction: {exc}")) for _, done, _ in batch])
            return []
        for position, (fn, done, _) in enumerate(batch):
            # A savepoint per unit: one failing request rolls back alone, the rest still commit.
            conn.execute("SAVEPOINT unit")
            try:
                result = fn(conn)
            except BaseException as exc:  # handed to the caller; the writer thread must live on
                if conn.getautocommit():
                    # SQLite already rolled the whole transaction back (disk full, I/O error):
                    # the units before this one are gone too; the ones after get a new group.
                    lost = StorageError("the write transaction was rolled back by the database")
                    _resolve([(d, None, lost) for d, _, _ in outcomes] + [(done, None, exc)])
                    return batch[position + 1:]
                conn.execute("ROLLBACK TO unit")
                conn.execute("RELEASE unit")
                outcomes.append((done, None, exc))
            else:
                conn.execute("RELEASE unit")
                outcomes.append((done, result, None))
        try:
            conn.execute("COMMIT")
        except apsw.Error as exc:
            if not conn.getautocommit():
                conn.execute("ROLLBACK")
            failure = StorageError(f"commit failed: {exc}")
            outcomes = [(done, None, error or failure) for done, _, error in outcomes]
        _resolve(outcomes)
        return []

    # ---- reads ------------------------------------------------------------------------------

    def reader(self) -> apsw.Connection:
        """This thread's read connection (WAL: readers never block the writer)."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = apsw.Connection(str(self.path), flags=apsw.SQLITE_OPEN_READONLY)
            conn.setbusytimeout(10_000)
            conn.execute("PRAGMA cache_size=-16000")
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def rows(self, sql: str, params: tuple | dict = ()) -> list[tuple]:
        return self.reader().execute(sql, params).fetchall()

    def row(self, sql: str, params: tuple | dict = ()) -> tuple | None:
        for found in self.reader().execute(sql, params):
            return found
        return None

    async def read_off_loop(self, fn: Callable[[apsw.Connection], T]) -> T:
        """Run a longer read (lists, searches) on a worker thread with its own connection."""
        return await asyncio.to_thread(lambda: fn(self.reader()))

    def backup_to(self, dest: Path) -> None:
        """SQLite online backup: a consistent copy while the service keeps writing. One step copies
        every page inside one read transaction, so concurrent commits cannot restart it."""
        target = apsw.Connection(str(dest))
        try:
            with target.backup("main", self.reader(), "main") as backup:
                backup.step(-1)
        finally:
            target.close()


def _resolve(outcomes: list[tuple[Any, Any, BaseException | None]]) -> None:
    """Hand results back: one wake-up per event loop for the whole batch (each wake-up is a
    system call and a GIL hand-over), plain futures for threads without a loop. A future that
    already has its answer (a group that failed after some were given) keeps it."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for future, result, error in outcomes:
        if isinstance(future, asyncio.Future):
            by_loop.setdefault(future.get_loop(), []).append((future, result, error))
        elif future.done():
            continue
        elif error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    for loop, settled in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle_all, settled)
        except RuntimeError:
            if not loop.is_closed():
                raise
            # that loop has closed: nobody waits for these results any more


def _settle_all(settled: list[tuple[asyncio.Future, Any, BaseException | None]]) -> None:
    for future, result, error in settled:
        if future.done():  # cancelled by its caller, or answered before its group failed
            continue
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
