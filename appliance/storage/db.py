"""SQLite in WAL mode with one write connection and group commit; reads use per-thread
connections.

- Coroutines' write units run on their event loop's thread, all units of one loop turn (plus
  those queued while the previous group was committing) in one transaction; the writer thread
  then COMMITs it, so the fsync never stalls the loop. A connection whose COMMIT does not fsync
  (WAL with synchronous=NORMAL, the delivery process's) commits on the loop itself, except when
  the WAL is due a checkpoint, which fsyncs: that group, and the checkpoint, go to the writer thread.
- Threads' units (CLI, tests) and any group the loop could not run (a unit that raised, another
  process holding the write lock) go to the writer thread, which runs and commits them.

Measured on this machine class (bench/HISTORY.md): group commit keeps `synchronous=FULL` affordable,
while one commit per request does not. Units ran on the writer thread until the submit benchmark
showed the two threads trading the GIL at every statement (bench/HISTORY.md)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import queue
import shutil
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import apsw

from appliance.private_paths import private_file
from appliance.storage.migrations import apply as apply_migrations
from appliance.storage.secrets import Secrets
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
_BUSY_TIMEOUT_MS = 10_000
_LOOP_LOCK_PATIENCE_SECONDS = 0.002
_OWNER_POLL_SECONDS = 0.0005  # how long the writer thread waits for another process's write lock
_SWITCH_INTERVAL_SECONDS = 0.0005
_CHECKPOINT_PAGES = 1000  # SQLite's own automatic checkpoint size (wal_autocheckpoint)
_STOP = object()


class StorageError(Exception):
    """The database could not be opened or written; the message carries no row data."""


class UnstorableText(StorageError):
    """A value the database cannot hold or compare: PostgreSQL's text has no NUL character. The
    request is refused as invalid (JSON bodies are checked before, naming the field)."""


class StorageUnavailable(StorageError):
    """The database cannot answer now (unreachable, its disk full) but may later: the request is
    refused whole (nothing committed), and asking again later is the remedy. `reason` is a short
    phrase fit for an API client (no URL, host or path)."""

    def __init__(self, message: str, reason: str = "the database is not reachable") -> None:
        super().__init__(message)
        self.reason = reason


def _waiting_for_other_writers(patience: float) -> Callable[[int], bool]:
    """A busy handler: wait up to `patience` seconds for another process's write lock (the delivery
    process's, see appliance/processes.py), trying again every 0.1 ms at first. SQLite's own busy timeout sleeps 1, 2, 5,
    10... ms between tries: that sleep, not the other process's write (well under a millisecond),
    was what a waiting writer lost; measured with delivery in a process of its own (bench.product),
    submit-to-delivered p99 41-69 ms against 827 ms."""
    started = 0.0

    def busy(tries: int) -> bool:
        nonlocal started
        now = time.monotonic()
        if tries == 0:
            started = now
        elif now - started > patience:
            return False  # SQLITE_BUSY, as the busy timeout gives
        # A commit takes well under a millisecond; a lock held longer (a backup, a large import)
        # is waited for in 1 ms sleeps, not thousands of wake-ups competing for the GIL.
        time.sleep(0.0001 if now - started < 0.005 else 0.001)
        return True

    return busy


def hand_over_the_gil_quickly() -> None:
    """For a serving process: its writer thread needs the GIL twice a group (to take the group
    over, and after its COMMIT) while the event loop runs Python without pause under load. At the
    default 5 ms switch interval it waited 5 ms each time, the first time holding SQLite's write
    lock, which the other process then waited for too. At 0.5 ms: 0.6 ms (a loop thread busy in
    Python against a writer thread committing, p50; bench/HISTORY.md)."""
    sys.setswitchinterval(min(sys.getswitchinterval(), _SWITCH_INTERVAL_SECONDS))


def _commits_without_sync(conn: apsw.Connection) -> bool:
    """WAL with synchronous=NORMAL (or OFF): a COMMIT writes the WAL and does not fsync it. As the
    connection reports it: a file system without WAL support keeps a rollback journal, whose
    COMMIT fsyncs at NORMAL too."""
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    level = conn.execute("PRAGMA synchronous").fetchone()[0]
    return str(mode).lower() == "wal" and int(level) <= 1


def _configure(conn: apsw.Connection, synchronous: str) -> None:
    conn.setbusyhandler(_waiting_for_other_writers(_BUSY_TIMEOUT_MS / 1000))
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA temp_store=MEMORY")
    conn.execute("PRAGMA cache_size=-32000")


class Database:
    def __init__(self, path: Path, *, synchronous: str = "FULL") -> None:
        self.path = Path(path)
        self.synchronous = synchronous.upper()
        # Whether a COMMIT waits for the disk (set at open: see _commits_without_sync).
        self._commit_syncs = True
        self._checkpoint_due = False
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._local = threading.local()
        self._readers: list[apsw.Connection] = []
        self._readers_lock = threading.Lock()
        self._writer: threading.Thread | None = None
        self._write_conn: apsw.Connection | None = None
        # Whoever runs SQL on the write connection holds this: the writer thread for its own
        # groups, or an event loop for a group it runs itself until the writer has committed it.
        self._write_owner = threading.Lock()
        self._loop_waiting: _LoopWrites | None = None  # a loop whose units wait for `_write_owner`
        # Made once: a write connection switches between them for every group.
        self._patient = _waiting_for_other_writers(_BUSY_TIMEOUT_MS / 1000)
        self._brief = _waiting_for_other_writers(_LOOP_LOCK_PATIENCE_SECONDS)
        self._loop_writes: _LoopWrites | None = None
        self._closed = False
        self.changes: ChangeSignal | None = None

    # ---- life cycle -------------------------------------------------------------------------

    def open(self) -> "Database":
        self._closed = False
        try:
            private_file(self.path)
        except OSError as exc:
            raise StorageError(f"cannot create database {self.path}: {exc.strerror}") from None
        try:
            conn = apsw.Connection(str(self.path))
            _configure(conn, self.synchronous)
            apply_migrations(conn)
        except apsw.Error as exc:
            raise StorageError(f"cannot open database {self.path}: {exc}") from None
        self._write_conn = conn
        self._commit_syncs = not _commits_without_sync(conn)
        if not self._commit_syncs:
            # SQLite checkpoints the WAL on the connection whose COMMIT made it large, and a
            # checkpoint fsyncs: noted here instead, and run on the writer thread.
            conn.setwalhook(self._note_wal_size)
        self.changes = open_signal(self.path)
        self._writer = threading.Thread(target=self._write_loop, name="appliance-writer", daemon=True)
        self._writer.start()
        return self

    def close(self) -> None:
        if self._writer is not None:
            # A loop's group in flight is committed first: the writer releases the connection
            # once it has; later units (on a loop or a thread) hear that the database is closed.
            with self._write_owner:
                self._closed = True
            self._call_back_waiting_loop()  # its units hear that the database is closed
            self._queue.put(_STOP)
            self._writer.join()
            self._writer = None
        if self._write_conn is not None:
            self._write_conn.setbusyhandler(self._patient)
            try:
                self._write_conn.execute("PRAGMA optimize")
            except apsw.Error:  # a help for the next start, not a write of ours: a full disk or a
                pass            # busy file must not keep the connection open or fail the close
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

    @property
    def write_connection(self) -> apsw.Connection:
        """The one write connection (open): units get it through their group's transaction."""
        assert self._write_conn is not None, "the database is not open"
        return self._write_conn

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
        if self._closed:
            raise StorageError("the database is closed")
        loop = asyncio.get_running_loop()
        pending = self._loop_writes
        if pending is None or pending.loop is not loop:
            if pending is not None and (pending.units or pending.committing) and not pending.loop.is_closed():
                # Another loop's group is under way (tests run one loop after another): this
                # unit takes the writer thread's path.
                return await self.write_off_loop(fn, may_refuse=may_refuse)
            pending = self._loop_writes = _LoopWrites(loop)
        future = loop.create_future()
        pending.units.append((fn, future, may_refuse))
        if not pending.scheduled and not pending.committing:
            pending.scheduled = True
            loop.call_soon(self._run_on_loop, pending)
        return await future

    async def write_off_loop(self, fn: WriteFn[T], *, may_refuse: bool = False) -> T:
        """`write` for a long unit (the activity log's batch of a second): it runs on the writer
        thread, so the event loop goes on answering requests meanwhile."""
        if self._closed:
            raise StorageError("the database is closed")
        future = asyncio.get_running_loop().create_future()
        self._queue.put((fn, future, may_refuse))
        return await future

    def write_sync(self, fn: WriteFn[T], *, may_refuse: bool = False) -> T:
        """The same for threads without an event loop (CLI, tests, job helpers)."""
        if self._closed:
            raise StorageError("the database is closed")
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
            if type(item) is _LoopGroup:
                self._commit_loop_group(conn, item)
                continue
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
                if type(item) is _LoopGroup:  # its loop holds the connection until it is committed
                    self._commit_loop_group(conn, item)
                    continue
                batch.append(item)
            busy = len(batch) >= _BUSY_GROUP
            # A loop may have taken the connection meanwhile; only this thread can commit its
            # group and so free the connection, hence no blocking wait for it here.
            while not self._write_owner.acquire(timeout=_OWNER_POLL_SECONDS):
                stopping = self._take_queued(conn, batch) or stopping
            try:
                conn.setbusyhandler(self._patient)
                self._commit_batch(conn, batch)
                self._checkpoint_if_due(conn)
            finally:
                self._write_owner.release()
                self._call_back_waiting_loop()
        # Queued after the stop (close() was called meanwhile): nothing runs them any more.
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if type(item) is _LoopGroup:
                self._commit_loop_group(conn, item)
            elif item is not _STOP:
                _resolve([(item[1], None, StorageError("the database is closed"))])

    def _take_queued(self, conn: apsw.Connection, batch: list) -> bool:
        """Commit the loop groups queued now and add the other units to `batch`; True if the
        stop was among them."""
        stopping = False
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return stopping
            if item is _STOP:
                stopping = True
            elif type(item) is _LoopGroup:
                self._commit_loop_group(conn, item)
            else:
                batch.append(item)

    # ---- groups run on the event loop ------------------------------------------------------
    # Units queued by coroutines run on their event loop's thread, and only the COMMIT (the WAL
    # write and its fsync) on the writer thread, or on the loop when it does not fsync. Running
    # them on the writer thread made the two threads trade the GIL at every SQL statement on one
    # busy core (bench/HISTORY.md).

    def _run_on_loop(self, pending: _LoopWrites) -> None:
        pending.scheduled = False
        if pending.committing or not pending.units:
            return
        batch, pending.units = pending.units, []
        conn = self._write_conn
        if not self._write_owner.acquire(blocking=False):
            # The writer thread holds the connection (a thread's units, or a group that met
            # another process's lock). These units wait for it on the loop, and the writer thread
            # calls back when it lets go: joining its batches instead kept every later group off
            # the loop while the delivery process wrote (a third of the server's time in units
            # run on the writer thread, trading the GIL; bench.product under py-spy).
            pending.units[:0] = batch
            self._loop_waiting = pending
            if not self._write_owner.acquire(blocking=False):
                return
            self._loop_waiting = None  # it let go meanwhile
            batch, pending.units = pending.units, []
        if self._closed or conn is None:
            self._write_owner.release()
            _settle_all([(done, None, StorageError("the database is closed")) for _, done, _ in batch])
            return
        outcomes = None
        committed = False
        try:
            # Another process's write lock is waited for on the loop only as long as one of its
            # commits takes; longer, and the writer thread waits. Handing every group that met the
            # delivery process's lock to the writer thread put 20-40 % of the groups there
            # (bench.product), where units run off the loop; with this wait, 5-10 %.
            conn.setbusyhandler(self._brief)
            outcomes = self._run_units(conn, batch)
            if outcomes is not None and not self._commit_syncs and not self._checkpoint_due:
                # No fsync at this COMMIT, only the WAL write: done here, the write lock is not
                # held while the writer thread waits for the GIL to take the group over.
                conn.execute("COMMIT")
                committed = True
        except BaseException:  # noqa: BLE001 - the writer thread runs the group again and reports
            try:
                if not conn.getautocommit():
                    conn.execute("ROLLBACK")
            except apsw.Error:
                pass  # the writer thread's run reports the state of the connection
            outcomes = None
        finally:
            if outcomes is None:  # the writer thread runs the group again, and reports the failure if it recurs
                self._write_owner.release()
                for item in batch:
                    self._queue.put(item)
        if committed:
            self._write_owner.release()
            self._call_back_waiting_loop()  # another loop's (tests run one loop after another)
            self._loop_group_done(pending, outcomes)
        elif outcomes is not None:
            pending.committing = True
            self._queue.put(_LoopGroup(pending, batch, outcomes))

    @staticmethod
    def _run_units(conn: apsw.Connection, batch: list) -> list | None:
        """Every unit in one open transaction, without committing; None when that could not be
        done (the transaction could not start, or a unit that may not refuse raised), with
        nothing kept. Units that may refuse run under a savepoint of their own."""
        try:
            conn.execute("BEGIN IMMEDIATE")
        except apsw.Error:
            return None
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
            return outcomes
        if not conn.getautocommit():
            conn.execute("ROLLBACK")
        return None

    def _commit_loop_group(self, conn: apsw.Connection, group: _LoopGroup) -> None:
        """On the writer thread: COMMIT what a loop ran (the loop holds `_write_owner` for it);
        when that fails, the group goes round again unit by unit, as `_commit_batch` does."""
        outcomes = group.outcomes
        try:
            conn.setbusyhandler(self._patient)  # the loop waited less for its BEGIN
            conn.execute("COMMIT")
            self._checkpoint_if_due(conn)
        except apsw.Error:
            outcomes = []  # the callers hear from _commit_batch, which reports the failure if it recurs
            try:
                if not conn.getautocommit():
                    conn.execute("ROLLBACK")
                self._commit_batch(conn, group.batch)
            except BaseException as exc:  # the writer thread must live on
                _resolve([(done, None, StorageError(f"write failed: {type(exc).__name__}"))
                          for _, done, _ in group.batch])
        finally:
            self._write_owner.release()
            self._call_back_waiting_loop()  # another loop's (tests run one loop after another)
        try:
            group.pending.loop.call_soon_threadsafe(self._loop_group_done, group.pending, outcomes)
        except RuntimeError:
            if not group.pending.loop.is_closed():
                raise
            group.pending.committing = False  # that loop has closed: nobody waits for these results

    def _note_wal_size(self, _conn: apsw.Connection, _name: str, pages: int) -> int:
        """SQLite's WAL hook, after each commit, in place of its automatic checkpoint."""
        if pages >= _CHECKPOINT_PAGES:
            self._checkpoint_due = True
        return apsw.SQLITE_OK

    def _checkpoint_if_due(self, conn: apsw.Connection) -> None:
        """On the writer thread, holding the connection: the checkpoint SQLite would have run."""
        if self._checkpoint_due:
            self._checkpoint_due = False
            try:
                conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
            except apsw.Error:
                pass  # as SQLite's own: the next commit past the size asks again

    def _call_back_waiting_loop(self) -> None:
        """After the writer thread let the connection go: the loop whose units wait for it runs them."""
        waiting, self._loop_waiting = self._loop_waiting, None
        if waiting is not None:
            with contextlib.suppress(RuntimeError):  # that loop has closed: nobody waits any more
                waiting.loop.call_soon_threadsafe(self._resume_on_loop, waiting)

    def _resume_on_loop(self, pending: _LoopWrites) -> None:
        if pending.units and not pending.scheduled and not pending.committing:
            self._run_on_loop(pending)

    def _loop_group_done(self, pending: _LoopWrites, outcomes: list) -> None:
        _settle_all(outcomes)
        pending.committing = False
        if pending.units and not pending.scheduled:
            pending.scheduled = True
            pending.loop.call_soon(self._run_on_loop, pending)

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

    @classmethod
    def _run_together(cls, conn: apsw.Connection, batch: list) -> bool:
        """The usual case: every unit succeeds, so the group runs without a savepoint per unit (a
        savepoint copies every page its unit changes: about a third of a submit's write cost);
        only units that may refuse get one. When another unit raises (or the transaction cannot
        start, or the commit fails), nothing of the group is kept and False sends it to
        `_run_batch`, which runs it again unit by unit; that second run is why a unit must not act
        outside `conn`. True: every caller has its answer."""
        outcomes = cls._run_units(conn, batch)
        if outcomes is None:
            return False
        try:
            conn.execute("COMMIT")
        except apsw.Error:
            if not conn.getautocommit():
                conn.execute("ROLLBACK")
            return False
        _resolve(outcomes)
        return True

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
                    lost = StorageUnavailable("the write transaction was rolled back by the database",
                                              reason="the database could not write")
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
            # A full disk (the WAL could not grow at COMMIT) stays what it is: the store answers
            # it as unavailable (503, try later), not as an internal error.
            failure = exc if isinstance(exc, apsw.FullError) else StorageError(f"commit failed: {exc}")
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

    def ping(self) -> None:
        """A trivial read: raises when the database does not answer."""
        self.row("SELECT 1")

    def health(self) -> tuple[str, int]:
        """(SQLite's integrity_check verdict, migrations applied)."""
        conn = self.reader()
        (verdict,) = conn.execute("PRAGMA integrity_check").fetchone()
        return verdict, conn.execute("SELECT count(*) FROM migrations").fetchone()[0]

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
        try:
            private_file(dest)
        except OSError as exc:
            raise StorageError(f"cannot write backup {dest}: {exc.strerror}") from None
        target = apsw.Connection(str(dest))
        try:
            with target.backup("main", self.reader(), "main") as backup:
                backup.step(-1)
        finally:
            target.close()


