"""The activity log (every request) and keys' lastUsedAt, written in batches by the ticker so the
request path only appends to memory."""

from __future__ import annotations

from collections.abc import Sequence

import apsw

ActivityRow = tuple[str, str | None, str | None, str, str, int, float, str]
# (at, tenant_id, key_id, method, route, status, duration_ms, request_id)


def append_activity(conn: apsw.Connection, rows: Sequence[ActivityRow]) -> None:
    conn.executemany(
        "INSERT INTO activity_log(at, tenant_id, key_id, method, route, status, duration_ms, request_id)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    last_used: dict[str, str] = {}
    for at, _, key_id, *_ in rows:
        if key_id:
            last_used[key_id] = at
    conn.executemany(
        "UPDATE api_keys SET last_used_at = ? WHERE key_id = ?",
        [(at, key_id) for key_id, at in last_used.items()],
    )


def recent_activity(conn: apsw.Connection, tenant_id: str, limit: int = 100) -> list[tuple]:
    return conn.execute(
        "SELECT at, key_id, method, route, status, duration_ms, request_id FROM activity_log"
        " WHERE tenant_id = ? ORDER BY id DESC LIMIT ?",
        (tenant_id, limit),
    ).fetchall()


def purge_activity(conn: apsw.Connection, before: str) -> int:
    conn.execute("DELETE FROM activity_log WHERE at < ?", (before,))
    return conn.changes()
