"""Buyer health: how each answer moves an endpoint's counters, and when the endpoint's
`healthPolicy` pauses it. A paused endpoint's leads wait (their jobs are parked, not failed)
until someone resumes it. Pure: services/delivery_outcome.py stores the health in the answer's
transaction."""

from __future__ import annotations

import msgspec

from appliance.domain.endpoint import HealthPolicy

ACTIVE, PAUSED = "active", "paused"


class EndpointHealth(msgspec.Struct, frozen=True):
    state: str = ACTIVE
    paused_reason: str | None = None
    paused_at: str | None = None
    consecutive_errors: int = 0
    consecutive_failures: int = 0
    last_success_at: str | None = None
    last_error_at: str | None = None

    @property
    def paused(self) -> bool:
        return self.state == PAUSED


def after_answer(health: EndpointHealth, outcome: str, reason: str | None, policy: HealthPolicy,
                 now: str) -> tuple[EndpointHealth, bool]:
    """The health after the endpoint answered `outcome` (success, failure, duplicate, error),
    and whether this answer paused it. A duplicate is a healthy answer: the buyer works and
    already has the lead."""
    errors, failures = health.consecutive_errors, health.consecutive_failures
    last_success, last_error = health.last_success_at, health.last_error_at
    if outcome == "error":
        errors, last_error = errors + 1, now
    elif outcome == "failure":
        errors, failures = 0, failures + 1
    else:
        errors = failures = 0
        if outcome == "success":
            last_success = now
    updated = msgspec.structs.replace(health, consecutive_errors=errors, consecutive_failures=failures,
                                      last_success_at=last_success, last_error_at=last_error)
    if health.paused:
        return updated, False
    cause = None
    if policy.pause_after_consecutive_errors and errors >= policy.pause_after_consecutive_errors:
        cause = f"{errors} error{'s' if errors != 1 else ''} in a row"
    elif policy.pause_after_consecutive_failures and failures >= policy.pause_after_consecutive_failures:
        cause = f"{failures} failure{'s' if failures != 1 else ''} in a row"
    if cause is None:
        return updated, False
    return paused(updated, f"paused by its health policy after {cause} (last: {reason or outcome})", now), True


def paused(health: EndpointHealth, reason: str, now: str) -> EndpointHealth:
    return msgspec.structs.replace(health, state=PAUSED, paused_reason=reason, paused_at=now)


def resumed(health: EndpointHealth) -> EndpointHealth:
    """Active again with clean counters: the next errors count from zero."""
    return msgspec.structs.replace(health, state=ACTIVE, paused_reason=None, paused_at=None,
                                   consecutive_errors=0, consecutive_failures=0)
