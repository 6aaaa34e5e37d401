"""The PostgreSQL store (appliance/storage/postgres): migrations, write units (serializable, run
again on conflict, all-or-nothing), errors that name no password, the change signal between
processes, job claims across stores. A real throwaway cluster (tests/postgres_cluster.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import subprocess
import sys
import threading
import time

import psycopg
import pytest

from appliance.storage.db import StorageError, StorageUnavailable
from appliance.storage.migrations import MIGRATIONS as SQLITE_MIGRATIONS
from appliance.storage.postgres.url import redact, without_password
from appliance.storage.postgres.migrations import MIGRATIONS, apply
from appliance.storage.postgres.store import PgStore
from tests.postgres_cluster import Relay
from tests.processes import free_port

pytestmark = pytest.mark.postgresql_own

NOW = "2026-03-01T12:00:00.000Z"


@pytest.fixture
def store(postgres_url):
    opened = PgStore.open_url(postgres_url)
    yield opened
    opened.close()


def test_the_same_migrations_by_name_recorded_and_run_twice_change_nothing(postgres_url):
    assert [name for name, _ in MIGRATIONS if not name.startswith("pg")] == [name for name, _ in SQLITE_MIGRATIONS]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        names = [n for (n,) in conn.execute("SELECT name FROM migrations ORDER BY name")]
        assert names == sorted(name for name, _ in MIGRATIONS)
        schema = conn.execute("SELECT table_name, column_name, data_type FROM information_schema.columns"
                              " WHERE table_schema = 'public' ORDER BY 1, 2").fetchall()
        assert apply(conn) == []
        PgStore.open_url(postgres_url).close()
        assert conn.execute("SELECT table_name, column_name, data_type FROM information_schema.columns"
                            " WHERE table_schema = 'public' ORDER BY 1, 2").fetchall() == schema


def test_a_database_whose_text_does_not_sort_byte_by_byte_is_refused(postgres_cluster):
    postgres_cluster.admin("CREATE DATABASE not_c TEMPLATE template0 LOCALE 'C.UTF-8' ENCODING 'UTF8'")
    PgStore.open_url(postgres_cluster.url("not_c"), create=True).close()  # C.UTF-8 sorts by code point: accepted
    postgres_cluster.admin("DROP DATABASE not_c")
    locales = {row[0] for row in psycopg.connect(postgres_cluster.url(), autocommit=True).execute(
        "SELECT collname FROM pg_collation WHERE collprovider = 'c'")}
    other = next((name for name in ("en_US.utf8", "en_US.UTF-8", "de_DE.utf8") if name in locales), None)
    if other is None:
        pytest.skip("no libc locale other than C in this cluster")
    postgres_cluster.admin(f"CREATE DATABASE not_c TEMPLATE template0 LOCALE '{other}' ENCODING 'UTF8'")
    try:
        with pytest.raises(StorageError, match="collation"):
            PgStore.open_url(postgres_cluster.url("not_c"), create=True)
    finally:
        postgres_cluster.admin("DROP DATABASE not_c")


def test_concurrent_read_modify_write_units_behave_as_if_run_one_after_another(store):
    """What the SQLite store's single writer gives for free: 8 threads x 25 units each reading a
    counter and writing it back one higher lose no increment (serialization failures run again)."""
    tenant_id = store.write_sync(lambda tx: tx.tenants.create_tenant("A", NOW))

    def bump(tx):
        value = tx.caps.counter_value(tenant_id, "scope", "")
        tx.secrets.put(tenant_id, "probe", str(value).encode(), NOW)  # acts on what it read
        tx.caps.add_to_counter(tenant_id, "scope", "")

    def worker():
        for _ in range(25):
            store.write_sync(bump)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.reader().caps.counter_value(tenant_id, "scope", "") == 200


def test_a_unit_that_raises_leaves_nothing_and_its_caller_gets_the_error(store):
    def unit(tx):
        tx.tenants.create_tenant("kept?", NOW)
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        store.write_sync(unit)
    with pytest.raises(ValueError, match="refused"):
        asyncio.run(store.write(unit, may_refuse=True))
    assert store.reader().tenants.list_tenants() == []


def test_reads_in_a_with_block_see_one_snapshot(store):
    tenant_id = store.write_sync(lambda tx: tx.tenants.create_tenant("A", NOW))
    reader = store.reader()
    with reader as tx:
        before = tx.tenants.config_rev(tenant_id)
        done = threading.Thread(target=store.write_sync, args=(lambda w: w.tenants.bump_config_rev(tenant_id),))
        done.start()
        done.join()
        assert tx.tenants.config_rev(tenant_id) == before
    assert store.reader().tenants.config_rev(tenant_id) == before + 1


def test_a_write_after_close_is_a_storage_error(postgres_url):
    store = PgStore.open_url(postgres_url)
    store.close()
    with pytest.raises(StorageError, match="closed"):
        store.write_sync(lambda tx: tx.tenants.create_tenant("A", NOW))


def test_units_at_once_commit_and_a_failing_one_costs_no_other(store):
    """100 units at once insert 50 values twice into a unique column: 50 commit, the other 50
    get their own error, and more failures than the pool has connections leave it whole."""
    db = store.postgres
    db.write_sync(lambda c: c.execute("CREATE TABLE t (v bigint UNIQUE)"))
    results: list = []

    def insert(value):
        try:
            db.write_sync(lambda c: c.execute("INSERT INTO t VALUES (?)", (value,)))
            results.append(value)
        except psycopg.errors.UniqueViolation:
            results.append("dup")

    threads = [threading.Thread(target=insert, args=(v % 50,)) for v in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r for r in results if r != "dup") == list(range(50))
    assert results.count("dup") == 50 > db.pool_size
    assert db.row("SELECT count(*) FROM t") == (50,)


def test_units_an_event_loop_issues_together_run_in_that_order(store):
    """As SQLite's one writer runs them: the delivery worker reserves delivery-limit slots for
    the jobs it claimed together oldest first. A unit that fails, and one whose caller was
    cancelled (it still runs, as one already queued does), leave the order of the others."""
    db = store.postgres
    db.write_sync(lambda c: c.execute("CREATE TABLE issued (n bigint, at bigserial)"))

    def unit(n):
        def insert(c):
            c.execute("INSERT INTO issued (n) VALUES (?)", (n,))
            if n == 10:
                raise ValueError("refused")
        return insert

    async def issue():
        tasks = [asyncio.create_task(db.write(unit(n))) for n in range(40)]
        await asyncio.sleep(0)  # every unit issued, in order
        tasks[20].cancel()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=30)
        assert isinstance(results[10], ValueError) and isinstance(results[20], asyncio.CancelledError)

    asyncio.run(issue())
    order = [n for (n,) in db.reader().execute("SELECT n FROM issued ORDER BY at").fetchall()]
    assert order == [n for n in range(40) if n != 10]


def test_units_queued_in_an_outage_fail_each_on_its_own_and_the_next_commits_once_it_answers(
        postgres_cluster, postgres_url):
    """Each unit waits half a second for a connection while the database is away: 24 issued
    together fail side by side (in turn they would take over 11 s), none of them waits for the
    unit before it. Once the database answers, units commit again."""
    relay = Relay(postgres_cluster, free_port())
    relay.start()
    store = PgStore.open_url(relay.url(postgres_url.rsplit("/", 1)[1]))
    db = store.postgres
    try:
        db.write_sync(lambda c: c.execute("SELECT 1"))
        relay.stop()

        async def issue():
            return await asyncio.gather(*(db.write(lambda c: c.execute("SELECT 1")) for _ in range(24)),
                                        return_exceptions=True)

        started = time.monotonic()
        results = asyncio.run(issue())
        assert all(isinstance(r, StorageUnavailable) for r in results), results
        assert time.monotonic() - started < 6

        relay.start()
        deadline = time.monotonic() + 15
        while True:
            try:
                assert asyncio.run(db.write(lambda c: c.execute("SELECT 1").fetchone())) == (1,)
                break
            except StorageUnavailable:
                assert time.monotonic() < deadline, "never committed again"
                time.sleep(0.2)
    finally:
        store.close()
        relay.stop()


def test_a_commit_that_fails_answers_its_caller_and_keeps_nothing(store):
    """A deferred foreign key left broken makes COMMIT fail: each caller hears so, nothing of
    its unit is kept, and the connections it used serve the next units."""
    db = store.postgres
    db.write_sync(lambda c: c.execute("CREATE TABLE p (id bigint PRIMARY KEY)"))
    db.write_sync(lambda c: c.execute("CREATE TABLE k (p bigint REFERENCES p(id) DEFERRABLE INITIALLY DEFERRED)"))

    def broken(conn):
        conn.execute("INSERT INTO p VALUES (1)")
        conn.execute("INSERT INTO k VALUES (7)")  # checked at COMMIT only
        return "committed?"

    for _ in range(db.pool_size + 2):
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            db.write_sync(broken)
    assert db.row("SELECT count(*) FROM p") == (0,)
    db.write_sync(lambda c: c.execute("INSERT INTO p VALUES (1)") and c.execute("INSERT INTO k VALUES (1)"))
    assert db.row("SELECT count(*) FROM k") == (1,)


def test_a_row_locked_by_another_process_never_blocks_the_event_loop(store, postgres_url):
    """Another connection (not a unit: an operator's own transaction) holds a row lock: the
    loop's write on that row waits off the loop (the loop goes on turning), then counts on the
    value the holder committed."""
    db = store.postgres
    db.write_sync(lambda c: c.execute("CREATE TABLE t (id bigint PRIMARY KEY, v bigint)"))
    db.write_sync(lambda c: c.execute("INSERT INTO t VALUES (1, 0)"))
    with psycopg.connect(postgres_url) as other:
        other.execute("UPDATE t SET v = v + 1 WHERE id = 1")  # holds the row until its commit

        async def while_locked():
            locked = asyncio.ensure_future(db.write(lambda c: c.execute("UPDATE t SET v = v + 10 WHERE id = 1")))
            turns = 0
            for _ in range(20):
                await asyncio.sleep(0.01)
                turns += 1
            assert turns == 20 and not locked.done()
            other.commit()
            await asyncio.wait_for(locked, 10)

        asyncio.run(while_locked())
    assert db.row("SELECT v FROM t WHERE id = 1") == (11,)


def test_units_naming_no_locks_of_several_processes_run_one_at_a_time(postgres_url):
    """A unit that names no locks takes the database's writer lock exclusively: a unit of
    another process waits for one under way, so each reads what the one before it committed (a
    read-modify-write counter loses nothing across processes)."""
    first, second = PgStore.open_url(postgres_url), PgStore.open_url(postgres_url)
    try:
        first.postgres.write_sync(lambda c: c.execute("CREATE TABLE n (v bigint)"))
        first.postgres.write_sync(lambda c: c.execute("INSERT INTO n VALUES (0)"))
        entered, release = threading.Event(), threading.Event()

        def slow(c):
            (v,) = c.execute("SELECT v FROM n").fetchone()
            entered.set()
            assert release.wait(10)
            c.execute("UPDATE n SET v = ?", (v + 1,))

        def quick(c):
            (v,) = c.execute("SELECT v FROM n").fetchone()
            c.execute("UPDATE n SET v = ?", (v + 1,))
            return v

        holder = threading.Thread(target=first.postgres.write_sync, args=(slow,))
        holder.start()
        assert entered.wait(10)
        waiter = concurrent.futures.ThreadPoolExecutor(1).submit(second.postgres.write_sync, quick)
        time.sleep(0.3)
        assert not waiter.done()  # it waits for the writer lock, not reading the old value
        release.set()
        holder.join(10)
        assert waiter.result(10) == 1
        assert first.postgres.row("SELECT v FROM n") == (2,)
    finally:
        first.close()
        second.close()


def test_scoped_units_of_two_processes_reading_one_counter_lose_no_increment(postgres_url):
    """Scoped units (locks named, here none up front) of two processes, four threads each, read
    a cap counter and write it back one higher: the counter's lock, taken as the unit reads it,
    keeps every increment; groups cut where the other process holds it, and go on."""
    first, second = PgStore.open_url(postgres_url), PgStore.open_url(postgres_url)
    try:
        tenant_id = first.write_sync(lambda tx: tx.tenants.create_tenant("A", NOW))

        def bump(tx):
            value = tx.caps.counter_value(tenant_id, "scope", "")
            tx.secrets.put(tenant_id, "probe", str(value).encode(), NOW)  # acts on what it read
            tx.caps.add_to_counter(tenant_id, "scope", "")

        async def many(store):
            await asyncio.gather(*(store.write(bump, locks=()) for _ in range(100)))

        threads = [threading.Thread(target=asyncio.run, args=(many(store),)) for store in (first, second) * 2]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert first.reader().caps.counter_value(tenant_id, "scope", "") == 400
    finally:
        first.close()
        second.close()


def test_scoped_units_naming_different_things_commit_while_one_holds_its_lock(postgres_url):
    """No install-wide lock for scoped units: while one process's unit holds `x` (and waits), the
    other process commits a unit naming `y` at once, and one naming `x` only after the holder."""
    first, second = PgStore.open_url(postgres_url), PgStore.open_url(postgres_url)
    try:
        first.postgres.write_sync(lambda c: c.execute("CREATE TABLE seen (what text)"))
        entered, release = threading.Event(), threading.Event()

        def holder(tx):
            entered.set()
            assert release.wait(10)
            tx._conn.execute("INSERT INTO seen VALUES ('holder')")

        def insert(what):
            return lambda tx: tx._conn.execute("INSERT INTO seen VALUES (?)", (what,))

        held = threading.Thread(target=first.write_sync, args=(holder,), kwargs={"locks": ["x"]})
        held.start()
        assert entered.wait(10)
        second.write_sync(insert("y"), locks=["y"])  # would hang here behind an install-wide lock
        waiter = concurrent.futures.ThreadPoolExecutor(1).submit(second.write_sync, insert("x"), locks=["x"])
        time.sleep(0.3)
        assert not waiter.done()
        release.set()
        held.join(10)
        waiter.result(10)
        order = [what for (what,) in first.postgres.reader().execute("SELECT what FROM seen").fetchall()]
        assert order == ["y", "holder", "x"]
    finally:
        first.close()
        second.close()


def test_a_deadlock_between_two_processes_units_is_run_again_and_both_commit(postgres_url):
    """Two scoped units lock the same two rows in opposite orders (nothing names them): PostgreSQL
    aborts one as a deadlock, the store runs it again, and both callers get their answer."""
    first, second = PgStore.open_url(postgres_url), PgStore.open_url(postgres_url)
    try:
        first.postgres.write_sync(lambda c: c.execute("CREATE TABLE r (id bigint PRIMARY KEY, v bigint)"))
        first.postgres.write_sync(lambda c: c.execute("INSERT INTO r VALUES (1, 0), (2, 0)"))
        both = threading.Barrier(2)

        def crossing(a, b):
            def unit(tx):
                tx._conn.execute("UPDATE r SET v = v + 1 WHERE id = ?", (a,))
                with contextlib.suppress(threading.BrokenBarrierError):
                    both.wait(2)  # the run again passes alone
                tx._conn.execute("UPDATE r SET v = v + 1 WHERE id = ?", (b,))
                return "done"
            return unit

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            one = pool.submit(first.write_sync, crossing(1, 2), locks=())
            other = pool.submit(second.write_sync, crossing(2, 1), locks=())
            assert (one.result(30), other.result(30)) == ("done", "done")
        assert first.postgres.reader().execute("SELECT v FROM r ORDER BY id").fetchall() == [(2,), (2,)]
    finally:
        first.close()
        second.close()


def test_a_connection_cut_in_the_middle_of_a_group_keeps_none_of_it(postgres_cluster, postgres_url):
    """Twelve units queued together run in one group; the connection is cut while the sixth
    runs: every caller hears the database is unavailable, and none of their rows was kept.
    Once the database answers, units commit again."""
    relay = Relay(postgres_cluster, free_port())
    relay.start()
    store = PgStore.open_url(relay.url(postgres_url.rsplit("/", 1)[1]))
    db = store.postgres
    try:
        db.write_sync(lambda c: c.execute("CREATE TABLE g (n bigint)"))

        def unit(n):
            def insert(c):
                c.execute("INSERT INTO g VALUES (?)", (n,))
                if n == 5:
                    relay.stop()
                    c.execute("INSERT INTO g VALUES (-1)")
            return insert

        async def issue():
            gate = threading.Event()
            blocker = asyncio.ensure_future(db.write(lambda c: gate.wait(10)))  # the writer is busy meanwhile
            await asyncio.sleep(0.1)
            units = [asyncio.ensure_future(db.write(unit(n), locks=())) for n in range(12)]
            await asyncio.sleep(0.1)  # all twelve queued
            gate.set()
            await blocker
            return await asyncio.gather(*units, return_exceptions=True)

        results = asyncio.run(issue())
        assert all(isinstance(r, StorageUnavailable) for r in results), results
        relay.start()
        deadline = time.monotonic() + 15
        while True:
            try:
                asyncio.run(db.write(lambda c: c.execute("INSERT INTO g VALUES (100)"), locks=()))
                break
            except StorageUnavailable:
                assert time.monotonic() < deadline, "never committed again"
                time.sleep(0.2)
        assert db.reader().execute("SELECT n FROM g").fetchall() == [(100,)]
    finally:
        store.close()
        relay.stop()


def test_an_unreachable_database_is_one_line_naming_no_password(postgres_cluster):
    url = f"postgresql://postgres:s3cret-pw@127.0.0.1:{postgres_cluster.port + 1}/nowhere"
    with pytest.raises(StorageError) as caught:
        PgStore.open_url(url)
    message = str(caught.value)
    assert isinstance(caught.value, StorageUnavailable)  # an outage: a server keeps trying (test_database_outage.py)
    assert "s3cret-pw" not in message and "\n" not in message
    assert "postgres:***@127.0.0.1" in message
    assert redact("postgresql://u@h/db") == "postgresql://u@h/db"


def test_every_way_of_giving_a_password_is_redacted_and_kept_off_the_tools_command_line():
    assert redact("postgresql://u:p%40ss@h:5/db") == "postgresql://u:***@h:5/db"
    assert redact("postgresql://u@h/db?sslmode=disable&password=x1") == "postgresql://u@h/db?sslmode=disable&password=***"
    assert redact("host=h password='a b' user=u") == "host=h password=*** user=u"
    # pg_dump and pg_restore get the URL without it, and the password (decoded) in PGPASSWORD
    assert without_password("postgresql://u:p%40ss@h:5/db") == ("postgresql://u@h:5/db", "p@ss")
    assert without_password("postgresql://u@h/db?password=x1&sslmode=disable") == \
        ("postgresql://u@h/db?sslmode=disable", "x1")
    assert without_password("postgresql://u@h/db") == ("postgresql://u@h/db", None)


def test_wrong_credentials_are_a_storage_error_naming_no_password(postgres_cluster):
    # The cluster trusts everyone; this role alone must give its password.
    hba = postgres_cluster.data / "pg_hba.conf"
    trusting = hba.read_text()
    hba.write_text("host all appliance_pw 127.0.0.1/32 scram-sha-256\n" + trusting)
    with psycopg.connect(postgres_cluster.url(), autocommit=True) as conn:
        conn.execute("CREATE ROLE appliance_pw LOGIN PASSWORD 'right-one'")
        conn.execute("SELECT pg_reload_conf()")
    try:
        with pytest.raises(StorageError, match="password authentication failed") as caught:
            PgStore.open_url(f"postgresql://appliance_pw:wrong-one@127.0.0.1:{postgres_cluster.port}/postgres")
        assert "wrong-one" not in str(caught.value) and "\n" not in str(caught.value)
        assert not isinstance(caught.value, StorageUnavailable)  # waiting would not mend it
    finally:
        hba.write_text(trusting)
        with psycopg.connect(postgres_cluster.url(), autocommit=True) as conn:
            conn.execute("DROP ROLE appliance_pw")
            conn.execute("SELECT pg_reload_conf()")


def test_an_admin_change_reaches_another_store_within_a_second(postgres_url):
    first, second = PgStore.open_url(postgres_url), PgStore.open_url(postgres_url)
    try:
        deadline = time.monotonic() + 15
        while not second.changes._connected and time.monotonic() < deadline:
            time.sleep(0.01)
        # Not listening, the value moves on every read: the check below would hold without the NOTIFY.
        assert second.changes._connected
        seen = second.changes.value()
        first.announce_admin_change()
        deadline = time.monotonic() + 1
        while second.changes.value() == seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert second.changes.value() != seen
    finally:
        first.close()
        second.close()


def test_two_stores_claiming_at_once_never_claim_a_job_twice(postgres_url):
    stores = [PgStore.open_url(postgres_url) for _ in range(2)]
    try:
        def queue(tx):
            tenant_id = tx.tenants.create_tenant("A", NOW)
            for n in range(200):
                tx.jobs.insert_job(tenant_id=tenant_id, kind="deliver", lead_id=f"lead_{n}",
                                   submission_id=f"sub_{n}", due_at=NOW, now=NOW)

        stores[0].write_sync(queue)
        claimed: list[list[int]] = [[], []]

        def claimer(i):
            while True:
                jobs = stores[i].write_sync(lambda tx: tx.jobs.claim_due(NOW, 7))
                if not jobs:
                    return
                claimed[i].extend(job.job_id for job in jobs)

        threads = [threading.Thread(target=claimer, args=(i,)) for i in range(2) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        every = claimed[0] + claimed[1]
        assert len(every) == len(set(every)) == 200
    finally:
        for s in stores:
            s.close()


_CLAIMER = """
import sys, time
from appliance.storage.postgres.store import PgStore
store = PgStore.open_url(sys.argv[1], lease_seconds=1.0)
def claim(tx):
    jobs = tx.jobs.claim_due(sys.argv[2], 5)
    tx.caps.add_to_counter(jobs[0].tenant_id, "campaign:C", "2026-03-01")  # a delivery-limit slot held
    tx.jobs.hold_reservations(jobs[0].job_id, [("campaign:C", "2026-03-01")])
    return jobs
print(len(store.write_sync(claim)), flush=True)
time.sleep(600)
"""


def _queue_jobs(store, count):
    def queue(tx):
        tenant_id = tx.tenants.create_tenant("A", NOW)
        for n in range(count):
            tx.jobs.insert_job(tenant_id=tenant_id, kind="deliver", lead_id=f"lead_{n}",
                               submission_id=f"sub_{n}", due_at=NOW, now=NOW)
        return tenant_id

    return store.write_sync(queue)


def test_leases_are_renewed_while_a_long_unit_holds_the_writer_lock(postgres_url):
    """Renewing touches only the process's own running jobs, so it does not wait for the writer
    lock: a unit holding it longer than a lease (a large purge) does not cost live jobs."""
    a = PgStore.open_url(postgres_url, lease_seconds=1.0)
    b = PgStore.open_url(postgres_url)
    try:
        _queue_jobs(a, 1)
        (job,) = a.write_sync(lambda tx: tx.jobs.claim_due(NOW, 1))
        holding, release = threading.Event(), threading.Event()

        def long_unit(conn):
            holding.set()
            assert release.wait(10)

        holder = threading.Thread(target=b.postgres.write_sync, args=(long_unit,))
        holder.start()
        assert holding.wait(10)
        try:
            time.sleep(2.5)  # past the 1 s lease: only renewals keep it alive
            (alive,) = a.postgres.row("SELECT lease_until > clock_timestamp() FROM jobs WHERE job_id = ?",
                                      (job.job_id,))
        finally:
            release.set()
            holder.join(10)
        assert alive is True
        assert b.write_sync(lambda tx: tx.jobs.requeue_expired()) == 0
    finally:
        a.close()
        b.close()


def test_a_dead_processs_jobs_are_taken_over_and_a_live_ones_never(postgres_url):
    """Process A claims 5 jobs (one holding a delivery-limit slot) and keeps renewing its leases:
    store B, starting and claiming meanwhile, leaves them alone. A is SIGKILLed: once its leases
    run out B claims the 5 jobs, and the slot is given back."""
    b = PgStore.open_url(postgres_url, lease_seconds=1.0)
    a = None
    try:
        tenant_id = _queue_jobs(b, 5)
        a = subprocess.Popen([sys.executable, "-c", _CLAIMER, postgres_url, NOW], stdout=subprocess.PIPE, text=True)
        assert a.stdout.readline().strip() == "5"
        assert b.write_sync(lambda tx: tx.jobs.requeue_interrupted(NOW)) == 0  # B starts: A's jobs are A's
        deadline = time.monotonic() + 3  # three lease lengths: A renews, B never finds them expired
        while time.monotonic() < deadline:
            assert b.write_sync(lambda tx: tx.jobs.claim_due(NOW, 10)) == []
            time.sleep(0.1)
        assert b.reader().caps.counter_value(tenant_id, "campaign:C", "2026-03-01") == 1
        a.kill()
        a.wait(5)
        taken: list = []
        deadline = time.monotonic() + 10
        while len(taken) < 5 and time.monotonic() < deadline:
            taken += b.write_sync(lambda tx: tx.jobs.claim_due(NOW, 10))
            time.sleep(0.1)
        assert sorted(job.lead_id for job in taken) == [f"lead_{n}" for n in range(5)]
        assert {job.attempts for job in taken} == {2}
        assert b.reader().caps.counter_value(tenant_id, "campaign:C", "2026-03-01") == 0
    finally:
        if a is not None and a.poll() is None:
            a.kill()
            a.wait(5)
        b.close()


def test_a_store_closed_cleanly_hands_its_running_jobs_back_at_once(postgres_url):
    """A clean stop leaves its jobs `running` (the worker cancels them); the next start takes
    them without waiting out their leases."""
    first = PgStore.open_url(postgres_url)
    _queue_jobs(first, 3)
    assert len(first.write_sync(lambda tx: tx.jobs.claim_due(NOW, 10))) == 3
    first.close()
    second = PgStore.open_url(postgres_url)
    try:
        assert second.write_sync(lambda tx: tx.jobs.requeue_interrupted(NOW)) == 3
        assert len(second.write_sync(lambda tx: tx.jobs.claim_due(NOW, 10))) == 3
    finally:
        second.close()


def test_a_process_that_lost_its_claim_leaves_the_job_and_its_slots_to_the_new_owner(postgres_url):
    """A claims a job and takes a delivery-limit slot; its lease ends (as when A is cut off from
    the database past it) and B takes the job over with a slot of its own. A, back, can neither
    finish, reschedule nor park the job, nor give back B's slot; B settles it."""
    a = PgStore.open_url(postgres_url, lease_seconds=600)  # A renews nothing during the test
    b = PgStore.open_url(postgres_url)
    slot = ("campaign:C", "2026-03-01")

    def take_slot(job):
        def unit(tx):
            tx.caps.add_to_counter(job.tenant_id, *slot)
            tx.jobs.hold_reservations(job.job_id, [slot])
        return unit

    def slots():
        return b.reader().caps.counter_value(tenant_id, *slot)

    try:
        tenant_id = _queue_jobs(a, 1)
        (job,) = a.write_sync(lambda tx: tx.jobs.claim_due(NOW, 1))
        a.write_sync(take_slot(job))
        a.postgres.write_sync(lambda conn: conn.execute(
            "UPDATE jobs SET lease_until = clock_timestamp() - interval '1 second' WHERE job_id = ?", (job.job_id,)))
        assert b.write_sync(lambda tx: tx.jobs.requeue_expired()) == 1
        (again,) = b.write_sync(lambda tx: tx.jobs.claim_due(NOW, 1))
        assert again.job_id == job.job_id
        b.write_sync(take_slot(again))
        assert slots() == 1  # A's slot went back with the requeue, B holds one

        # The delivery worker runs each of a job's units only while this holds (jobs/delivery.py _write).
        assert a.write_sync(lambda tx: tx.jobs.holds(job)) is False
        assert b.write_sync(lambda tx: tx.jobs.holds(again)) is True
        assert b.write_sync(lambda tx: tx.jobs.holds(job)) is False  # the earlier attempt's claim, not B's
        assert a.write_sync(lambda tx: tx.jobs.finish(job.job_id, "done", NOW)) is False
        assert a.write_sync(lambda tx: tx.jobs.reschedule(job.job_id, NOW, NOW, error="timeout")) is False
        assert a.write_sync(lambda tx: tx.jobs.park(tenant_id, job.job_id, "ep", NOW, "paused", attempted=True)) is False
        a.write_sync(lambda tx: tx.jobs.release_reservations(tenant_id, job.job_id))
        assert slots() == 1
        assert b.reader().jobs.job_state(job.job_id) == "running"

        # The worker's fence: a unit of A's for the job answers ClaimLost and keeps nothing it wrote,
        # whether the fence's answer comes with a read in the unit, with the group's end (scoped
        # units, pipelined), or at once (a unit run alone); the units grouped with it commit.
        other = ("campaign:D", "2026-03-01")

        def fenced(read_after: bool):
            def unit(tx):
                tx.jobs.fence(job)
                tx.caps.add_to_counter(tenant_id, *slot)
                return tx.caps.counter_value(tenant_id, *slot) if read_after else None
            return unit

        def good(tx):
            tx.caps.add_to_counter(tenant_id, *other)

        async def grouped():
            return await asyncio.gather(
                *(a.write(good, locks=()) for _ in range(4)), a.write(fenced(True), locks=()),
                *(a.write(good, locks=()) for _ in range(4)), a.write(fenced(False), locks=()),
                a.write(fenced(False)), return_exceptions=True)

        outcomes = asyncio.run(grouped())
        assert [type(o).__name__ for o in outcomes] == ["NoneType"] * 4 + ["ClaimLost"] + ["NoneType"] * 4 \
            + ["ClaimLost"] * 2
        assert slots() == 1
        assert b.reader().caps.counter_value(tenant_id, *other) == 8
        b.write_sync(lambda tx: tx.jobs.fence(again))  # B's own claim stands

        def broken(tx):  # a bug between the fence and the unit's next wait
            tx.jobs.fence(job)
            tx.caps.add_to_counter(tenant_id, *slot)
            raise ValueError("a bug")

        async def with_a_bug():
            return await asyncio.gather(a.write(broken, locks=()), a.write(good, locks=()), return_exceptions=True)

        # The bug is the unit's answer (its fence's check went with its savepoint), the next unit commits.
        assert [type(o).__name__ for o in asyncio.run(with_a_bug())] == ["ValueError", "NoneType"]
        assert slots() == 1
        assert b.reader().caps.counter_value(tenant_id, *other) == 9

        assert b.write_sync(lambda tx: tx.jobs.finish(job.job_id, "done", NOW)) is True
        assert b.reader().jobs.job_state(job.job_id) == "done"
        assert slots() == 1  # a delivery made keeps its slot
    finally:
        a.close()
        b.close()


_LEADER = """
import asyncio, sys, time
from appliance.storage.postgres.store import PgStore
store = PgStore.open_url(sys.argv[1])
print(asyncio.run(store.runs_timed_work()), flush=True)
time.sleep(600)
"""


def test_timed_work_has_one_leader_and_another_process_takes_over_when_it_dies(postgres_url):
    a = subprocess.Popen([sys.executable, "-c", _LEADER, postgres_url], stdout=subprocess.PIPE, text=True)
    b, c = PgStore.open_url(postgres_url), PgStore.open_url(postgres_url)
    try:
        assert a.stdout.readline().strip() == "True"
        assert not asyncio.run(b.runs_timed_work()) and not asyncio.run(c.runs_timed_work())
        a.kill()
        a.wait(5)
        deadline = time.monotonic() + 10  # the server ends the killed leader's session at once
        while not asyncio.run(b.runs_timed_work()):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert asyncio.run(b.runs_timed_work()) and not asyncio.run(c.runs_timed_work())  # B stays leader
        b.close()
        # A clean stop hands it on: the lock goes when the server has ended B's session, which
        # it does a moment after B disconnects, not before close() returns.
        deadline = time.monotonic() + 10
        while not asyncio.run(c.runs_timed_work()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait(5)
        b.close()
        c.close()


def test_two_tickers_on_one_database_purge_once(postgres_url, monkeypatch):
    from types import SimpleNamespace

    from appliance.clock import Clock
    from appliance.jobs import ticker

    purged: list[str] = []
    purge = ticker.purge_old_activity

    async def counted(runtime):
        purged.append(runtime.name)
        return await purge(runtime)

    monkeypatch.setattr(ticker, "purge_old_activity", counted)
    monkeypatch.setattr(ticker, "TICK_SECONDS", 0.05)
    stores = [PgStore.open_url(postgres_url) for _ in range(2)]
    config = SimpleNamespace(storage=SimpleNamespace(activity_log_days=30))
    runtimes = [SimpleNamespace(name=n, store=s, clock=Clock(), activity=[], config=config)
                for n, s in zip("ab", stores, strict=True)]

    async def both() -> None:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(ticker.run_ticker(r, stop)) for r in runtimes]
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*tasks)

    try:
        asyncio.run(both())
    finally:
        for s in stores:
            s.close()
    assert len(purged) == 1  # both were due at start; one process holds the lock


def test_a_worker_started_again_in_the_same_process_takes_back_its_own_running_jobs(postgres_url):
    """The app stopped mid-attempt and started again on the same store: its leases are still
    renewed, yet those jobs are nobody's now."""
    store = PgStore.open_url(postgres_url)
    try:
        _queue_jobs(store, 2)
        assert len(store.write_sync(lambda tx: tx.jobs.claim_due(NOW, 10))) == 2
        assert store.write_sync(lambda tx: tx.jobs.requeue_interrupted(NOW)) == 2
    finally:
        store.close()
