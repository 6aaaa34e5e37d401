"""The activity log (every request) and keys' lastUsedAt, written in batches by the ticker so the
request path only appends to memory."""

from __future__ import annotations

from collections.abc import Sequence

import apsw

ActivityRow = tuple[str, str | None, str | None, str, str, int, float, str]
# (at, tenant_id, key_id, method, route, status, duration_ms, request_id)


class Activity:
    """The activity log and keys' lastUsedAt."""

    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def append(self, rows: Sequence[ActivityRow]) -> None:
        self._conn.executemany(
            "INSERT INTO activity_log(at, tenant_id, key_id, method, route, status, duration_ms, request_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        last_used: dict[str, str] = {}
        for at, _, key_id, *_ in rows:
            if key_id:
                last_used[key_id] = at
        self._conn.executemany(
            "UPDATE api_keys SET last_used_at = ? WHERE key_id = ?",
            [(at, key_id) for key_id, at in last_used.items()],
        )

    def page(self, tenant_id: str, before_id: int | None, limit: int) -> list[tuple]:
        """(id, key name, method, route, status, duration_ms, at, request_id, key or user id) of
        the tenant's requests, newest first, below the row id `before_id` when given."""
        return self._conn.execute(
            "SELECT a.id, k.name, a.method, a.route, a.status, a.duration_ms, a.at, a.request_id, a.key_id"
            " FROM activity_log a LEFT JOIN api_keys k ON k.key_id = a.key_id"
            " WHERE a.tenant_id = ? AND a.id < ? ORDER BY a.id DESC LIMIT ?",
            (tenant_id, before_id if before_id is not None else 2**63 - 1, limit),
        ).fetchall()

    def recent(self, tenant_id: str, limit: int = 100) -> list[tuple]:
        return self._conn.execute(
            "SELECT at, key_id, method, route, status, duration_ms, request_id FROM activity_log"
            " WHERE tenant_id = ? ORDER BY id DESC LIMIT ?",
            (tenant_id, limit),
        ).fetchall()

    def purge(self, before: str) -> int:
        self._conn.execute("DELETE FROM activity_log WHERE at < ?", (before,))
        return self._conn.changes()
