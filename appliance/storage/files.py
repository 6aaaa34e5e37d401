"""File references: one row per (tenant, lead, fileKey), the API document kept
as JSON so reads splice it into responses as stored; a document sent for e-signature is also
found by its provider's id (`esign_ref`), and its signed file is kept in `file_contents`."""

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
               doc: bytes, esign_ref: str | None = None) -> None:
        self._conn.execute(
            "INSERT INTO files(file_id, tenant_id, lead_id, file_key, created_at, updated_at, doc, esign_ref)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (file_id, tenant_id, lead_id, file_key, created_at, created_at, doc, esign_ref),
        )

    def update(self, tenant_id: str, *, file_id: str, updated_at: str, doc: bytes) -> None:
        self._conn.execute("UPDATE files SET updated_at = ?, doc = ? WHERE file_id = ? AND tenant_id = ?",
                           (updated_at, doc, file_id, tenant_id))

    def set_esign_ref(self, tenant_id: str, file_id: str, esign_ref: str | None) -> None:
        self._conn.execute("UPDATE files SET esign_ref = ? WHERE file_id = ? AND tenant_id = ?",
                           (esign_ref, file_id, tenant_id))

    def esign_refs_of(self, tenant_id: str, lead_id: str) -> dict[str, str]:
        """file id -> esign_ref of the lead's references the e-signature step wrote."""
        return dict(self._conn.execute(
            "SELECT file_id, esign_ref FROM files WHERE tenant_id = ? AND lead_id = ? AND esign_ref IS NOT NULL",
            (tenant_id, lead_id)).fetchall())

    def is_esign_managed(self, tenant_id: str, lead_id: str, file_key: str) -> bool:
        return self._conn.execute(
            "SELECT 1 FROM files WHERE tenant_id = ? AND lead_id = ? AND file_key = ? AND esign_ref IS NOT NULL",
            (tenant_id, lead_id, file_key)).fetchone() is not None

    def find_by_esign_ref(self, tenant_id: str, esign_ref: str) -> tuple[str, bytes] | None:
        """(lead id, file reference) of the document a provider calls `esign_ref`."""
        found = self._conn.execute(
            "SELECT lead_id, doc FROM files WHERE tenant_id = ? AND esign_ref = ? ORDER BY file_id DESC LIMIT 1",
            (tenant_id, esign_ref)).fetchone()
        return (found[0], found[1]) if found else None

    def keep_content(self, tenant_id: str, file_id: str, content_type: str, content: bytes, now: str) -> None:
        """The file itself (a signed document), replacing what was kept before."""
        self.drop_content(tenant_id, file_id)
        self._conn.execute(
            "INSERT INTO file_contents(file_id, tenant_id, content_type, content, created_at) VALUES (?, ?, ?, ?, ?)",
            (file_id, tenant_id, content_type, content, now))

    def drop_content(self, tenant_id: str, file_id: str) -> None:
        self._conn.execute("DELETE FROM file_contents WHERE file_id = ? AND tenant_id = ?", (file_id, tenant_id))

    def content(self, tenant_id: str, lead_id: str, file_key: str) -> tuple[str, bytes] | None:
        """(content type, bytes) of the file kept for a file reference."""
        found = self._conn.execute(
            "SELECT c.content_type, c.content FROM files f JOIN file_contents c ON c.file_id = f.file_id"
            " WHERE f.tenant_id = ? AND f.lead_id = ? AND f.file_key = ?", (tenant_id, lead_id, file_key)).fetchone()
        return (found[0], bytes(found[1])) if found else None

    def kept_ids(self, tenant_id: str, lead_id: str) -> set[str]:
        """The lead's file ids whose file is kept."""
        return {file_id for (file_id,) in self._conn.execute(
            "SELECT c.file_id FROM files f JOIN file_contents c ON c.file_id = f.file_id"
            " WHERE f.tenant_id = ? AND f.lead_id = ?", (tenant_id, lead_id))}

    def docs_of(self, tenant_id: str, lead_id: str) -> list[bytes]:
        """The lead's file references, oldest first."""
        return [doc for (doc,) in self._conn.execute(
            "SELECT doc FROM files WHERE tenant_id = ? AND lead_id = ? ORDER BY file_id", (tenant_id, lead_id))]
