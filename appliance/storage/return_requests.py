"""Buyers' return requests (services/return_requests.py): one row each, decided once."""

from __future__ import annotations

import apsw

from appliance.domain.returns import ReturnRequest

_FIELDS = ReturnRequest.__struct_fields__  # the columns, in the struct's order
_COLUMNS = ", ".join(_FIELDS)


def _request(row: tuple | None) -> ReturnRequest | None:
    return ReturnRequest(**dict(zip(_FIELDS, row))) if row is not None else None


class ReturnRequests:
    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def insert(self, tenant_id: str, request: ReturnRequest) -> None:
        self._conn.execute(f"INSERT INTO return_requests(tenant_id, {_COLUMNS}) VALUES (?{', ?' * len(_FIELDS)})",
                           (tenant_id, *(getattr(request, name) for name in _FIELDS)))

    def get(self, tenant_id: str, request_id: str) -> ReturnRequest | None:
        return _request(self._conn.execute(f"SELECT {_COLUMNS} FROM return_requests WHERE tenant_id = ?"
                                           " AND request_id = ?", (tenant_id, request_id)).fetchone())

    def open_for_lead(self, tenant_id: str, lead_id: str) -> ReturnRequest | None:
        return _request(self._conn.execute(f"SELECT {_COLUMNS} FROM return_requests WHERE tenant_id = ?"
                                           " AND lead_id = ? AND state = 'pending'", (tenant_id, lead_id)).fetchone())

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

    def page(self, tenant_id: str, state: str | None, before_id: str | None, limit: int) -> list[ReturnRequest]:
        """Newest first, below `before_id` when given."""
        sql = f"SELECT {_COLUMNS} FROM return_requests WHERE tenant_id = ? AND request_id < ?"
        args: list[object] = [tenant_id, before_id or "~"]
        if state is not None:
            sql += " AND state = ?"
            args.append(state)
        return [_request(row) for row in self._conn.execute(sql + " ORDER BY request_id DESC LIMIT ?",
                                                            (*args, limit))]  # type: ignore[misc]
