"""The database file: WAL, durability setting, migrations recorded and idempotent, group commit."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import closing
from pathlib import Path

import apsw
import pytest

from appliance.storage.db import Database, StorageError
from appliance.storage.migrations import MIGRATIONS, apply

# SQLite's engine (WAL, group commit, the file): PostgreSQL's is tested in test_storage_postgresql.py.
pytestmark = pytest.mark.sqlite_only


def test_database_runs_in_wal_with_full_sync(runtime, config):
    conn = apsw.Connection(str(config.database_file))
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    writer_sync = runtime.store.sqlite.write_sync(lambda c: c.execute("PRAGMA synchronous").fetchone()[0])
    assert writer_sync == 2  # FULL


def test_migrations_are_recorded_and_run_twice_changes_nothing(tmp_path):
    path = tmp_path / "m.db"
    Database(path).open().close()
    conn = apsw.Connection(str(path))
    names = [n for (n,) in conn.execute("SELECT name FROM migrations ORDER BY name")]
    assert names == sorted(name for name, _ in MIGRATIONS)
    schema_before = conn.execute("SELECT sql FROM sqlite_master ORDER BY name").fetchall()
    assert apply(conn) == []
    Database(path).open().close()
    assert conn.execute("SELECT sql FROM sqlite_master ORDER BY name").fetchall() == schema_before


def test_group_commit_isolates_a_failing_unit(tmp_path):
    with Database(tmp_path / "g.db") as db:
        db.write_sync(lambda c: c.execute("CREATE TABLE t (v INTEGER UNIQUE)"))
        results: list = []

        def insert(value):
            try:
                db.write_sync(lambda c: c.execute("INSERT INTO t VALUES (?)", (value,)))
                results.append(value)
            except apsw.ConstraintError:
                results.append("dup")

        threads = [threading.Thread(target=insert, args=(v % 50,)) for v in range(100)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(r for r in results if r != "dup") == list(range(50))
        assert results.count("dup") == 50
        assert db.rows("SELECT count(*) FROM t") == [(50,)]


def _as_one_group(db, calls):
    """Run each of `calls` (it writes through db) on a thread of its own, queued in this order
    while the writer is held, so that their units form one group."""
    release, held = threading.Event(), threading.Event()
    hold = threading.Thread(target=db.write_sync, args=(lambda c: (held.set(), release.wait(10)),))
    hold.start()
    held.wait(10)
    threads = []
    for position, call in enumerate(calls):
        threads.append(threading.Thread(target=call))
        threads[-1].start()
        while db._queue.qsize() <= position:
            threading.Event().wait(0.001)
    release.set()
    for t in (hold, *threads):
        t.join(10)


@pytest.mark.parametrize("may_refuse", [False, True])
def test_a_group_with_a_failing_unit_commits_each_other_unit_once(tmp_path, may_refuse):
    """One group (the writer is held until every unit is queued): the failing unit's writes are
    gone, every other unit's writes are there exactly once, and each caller gets its own answer.
    A unit that may refuse fails alone; any other failure sends the group round again."""
    with Database(tmp_path / "g.db") as db:
        db.write_sync(lambda c: c.execute("CREATE TABLE t (v INTEGER)"))
        runs: list[int] = []

        def failing(conn):
            conn.execute("INSERT INTO t VALUES (-1)")
            raise ValueError("refused")

        def inserting(value):
            def unit(conn):
                runs.append(value)
                conn.execute("INSERT INTO t VALUES (?)", (value,))
                return value
            return unit

        units = [inserting(0), failing, inserting(1), inserting(2)]
        answers: dict[int, object] = {}

        def call(position, unit):
            try:
                answers[position] = db.write_sync(unit, may_refuse=may_refuse and unit is failing)
            except ValueError as exc:
                answers[position] = str(exc)

        _as_one_group(db, [lambda p=p, u=u: call(p, u) for p, u in enumerate(units)])
        assert answers == {0: 0, 1: "refused", 2: 1, 3: 2}
        assert db.rows("SELECT v FROM t ORDER BY v") == [(0,), (1,), (2,)]
        assert sorted(runs) == ([0, 1, 2] if may_refuse else [0, 0, 1, 2])  # the first unit ran twice


def test_a_large_group_the_database_rolls_back_unit_after_unit_answers_every_caller(tmp_path):
    """A full disk rolls the transaction back inside each unit, so the group goes round again
    for every unit: each of 500 callers still gets its error, none waits forever, and the
    writer lives on."""
    with Database(tmp_path / "full.db") as db:
        db.write_sync(lambda c: c.execute("CREATE TABLE t (v BLOB)"))
        # Pages a migration freed would take the first inserts: a filler row uses them up.
        db.write_sync(lambda c: c.execute("CREATE TABLE filler (v BLOB)") and c.execute(
            "INSERT INTO filler VALUES (zeroblob(?))", (c.execute("PRAGMA freelist_count").fetchone()[0] * 4096,)))
        release, held = threading.Event(), threading.Event()

        def hold_then_fill_the_disk(conn):
            held.set()
            release.wait(10)
            conn.execute("PRAGMA max_page_count=1")  # no room: every insert below fails with SQLITE_FULL

        hold = threading.Thread(target=db.write_sync, args=(hold_then_fill_the_disk,))
        hold.start()
        held.wait(10)

        async def many(count):
            writes = [asyncio.ensure_future(db.write(lambda c: c.execute("INSERT INTO t VALUES (?)", (b"x" * 5000,))))
                      for _ in range(count)]
            # They wait on the loop for the connection the thread's unit holds, as one group.
            while db._loop_writes is None or len(db._loop_writes.units) < count:
                await asyncio.sleep(0.001)
            release.set()
            return await asyncio.wait_for(asyncio.gather(*writes, return_exceptions=True), 30)

        answers = asyncio.run(many(500))
        hold.join(10)
        assert len(answers) == 500 and all(isinstance(a, apsw.FullError) for a in answers)
        db.write_sync(lambda c: c.execute("PRAGMA max_page_count=1073741823"))
        db.write_sync(lambda c: c.execute("INSERT INTO t VALUES (1)"))
        assert db.rows("SELECT count(*) FROM t") == [(1,)]


def test_a_commit_that_fails_answers_every_unit_of_the_group(tmp_path):
    """A deferred foreign key left broken makes COMMIT fail: the group goes round unit by unit,
    the commit fails again, and every caller hears so; nothing of the group is kept."""
    with Database(tmp_path / "c.db") as db:
        db.write_sync(lambda c: c.execute(
            "CREATE TABLE p (id INTEGER PRIMARY KEY);"
            " CREATE TABLE k (p INTEGER REFERENCES p(id) DEFERRABLE INITIALLY DEFERRED)"))
        answers: list = []

        def call(unit):
            try:
                answers.append(db.write_sync(unit))
            except Exception as exc:  # noqa: BLE001 - the answer is what the test looks at
                answers.append(exc)

        units = [lambda c: c.execute("INSERT INTO p VALUES (1)"), lambda c: c.execute("INSERT INTO k VALUES (7)")]
        _as_one_group(db, [lambda u=u: call(u) for u in units])
        assert len(answers) == 2 and all("commit failed" in str(a) for a in answers)
        assert db.rows("SELECT count(*) FROM p") == [(0,)]


def test_unreadable_database_is_a_clear_error(tmp_path):
    bad = tmp_path / "not-a-db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StorageError, match="cannot open database"):
        Database(bad).open()


# ---- groups run on the event loop (the units of coroutines), committed by the writer thread when
# ---- the COMMIT fsyncs, by the loop when it does not

# FULL commits on the writer thread (its fsync off the loop), NORMAL on the loop: the loop's
# groups are tested both ways.
both_commits = pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])


def _table(tmp_path, name="loop.db", sql="CREATE TABLE t (v INTEGER)", synchronous="FULL"):
    db = Database(tmp_path / name, synchronous=synchronous).open()
    db.write_sync(lambda c: c.execute(sql))
    return db


def _inserting(value, runs, threads=None):
    def unit(conn):
        runs.append(value)
        if threads is not None:
            threads.append(threading.current_thread().name)
        conn.execute("INSERT INTO t VALUES (?)", (value,))
        return value
    return unit


def _failing(conn):
    conn.execute("INSERT INTO t VALUES (-1)")
    raise ValueError("refused")


@pytest.mark.parametrize("may_refuse", [False, True])
@both_commits
def test_a_loop_group_with_a_failing_unit_keeps_every_other_unit_once(tmp_path, synchronous, may_refuse):
    """Writes awaited together on one loop form one group run on the loop. A unit that may refuse
    fails alone; any other failure sends the group to the writer thread, unit by unit."""
    with closing(_table(tmp_path, synchronous=synchronous)) as db:
        runs: list[int] = []
        threads: list[str] = []
        units = [_inserting(0, runs, threads), _failing, _inserting(1, runs, threads), _inserting(2, runs, threads)]

        async def together():
            return await asyncio.gather(*(db.write(u, may_refuse=may_refuse and u is _failing) for u in units),
                                        return_exceptions=True)

        answers = asyncio.run(together())
        assert answers[0] == 0 and answers[2:] == [1, 2]
        assert isinstance(answers[1], ValueError) and str(answers[1]) == "refused"
        assert db.rows("SELECT v FROM t ORDER BY v") == [(0,), (1,), (2,)]
        if may_refuse:  # one group, run on the loop's own thread
            assert sorted(runs) == [0, 1, 2] and set(threads) == {threading.current_thread().name}
        else:  # the units before the failing one ran more than once, the later runs on the writer thread
            assert set(runs) == {0, 1, 2} and runs.count(0) > 1 and "appliance-writer" in threads


@both_commits
def test_a_loop_group_is_committed_off_the_loop_only_when_its_commit_syncs(tmp_path, synchronous):
    """FULL fsyncs at COMMIT: the writer thread commits while the loop runs on. NORMAL only
    writes the WAL: the loop commits its group itself."""
    with closing(_table(tmp_path, synchronous=synchronous)) as db:
        committed_on: list[str] = []
        db.write_connection.setcommithook(lambda: committed_on.append(threading.current_thread().name) or False)
        assert asyncio.run(db.write(lambda c: c.execute("INSERT INTO t VALUES (1)") and 1)) == 1
        assert committed_on == ["appliance-writer" if synchronous == "FULL" else threading.current_thread().name]
        assert db.rows("SELECT v FROM t") == [(1,)]


class _SyncRecordingVFS(apsw.VFS):
    """The default VFS while registered: records the thread of every fsync."""

    def __init__(self, synced_on: list[tuple[str, str]]) -> None:
        self.synced_on = synced_on
        self.base = apsw.vfs_names()[0]
        super().__init__("record-syncs", self.base, makedefault=True)

    def xOpen(self, name, flags):
        return _SyncRecordingFile(self.synced_on, self.base, name, flags)


class _SyncRecordingFile(apsw.VFSFile):
    def __init__(self, synced_on: list[tuple[str, str]], base: str, name, flags) -> None:
        self.synced_on = synced_on
        super().__init__(base, name, flags)

        self.file = name.filename() if hasattr(name, "filename") else str(name)

    def xSync(self, flags):
        self.synced_on.append((threading.current_thread().name, Path(self.file).name))
        return super().xSync(flags)


def test_a_loop_committing_without_fsync_leaves_the_wal_checkpoints_to_the_writer_thread(tmp_path):
    """NORMAL: a checkpoint fsyncs the WAL and the database file, and SQLite would run it on the
    connection whose COMMIT made the WAL large, the loop's. It runs on the writer thread; the
    loop's commits sync nothing but a restarted WAL's header (SQLite's own, once a WAL: how many
    WALs the 5 MB fill depends on the schema's size)."""
    synced_on: list[tuple[str, str]] = []
    vfs = _SyncRecordingVFS(synced_on)
    try:
        db = _table(tmp_path, sql="CREATE TABLE t (v BLOB)", synchronous="NORMAL")
        synced_on.clear()

        async def writes():  # about 5 MB: past SQLite's checkpoint size of 1,000 pages
            for _ in range(300):
                await db.write(lambda c: c.execute("INSERT INTO t VALUES (randomblob(16000))"))

        asyncio.run(writes())
        during = list(synced_on)
        assert db.write_sync(lambda c: c.execute("SELECT count(*) FROM t").fetchone()) == (300,)
        db.close()
    finally:
        vfs.unregister()
    on_loop = [file for thread, file in during if thread != "appliance-writer"]
    checkpoints = during.count(("appliance-writer", "loop.db"))
    assert checkpoints, during  # the checkpoint ran
    # The loop syncs at most the header of each WAL restarted after a checkpoint, never the file.
    assert set(on_loop) <= {"loop.db-wal"} and len(on_loop) <= checkpoints, during


@both_commits
def test_a_loop_group_whose_commit_fails_answers_every_unit(tmp_path, synchronous):
    sql = ("CREATE TABLE p (id INTEGER PRIMARY KEY);"
           " CREATE TABLE k (p INTEGER REFERENCES p(id) DEFERRABLE INITIALLY DEFERRED)")
    with closing(_table(tmp_path, sql=sql, synchronous=synchronous)) as db:
        async def together():
            return await asyncio.gather(db.write(lambda c: c.execute("INSERT INTO p VALUES (1)")),
                                        db.write(lambda c: c.execute("INSERT INTO k VALUES (7)")),
                                        return_exceptions=True)

        answers = asyncio.run(together())
        assert all("commit failed" in str(a) for a in answers)
        assert db.rows("SELECT count(*) FROM p") == [(0,)]
        assert db.write_sync(lambda c: c.execute("INSERT INTO p VALUES (2)") and 2) == 2  # the writer lives on


@both_commits
def test_loop_writes_wait_for_a_thread_that_holds_the_connection(tmp_path, synchronous):
    """A thread's write holds the write connection: the loop's units go to the writer thread
    and are committed after it, each once."""
    with closing(_table(tmp_path, synchronous=synchronous)) as db:
        release, held = threading.Event(), threading.Event()
        hold = threading.Thread(target=db.write_sync, args=(lambda c: (held.set(), release.wait(10)),))
        hold.start()
        held.wait(10)
        runs: list[int] = []

        async def while_held():
            writes = [asyncio.ensure_future(db.write(_inserting(v, runs))) for v in range(5)]
            await asyncio.sleep(0.05)
            assert not any(w.done() for w in writes)
            release.set()
            return await asyncio.wait_for(asyncio.gather(*writes), 10)

        assert asyncio.run(while_held()) == [0, 1, 2, 3, 4]
        hold.join(10)
        assert sorted(runs) == [0, 1, 2, 3, 4]
        assert db.rows("SELECT count(*) FROM t") == [(5,)]


def test_a_long_unit_written_off_the_loop_leaves_the_loop_running(tmp_path):
    """write_off_loop runs its unit on the writer thread: the loop ticks, and its own writes
    commit after the long unit, each once."""
    with closing(_table(tmp_path)) as db:
        threads: list[str] = []
        runs: list[int] = []

        def long_unit(conn):
            threads.append(threading.current_thread().name)
            conn.execute("INSERT INTO t VALUES (100)")
            time.sleep(0.3)
            return "long"

        async def meanwhile():
            long = asyncio.ensure_future(db.write_off_loop(long_unit))
            while not threads:
                await asyncio.sleep(0.001)
            # The window opens once the long unit runs: a writer thread slow to take it up must not shorten it.
            ticks, started = 0, asyncio.get_running_loop().time()
            short = [asyncio.ensure_future(db.write(_inserting(v, runs))) for v in range(3)]
            while asyncio.get_running_loop().time() - started < 0.2:
                await asyncio.sleep(0.01)
                ticks += 1
            return ticks, await asyncio.wait_for(long, 10), await asyncio.wait_for(asyncio.gather(*short), 10)

        ticks, long_answer, short_answers = asyncio.run(meanwhile())
        assert threads == ["appliance-writer"] and long_answer == "long" and short_answers == [0, 1, 2]
        assert ticks >= 8 and sorted(runs) == [0, 1, 2]  # a blocked loop would have ticked once or twice
        assert db.rows("SELECT v FROM t ORDER BY v") == [(0,), (1,), (2,), (100,)]


@both_commits
def test_another_process_holding_the_write_lock_never_blocks_the_event_loop(tmp_path, synchronous):
    """Another connection (another process: the CLI) holds the database's write lock: the loop
    keeps running, and the write lands once the lock is free."""
    with closing(_table(tmp_path, synchronous=synchronous)) as db:
        other = apsw.Connection(str(tmp_path / "loop.db"))
        other.execute("BEGIN IMMEDIATE")

        async def while_locked():
            write = asyncio.ensure_future(db.write(lambda c: c.execute("INSERT INTO t VALUES (1)") and 1))
            ticks, started = 0, asyncio.get_running_loop().time()
            while asyncio.get_running_loop().time() - started < 0.3:
                await asyncio.sleep(0.01)
                ticks += 1
            assert not write.done()
            other.execute("COMMIT")
            return ticks, await asyncio.wait_for(write, 10)

        ticks, answer = asyncio.run(while_locked())
        assert ticks >= 10 and answer == 1  # a blocked loop would have ticked once or twice
        assert db.rows("SELECT count(*) FROM t") == [(1,)]
        other.close()


def test_a_write_after_close_is_a_storage_error(tmp_path):
    db = _table(tmp_path)
    db.close()
    with pytest.raises(StorageError, match="closed"):
        asyncio.run(db.write(lambda c: c.execute("INSERT INTO t VALUES (1)")))


def test_units_queued_while_a_loop_group_commits_form_the_next_group(tmp_path):
    with closing(_table(tmp_path)) as db:
        seen: list[int] = []

        def count_then_insert(conn):
            seen.append(conn.execute("SELECT count(*) FROM t").fetchone()[0])
            conn.execute("INSERT INTO t VALUES (2)")
            return threading.current_thread().name

        async def two_groups():
            first = asyncio.ensure_future(db.write(lambda c: c.execute("INSERT INTO t VALUES (1)") and 1))
            await asyncio.sleep(0)  # the first write is queued: its group runs next
            await asyncio.sleep(0)  # ... and has been handed to the writer thread to commit
            second = await db.write(count_then_insert)
            return await first, second

        first, ran_on = asyncio.run(two_groups())
        assert first == 1 and ran_on == threading.current_thread().name
        assert seen == [1]  # the second group started after the first was committed
        assert db.rows("SELECT v FROM t ORDER BY v") == [(1,), (2,)]


@both_commits
def test_thread_writes_and_loop_writes_at_the_same_time_all_complete(tmp_path, synchronous):
    """Threads' writes (CLI, tests) and a loop's groups share the one connection; neither waits
    for the other forever."""
    with closing(_table(tmp_path, synchronous=synchronous)) as db:
        stop = threading.Event()
        counts = [0] * 3

        def thread_writes(slot):
            while not stop.is_set():
                db.write_sync(lambda c: c.execute("INSERT INTO t VALUES (0)"))
                counts[slot] += 1

        threads = [threading.Thread(target=thread_writes, args=(slot,)) for slot in range(3)]
        for t in threads:
            t.start()

        async def loop_writes():
            groups, started = 0, time.monotonic()
            while time.monotonic() - started < 1.5:
                await asyncio.wait_for(asyncio.gather(
                    *(db.write(lambda c: c.execute("INSERT INTO t VALUES (1)")) for _ in range(3))), 10)
                groups += 1
            return groups

        try:
            groups = asyncio.run(loop_writes())
        finally:
            stop.set()
            for t in threads:
                t.join(10)
        assert groups > 10 and all(counts) and not any(t.is_alive() for t in threads)
        assert db.rows("SELECT count(*) FROM t WHERE v = 1") == [(3 * groups,)]
        assert db.rows("SELECT count(*) FROM t WHERE v = 0") == [(sum(counts),)]


@both_commits
def test_close_from_another_thread_lets_the_running_loop_group_commit(tmp_path, synchronous):
    """close() while a loop is running a group (a test thread closing the app's database): that
    group is committed and answered, and writes after close are refused, never left waiting."""
    db = _table(tmp_path, synchronous=synchronous)
    running, closed, answers = threading.Event(), threading.Event(), {}

    def slow(conn):
        conn.execute("INSERT INTO t VALUES (1)")
        running.set()
        time.sleep(0.3)  # close() is called meanwhile
        conn.execute("INSERT INTO t VALUES (2)")
        return "committed"

    async def writes():
        answers["first"] = await asyncio.wait_for(db.write(slow), 10)
        await asyncio.to_thread(closed.wait, 10)
        try:
            await asyncio.wait_for(db.write(lambda c: c.execute("INSERT INTO t VALUES (3)")), 10)
        except Exception as exc:  # noqa: BLE001 - the answer is what the test looks at
            answers["after"] = exc

    loop_thread = threading.Thread(target=asyncio.run, args=(writes(),))
    loop_thread.start()
    assert running.wait(10)
    db.close()
    closed.set()
    loop_thread.join(10)
    assert answers["first"] == "committed"
    assert isinstance(answers["after"], StorageError) and "closed" in str(answers["after"])
    conn = apsw.Connection(str(tmp_path / "loop.db"))
    assert conn.execute("SELECT v FROM t ORDER BY v").fetchall() == [(1,), (2,)]


def test_a_loop_that_closes_while_its_group_commits_leaves_later_loops_their_own_path(tmp_path):
    with closing(_table(tmp_path)) as db:
        async def fire_and_forget():
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(db.write(lambda c: c.execute(
                "INSERT INTO t VALUES (1)"))))
            await asyncio.sleep(0)
            await asyncio.sleep(0)  # the group is with the writer thread when this loop ends

        asyncio.run(fire_and_forget())
        ran_on: list[str] = []

        async def later():
            return await asyncio.wait_for(db.write(lambda c: ran_on.append(threading.current_thread().name) or 1), 10)

        for _ in range(3):
            assert asyncio.run(later()) == 1
        assert ran_on[-1] == threading.current_thread().name  # on the loop again, not the writer thread