def optimize(conn: apsw.Connection) -> None:
    """Let SQLite refresh the statistics its query planner uses (cheap when nothing changed)."""
    conn.execute("PRAGMA optimize")


def inspect_backup(path: Path) -> str | None:
    """Check that `path` is a sound appliance database; answers the master key id its secrets
    were sealed with (None when it holds none). Raises StorageError saying what is wrong."""
    for suffix in ("-wal", "-shm"):
        if path.with_name(path.name + suffix).exists():
            # A file copy of a live database: its latest commits are in the WAL beside it, which
            # the check would read and the restore, copying the main file, would not carry.
            raise StorageError(f"{path} has a {suffix} file beside it (a copy of a running database): "
                               "restore a file made by `appliance backup`")
    try:
        # immutable: read as the file is, creating no -wal or -shm beside it
        conn = apsw.Connection(f"file:{urllib.parse.quote(str(path.resolve()))}?immutable=1",
                               flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    except apsw.Error as exc:
        raise StorageError(f"cannot open backup {path}: {exc}") from None
    try:
        (verdict,) = conn.execute("PRAGMA integrity_check").fetchone()
        if verdict != "ok":
            raise StorageError(f"backup {path} fails its integrity check: {verdict}")
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'migrations'").fetchone() is None:
            raise StorageError(f"{path} is a database, but not an appliance's")
        return Secrets(conn).key_id_in_use()
    except apsw.Error as exc:
        raise StorageError(f"backup {path} is not a readable database: {exc}") from None
    finally:
        conn.close()


def restore_database(backup: Path, database_file: Path, keep_as: Path) -> bool:
    """Put a copy of `backup` in place of `database_file` (no server may have it open). The
    database it replaces is kept as `keep_as`, whole (its WAL checkpointed into it first); the old
    WAL and shared-memory files are removed, so nothing of them is applied to the restored file.
    True when there was a database to keep."""
    staged = database_file.with_name(database_file.name + ".restoring")
    staged.unlink(missing_ok=True)
    try:
        private_file(staged)
        with open(backup, "rb") as source, open(staged, "r+b") as target:
            shutil.copyfileobj(source, target, 1024 * 1024)
            target.flush()
            os.fsync(target.fileno())
        kept = database_file.exists()
        wal = database_file.with_name(database_file.name + "-wal")
        if kept and not _checkpointed(database_file):
            # A damaged database (what a restore is often for) cannot be checkpointed: its WAL
            # is kept beside it as it is.
            if wal.exists():
                os.replace(wal, keep_as.with_name(keep_as.name + "-wal"))
        if kept:
            os.replace(database_file, keep_as)
        for suffix in ("-wal", "-shm"):
            database_file.with_name(database_file.name + suffix).unlink(missing_ok=True)
        os.replace(staged, database_file)
        folder = os.open(database_file.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    except (OSError, apsw.Error) as exc:
        staged.unlink(missing_ok=True)
        raise StorageError(f"restore failed: {exc}") from None
    return kept


def _checkpointed(database_file: Path) -> bool:
    """Whether everything in the database's WAL is now in the file itself."""
    try:
        conn = apsw.Connection(str(database_file))
        try:
            busy, _frames, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            return busy == 0
        finally:
            conn.close()
    except apsw.Error:
        return False


class _LoopWrites:
    """An event loop's units waiting for their group, and whether its last group is committing."""

    __slots__ = ("loop", "units", "scheduled", "committing")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.units: list = []
        self.scheduled = False
        self.committing = False


class _LoopGroup(NamedTuple):
    """Units a loop has run in an open transaction, for the writer thread to commit."""

    pending: _LoopWrites
    batch: list
    outcomes: list


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
