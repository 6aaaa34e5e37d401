"""Cap counters: leads counted per scope and period."""

from __future__ import annotations

import apsw


class Caps:
    """Cap counters: leads counted per scope and period."""

    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def counter_value(self, tenant_id: str, scope: str, period_start: str) -> int:
        found = self._conn.execute(
            "SELECT count FROM cap_counters WHERE tenant_id = ? AND scope = ? AND period_start = ?",
            (tenant_id, scope, period_start)).fetchone()
        return found[0] if found else 0

    def add_to_counter(self, tenant_id: str, scope: str, period_start: str) -> None:
        self._conn.execute(
            "INSERT INTO cap_counters(tenant_id, scope, period_start, count) VALUES (?, ?, ?, 1)"
            " ON CONFLICT(tenant_id, scope, period_start) DO UPDATE SET count = count + 1",
            (tenant_id, scope, period_start),
        )

    def take_from_counter(self, tenant_id: str, scope: str, period_start: str) -> None:
        """Give back a slot taken for a delivery that did not happen."""
        self._conn.execute(
            "UPDATE cap_counters SET count = max(count - 1, 0) WHERE tenant_id = ? AND scope = ? AND period_start = ?",
            (tenant_id, scope, period_start),
        )
