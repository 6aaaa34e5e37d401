"""The database file: WAL, durability setting, migrations recorded and idempotent, group commit."""

from __future__ import annotations

import threading

import apsw
import pytest

from appliance.storage.db import Database
from appliance.storage.migrations import MIGRATIONS, apply


def test_database_runs_in_wal_with_full_sync(runtime, config):
    conn = apsw.Connection(str(config.database_file))
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    writer_sync = runtime.db.write_sync(lambda c: c.execute("PRAGMA synchronous").fetchone()[0])
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
    db = Database(tmp_path / "g.db").open()
    try:
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
    finally:
        db.close()


def test_unreadable_database_is_a_clear_error(tmp_path):
    from appliance.storage.db import StorageError

    bad = tmp_path / "not-a-db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StorageError, match="cannot open database"):
        Database(bad).open()
