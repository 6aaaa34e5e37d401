"""CSV lead imports (migration m012): one row per import with its counters, advanced in the same
transaction as the leads it writes, so the counts are what was committed."""

from __future__ import annotations

import json
from dataclasses import dataclass

import apsw

MAX_ERRORS = 100  # failed rows kept with their details: the first ones


@dataclass(frozen=True)
class ImportRecord:
    import_id: str
    campaign_id: str
    file_name: str | None
    process: bool
    columns: dict[str, str]
    state: str
    total: int
    processed: int
    created: int
    failed: int
    errors: list[dict]
    reason: str | None
    created_at: str
    updated_at: str
    finished_at: str | None


_COLUMNS = ("import_id, campaign_id, file_name, process, columns, state, total, processed, created, failed, errors,"
            " reason, created_at, updated_at, finished_at")


def _record(row: tuple) -> ImportRecord:
    (import_id, campaign_id, file_name, process, columns, state, total, processed, created, failed, errors, reason,
     created_at, updated_at, finished_at) = row
    return ImportRecord(import_id, campaign_id, file_name, bool(process), json.loads(columns), state, total,
                        processed, created, failed, json.loads(errors), reason, created_at, updated_at, finished_at)


class Imports:
    """Lead imports and their progress."""

    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def create(self, tenant_id: str, import_id: str, campaign_id: str, file_name: str | None, process: bool,
               columns: dict[str, str], total: int, now: str) -> None:
        self._conn.execute(
            "INSERT INTO lead_imports(import_id, tenant_id, campaign_id, file_name, process, columns, state, total,"
            " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, 'running', ?, ?, ?)",
            (import_id, tenant_id, campaign_id, file_name, int(process), json.dumps(columns), total, now, now))

    def running_count(self, tenant_id: str) -> int:
        return self._conn.execute("SELECT count(*) FROM lead_imports WHERE tenant_id = ? AND state = 'running'",
                                  (tenant_id,)).fetchone()[0]

    def get(self, tenant_id: str, import_id: str) -> ImportRecord | None:
        found = self._conn.execute(f"SELECT {_COLUMNS} FROM lead_imports WHERE import_id = ? AND tenant_id = ?",
                                   (import_id, tenant_id)).fetchone()
        return _record(found) if found else None

    def advance(self, import_id: str, *, created: int, failed: list[dict], now: str) -> None:
        """Count `created` leads and the rows in `failed` ({row, details}; the first MAX_ERRORS
        of the import are kept)."""
        self._conn.execute(
            "UPDATE lead_imports SET processed = processed + ?, created = created + ?, failed = failed + ?,"
            " updated_at = ? WHERE import_id = ?", (created + len(failed), created, len(failed), now, import_id))
        if failed:
            (kept,) = self._conn.execute("SELECT errors FROM lead_imports WHERE import_id = ?", (import_id,)).fetchone()
            errors = json.loads(kept)
            if len(errors) < MAX_ERRORS:
                self._conn.execute("UPDATE lead_imports SET errors = ? WHERE import_id = ?",
                                   (json.dumps((errors + failed)[:MAX_ERRORS]), import_id))

    def finish(self, import_id: str, state: str, reason: str | None, now: str) -> None:
        self._conn.execute("UPDATE lead_imports SET state = ?, reason = ?, updated_at = ?, finished_at = ?"
                           " WHERE import_id = ? AND state = 'running'", (state, reason, now, now, import_id))

    def fail_running(self, reason: str, now: str) -> int:
        """Every import still `running` ends `failed` with `reason`: one process owns an SQLite
        install, and it calls this when it runs none."""
        self._conn.execute("UPDATE lead_imports SET state = 'failed', reason = ?, updated_at = ?, finished_at = ?"
                           " WHERE state = 'running'", (reason, now, now))
        return self._conn.changes()
