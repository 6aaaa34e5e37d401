"""Campaign configuration shapes (interface 2.1) and the rule sets they carry."""

from __future__ import annotations

from typing import Literal

import msgspec

from appliance.model import Model

LogicalOperator = Literal["AND", "OR"]
Severity = Literal["disqualify", "review", "flag"]
AppliesAt = Literal["ingestion", "delivery"]
Operator = Literal[
    "equals", "not_equals", "contains", "not_contains", "starts_with", "ends_with",
    "greater_than", "less_than", "greater_or_equal", "less_or_equal", "between",
    "exists", "not_exists", "in_value_set", "not_in_value_set", "matches", "age_between",
]
Scalar = str | int | float | bool | None


class Condition(Model):
    field: str | None = None
    operator: Operator = "equals"
    value: list[Scalar] | None = None
    value_set_id: str | None = None
    prompt: str | None = None
    max_severity: Severity = "disqualify"


class SubRule(Model):
    logical_operator: LogicalOperator = "AND"
    conditions: list[Condition] = []


class RuleSet(Model):
    logical_operator: LogicalOperator = "AND"
    sub_rules: list[SubRule] = []
    applies_at: AppliesAt = "ingestion"
    is_active: bool = True
    name: str | None = None


class RouteTarget(Model):
    campaign_id: str
    client_name: str | None = None
    offer_name: str | None = None


class RoutingRule(Model):
    route_name: str | None = None
    active: bool = True
    priority: int | float = 0
    logical_operator: LogicalOperator = "AND"
    sub_rules: list[SubRule] = []
    route_to: RouteTarget


CapType = Literal["hourly", "daily", "weekly", "monthly", "lifetime"]
ConstraintAction = Literal["queue", "next_priority", "route"]
Weekday = Literal["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


class SourceCap(Model):
    active: bool = True
    cap: int
    type: CapType = "daily"
    start_date: str | None = None
    end_date: str | None = None


class DeliveryLimit(Model):
    active: bool = True
    cap: int
    type: CapType = "daily"
    action: ConstraintAction = "queue"
    start_date: str | None = None
    end_date: str | None = None
    route_to_campaign_id: str | None = None


class ScheduleDay(Model):
    active: bool = True
    day: Weekday
    start_time: str  # HH:MM, local to the schedule's timezone
    end_time: str


class DeliverySchedule(Model):
    timezone: str = "UTC"
    action: ConstraintAction = "queue"
    specific_days: list[ScheduleDay] = []
    route_to_campaign_id: str | None = None


class MatchFields(Model):
    email: bool = True
    phone: bool = True
    match_logic: LogicalOperator = "OR"


class DedupeOverride(Model):
    enabled: bool = True
    window: int | float = 30  # days
    match_fields: MatchFields = msgspec.field(default_factory=MatchFields)
