"""Money entries per lead: revenue and cost as they were when earned."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import apsw


@dataclass(frozen=True)
class LedgerEntry:
    kind: str
    lead_status: str
    amount: float
    currency: str
    campaign_id: str | None
    source_id: str | None


class Ledger:
    """Money entries per lead: revenue and cost as they were when earned."""

    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def record(self, tenant_id: str, lead_id: str, submission_id: str,
               entries: Iterable[LedgerEntry], now: str) -> None:
        self._conn.executemany(
            "INSERT INTO ledger(tenant_id, lead_id, submission_id, kind, lead_status, amount, currency, campaign_id,"
            " source_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(tenant_id, lead_id, submission_id, e.kind, e.lead_status, e.amount, e.currency, e.campaign_id,
              e.source_id, now) for e in entries],
        )

    def entries_of(self, tenant_id: str, lead_id: str) -> list[tuple]:
        return self._conn.execute(
            "SELECT kind, lead_status, amount, currency, campaign_id, source_id FROM ledger"
            " WHERE tenant_id = ? AND lead_id = ? ORDER BY entry_id", (tenant_id, lead_id)).fetchall()
