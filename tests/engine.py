"""The engine under a test's store, for the tests' own SQL (counting rows, forcing a state):
SQLite's `Database` or PostgreSQL's `PgDatabase`. Both take `?` parameters in `reader().execute`
and offer `write_sync(fn)` and `row(sql)`; SQL only one engine knows (PRAGMA, EXPLAIN) belongs in
a test marked for that backend."""

from __future__ import annotations

from typing import Any


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
