"""Money entries per lead: cost, revenue and returns, as they were when earned."""

from __future__ import annotations

from collections.abc import Iterable
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


class Ledger:
    """Money entries per lead: cost, revenue and returns, as they were when earned."""

    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def record(self, tenant_id: str, lead_id: str, submission_id: str, lines: Iterable[LedgerLine],
               now: str) -> None:
        """Keeps one entry per (milestone, submission): a line whose milestone already paid for
        this submission is dropped."""
        self._conn.executemany(
            "INSERT OR IGNORE INTO ledger_entries(entry_id, tenant_id, lead_id, submission_id, kind, milestone,"
            " lead_status, amount, currency, campaign_id, client_id, source_id, delivery_endpoint_id, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(new_id("led"), tenant_id, lead_id, submission_id, e.kind, e.milestone, e.lead_status, e.amount,
              e.currency, e.campaign_id, e.client_id, e.source_id, e.delivery_endpoint_id, now) for e in lines],
        )

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

    def sales_since(self, tenant_id: str, client_id: str, since: str) -> int:
        """The client's deliveries that earned revenue since `since` (one a submission)."""
        return self._conn.execute(
            "SELECT count(DISTINCT submission_id) FROM ledger_entries WHERE tenant_id = ? AND client_id = ?"
            " AND created_at >= ? AND kind = 'revenue'", (tenant_id, client_id, since)).fetchone()[0]

    def delivered_revenue(self, tenant_id: str, submission_id: str) -> list[tuple[float, str]]:
        """(amount, currency) of the revenue a submission earned on delivery."""
        return self._conn.execute(
            "SELECT amount, currency FROM ledger_entries WHERE tenant_id = ? AND submission_id = ?"
            " AND kind = 'revenue' AND lead_status = 'delivered'", (tenant_id, submission_id)).fetchall()
