"""The engine under a test's store, for the tests' own SQL (counting rows, forcing a state):
SQLite's `Database` or PostgreSQL's `PgDatabase`. Both take `?` parameters in `reader().execute`
and offer `write_sync(fn)` and `row(sql)`; SQL only one engine knows (PRAGMA, EXPLAIN) belongs in
a test marked for that backend."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import apsw

from appliance.config import Config
from appliance.runtime import open_store


def engine(store: Any) -> Any:
    return store.postgres if hasattr(store, "postgres") else store.sqlite


def table_columns(store: Any) -> dict[str, list[str]]:
    """Every table of the appliance's database and its columns, in order (SQLite's own tables and
    PostgreSQL's catalogs aside)."""
    if hasattr(store, "postgres"):
        tables: dict[str, list[str]] = {}
        for table, column in store.postgres.reader().execute(
                "SELECT table_name, column_name FROM information_schema.columns "
                "WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"):
            tables.setdefault(table, []).append(column)
        return tables
    conn = store.sqlite.reader()
    names = [name for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
    return {name: [c[1] for c in conn.execute(f"PRAGMA table_info({name})")] for name in names}


def stored_bytes(config: Config) -> bytes:
    """All the install's database holds, for scans for values that must never be stored in plain:
    on SQLite its files (WAL checkpointed; freed pages included), on PostgreSQL every row of every
    table (text as UTF-8, bytea as its bytes)."""
    if config.storage.backend == "postgresql":
        store = open_store(config)
        try:
            conn = store.postgres.reader()  # type: ignore[attr-defined]
            values = [value for table in table_columns(store)
                      for row in conn.execute(f'SELECT * FROM "{table}"') for value in row]
        finally:
            store.close()
        return b"\n".join(bytes(v) if isinstance(v, (bytes, memoryview)) else str(v).encode() for v in values)
    conn = apsw.Connection(str(config.database_file))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return b"".join(path.read_bytes() for path in sorted(config.database_file.parent.glob(config.database_file.name + "*"))
                    if path.is_file())


def seen(store: Any, check: Callable[[], bool]) -> bool:
    """Whether a server on `store` sees a change another process committed and announced: on
    SQLite it reads the signal file on every request, so `check` holds at once; on PostgreSQL the
    NOTIFY reaches its listener thread asynchronously, so `check` holds within the promised second."""
    if not hasattr(store, "postgres"):
        return check()
    deadline = time.monotonic() + 1.0
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
