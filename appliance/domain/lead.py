"""Leads and submissions as the API returns them."""

from __future__ import annotations

from typing import Any, Literal

from appliance.model import Model

LeadStatus = Literal[
    "new", "pending", "qualified", "disqualified", "duplicate", "queued", "pending_action",
    "delivered", "failed", "rejected", "error", "returned", "suppressed", "document_sent", "signed",
]
LEAD_STATUSES: tuple[str, ...] = LeadStatus.__args__  # type: ignore[attr-defined]
# A returned lead may be resold: a repost (to another campaign or endpoint) sends it again.
REPOSTABLE: frozenset[str] = frozenset({"failed", "rejected", "error", "returned"})
# What a caller may set by hand (bulk update, submission patch): every status but `returned`,
# which only POST /api/v1/leads/{leadId}/return sets, with the entries reversing the revenue.
SettableStatus = Literal[
    "new", "pending", "qualified", "disqualified", "duplicate", "queued", "pending_action",
    "delivered", "failed", "rejected", "error",
]
FlowType = Literal["standard", "manual_delivery", "repost"]
ApprovalStatus = Literal["approved", "rejected", "pending"]
RoutingMethod = Literal["original", "rule", "fallback", "manual"]


class Address(Model):
    street: str | None = None
    city: str | None = None
    state: str | None = None
    zip: str | None = None


class QuestionAnswer(Model):
    key: str | None = None
    question: str
    answer: Any = None


class Approval(Model):
    status: ApprovalStatus
    campaign_id: str | None = None
    decided_at: str | None = None
    decided_by: str | None = None
    reason: str | None = None


class LeadRecord(Model):
    """Submit body's field names plus the record's own."""

    lead_id: str
    status: LeadStatus
    campaign_id: str | None = None
    client_id: str | None = None
    offer_id: str | None = None
    source_id: str | None = None
    first_name: str | None = None
    last_name: str | None = None
    email: str | None = None
    phone: str | None = None
    phone_e164: str | None = None
    address: Address | None = None
    date_of_birth: str | None = None
    country: str | None = None
    files: list[dict[str, Any]] = []
    questionnaire: list[QuestionAnswer] = []
    attribution: dict[str, Any] = {}
    compliance: dict[str, Any] = {}
    is_test: bool = False
    timezone: str | None = None
    notes: str | None = None
    custom_fields: dict[str, Any] = {}
    # `<verifier>`: {outcome, reason, data} of the latest run of each verification step.
    verification: dict[str, Any] = {}
    approval: Approval | None = None
    submission_count: int = 0
    created_at: str
    updated_at: str


class JourneyError(Model):
    code: str | None = None
    message: str | None = None
    stack: str | None = None


class JourneyEvent(Model):
    timestamp: str | None = None
    type: Any = None
    to_client: str | None = None
    to_offer: str | None = None
    to_campaign_id: str | None = None
    reason: str | None = None
    details: dict[str, Any] | None = None
    error: JourneyError | None = None


class CampaignSnapshot(Model):
    campaign_id: str | None = None
    name: str | None = None
    client_id: str | None = None
    client_name: str | None = None
    client_abbrev: str | None = None
    offer_id: str | None = None
    offer_name: str | None = None
    offer_abbrev: str | None = None


class QualificationOutcome(Model):
    passed: bool | None = None
    original_campaign_qualified: bool | None = None
    score: int | float | None = None
    method: str | None = None
    reason: str | None = None
    qualified_at: str | None = None


class AlternativeCampaign(Model):
    campaign_id: str | None = None
    client_name: str | None = None
    offer_name: str | None = None
    qualified: bool | None = None
    priority: int | float | None = None
    reason: str | None = None


class RoutingOutcome(Model):
    was_routed: bool | None = None
    original_campaign_id: str | None = None
    routed_to_campaign_id: str | None = None
    routing_reason: str | None = None
    routing_method: RoutingMethod | None = None
    routing_rule_name: str | None = None
    alternative_campaigns: list[AlternativeCampaign] = []
    routing_evaluated_at: str | None = None


class PostingOutcome(Model):
    success: bool | None = None
    client_lead_id: str | None = None
    status_code: int | None = None
    posted_at: str | None = None


class DeliveryOutcome(Model):
    success: bool | None = None
    client_lead_id: str | None = None
    status_code: int | None = None
    response_message: str | None = None
    url: str | None = None
    method: str | None = None
    body_format: str | None = None
    delivered_at: str | None = None


class Submission(Model):
    submission_id: str
    lead_id: str
    submission_number: int
    campaign: CampaignSnapshot
    status: LeadStatus
    qualification: QualificationOutcome | None = None
    routing: RoutingOutcome | None = None
    posting: PostingOutcome | None = None
    delivery: DeliveryOutcome | None = None
    result: str | None = None
    client_lead_id: str | None = None
    response_fields: dict[str, str] = {}
    journey_events: list[JourneyEvent] = []
    first_submission_actions: list[Any] = []
    flow_type: FlowType = "standard"
    submitted_at: str | None = None
    qualified_at: str | None = None
    posted_at: str | None = None
    created_at: str
    updated_at: str


class LeadDetail(LeadRecord):
    submissions: list[Submission] = []
