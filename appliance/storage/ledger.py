"""Money entries per lead: cost, revenue and returns, as they were when earned."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import apsw

from appliance.domain.ledger import LedgerLine
from appliance.ids import new_id

_COLUMNS = ("entry_id, lead_id, submission_id, campaign_id, client_id, source_id, delivery_endpoint_id, kind,"
            " amount, currency, lead_status, created_at")


@dataclass(frozen=True)
class LedgerFilter:
    lead_id: str | None = None
    campaign_ids: tuple[str, ...] = ()
    client_ids: tuple[str, ...] = ()
    source_ids: tuple[str, ...] = ()
    kind: str | None = None
    after_id: str | None = None    # lower id bound (startDate), inclusive
    before_id: str | None = None   # upper id bound (endDate or the cursor), exclusive


def _row(tenant_id: str, lead_id: str, submission_id: str, e: LedgerLine, now: str) -> tuple:
    return (new_id("led"), tenant_id, lead_id, submission_id, e.kind, e.milestone, e.lead_status, e.amount,
            e.currency, e.campaign_id, e.client_id, e.source_id, e.delivery_endpoint_id, now)


class Ledger:
    """Money entries per lead: cost, revenue and returns, as they were when earned."""

    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    # One entry per (milestone, submission): a line whose milestone already paid is dropped.
    _INSERT = ("INSERT OR IGNORE INTO ledger_entries(entry_id, tenant_id, lead_id, submission_id, kind, milestone,"
               " lead_status, amount, currency, campaign_id, client_id, source_id, delivery_endpoint_id, created_at)"
               " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")

    def record(self, tenant_id: str, lead_id: str, submission_id: str, lines: Iterable[LedgerLine],
               now: str) -> None:
        self._conn.executemany(self._INSERT, [_row(tenant_id, lead_id, submission_id, e, now) for e in lines])

    def record_new(self, tenant_id: str, lead_id: str, submission_id: str, lines: Iterable[LedgerLine],
                   now: str) -> list[LedgerLine]:
        """As `record`, answering the lines written (a client's balance follows those only)."""
        written = []
        for line in lines:
            self._conn.execute(self._INSERT, _row(tenant_id, lead_id, submission_id, line, now))
            if self._conn.changes():
                written.append(line)
        return written

    def entries_of(self, tenant_id: str, lead_id: str) -> list[tuple]:
        """(kind, leadStatus, amount, currency, campaignId, sourceId) of the lead's entries, oldest first."""
        return self._conn.execute(
            "SELECT kind, lead_status, amount, currency, campaign_id, source_id FROM ledger_entries"
            " WHERE tenant_id = ? AND lead_id = ? ORDER BY entry_id", (tenant_id, lead_id)).fetchall()

    def page(self, tenant_id: str, where: LedgerFilter, limit: int) -> list[dict]:
        """One page of entries as the API shows them, newest first."""
        clauses, params = ["tenant_id = ?"], [tenant_id]
        for column, values in (("campaign_id", where.campaign_ids), ("client_id", where.client_ids),
                               ("source_id", where.source_ids)):
            if values:
                clauses.append(f"{column} IN ({','.join('?' * len(values))})")
                params.extend(values)
        for column, value in (("lead_id", where.lead_id), ("kind", where.kind)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if where.after_id is not None:
            clauses.append("entry_id >= ?")
            params.append(where.after_id)
        if where.before_id is not None:
            clauses.append("entry_id < ?")
            params.append(where.before_id)
        index = "ledger_entries_by_lead" if where.lead_id is not None else "ledger_entries_by_tenant"
        rows = self._conn.execute(
            f"SELECT {_COLUMNS} FROM ledger_entries INDEXED BY {index} WHERE {' AND '.join(clauses)}"
            " ORDER BY entry_id DESC LIMIT ?", [*params, limit])
        return [{"entryId": r[0], "leadId": r[1], "submissionId": r[2], "campaignId": r[3], "clientId": r[4],
                 "sourceId": r[5], "deliveryEndpointId": r[6], "kind": r[7], "amount": r[8], "currency": r[9],
                 "leadStatus": r[10], "createdAt": r[11]} for r in rows]

    # A sale as the portal shows it to its buyer: (entryId, leadId, submissionId, amount, currency, createdAt).
    _SALE = "entry_id, lead_id, submission_id, amount, currency, created_at"

    def sales_to_client(self, tenant_id: str, client_id: str, before: tuple[str, str] | None,
                        limit: int) -> list[tuple]:
        """A page of the client's sales (its revenue entries), newest first, before `before`
        ((createdAt, entryId) of the last one shown): one walk of ledger_entries_sales."""
        bound, params = "", [tenant_id, client_id]
        if before is not None:
            bound = " AND (created_at < ? OR (created_at = ? AND entry_id < ?))"
            params += [before[0], before[0], before[1]]
        return self._conn.execute(
            f"SELECT {self._SALE} FROM ledger_entries INDEXED BY ledger_entries_sales WHERE tenant_id = ?"
            f" AND client_id = ? AND kind = 'revenue'{bound} ORDER BY created_at DESC, entry_id DESC LIMIT ?",
            [*params, limit]).fetchall()

    def sales_of_leads(self, tenant_id: str, client_id: str, lead_ids: Sequence[str]) -> list[tuple]:
        """The client's sales of these leads, newest first (none: not leads sold to it)."""
        if not lead_ids:
            return []
        return self._conn.execute(
            f"SELECT {self._SALE} FROM ledger_entries INDEXED BY ledger_entries_by_lead WHERE tenant_id = ?"
            f" AND lead_id IN ({','.join('?' * len(lead_ids))}) AND kind = 'revenue' AND client_id = ?"
            " ORDER BY created_at DESC, entry_id DESC", (tenant_id, *lead_ids, client_id)).fetchall()

    def latest_buyer(self, tenant_id: str, lead_id: str) -> str | None:
        """The client of the lead's latest sale."""
        found = self._conn.execute(
            "SELECT client_id FROM ledger_entries WHERE tenant_id = ? AND lead_id = ? AND kind = 'revenue'"
            " ORDER BY created_at DESC, entry_id DESC LIMIT 1", (tenant_id, lead_id)).fetchone()
        return found[0] if found else None

    def source_costs(self, tenant_id: str, source_ids: Sequence[str], before_id: str | None, limit: int,
                     lead_id: str | None = None) -> list[tuple]:
        """A page of the cost entries of `source_ids` (of one lead, if named), newest first:
        (entryId, leadId, sourceId, leadStatus, amount, currency, createdAt); one walk of
        ledger_entries_costs per source, each stopping at `limit`, merged."""
        if not source_ids:
            return []
        bound = "".join((" AND entry_id < ?" if before_id is not None else "",
                         " AND lead_id = ?" if lead_id is not None else ""))
        arm = ("SELECT * FROM (SELECT entry_id, lead_id, source_id, lead_status, amount, currency, created_at"
               " FROM ledger_entries INDEXED BY ledger_entries_costs WHERE tenant_id = ? AND source_id = ?"
               f" AND kind = 'cost'{bound} ORDER BY entry_id DESC LIMIT ?) AS arm")
        params: list = []
        for source_id in source_ids:
            params += [tenant_id, source_id, *(v for v in (before_id, lead_id) if v is not None), limit]
        return self._conn.execute(" UNION ALL ".join([arm] * len(source_ids)) + " ORDER BY 1 DESC LIMIT ?",
                                  [*params, limit]).fetchall()

    def source_costs_by_day(self, tenant_id: str, source_ids: Sequence[str], first_day: int,
                            end_day: int) -> list[tuple[int, str, float]]:
        """(UTC day since the epoch, currency, cost) of `source_ids` on days [first_day, end_day):
        from the daily report rollup."""
        if not source_ids:
            return []
        return self._conn.execute(
            "SELECT bucket, currency, sum(cost) FROM report_money_daily WHERE tenant_id = ? AND bucket >= ?"
            f" AND bucket < ? AND source_id IN ({','.join('?' * len(source_ids))}) GROUP BY 1, 2"
            " HAVING sum(cost) != 0", (tenant_id, first_day, end_day, *source_ids)).fetchall()

    def sales_since(self, tenant_id: str, client_id: str, since: str) -> int:
        """The client's deliveries that earned revenue since `since` (one a submission)."""
        return self._conn.execute(
            "SELECT count(DISTINCT submission_id) FROM ledger_entries WHERE tenant_id = ? AND client_id = ?"
            " AND created_at >= ? AND kind = 'revenue'", (tenant_id, client_id, since)).fetchone()[0]

    def delivered_revenue(self, tenant_id: str, submission_id: str) -> list[tuple[float, str, str | None, str | None]]:
        """(amount, currency, clientId, deliveryEndpointId) of the revenue a submission earned on
        delivery, oldest first."""
        return self._conn.execute(
            "SELECT amount, currency, client_id, delivery_endpoint_id FROM ledger_entries WHERE tenant_id = ?"
            " AND submission_id = ? AND kind = 'revenue' AND lead_status = 'delivered' ORDER BY entry_id",
            (tenant_id, submission_id)).fetchall()
