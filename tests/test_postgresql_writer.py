"""The PostgreSQL store's writer thread (appliance/storage/postgres/engine.py: `_write_loop`,
`_run_next`, `_run_group`, `_one_by_one`, `close`) where a group does not simply commit: an
outage met while a group runs again without the unit whose lock was busy, an error no unit owns
(COMMIT refuses the group), units queued while the store closes, and a batch cut off in the middle
of its pipeline. Every caller gets an answer, none is left waiting, nothing is half committed.

A real throwaway cluster (tests/postgres_cluster.py) and real faults only: a lock held by another
connection, a TCP relay cut (tests/postgres_cluster.Relay), a deferred foreign key, a backend ended
with pg_terminate_backend. Units are issued while the writer runs an exclusive unit that waits, so
they queue in order and the writer takes them as one batch, as under load."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import random
import threading
import time

import psycopg
import pytest

from appliance.errors import EXCEPTION_HANDLERS, handle_storage_unavailable
from appliance.storage.db import StorageError, StorageUnavailable
from appliance.storage.locks import key_of
from appliance.storage.postgres.store import PgStore
from tests.postgres_cluster import Relay
from tests.processes import free_port

pytestmark = [pytest.mark.postgresql_own, pytest.mark.timeout(120)]

ANSWER_WITHIN = 15.0  # seconds: a unit not answered by then is left hanging


@pytest.fixture
def store(postgres_url):
    opened = PgStore.open_url(postgres_url)
    yield opened
    opened.close()


def sql(tx):
    """The unit's connection, for statements of the test's own tables."""
    return tx._conn


async def one_batch(store: PgStore, units: list) -> list:
    """Issues `units` ((unit, keyword arguments of `write`) pairs) while the writer runs an
    exclusive unit that waits: they queue in this order and the writer takes them as one batch.
    Returns each one's result or exception; fails when any is not answered in time."""
    holding, release = threading.Event(), threading.Event()

    def hold(tx):
        holding.set()
        assert release.wait(ANSWER_WITHIN)

    blocker = asyncio.ensure_future(store.write(hold))
    assert await asyncio.to_thread(holding.wait, ANSWER_WITHIN), "the writer never ran the blocking unit"
    tasks = [asyncio.ensure_future(store.write(unit, **how)) for unit, how in units]
    await asyncio.sleep(0)  # each task queues its unit, in order
    release.set()
    await asyncio.wait_for(blocker, ANSWER_WITHIN)
    _, pending = await asyncio.wait(tasks, timeout=ANSWER_WITHIN)
    assert not pending, f"units left hanging (their positions): {sorted(tasks.index(t) for t in pending)}"
    return [task.exception() or task.result() for task in tasks]


def answered_as_an_outage(result: object) -> bool:
    """What the HTTP layer answers 503 with Retry-After (appliance/errors.py), not a 500."""
    if not isinstance(result, StorageUnavailable):
        return False
    handler = next(EXCEPTION_HANDLERS[cls] for cls in type(result).__mro__ if cls in EXCEPTION_HANDLERS)
    response = handler(None, result)
    headers = {name.lower(): value for name, value in response.headers.items()}
    return handler is handle_storage_unavailable and response.status_code == 503 and int(headers["retry-after"]) > 0


def until_it_commits(store: PgStore, unit, **how) -> object:
    """The database answers again: a unit commits (after StorageUnavailable while it does not)."""
    deadline = time.monotonic() + ANSWER_WITHIN
    while True:
        try:
            return store.write_sync(unit, **how)
        except StorageUnavailable:
            assert time.monotonic() < deadline, "never committed again"
            time.sleep(0.2)


# ---- 1. an outage while a group runs again short of a busy lock -----------------------------------

