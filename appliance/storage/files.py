"""File references: one row per (tenant, lead, fileKey), the API document kept
as JSON so reads splice it into responses as stored."""

from __future__ import annotations

import apsw


class Files:
    """File references attached to leads."""

    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def find(self, tenant_id: str, lead_id: str, file_key: str) -> bytes | None:
        found = self._conn.execute(
            "SELECT doc FROM files WHERE tenant_id = ? AND lead_id = ? AND file_key = ?", (tenant_id, lead_id, file_key)
        ).fetchone()
        return found[0] if found else None

    def insert(self, tenant_id: str, *, file_id: str, lead_id: str, file_key: str, created_at: str,
               doc: bytes) -> None:
        self._conn.execute(
            "INSERT INTO files(file_id, tenant_id, lead_id, file_key, created_at, updated_at, doc)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (file_id, tenant_id, lead_id, file_key, created_at, created_at, doc),
        )

    def update(self, tenant_id: str, *, file_id: str, updated_at: str, doc: bytes) -> None:
        self._conn.execute("UPDATE files SET updated_at = ?, doc = ? WHERE file_id = ? AND tenant_id = ?",
                           (updated_at, doc, file_id, tenant_id))

    def docs_of(self, tenant_id: str, lead_id: str) -> list[bytes]:
        """The lead's file references, oldest first."""
        return [doc for (doc,) in self._conn.execute(
            "SELECT doc FROM files WHERE tenant_id = ? AND lead_id = ? ORDER BY file_id", (tenant_id, lead_id))]
