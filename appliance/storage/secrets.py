"""Sealed secrets by owner reference; the plaintext never reaches this module."""

from __future__ import annotations

import apsw
import msgspec


class Secrets:
    """Sealed secrets by reference (sealing is crypto.py's; this stores the sealed bytes)."""

    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def put(self, tenant_id: str, ref: str, sealed: bytes, now: str) -> None:
        self._conn.execute(
            "INSERT INTO secrets(tenant_id, ref, sealed, updated_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT(tenant_id, ref) DO UPDATE SET sealed = excluded.sealed, updated_at = excluded.updated_at",
            (tenant_id, ref, sealed, now),
        )

    def delete(self, tenant_id: str, ref: str) -> None:
        self._conn.execute("DELETE FROM secrets WHERE tenant_id = ? AND ref = ?", (tenant_id, ref))

    def get(self, tenant_id: str, ref: str) -> bytes | None:
        found = self._conn.execute(
            "SELECT sealed FROM secrets WHERE tenant_id = ? AND ref = ?", (tenant_id, ref)
        ).fetchone()
        return found[0] if found else None

    def key_id_in_use(self) -> str | None:
        """The master key id one stored secret was sealed under (every one is sealed under the same),
        or None before the first secret."""
        found = self._conn.execute("SELECT sealed FROM secrets LIMIT 1").fetchone()
        if found is None:
            return None
        return msgspec.json.decode(found[0], type=dict).get("kmsKeyId")