def test_an_outage_met_while_a_group_runs_again_short_of_a_busy_lock_answers_every_unit(
        postgres_cluster, postgres_url):
    """Six scoped units and an exclusive one are one batch. The third unit's lock is held by
    another connection: its try fails (LockBusy at position 2), so the first two run again as a
    group of their own and the rest wait for the next group. The database goes away during that
    run: the two, the four cut off and the exclusive unit queued behind them are all answered
    StorageUnavailable (none left waiting), and none of their rows was kept."""
    relay = Relay(postgres_cluster, free_port())
    relay.start()
    store = PgStore.open_url(relay.url(postgres_url.rsplit("/", 1)[1]))
    other = psycopg.connect(postgres_url, autocommit=True)  # straight to the server: the cut spares it
    try:
        store.postgres.write_sync(lambda c: c.execute("CREATE TABLE t (n bigint)"))
        other.execute("SELECT pg_advisory_lock(%s)", (key_of("held elsewhere"),))
        runs: collections.Counter = collections.Counter()

        def insert(n, *, cut_on_run=0):
            def unit(tx):
                runs[n] += 1
                sql(tx).execute("INSERT INTO t VALUES (?)", (n,))
                if runs[n] == cut_on_run:
                    relay.stop()  # the database goes away while this group runs
                    sql(tx).execute("SELECT 1").fetchone()
                return n
            return unit

        results = asyncio.run(one_batch(store, [
            (insert(0, cut_on_run=2), {"locks": ["a"]}),
            (insert(1), {"locks": ["b"]}),
            (insert(2), {"locks": ["held elsewhere"]}),  # the try fails: the group ends before it
            (insert(3), {"locks": ["c"]}),
            (insert(4), {"locks": ()}),
            (insert(5), {"locks": ["a"]}),
            (insert(6), {}),  # exclusive: a group of its own, after these
        ]))
        assert all(answered_as_an_outage(r) for r in results), results
        # The first run went to the end (the try is answered at the group's last wait), the first
        # two ran again and met the cut there, the exclusive unit never ran.
        assert runs == {0: 2, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1}, runs
        assert other.execute("SELECT count(*) FROM t").fetchone() == (0,)

        other.execute("SELECT pg_advisory_unlock_all()")
        relay.start()
        until_it_commits(store, insert(100), locks=["held elsewhere"])
        assert other.execute("SELECT n FROM t").fetchall() == [(100,)]
    finally:
        other.close()
        store.close()
        relay.stop()


# ---- 2. an error no unit owns: the group's units one by one ----------------------------------------

@pytest.mark.parametrize("with_a_refusal", [False, True],
                         ids=["commit refused", "commit refused again after a run with savepoints"])
def test_a_commit_no_unit_is_blamed_for_runs_the_units_one_by_one(store, with_a_refusal):
    """One unit of a group leaves a deferred foreign key broken: COMMIT refuses the whole group
    and no unit raised (with a unit that raises, the group runs again with a savepoint per unit
    first, and COMMIT refuses it again). Each unit then runs alone: the others commit, the
    broken one gets its ForeignKeyViolation, the raising one its own error, and the writer goes
    on committing."""
    db = store.postgres
    db.write_sync(lambda c: c.execute("CREATE TABLE parent (id bigint PRIMARY KEY)"))
    db.write_sync(lambda c: c.execute(
        "CREATE TABLE child (n bigint, parent bigint REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)"))
    db.write_sync(lambda c: c.execute("INSERT INTO parent VALUES (1)"))
    runs: collections.Counter = collections.Counter()

    def child(n, parent=1, *, refuse=False):
        def unit(tx):
            runs[n] += 1
            sql(tx).execute("INSERT INTO child VALUES (?, ?)", (n, parent))
            if refuse:
                raise ValueError("refused")
            return n
        return unit

    units = [(child(n, 999 if n == 3 else 1), {"locks": [f"lead:{n}"]}) for n in range(6)]
    if with_a_refusal:
        units.append((child(10, refuse=True), {"locks": ["lead:10"]}))
    results = dict(zip([0, 1, 2, 3, 4, 5, 10][:len(units)], asyncio.run(one_batch(store, units)), strict=True))

    assert isinstance(results.pop(3), psycopg.errors.ForeignKeyViolation)
    if with_a_refusal:
        assert isinstance(results.pop(10), ValueError)
    assert results == {n: n for n in (0, 1, 2, 4, 5)}, results
    # Together (and again with a savepoint each when one raised), then alone: the error was found.
    # The raising unit, alone, runs once more with its savepoint, where it fails on its own.
    assert runs == ({0: 3, 1: 3, 2: 3, 3: 3, 4: 3, 5: 3, 10: 4} if with_a_refusal else dict.fromkeys(range(6), 2)), runs
    assert store.write_sync(child(6), locks=["lead:6"]) == 6  # the writer goes on
    assert db.row("SELECT array_agg(n ORDER BY n) FROM child") == ([0, 1, 2, 4, 5, 6],)


