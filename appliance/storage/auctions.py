"""Auction rounds (domain/auction.AuctionRecord), one row each: a lead's rounds for its
auctions list, and a submission's latest round, whose standing bids the lead is sold to."""

from __future__ import annotations

import apsw
import msgspec

from appliance.domain.auction import AuctionRecord

_decode = msgspec.json.Decoder(AuctionRecord).decode


class Auctions:
    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def record(self, tenant_id: str, auction: AuctionRecord) -> None:
        self._conn.execute(
            "INSERT INTO auctions(auction_id, tenant_id, lead_id, submission_id, started_at, record)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (auction.auction_id, tenant_id, auction.lead_id, auction.submission_id, auction.started_at,
             msgspec.json.encode(auction)))

    def get(self, tenant_id: str, auction_id: str) -> AuctionRecord | None:
        row = self._conn.execute("SELECT record FROM auctions WHERE auction_id = ? AND tenant_id = ?",
                                 (auction_id, tenant_id)).fetchone()
        return _decode(row[0]) if row else None

    def update(self, tenant_id: str, auction: AuctionRecord) -> None:
        """A round given its lead and submission (a supplier's ping, once posted) or its winners."""
        self._conn.execute(
            "UPDATE auctions SET lead_id = ?, submission_id = ?, record = ? WHERE auction_id = ? AND tenant_id = ?",
            (auction.lead_id, auction.submission_id, msgspec.json.encode(auction), auction.auction_id, tenant_id))

    def latest_of_submission(self, tenant_id: str, submission_id: str) -> AuctionRecord | None:
        row = self._conn.execute(
            "SELECT record FROM auctions WHERE submission_id = ? AND tenant_id = ? ORDER BY auction_id DESC LIMIT 1",
            (submission_id, tenant_id)).fetchone()
        return _decode(row[0]) if row else None

    def rounds_of_submission(self, tenant_id: str, submission_id: str) -> int:
        (count,) = self._conn.execute("SELECT count(*) FROM auctions WHERE submission_id = ? AND tenant_id = ?",
                                      (submission_id, tenant_id)).fetchone()
        return count

    def of_lead(self, tenant_id: str, lead_id: str, before: str | None, limit: int) -> list[AuctionRecord]:
        """The lead's rounds, newest first; `before`: an auctionId (the cursor)."""
        older = " AND auction_id < ?" if before is not None else ""
        rows = self._conn.execute(
            f"SELECT record FROM auctions WHERE tenant_id = ? AND lead_id = ?{older} ORDER BY auction_id DESC LIMIT ?",
            (tenant_id, lead_id, *((before,) if before is not None else ()), limit)).fetchall()
        return [_decode(row[0]) for row in rows]
