"""Suppliers' pings (POST /api/v1/leads/ping): what each was offered, until the lead is posted
with its pingId (`lead_id` set once, in the submit's transaction) or the ping is purged."""

from __future__ import annotations

from typing import NamedTuple

import apsw


class PingRecord(NamedTuple):
    ping_id: str
    source_id: str | None
    campaign_id: str
    accepted: bool
    bid: float | None
    currency: str
    reason: str | None
    auction_id: str | None
    created_at: str
    expires_at: str
    lead_id: str | None


_COLUMNS = ("ping_id, source_id, campaign_id, accepted, bid, currency, reason, auction_id, created_at, expires_at,"
            " lead_id")


def _record(row: tuple) -> PingRecord:
    return PingRecord(row[0], row[1], row[2], bool(row[3]), *row[4:])


class Pings:
    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def insert(self, tenant_id: str, ping: PingRecord) -> None:
        self._conn.execute(
            f"INSERT INTO pings(tenant_id, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (tenant_id, ping.ping_id, ping.source_id, ping.campaign_id, int(ping.accepted), ping.bid, ping.currency,
             ping.reason, ping.auction_id, ping.created_at, ping.expires_at, ping.lead_id))

    def get(self, tenant_id: str, ping_id: str) -> PingRecord | None:
        row = self._conn.execute(f"SELECT {_COLUMNS} FROM pings WHERE ping_id = ? AND tenant_id = ?",
                                 (ping_id, tenant_id)).fetchone()
        return _record(row) if row else None

    def mark_posted(self, tenant_id: str, ping_id: str, lead_id: str) -> bool:
        """The ping taken by its lead; False when another submit took it first."""
        self._conn.execute("UPDATE pings SET lead_id = ? WHERE ping_id = ? AND tenant_id = ? AND lead_id IS NULL",
                           (lead_id, ping_id, tenant_id))
        return self._conn.changes() == 1

    def page(self, tenant_id: str, *, source_id: str | None, campaign_id: str | None, after_id: str | None,
             before_id: str | None, limit: int) -> list[PingRecord]:
        """Newest first; `after_id` / `before_id`: id bounds (dates and the cursor, as for leads)."""
        clauses, params = ["tenant_id = ?"], [tenant_id]
        for column, value in (("source_id", source_id), ("campaign_id", campaign_id)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if after_id is not None:
            clauses.append("ping_id >= ?")
            params.append(after_id)
        if before_id is not None:
            clauses.append("ping_id < ?")
            params.append(before_id)
        rows = self._conn.execute(f"SELECT {_COLUMNS} FROM pings WHERE {' AND '.join(clauses)}"
                                  " ORDER BY ping_id DESC LIMIT ?", (*params, limit)).fetchall()
        return [_record(row) for row in rows]

    def purge(self, before: str) -> int:
        """Pings made before `before`, and the rounds of those never posted."""
        self._conn.execute("DELETE FROM auctions WHERE lead_id IS NULL AND auction_id IN"
                           " (SELECT auction_id FROM pings WHERE created_at < ? AND auction_id IS NOT NULL)", (before,))
        self._conn.execute("DELETE FROM pings WHERE created_at < ?", (before,))
        return self._conn.changes()
