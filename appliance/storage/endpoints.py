"""Buyers' state: each endpoint's health (active or paused, counters, last answers), its answers
per hour, and each campaign's distribution rotation."""

from __future__ import annotations

import apsw
import msgspec

from appliance.domain.endpoint_health import EndpointHealth

_HEALTH = ("state, paused_reason, paused_at, consecutive_errors, consecutive_failures, last_success_at,"
           " last_error_at")
_COUNTED = {"success": "delivered", "failure": "failed", "error": "error"}  # a duplicate is no trouble and no sale


class Endpoints:
    """Endpoint health, answers per hour and distribution rotations."""

    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def health(self, tenant_id: str, endpoint_id: str) -> EndpointHealth:
        found = self._conn.execute(
            f"SELECT {_HEALTH} FROM endpoint_health WHERE tenant_id = ? AND endpoint_id = ?",
            (tenant_id, endpoint_id)).fetchone()
        return EndpointHealth(*found) if found else EndpointHealth()

    def is_paused(self, tenant_id: str, endpoint_id: str) -> bool:
        return self._conn.execute(
            "SELECT 1 FROM endpoint_health WHERE tenant_id = ? AND endpoint_id = ? AND state = 'paused'",
            (tenant_id, endpoint_id)).fetchone() is not None

    def paused_ids(self, tenant_id: str) -> frozenset[str]:
        """The tenant's paused endpoints, in one statement (an auction asks about all its buyers)."""
        return frozenset(row[0] for row in self._conn.execute(
            "SELECT endpoint_id FROM endpoint_health WHERE tenant_id = ? AND state = 'paused'", (tenant_id,)))

    def paused_count(self) -> int:
        """Paused endpoints of every tenant (the metrics)."""
        return self._conn.execute("SELECT count(*) FROM endpoint_health WHERE state = 'paused'").fetchone()[0]

    def all_health(self, tenant_id: str) -> dict[str, EndpointHealth]:
        return {row[0]: EndpointHealth(*row[1:]) for row in self._conn.execute(
            f"SELECT endpoint_id, {_HEALTH} FROM endpoint_health WHERE tenant_id = ?", (tenant_id,))}

    def save_health(self, tenant_id: str, endpoint_id: str, health: EndpointHealth) -> None:
        self._conn.execute(
            f"INSERT OR REPLACE INTO endpoint_health(tenant_id, endpoint_id, {_HEALTH})"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (tenant_id, endpoint_id, *msgspec.structs.astuple(health)))

    def healthy_answer(self, tenant_id: str, endpoint_id: str, success_at: str | None) -> None:
        """A success (`success_at`) or a duplicate: both runs end (`after_answer`'s rule, in one
        statement: such an answer never pauses, so the row need not be read first)."""
        self._conn.execute(
            "INSERT INTO endpoint_health(tenant_id, endpoint_id, last_success_at) VALUES (?, ?, ?)"
            " ON CONFLICT (tenant_id, endpoint_id) DO UPDATE SET consecutive_errors = 0, consecutive_failures = 0,"
            " last_success_at = coalesce(excluded.last_success_at, endpoint_health.last_success_at)",
            (tenant_id, endpoint_id, success_at))

    _COUNT_ANSWER = ("INSERT INTO endpoint_outcomes(tenant_id, endpoint_id, hour, {column}) VALUES (?, ?, ?, 1)"
                     " ON CONFLICT (tenant_id, endpoint_id, hour) DO UPDATE SET {column} = endpoint_outcomes.{column} + 1")

    def count_answer(self, tenant_id: str, endpoint_id: str, hour: str, outcome: str) -> None:
        column = _COUNTED.get(outcome)
        if column is None:
            return
        self._conn.execute(self._COUNT_ANSWER.format(column=column), (tenant_id, endpoint_id, hour))

    def answers_since(self, tenant_id: str, hour: str) -> dict[str, tuple[int, int, int]]:
        """(delivered, failed, error) per endpoint over the hours from `hour` on."""
        return {row[0]: row[1:] for row in self._conn.execute(
            "SELECT endpoint_id, sum(delivered), sum(failed), sum(error) FROM endpoint_outcomes"
            " WHERE tenant_id = ? AND hour >= ? GROUP BY endpoint_id", (tenant_id, hour))}

    def purge_answers(self, before_hour: str) -> int:
        self._conn.execute("DELETE FROM endpoint_outcomes WHERE hour < ?", (before_hour,))
        return self._conn.changes()

    def rotation(self, tenant_id: str, campaign_id: str) -> dict[str, float]:
        found = self._conn.execute(
            "SELECT weights FROM distribution_rotation WHERE tenant_id = ? AND campaign_id = ?",
            (tenant_id, campaign_id)).fetchone()
        return msgspec.json.decode(found[0], type=dict[str, float]) if found else {}

    def save_rotation(self, tenant_id: str, campaign_id: str, weights: dict[str, float]) -> None:
        self._conn.execute(
            "INSERT OR REPLACE INTO distribution_rotation(tenant_id, campaign_id, weights) VALUES (?, ?, ?)",
            (tenant_id, campaign_id, msgspec.json.encode(weights)))
