"""Suppression lists: a tenant's named lists of contact values nobody may be sold, kept as
SHA-256 digests only (appliance/domain/suppression makes them), one row per (list, digest) in a
table without rowids, so a check is one primary-key lookup per (list, digest)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import apsw

from appliance.domain.suppression import SMS_OPT_OUTS

SuppressionListRow = tuple[str, str, str, int]  # (list_id, name, created_at, entry count)


class Suppression:
    """Suppression lists and their entries."""

    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def create_list(self, tenant_id: str, list_id: str, name: str, created_at: str) -> None:
        self._conn.execute(
            "INSERT INTO suppression_lists(list_id, tenant_id, name, created_at) VALUES (?, ?, ?, ?)",
            (list_id, tenant_id, name, created_at))

    def get_list(self, tenant_id: str, list_id: str) -> SuppressionListRow | None:
        found = self._conn.execute(
            "SELECT list_id, name, created_at, entry_count FROM suppression_lists WHERE list_id = ? AND tenant_id = ?",
            (list_id, tenant_id)).fetchone()
        return tuple(found) if found else None

    def list_lists(self, tenant_id: str, after: str | None, limit: int) -> list[SuppressionListRow]:
        """The tenant's lists in listId order, after `after`."""
        return [tuple(row) for row in self._conn.execute(
            "SELECT list_id, name, created_at, entry_count FROM suppression_lists WHERE tenant_id = ? AND list_id > ?"
            " ORDER BY list_id LIMIT ?", (tenant_id, after or "", limit))]

    def list_ids(self, tenant_id: str) -> list[str]:
        return [list_id for (list_id,) in self._conn.execute(
            "SELECT list_id FROM suppression_lists WHERE tenant_id = ?", (tenant_id,))]

    def add_many(self, list_id: str, hashes: Iterable[bytes]) -> int:
        """Adds the digests not yet on the list; returns how many were new."""
        before = self._conn.total_changes()
        self._conn.executemany("INSERT OR IGNORE INTO suppression_entries(list_id, hash) VALUES (?, ?)",
                               ((list_id, h) for h in hashes))
        added = self._conn.total_changes() - before
        self._count_by(list_id, added)
        return added

    def remove_many(self, list_id: str, hashes: Iterable[bytes]) -> int:
        """Removes the digests on the list; returns how many were there."""
        before = self._conn.total_changes()
        self._conn.executemany("DELETE FROM suppression_entries WHERE list_id = ? AND hash = ?",
                               ((list_id, h) for h in hashes))
        removed = self._conn.total_changes() - before
        self._count_by(list_id, -removed)
        return removed

    def _count_by(self, list_id: str, delta: int) -> None:
        if delta:
            self._conn.execute("UPDATE suppression_lists SET entry_count = entry_count + ? WHERE list_id = ?",
                               (delta, list_id))

    def count(self, list_id: str) -> int:
        """The list's entries (kept as a column: no scan of a million rows)."""
        found = self._conn.execute("SELECT entry_count FROM suppression_lists WHERE list_id = ?",
                                   (list_id,)).fetchone()
        return found[0] if found else 0

    def first_match(self, tenant_id: str, list_ids: Sequence[str], hashes: Sequence[bytes]) -> str | None:
        """The first of `list_ids` (the tenant's) holding any of `hashes`, or None: one query, a
        primary-key probe per (list, digest). `sms-opt-outs` is the tenant's SMS opt-outs (kept by
        the SMS webhooks alone: it is no list of `suppression_lists`, so the lists API cannot
        change it)."""
        if not list_ids or not hashes:
            return None
        if SMS_OPT_OUTS in list_ids:
            digests = ",".join("?" * len(hashes))
            if self._conn.execute(f"SELECT 1 FROM sms_opt_outs WHERE tenant_id = ? AND hash IN ({digests}) LIMIT 1",
                                  (tenant_id, *hashes)).fetchone() is not None:
                return SMS_OPT_OUTS
            list_ids = [list_id for list_id in list_ids if list_id != SMS_OPT_OUTS]
            if not list_ids:
                return None
        lists = ",".join("?" * len(list_ids))
        digests = ",".join("?" * len(hashes))
        found = self._conn.execute(
            f"SELECT e.list_id FROM suppression_entries e JOIN suppression_lists l ON l.list_id = e.list_id"
            f" WHERE e.list_id IN ({lists}) AND e.hash IN ({digests}) AND l.tenant_id = ? LIMIT 1",
            (*list_ids, *hashes, tenant_id)).fetchone()
        return found[0] if found else None
