"""The report rollups (migration m008): lead counts and money per tenant, time bucket and
dimension. Money is kept by a trigger on ledger_entries; lead counts by `count_lead`, which
Leads.insert_lead and update_lead call in the same transaction (the only writes of leads; see
the migration for why not a trigger there). Read here for a range of quarter-hour buckets: the
whole UTC days inside the range come from the daily rollup, the quarter hours before and after
them from the quarter-hour one, so a 30-day range reads ~30 days of daily rows and at most two
days of quarter-hour rows, whatever its zone."""

from __future__ import annotations

from collections.abc import Mapping

import apsw

_DAY = 96  # quarter hours in a UTC day
_LEAD_KEYS = {"campaign": "campaign_id", "client": "client_id", "source": "source_id", "bucket": "bucket"}
_MONEY_KEYS = {**_LEAD_KEYS, "endpoint": "delivery_endpoint_id"}


_COUNT = [f"INSERT INTO report_leads{table} VALUES (?1, coalesce(unixepoch(?2), 0) / {seconds}, coalesce(?3, ''),"
          " coalesce(?4, ''), coalesce(?5, ''), ?6, ?7) ON CONFLICT DO UPDATE SET leads = leads + excluded.leads"
          for table, seconds in (("", 900), ("_daily", 86400))]


def count_lead(conn: apsw.Connection, tenant_id: str, created_at: str, campaign_id: str | None,
               client_id: str | None, source_id: str | None, status: str, step: int) -> None:
    """Add `step` (1 or -1) to the lead counts of a lead's creation bucket, dimensions and status."""
    row = (tenant_id, created_at, campaign_id, client_id, source_id, status, step)
    for statement in _COUNT:
        conn.execute(statement, row)


def count_leads(conn: apsw.Connection, tenant_id: str,
                counts: Mapping[tuple[str, str | None, str | None, str | None, str], int]) -> None:
    """`count_lead` for a batch: `counts` maps (created_at, campaign_id, client_id, source_id,
    status) to the number of leads added."""
    rows = [(tenant_id, *key, step) for key, step in counts.items()]
    for statement in _COUNT:
        conn.executemany(statement, rows)


def _pieces(first: int, end: int, utc_days: bool) -> list[tuple[str, int, int, int]]:
    """(table suffix, first bucket, end bucket, quarter hours per bucket) covering quarter hours
    [first, end): whole UTC days from the daily rollup when `utc_days`, the rest by quarter hour."""
    day_first, day_end = -(-first // _DAY), end // _DAY
    if not utc_days or day_first >= day_end:
        return [("", first, end, 1)]
    pieces = [("_daily", day_first, day_end, _DAY)]
    if first < day_first * _DAY:
        pieces.append(("", first, day_first * _DAY, 1))
    if day_end * _DAY < end:
        pieces.append(("", day_end * _DAY, end, 1))
    return pieces


class Reports:
    """Reads of the report rollups. `by` names the key of each row: a dimension (its id, '' for
    none) or `bucket` (the quarter hour; a row from the daily rollup is keyed by its day's first
    quarter hour). A key may come back more than once: the caller adds them up."""

    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def lead_counts(self, tenant_id: str, by: str, first: int, end: int, *,
                    utc_days: bool = True) -> list[tuple[str | int, str, int]]:
        """(key, status, leads) of the leads created in quarter hours [first, end), by their
        current status. `utc_days`: whole UTC days may be read as one bucket (with `by=bucket`,
        only when the caller's days start at UTC midnight)."""
        return self._summed(_LEAD_KEYS[by], "status, sum(leads) FROM report_leads{table}",
                            "HAVING sum(leads) != 0", tenant_id, first, end, utc_days)

    def money(self, tenant_id: str, by: str, first: int, end: int, *,
              utc_days: bool = True) -> list[tuple[str | int, str, float, float, float]]:
        """(key, currency, cost, revenue, returns) of the ledger entries created in quarter hours
        [first, end); `returns` is the sum of the (negative) return entries."""
        return self._summed(_MONEY_KEYS[by],
                            "currency, total(cost), total(revenue), total(returns) FROM report_money{table}", "",
                            tenant_id, first, end, utc_days)

    def _summed(self, key: str, sums: str, having: str, tenant_id: str, first: int, end: int,
                utc_days: bool) -> list:
        """`SELECT key, <sums>`, grouped by the key and the column after it (status, currency),
        over the quarter-hour and daily rollups that together cover [first, end)."""
        rows: list = []
        for table, low, high, scale in _pieces(first, end, utc_days):
            column = f"{key} * {scale}" if key == "bucket" else key
            rows += self._conn.execute(
                f"SELECT {column}, {sums.format(table=table)}"
                f" WHERE tenant_id = ? AND bucket >= ? AND bucket < ? GROUP BY 1, 2 {having}",
                (tenant_id, low, high)).fetchall()
        return rows
