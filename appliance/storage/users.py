"""People of a tenant (staff and parties), their one-time setup links and the sign-in throttle."""

from __future__ import annotations

from typing import NamedTuple

import apsw

_COLUMNS = ("user_id, tenant_id, email, name, role, client_id, supplier_id, active, password_hash, totp_secret,"
            " totp_pending, totp_last_step, recovery_codes, created_at, last_sign_in_at")


class UserRecord(NamedTuple):
    user_id: str
    tenant_id: str
    email: str
    name: str
    role: str
    client_id: str | None
    supplier_id: str | None
    active: bool
    password_hash: str | None
    totp_secret: bytes | None   # sealed
    totp_pending: bytes | None  # sealed
    totp_last_step: int | None
    recovery_codes: str         # JSON list of SHA-256 hex
    created_at: str
    last_sign_in_at: str | None


def _user(row: tuple | None) -> UserRecord | None:
    if row is None:
        return None
    values = list(row)
    values[7] = bool(values[7])
    for i in (9, 10):
        values[i] = bytes(values[i]) if values[i] is not None else None
    return UserRecord(*values)


class Users:
    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    # ---- users -----------------------------------------------------------------------------------

    def insert(self, user_id: str, tenant_id: str, email: str, name: str, role: str, client_id: str | None,
               supplier_id: str | None, now: str) -> None:
        self._conn.execute(
            "INSERT INTO users(user_id, tenant_id, email, name, role, client_id, supplier_id, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (user_id, tenant_id, email, name, role, client_id, supplier_id, now))

    def get(self, tenant_id: str, user_id: str) -> UserRecord | None:
        return _user(self._conn.execute(f"SELECT {_COLUMNS} FROM users WHERE tenant_id = ? AND user_id = ?",
                                        (tenant_id, user_id)).fetchone())

    def get_any(self, user_id: str) -> UserRecord | None:
        """A user of any tenant (a setup link or a session names the user, not the tenant)."""
        return _user(self._conn.execute(f"SELECT {_COLUMNS} FROM users WHERE user_id = ?", (user_id,)).fetchone())

    def by_email(self, tenant_id: str, email: str) -> UserRecord | None:
        return _user(self._conn.execute(f"SELECT {_COLUMNS} FROM users WHERE tenant_id = ? AND email = ?",
                                        (tenant_id, email)).fetchone())

    def all_by_email(self, email: str) -> list[UserRecord]:
        """The users of every tenant with this address (sign-in does not name a tenant)."""
        return [_user(row) for row in self._conn.execute(  # type: ignore[misc]
            f"SELECT {_COLUMNS} FROM users WHERE email = ? ORDER BY tenant_id", (email,))]

    def page(self, tenant_id: str, after_id: str | None, limit: int) -> list[UserRecord]:
        return [_user(row) for row in self._conn.execute(  # type: ignore[misc]
            f"SELECT {_COLUMNS} FROM users WHERE tenant_id = ? AND user_id > ? ORDER BY user_id LIMIT ?",
            (tenant_id, after_id or "", limit))]

    def count_active_owners(self, tenant_id: str) -> int:
        return self._conn.execute("SELECT count(*) FROM users WHERE tenant_id = ? AND role = 'owner' AND active = 1",
                                  (tenant_id,)).fetchone()[0]

    def update(self, user_id: str, *, name: str, role: str, active: bool) -> None:
        self._conn.execute("UPDATE users SET name = ?, role = ?, active = ? WHERE user_id = ?",
                           (name, role, int(active), user_id))

    def set_password(self, user_id: str, password_hash: str | None) -> None:
        self._conn.execute("UPDATE users SET password_hash = ? WHERE user_id = ?", (password_hash, user_id))

    def set_two_factor(self, user_id: str, *, secret: bytes | None, pending: bytes | None, last_step: int | None,
                       recovery_codes: str) -> None:
        self._conn.execute(
            "UPDATE users SET totp_secret = ?, totp_pending = ?, totp_last_step = ?, recovery_codes = ?"
            " WHERE user_id = ?", (secret, pending, last_step, recovery_codes, user_id))

    def signed_in(self, user_id: str, now: str) -> None:
        self._conn.execute("UPDATE users SET last_sign_in_at = ? WHERE user_id = ?", (now, user_id))

    # ---- setup links -------------------------------------------------------------------------------

    def insert_setup_token(self, token_hash: bytes, user_id: str, now: str, expires_at: str) -> None:
        """A new link; the user's earlier unused ones stop working (only the newest is valid)."""
        self._conn.execute("UPDATE setup_tokens SET used_at = ? WHERE user_id = ? AND used_at IS NULL",
                           (now, user_id))
        self._conn.execute("INSERT INTO setup_tokens(token_hash, user_id, created_at, expires_at)"
                           " VALUES (?, ?, ?, ?)", (token_hash, user_id, now, expires_at))

    def setup_token(self, token_hash: bytes) -> tuple[str, str, str | None] | None:
        """(user id, expires_at, used_at) of a link."""
        found = self._conn.execute("SELECT user_id, expires_at, used_at FROM setup_tokens WHERE token_hash = ?",
                                   (token_hash,)).fetchone()
        return tuple(found) if found else None  # type: ignore[return-value]

    def use_setup_token(self, token_hash: bytes, now: str) -> bool:
        self._conn.execute("UPDATE setup_tokens SET used_at = ? WHERE token_hash = ? AND used_at IS NULL"
                           " AND expires_at > ?", (now, token_hash, now))
        return self._conn.changes() > 0

    def purge_setup_tokens(self, before: str) -> int:
        """Links used or expired before `before`."""
        self._conn.execute("DELETE FROM setup_tokens WHERE coalesce(used_at, expires_at) < ?", (before,))
        return self._conn.changes()

    # ---- the sign-in throttle ----------------------------------------------------------------------

    def throttle(self, subject: str) -> tuple[int, str] | None:
        """(failures in a row, blocked until) of 'email:<address>' or 'ip:<address>'."""
        found = self._conn.execute("SELECT failures, blocked_until FROM sign_in_throttle WHERE subject = ?",
                                   (subject,)).fetchone()
        return tuple(found) if found else None  # type: ignore[return-value]

    def set_throttle(self, subject: str, failures: int, blocked_until: str, now: str) -> None:
        self._conn.execute(
            "INSERT INTO sign_in_throttle(subject, failures, blocked_until, updated_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT(subject) DO UPDATE SET failures = excluded.failures,"
            " blocked_until = excluded.blocked_until, updated_at = excluded.updated_at",
            (subject, failures, blocked_until, now))

    def clear_throttle(self, subject: str) -> None:
        self._conn.execute("DELETE FROM sign_in_throttle WHERE subject = ?", (subject,))

    def purge_throttle(self, before: str) -> int:
        self._conn.execute("DELETE FROM sign_in_throttle WHERE updated_at < ?", (before,))
        return self._conn.changes()
