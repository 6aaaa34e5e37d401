"""The admin console's sessions: one row per sign-in, keyed by the SHA-256 of the cookie's token."""

from __future__ import annotations

from typing import NamedTuple

import apsw


class ConsoleSessionRecord(NamedTuple):
    tenant_id: str
    key_id: str
    kind: str
    source_id: str | None
    config_rev: int
    csrf_token: str
    expires_at: str


class ConsoleSessions:
    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def insert(self, session_hash: bytes, tenant_id: str, key_id: str, csrf_token: str, created_at: str,
               expires_at: str) -> None:
        self._conn.execute(
            "INSERT INTO console_sessions(session_hash, tenant_id, key_id, csrf_token, created_at, expires_at)"
            " VALUES (?, ?, ?, ?, ?, ?)", (session_hash, tenant_id, key_id, csrf_token, created_at, expires_at))

    def find_live(self, session_hash: bytes, now: str) -> ConsoleSessionRecord | None:
        """The session if it has not expired and its key is not revoked (timestamps are ISO UTC
        text of one width, so they compare as strings)."""
        found = self._conn.execute(
            "SELECT s.tenant_id, s.key_id, k.kind, k.source_id, t.config_rev, s.csrf_token, s.expires_at"
            " FROM console_sessions s JOIN api_keys k ON k.key_id = s.key_id AND k.revoked_at IS NULL"
            " JOIN tenants t ON t.tenant_id = s.tenant_id WHERE s.session_hash = ? AND s.expires_at > ?",
            (session_hash, now)).fetchone()
        return ConsoleSessionRecord(*found) if found else None

    def delete(self, session_hash: bytes) -> None:
        self._conn.execute("DELETE FROM console_sessions WHERE session_hash = ?", (session_hash,))

    def delete_of_key(self, key_id: str) -> int:
        self._conn.execute("DELETE FROM console_sessions WHERE key_id = ?", (key_id,))
        return self._conn.changes()

    def purge_expired(self, now: str) -> int:
        self._conn.execute("DELETE FROM console_sessions WHERE expires_at <= ?", (now,))
        return self._conn.changes()
