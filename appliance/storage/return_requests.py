"""Buyers' return requests (services/return_requests.py): one row each, decided once."""

from __future__ import annotations

from typing import NamedTuple

import apsw

_COLUMNS = ("request_id, lead_id, client_id, state, reason, note, requested_by, created_at, decided_by, decided_at,"
            " decision_note")


class ReturnRequestRow(NamedTuple):
    request_id: str
    lead_id: str
    client_id: str | None
    state: str
    reason: str
    note: str | None
    requested_by: str
    created_at: str
    decided_by: str | None
    decided_at: str | None
    decision_note: str | None


class ReturnRequests:
    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def insert(self, tenant_id: str, row: ReturnRequestRow) -> None:
        self._conn.execute(f"INSERT INTO return_requests(tenant_id, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
                           " ?, ?)", (tenant_id, *row))

    def get(self, tenant_id: str, request_id: str) -> ReturnRequestRow | None:
        found = self._conn.execute(f"SELECT {_COLUMNS} FROM return_requests WHERE tenant_id = ? AND request_id = ?",
                                   (tenant_id, request_id)).fetchone()
        return ReturnRequestRow(*found) if found else None

    def open_for_lead(self, tenant_id: str, lead_id: str) -> ReturnRequestRow | None:
        found = self._conn.execute(f"SELECT {_COLUMNS} FROM return_requests WHERE tenant_id = ? AND lead_id = ?"
                                   " AND state = 'pending'", (tenant_id, lead_id)).fetchone()
        return ReturnRequestRow(*found) if found else None

    def decide(self, tenant_id: str, request_id: str, state: str, decided_by: str, decided_at: str,
               note: str | None) -> None:
        self._conn.execute("UPDATE return_requests SET state = ?, decided_by = ?, decided_at = ?, decision_note = ?"
                           " WHERE tenant_id = ? AND request_id = ?",
                           (state, decided_by, decided_at, note, tenant_id, request_id))

    def count_recent(self, tenant_id: str, client_id: str, since: str) -> int:
        """The client's requests pending or approved made since `since`."""
        return self._conn.execute(
            "SELECT count(*) FROM return_requests WHERE tenant_id = ? AND client_id = ? AND created_at >= ?"
            " AND state IN ('pending', 'approved')", (tenant_id, client_id, since)).fetchone()[0]

    def page(self, tenant_id: str, state: str | None, before_id: str | None, limit: int) -> list[ReturnRequestRow]:
        """Newest first, below `before_id` when given."""
        sql = f"SELECT {_COLUMNS} FROM return_requests WHERE tenant_id = ? AND request_id < ?"
        args: list[object] = [tenant_id, before_id or "~"]
        if state is not None:
            sql += " AND state = ?"
            args.append(state)
        return [ReturnRequestRow(*row) for row in self._conn.execute(sql + " ORDER BY request_id DESC LIMIT ?",
                                                                     (*args, limit))]