def test_a_failed_statement_answered_only_when_the_next_unit_takes_its_savepoint_is_its_own_units(store):
    """A scoped unit's INSERT breaks a unique key and nothing reads its answer; the next unit of
    the group may refuse (`may_refuse`), so it runs in a savepoint, whose start waits for the
    answers of everything sent. The error is the inserting unit's: it gets it, the others commit,
    and no caller is told its unit committed when its rows were not kept."""
    db = store.postgres
    db.write_sync(lambda c: c.execute("CREATE TABLE u (v bigint UNIQUE)"))
    db.write_sync(lambda c: c.execute("CREATE TABLE t (n bigint)"))
    db.write_sync(lambda c: c.execute("INSERT INTO u VALUES (0)"))

    def insert(n):
        return lambda tx: sql(tx).execute("INSERT INTO t VALUES (?)", (n,)) and n

    def duplicate(tx):
        sql(tx).execute("INSERT INTO t VALUES (99)")
        sql(tx).execute("INSERT INTO u VALUES (0)")  # fails; its answer is not read here
        return 99

    results = asyncio.run(one_batch(store, [
        (insert(1), {"locks": ["a"]}),
        (insert(2), {"locks": ["b"]}),
        (duplicate, {"locks": ["c"]}),
        # Nothing sent between the failed INSERT and this savepoint's start (no lock to try): the
        # start is where the error is answered, whatever the timing.
        (insert(3), {"locks": (), "may_refuse": True}),
    ]))
    kept = {n for (n,) in db.reader().execute("SELECT n FROM t").fetchall()}
    told_committed = {r for r in results if isinstance(r, int)}
    assert told_committed <= kept, f"told committed, not kept: {sorted(told_committed - kept)}; answers {results}"
    assert isinstance(results[2], psycopg.errors.UniqueViolation), results
    assert [results[0], results[1], results[3]] == [1, 2, 3], results
    assert kept == {1, 2, 3}


# ---- 3. close() racing with write() ----------------------------------------------------------------

def in_thread(fn, *args, **kwargs) -> concurrent.futures.Future:
    """`fn(*args, **kwargs)` on a daemon thread of its own: a call that never returns fails the
    test (`settled`) instead of holding up the test run, as a pool's thread would at its end."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def run():
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - the caller's answer
            future.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return future


def settled(futures, what: str) -> None:
    _, pending = concurrent.futures.wait(futures, timeout=ANSWER_WITHIN)
    assert not pending, f"{len(pending)} of {len(futures)} {what} never returned"


def committed(url: str) -> set[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        return {n for (n,) in conn.execute("SELECT n FROM t")}


def test_units_queued_while_the_store_closes_are_run_or_refused_and_close_returns(postgres_url):
    """The writer is busy when close() starts: the units queued before it, and those issued
    while it waits for the writer, are each run or refused ("closed"), the latter at once; close
    returns once the writer is done. No caller waits for ever, nothing refused was kept."""
    store = PgStore.open_url(postgres_url)
    store.postgres.write_sync(lambda c: c.execute("CREATE TABLE t (n bigint)"))
    holding, release = threading.Event(), threading.Event()

    def hold(tx):
        holding.set()
        assert release.wait(ANSWER_WITHIN)

    def insert(n):
        return lambda tx: sql(tx).execute("INSERT INTO t VALUES (?)", (n,)) and n

    try:
        try:
            blocker = in_thread(store.write_sync, hold)
            assert holding.wait(ANSWER_WITHIN)
            calls = {n: in_thread(store.write_sync, insert(n), locks=()) for n in range(8)}
            time.sleep(0.2)  # they wait behind the blocking unit
            closing = in_thread(store.close)
            time.sleep(0.3)  # close() is waiting for the writer
            late = {n: in_thread(store.write_sync, insert(n), locks=() if n % 2 else None) for n in range(100, 108)}
            settled(list(late.values()), "writes issued while closing")  # answered while the writer is still busy
            assert not closing.done(), "close() returned while the writer still ran a unit"
            calls.update(late)
        finally:
            release.set()
        settled([closing, blocker], "close() and the blocking unit")
        closing.result()
        blocker.result()
        settled(list(calls.values()), "writes queued before close()")
    finally:
        store.close()  # a second close changes nothing; it closes the store if the test failed early
    kept = committed(postgres_url)
    for n, call in calls.items():  # each one ran (and was kept), or was told the store is closed
        if call.exception() is None:
            assert call.result() == n and n in kept, n
        else:
            assert isinstance(call.exception(), StorageError) and "closed" in str(call.exception()) \
                and n not in kept, (n, call.exception())
    assert kept <= set(calls)
    assert all(late[n].exception() is not None for n in late)  # issued after close() began: refused


def test_writes_racing_close_are_each_committed_or_told_the_store_is_closed(postgres_url):
    """Threads and an event loop keep writing while another thread closes the store, at a
    different moment each round: every write returns (committed, or StorageError "closed"),
    close returns, and what was answered committed is exactly what the database kept."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (n bigint PRIMARY KEY)")
    ok: set[int] = set()
    refused: set[int] = set()
    numbers = iter(range(10**9))
    lock = threading.Lock()

    def next_number() -> int:
        with lock:
            return next(numbers)

    def insert(n):
        return lambda tx: sql(tx).execute("INSERT INTO t VALUES (?)", (n,))

    def outcome(n, error: BaseException | None) -> bool:
        """Records the answer; whether to go on writing."""
        with lock:
            if error is None:
                ok.add(n)
                return True
            assert isinstance(error, StorageError) and "closed" in str(error), repr(error)
            refused.add(n)
            return False

    def thread_writer(store):
        while True:
            n = next_number()
            try:
                store.write_sync(insert(n), locks=() if n % 3 else None)
            except StorageError as exc:
                if not outcome(n, exc):
                    return
            else:
                outcome(n, None)

    async def loop_writer(store):
        while True:
            batch = [next_number() for _ in range(16)]
            results = await asyncio.gather(*(store.write(insert(n), locks=()) for n in batch), return_exceptions=True)
            going_on = [outcome(n, r if isinstance(r, BaseException) else None) for n, r in zip(batch, results, strict=True)]
            if not all(going_on):
                return

    for round_ in range(6):
        store = PgStore.open_url(postgres_url)
        writers = [in_thread(thread_writer, store) for _ in range(6)]
        writers.append(in_thread(asyncio.run, loop_writer(store)))
        time.sleep(random.uniform(0.01, 0.15))
        closing = in_thread(store.close)
        settled([closing, *writers], f"writers and close() of round {round_}")
        for call in (closing, *writers):
            call.result()
    assert refused and ok
    assert committed(postgres_url) == ok


