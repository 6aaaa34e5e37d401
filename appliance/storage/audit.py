"""The audit log: who changed what, appended in the transaction of the change itself (a change
that rolls back leaves no entry), never updated; purged after `[retention] audit_days`."""

from __future__ import annotations

from typing import NamedTuple

import apsw


class AuditRow(NamedTuple):
    seq: int
    audit_id: str
    at: str
    actor: str
    action: str
    target: str | None
    before: str | None  # JSON text
    after: str | None
    ip: str | None
    request_id: str | None


class AuditFilter(NamedTuple):
    actor: str | None = None
    action: str | None = None
    start: str | None = None  # ISO UTC, inclusive
    end: str | None = None    # ISO UTC, exclusive


class Audit:
    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def append(self, tenant_id: str, audit_id: str, at: str, actor: str, action: str, target: str | None,
               before: str | None, after: str | None, ip: str | None, request_id: str | None) -> None:
        self._conn.execute(
            "INSERT INTO audit_log(audit_id, tenant_id, at, actor, action, target, before, after, ip, request_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (audit_id, tenant_id, at, actor, action, target, before, after, ip, request_id))

    def page(self, tenant_id: str, where: AuditFilter, before_seq: int | None, limit: int) -> list[AuditRow]:
        """The tenant's entries matching `where`, newest first, below `before_seq` when given."""
        sql = ["SELECT seq, audit_id, at, actor, action, target, before, after, ip, request_id FROM audit_log"
               " WHERE tenant_id = ? AND seq < ?"]
        args: list[object] = [tenant_id, before_seq if before_seq is not None else 2**63 - 1]
        for clause, value in (("actor = ?", where.actor), ("action = ?", where.action), ("at >= ?", where.start),
                              ("at < ?", where.end)):
            if value is not None:
                sql.append(clause)
                args.append(value)
        return [AuditRow(*row) for row in self._conn.execute(
            " AND ".join(sql) + " ORDER BY seq DESC LIMIT ?", (*args, limit))]

    def purge(self, before: str) -> int:
        self._conn.execute("DELETE FROM audit_log WHERE at < ?", (before,))
        return self._conn.changes()
