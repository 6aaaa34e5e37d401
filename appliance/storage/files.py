"""File references: one row per (tenant, lead, fileKey), the API document kept
as JSON so reads splice it into responses as stored."""

from __future__ import annotations

import apsw


def find(conn: apsw.Connection, tenant_id: str, lead_id: str, file_key: str) -> bytes | None:
    found = conn.execute(
        "SELECT doc FROM files WHERE tenant_id = ? AND lead_id = ? AND file_key = ?", (tenant_id, lead_id, file_key)
    ).fetchone()
    return found[0] if found else None


def insert(conn: apsw.Connection, tenant_id: str, *, file_id: str, lead_id: str, file_key: str, created_at: str,
           doc: bytes) -> None:
    conn.execute(
        "INSERT INTO files(file_id, tenant_id, lead_id, file_key, created_at, updated_at, doc)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (file_id, tenant_id, lead_id, file_key, created_at, created_at, doc),
    )


def update(conn: apsw.Connection, tenant_id: str, *, file_id: str, updated_at: str, doc: bytes) -> None:
    conn.execute("UPDATE files SET updated_at = ?, doc = ? WHERE file_id = ? AND tenant_id = ?",
                 (updated_at, doc, file_id, tenant_id))


def docs_of(conn: apsw.Connection, tenant_id: str, lead_id: str) -> list[bytes]:
    """The lead's file references, oldest first."""
    return [doc for (doc,) in conn.execute(
        "SELECT doc FROM files WHERE tenant_id = ? AND lead_id = ? ORDER BY file_id", (tenant_id, lead_id))]
