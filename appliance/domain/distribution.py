"""Several buyers per campaign: which endpoint a lead goes to first, and where it goes next.

The waterfall order is the active endpoints by `priority` (equal priorities keep the list's
order). `priority` sends every lead down that order; `round_robin` and `weighted` choose the
first endpoint by rotation and then go down the order from the top, skipping the endpoints the
lead already tried. The rotation is the smooth weighted round-robin: every choice adds each
open endpoint's weight to its running weight, takes the endpoint with the highest, and takes the
total back from it. Over any run of choices each endpoint gets its share of the weights to
within one lead, and the running weights are all the state there is: stored, they let the
rotation go on exactly where it was after a restart. `round_robin` is the same with every
weight 1. Pure: services/buyer_choice.py checks pauses, limits and schedules, and stores the
running weights."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from appliance.domain.campaign import Campaign, Distribution, DistributionEndpoint
from appliance.domain.constraints import Blocked, LIFETIME_RECHECK, LimitCheck, checks_of, limit_blocked
from appliance.domain.rules import matches
from appliance.domain.schedule import is_open, next_open

Weights = dict[str, float]


def waterfall(distribution: Distribution) -> list[DistributionEndpoint]:
    """The active endpoints in the order a lead tries them."""
    return sorted((e for e in distribution.endpoints if e.active), key=lambda e: e.priority)


def untried(distribution: Distribution, tried: Sequence[str], facts: Mapping[str, Any], *,
            value_sets: Mapping, today: date) -> list[DistributionEndpoint]:
    """The endpoints still to try for this lead, in order: active, not tried this round, and
    whose filter (`conditions`) the lead passes."""
    done = set(tried)
    return [e for e in waterfall(distribution) if e.delivery_endpoint_id not in done
            and (e.conditions is None or not e.conditions.sub_rules
                 or matches(e.conditions.logical_operator, e.conditions.sub_rules, facts,
                            value_sets=value_sets, today=today))]


def rotates(distribution: Distribution) -> bool:
    return distribution.method in ("round_robin", "weighted")


def rotate(distribution: Distribution, open_ids: Sequence[str], running: Weights) -> tuple[str, Weights]:
    """One turn of the rotation among `open_ids` (the endpoints that can take the lead now, in
    waterfall order): the chosen endpoint and the new running weights. Endpoints not open keep
    their running weight; endpoints no longer in the distribution drop out of it."""
    weight = {e.delivery_endpoint_id: (float(e.weight) if distribution.method == "weighted" else 1.0)
              for e in distribution.endpoints}
    updated = {eid: w for eid, w in running.items() if eid in weight}
    for eid in open_ids:
        updated[eid] = updated.get(eid, 0.0) + weight[eid]
    chosen = max(open_ids, key=lambda eid: updated[eid])  # the first of equals: waterfall order
    updated[chosen] -= sum(weight[eid] for eid in open_ids)
    return chosen, updated


@dataclass(frozen=True)
class EndpointGate:
    """What an endpoint's own limits and schedule say of sending to it now: the limit checks to
    count and reserve, and the schedule's block when it is closed."""
    limits: list[LimitCheck]
    closed: Blocked | None


def endpoint_gate(campaign: Campaign, entry: DistributionEndpoint, now: datetime) -> EndpointGate:
    zone_name = entry.delivery_schedule.timezone if entry.delivery_schedule else "UTC"
    limits = checks_of(entry.delivery_limits, now, zone_name,
                       scope=f"endpoint:{campaign.campaign_id}:{entry.delivery_endpoint_id}",
                       label=f"{entry.delivery_endpoint_id}: ")
    closed = None
    schedule = entry.delivery_schedule
    if schedule is not None and not is_open(schedule, now):
        opens = next_open(schedule, now)
        closed = Blocked(action="queue", reason=f"{entry.delivery_endpoint_id}: outside its delivery schedule",
                         release_at=opens if opens is not None else now + LIFETIME_RECHECK)
    return EndpointGate(limits, closed)


def full(gate: EndpointGate, counted: Callable[[str, str], int]) -> Blocked | None:
    """The first of the endpoint's limits that `counted(scope, period)` (deliveries so far)
    shows reached, or its closed schedule."""
    for check in gate.limits:
        if counted(check.scope, check.period_start) >= check.cap:
            return limit_blocked(check)
    return gate.closed
