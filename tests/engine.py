"""The engine under a test's store, for the tests' own SQL (counting rows, forcing a state):
SQLite's `Database` or PostgreSQL's `PgDatabase`. Both take `?` parameters in `reader().execute`
and offer `write_sync(fn)` and `row(sql)`; SQL only one engine knows (PRAGMA, EXPLAIN) belongs in
a test marked for that backend."""

from __future__ import annotations

from typing import Any


def engine(store: Any) -> Any:
    return store.postgres if hasattr(store, "postgres") else store.sqlite
