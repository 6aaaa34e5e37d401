"""Console sign-ins: one row per session, keyed by the SHA-256 of the cookie's token. A session
belongs to a user and lives while the user is active; `stage` is `live`, or the step its user
still owes before the pages open (`code`: the TOTP code, `enrol`: two-factor enrolment that the
tenant requires)."""

from __future__ import annotations

from typing import NamedTuple

import apsw


class ConsoleSessionRecord(NamedTuple):
    tenant_id: str
    user_id: str
    role: str
    email: str
    stage: str
    config_rev: int
    csrf_token: str
    expires_at: str
    two_factor: bool  # the user has turned two-factor on
    settings: str     # the tenant's settings (JSON): whether it requires two-factor


class ConsoleSessions:
    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def insert(self, session_hash: bytes, tenant_id: str, user_id: str, stage: str, csrf_token: str,
               created_at: str, expires_at: str) -> None:
        self._conn.execute(
            "INSERT INTO console_sessions(session_hash, tenant_id, user_id, stage, csrf_token, created_at, expires_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)", (session_hash, tenant_id, user_id, stage, csrf_token, created_at,
                                              expires_at))

    def find_live(self, session_hash: bytes, now: str) -> ConsoleSessionRecord | None:
        """The session if it has not expired and its user is active (timestamps are ISO UTC text
        of one width, so they compare as strings)."""
        found = self._conn.execute(
            "SELECT s.tenant_id, s.user_id, u.role, u.email, s.stage, t.config_rev, s.csrf_token, s.expires_at,"
            " u.totp_secret IS NOT NULL, t.settings"
            " FROM console_sessions s JOIN users u ON u.user_id = s.user_id AND u.active = 1"
            " JOIN tenants t ON t.tenant_id = s.tenant_id WHERE s.session_hash = ? AND s.expires_at > ?",
            (session_hash, now)).fetchone()
        return ConsoleSessionRecord(*found[:8], bool(found[8]), found[9]) if found else None

    def set_stage(self, session_hash: bytes, stage: str, expires_at: str) -> None:
        self._conn.execute("UPDATE console_sessions SET stage = ?, expires_at = ? WHERE session_hash = ?",
                           (stage, expires_at, session_hash))

    def delete(self, session_hash: bytes) -> None:
        self._conn.execute("DELETE FROM console_sessions WHERE session_hash = ?", (session_hash,))

    def delete_of_user(self, user_id: str) -> int:
        self._conn.execute("DELETE FROM console_sessions WHERE user_id = ?", (user_id,))
        return self._conn.changes()

    def purge_expired(self, now: str) -> int:
        self._conn.execute("DELETE FROM console_sessions WHERE expires_at <= ?", (now,))
        return self._conn.changes()