# ---- 4. a batch cut off in the middle of its pipeline ----------------------------------------------

def test_a_batch_cut_off_in_the_middle_of_its_pipeline_is_an_outage_not_an_error(store, postgres_url):
    """A group's statements go out in pipeline mode without waiting for answers. The server ends
    the writer's connection (pg_terminate_backend) while it runs one of them, with the statements
    of the units after it sent behind it: the batch is aborted. psycopg says so with errors that
    carry no SQLSTATE: OperationalError ("consuming input failed", "the connection is closed") and
    PipelineAborted for the statements queued behind, met here where a unit that may refuse takes
    its savepoint. Every unit is answered StorageUnavailable (503 with Retry-After), not a
    StorageError or a driver error (500), not even the unit that met the abort in its savepoint;
    nothing is kept, and the next unit commits on another connection."""
    db = store.postgres
    db.write_sync(lambda c: c.execute("CREATE TABLE t (n bigint)"))

    def insert(n):
        return lambda tx: sql(tx).execute("INSERT INTO t VALUES (?)", (n,)) and n

    def slow(tx):
        sql(tx).execute("INSERT INTO t VALUES (-1)")
        sql(tx).execute("SELECT pg_sleep(5)")  # not read: the units after it are sent meanwhile
        return "slow"

    def in_a_savepoint(tx):  # may refuse: run in a savepoint of its own, where it meets the cut
        sql(tx).execute("INSERT INTO t VALUES (-2)")
        return sql(tx).execute("SELECT count(*) FROM t").fetchone()

    ended = threading.Event()

    def end_the_writers_connection():
        with psycopg.connect(postgres_url, autocommit=True) as killer:
            deadline = time.monotonic() + ANSWER_WITHIN
            while time.monotonic() < deadline:
                (n,) = killer.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                                      " WHERE datname = current_database() AND query = 'SELECT pg_sleep(5)'"
                                      " AND state = 'active'").fetchone()
                if n:
                    ended.set()
                    return
                time.sleep(0.005)

    ending = threading.Thread(target=end_the_writers_connection)
    ending.start()
    try:
        units = [(insert(0), {"locks": ()}), (insert(1), {"locks": ["x"]}), (slow, {"locks": ()}),
                 *((insert(n), {"locks": ()}) for n in range(3, 8)), (in_a_savepoint, {"locks": (), "may_refuse": True}),
                 (insert(9), {"locks": ["y"]})]
        started = time.monotonic()
        results = asyncio.run(one_batch(store, units))
    finally:
        ending.join(ANSWER_WITHIN)
    assert ended.is_set(), "the slow statement was never seen running"
    assert all(answered_as_an_outage(r) for r in results), results
    assert time.monotonic() - started < 4, "the batch waited for the statement the server ended"
    assert db.row("SELECT count(*) FROM t") == (0,)
    assert until_it_commits(store, insert(100), locks=()) == 100
    assert db.row("SELECT array_agg(n) FROM t") == ([100],)
