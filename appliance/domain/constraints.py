"""Delivery constraints: delivery limits first, then the schedule. Pure: services/buyer_choice.py
counts and reserves inside a write transaction with the checks built here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from appliance.clock import iso
from appliance.domain import caps as caps_rules
from appliance.domain.campaign import Campaign, DeliveryLimit
from appliance.domain.pipeline import usable
from appliance.domain.schedule import is_open, next_open

# A lifetime limit never resets by itself; a queued lead looks again this often (the limit may
# have been raised by an import).
LIFETIME_RECHECK = timedelta(hours=1)


@dataclass(frozen=True)
class LimitCheck:
    scope: str
    period_start: str
    cap: int
    action: str
    route_to: str | None
    resets_at: datetime
    label: str


@dataclass(frozen=True)
class Blocked:
    action: str                 # queue, next_priority or route
    reason: str
    release_at: datetime        # when a queued lead should look again
    route_to: str | None = None


def campaign_zone(campaign: Campaign) -> str:
    schedule = campaign.delivery.delivery_schedule
    return schedule.timezone if schedule else "UTC"


def limit_checks(campaign: Campaign, now: datetime) -> list[LimitCheck]:
    return checks_of(campaign.delivery.delivery_limits, now, campaign_zone(campaign),
                     scope=f"delivery:{campaign.campaign_id}")


def checks_of(limits: list[DeliveryLimit], now: datetime, zone_name: str, *, scope: str,
              label: str = "") -> list[LimitCheck]:
    """The limits that apply now, each with its counter's scope (`scope:type`) and period in
    `zone_name`; `label` names whose limits they are in a reason."""
    tz = caps_rules.zone(zone_name)
    checks = []
    for limit in limits:
        if not caps_rules.cap_applies(limit, now, tz):
            continue
        start, end = caps_rules.period_bounds(limit.type, now, tz)
        checks.append(LimitCheck(
            scope=f"{scope}:{limit.type}", period_start=iso(start) if start else "",
            cap=limit.cap, action=limit.action, route_to=limit.route_to_campaign_id,
            resets_at=end if end is not None else now + LIFETIME_RECHECK,
            label=f"{label}{limit.type} delivery limit of {limit.cap}"))
    return checks


def limit_blocked(check: LimitCheck) -> Blocked:
    return Blocked(action=check.action, reason=f"{check.label} reached", release_at=check.resets_at,
                   route_to=check.route_to)


def schedule_blocked(campaign: Campaign, now: datetime) -> Blocked | None:
    schedule = campaign.delivery.delivery_schedule
    if schedule is None or is_open(schedule, now):
        return None
    opens = next_open(schedule, now)
    return Blocked(action=schedule.action, reason="outside the delivery schedule",
                   release_at=opens if opens is not None else now + LIFETIME_RECHECK,
                   route_to=schedule.route_to_campaign_id)


def campaigns_in_reach(campaign: Campaign, campaigns: Mapping[str, Campaign]) -> dict[str, Campaign]:
    """The campaign and those its constraints may send a lead on to (one level): its fallbacks and
    the campaigns its limits and schedule route to, those that take leads."""
    ids = [campaign.campaign_id, *campaign.qualification.fallback_campaigns]
    ids += [limit.route_to_campaign_id for limit in campaign.delivery.delivery_limits if limit.route_to_campaign_id]
    schedule = campaign.delivery.delivery_schedule
    if schedule is not None and schedule.route_to_campaign_id:
        ids.append(schedule.route_to_campaign_id)
    found = {cid: campaigns.get(cid) for cid in ids}
    return {cid: c for cid, c in found.items() if c is not None and (c is campaign or usable(c))}
