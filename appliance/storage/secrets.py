"""Sealed secrets by owner reference; the plaintext never reaches this module."""

from __future__ import annotations

import apsw


def put_sealed(conn: apsw.Connection, tenant_id: str, ref: str, sealed: bytes, now: str) -> None:
    conn.execute(
        "INSERT INTO secrets(tenant_id, ref, sealed, updated_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT(tenant_id, ref) DO UPDATE SET sealed = excluded.sealed, updated_at = excluded.updated_at",
        (tenant_id, ref, sealed, now),
    )


def get_sealed(conn: apsw.Connection, tenant_id: str, ref: str) -> bytes | None:
    found = conn.execute(
        "SELECT sealed FROM secrets WHERE tenant_id = ? AND ref = ?", (tenant_id, ref)
    ).fetchone()
    return found[0] if found else None


def refs_with_prefix(conn: apsw.Connection, tenant_id: str, prefix: str) -> list[str]:
    return [
        ref
        for (ref,) in conn.execute(
            "SELECT ref FROM secrets WHERE tenant_id = ? AND ref >= ? AND ref < ?",
            (tenant_id, prefix, prefix + "\uffff"),
        )
    ]
