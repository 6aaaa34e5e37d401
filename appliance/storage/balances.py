"""Clients' balances (services/balances.py): entries numbered per client, each with the running
balance after it, and the amounts held on the jobs of deliveries under way."""

from __future__ import annotations

import apsw

from appliance.domain.balance import BalanceLine

_FIELDS = BalanceLine.__struct_fields__  # the columns, in the struct's order
_LINE = ", ".join(_FIELDS)


def _line(row: tuple) -> BalanceLine:
    return BalanceLine(**dict(zip(_FIELDS, row)))


class Balances:
    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def last(self, tenant_id: str, client_id: str) -> tuple[int, float]:
        """(number, balance) of the client's newest entry; (0, 0) before its first."""
        found = self._conn.execute("SELECT seq, balance FROM balance_entries WHERE tenant_id = ? AND client_id = ?"
                                   " ORDER BY seq DESC LIMIT 1", (tenant_id, client_id)).fetchone()
        return (found[0], found[1]) if found else (0, 0.0)

    def append(self, tenant_id: str, client_id: str, seq: int, line: BalanceLine) -> None:
        self._conn.execute(f"INSERT INTO balance_entries(tenant_id, client_id, seq, {_LINE})"
                           " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           (tenant_id, client_id, seq, line.at, line.kind, line.amount, line.balance, line.currency,
                            line.lead_id, line.note))

    def balances(self, tenant_id: str) -> dict[str, float]:
        """Each client's balance now (clients without an entry are missing)."""
        return dict(self._conn.execute(
            "SELECT client_id, balance FROM balance_entries e WHERE tenant_id = ?1 AND seq ="
            " (SELECT max(seq) FROM balance_entries WHERE tenant_id = ?1 AND client_id = e.client_id)",
            (tenant_id,)).fetchall())

    def balance_before(self, tenant_id: str, client_id: str, at: str) -> float:
        found = self._conn.execute("SELECT balance FROM balance_entries WHERE tenant_id = ? AND client_id = ?"
                                   " AND at < ? ORDER BY at DESC, seq DESC LIMIT 1",
                                   (tenant_id, client_id, at)).fetchone()
        return found[0] if found else 0.0

    def lines(self, tenant_id: str, client_id: str, start: str, end: str) -> list[BalanceLine]:
        """Entries with `start` <= at < `end`, oldest first."""
        return [_line(row) for row in self._conn.execute(
            f"SELECT {_LINE} FROM balance_entries WHERE tenant_id = ? AND client_id = ? AND at >= ? AND at < ?"
            " ORDER BY seq", (tenant_id, client_id, start, end))]

    # ---- holds: the amount each delivery under way may spend ----------------------------------

    def held(self, tenant_id: str, client_id: str, but_job: int | None = None) -> float:
        """What the client's deliveries under way hold (a job's hold counts while it runs)."""
        found = self._conn.execute(
            "SELECT sum(hold_amount) FROM jobs WHERE tenant_id = ? AND hold_client = ? AND state = 'running'"
            " AND job_id != ?", (tenant_id, client_id, but_job if but_job is not None else -1)).fetchone()
        return found[0] or 0.0

    def hold(self, job_id: int, client_id: str, amount: float) -> None:
        self._conn.execute("UPDATE jobs SET hold_client = ?, hold_amount = ? WHERE job_id = ?",
                           (client_id, amount, job_id))
