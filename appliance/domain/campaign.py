"""Campaign configuration shapes and the rule sets they carry."""

from __future__ import annotations

import re
from datetime import date, datetime
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec

from appliance.model import Model, invalid

LogicalOperator = Literal["AND", "OR"]
Severity = Literal["disqualify", "review", "flag"]
AppliesAt = Literal["ingestion", "delivery"]
Operator = Literal[
    "equals", "not_equals", "contains", "not_contains", "starts_with", "ends_with",
    "greater_than", "less_than", "greater_or_equal", "less_or_equal", "between",
    "exists", "not_exists", "in_value_set", "not_in_value_set", "matches", "age_between",
]
Scalar = str | int | float | bool | None

# Lead and submission statuses plus the ingestion event cost milestones key on.
LeadStatus = Literal[
    "lead_ingested", "new", "pending", "qualified", "disqualified", "duplicate", "queued",
    "pending_action", "delivered", "failed", "rejected", "error", "returned", "document_sent", "signed",
]

_HHMM = re.compile(r"^(?:[01]\d|2[0-3]):[0-5]\d$")
_CAMPAIGN_CODE = re.compile(r"^[A-Za-z0-9_-]{3,5}$")


# Checks shared by every configuration shape (catalog, endpoint and messaging import them).

def check_timestamp(field: str, value: str | None) -> None:
    """An ISO 8601 date-time; a plain date is not a timestamp."""
    if value is not None and (not _parses(datetime, value) or _parses(date, value)):
        invalid(field, "must be an ISO 8601 timestamp")


def _parses(kind: type[date], value: str) -> bool:
    try:
        kind.fromisoformat(value)
    except ValueError:
        return False
    return True


def check_date(field: str, value: str | None) -> None:
    """An ISO 8601 date or date-time (validity windows and cap periods take either)."""
    if value is not None and not _parses(datetime, value):
        invalid(field, "must be an ISO 8601 date or timestamp")


def check_timezone(field: str, value: str) -> None:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a tz directory such as "America"
        invalid(field, "unknown time zone")


def check_regex(field: str, pattern: str | None) -> None:
    if pattern is None:
        return
    try:
        re.compile(pattern)
    except re.error as exc:
        # re.error's message names the problem and position, never the pattern text.
        invalid(field, f"invalid regular expression: {exc}")


def redacted_repr(struct: msgspec.Struct, secrets: tuple[str, ...]) -> str:
    """repr() of a struct with its secret attributes masked, so logs and test output never show them."""
    parts = []
    for name in struct.__struct_fields__:
        value = getattr(struct, name)
        shown = "'***'" if name in secrets and value is not None else repr(value)
        parts.append(f"{name}={shown}")
    return f"{type(struct).__name__}({', '.join(parts)})"


class Condition(Model):
    field: str | None = None
    operator: Operator = "equals"
    value: list[Scalar] | None = None
    value_set_id: str | None = None
    prompt: str | None = None
    max_severity: Severity = "disqualify"

    def __post_init__(self) -> None:
        if self.operator == "matches":
            for i, pattern in enumerate(self.value or []):
                if isinstance(pattern, str):
                    check_regex(f"value[{i}]", pattern)


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

    def __post_init__(self) -> None:
        if not self.campaign_id.strip():
            invalid("campaignId", "must not be empty")


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


def _check_period(cap: int, start_date: str | None, end_date: str | None) -> None:
    if cap < 0:
        invalid("cap", "must be at least 0")
    check_date("startDate", start_date)
    check_date("endDate", end_date)


class SourceCap(Model):
    active: bool = True
    cap: int
    type: CapType = "daily"
    start_date: str | None = None
    end_date: str | None = None

    def __post_init__(self) -> None:
        _check_period(self.cap, self.start_date, self.end_date)


class PingLimit(Model):
    """How many pings a supplier's source may send: over the cap, a ping is answered 429."""
    type: Literal["per_minute", "hourly", "daily"]
    cap: int

    def __post_init__(self) -> None:
        if not 1 <= self.cap <= 100_000_000:
            invalid("cap", "must be between 1 and 100000000")


class DeliveryLimit(Model):
    active: bool = True
    cap: int
    type: CapType = "daily"
    action: ConstraintAction = "queue"
    start_date: str | None = None
    end_date: str | None = None
    route_to_campaign_id: str | None = None

    def __post_init__(self) -> None:
        _check_period(self.cap, self.start_date, self.end_date)
        if self.action == "route" and not self.route_to_campaign_id:
            invalid("routeToCampaignId", "required when action is route")


class ScheduleDay(Model):
    active: bool = True
    day: Weekday
    start_time: str  # HH:MM, local to the schedule's timezone
    end_time: str

    def __post_init__(self) -> None:
        if not _HHMM.match(self.start_time):
            invalid("startTime", "must be a time HH:MM between 00:00 and 23:59")
        # 24:00 lets a window run to the end of the day.
        if self.end_time != "24:00" and not _HHMM.match(self.end_time):
            invalid("endTime", "must be a time HH:MM between 00:00 and 24:00")


class DeliverySchedule(Model):
    timezone: str = "UTC"
    action: ConstraintAction = "queue"
    specific_days: list[ScheduleDay] = []
    route_to_campaign_id: str | None = None

    def __post_init__(self) -> None:
        check_timezone("timezone", self.timezone)
        if self.action == "route" and not self.route_to_campaign_id:
            invalid("routeToCampaignId", "required when action is route")


class MatchFields(Model):
    email: bool = True
    phone: bool = True
    match_logic: LogicalOperator = "OR"


class DedupeOverride(Model):
    enabled: bool = True
    window: int | float = 30  # days
    match_fields: MatchFields = msgspec.field(default_factory=MatchFields)


class Offer(Model):
    offer_id: str | None = None
    offer_name: str | None = None


class Client(Model):
    client_id: str | None = None
    client_name: str | None = None


class Milestone(Model):
    """A cost (ingestion source) or revenue (delivery) entry written when a lead reaches lead_status."""

    lead_status: LeadStatus
    amount: int | float
    currency: str = "USD"
    valid_from: str | None = None
    valid_to: str | None = None
    conditions: RuleSet | None = None
    notes: str | None = None
    active: bool = True

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Z]{3}", self.currency):
            invalid("currency", "must be a three-letter ISO 4217 code in capitals")
        check_date("validFrom", self.valid_from)
        check_date("validTo", self.valid_to)


# 2.1.1 documents

class MappingOverride(Model):
    id: str | None = None
    provider_field_name: str | None = None
    provider_field_id: str | None = None
    provider_field_label: str | None = None
    provider_field_required: bool = False
    provider_field_type: str | None = None
    auto_fill: bool = True
    fallback_template: str | None = None
    # field_library: sourceValue is a field key; static: sourceValue is the text; template:
    # sourceValue is a template over field keys.
    source_type: Literal["field_library", "static", "template"] = "field_library"
    source_value: str | None = None
    source_label: str | None = None


class CampaignDocument(Model):
    document_id: str
    kind: Literal["esign", "static"] = "esign"
    sign_template_id: str | None = None
    static_asset_id: str | None = None
    type: str | None = None
    name: str | None = None
    conditions: RuleSet | None = None
    field_mapping_overrides: list[MappingOverride] = []
    is_active: bool = True
    required: bool = False
    auto_send: bool = False
    expires_in_days: int | float | None = None
    order: int | float = 0

    def __post_init__(self) -> None:
        if self.expires_in_days is not None and self.expires_in_days <= 0:
            invalid("expiresInDays", "must be greater than 0")


# 2.1.2 campaignAiAgents

class AgentRef(Model):
    agent_id: str


class OverlayText(Model):
    mode: Literal["inline", "block"] = "inline"  # block: value is a blockId
    value: str | None = None


class OverlayRule(Model):
    id: str
    type: Literal["guardrail", "instruction"] = "guardrail"
    text: str | None = None
    block_id: str | None = None
    order: int | float = 0
    enabled: bool = True


class Overlay(Model):
    persona: OverlayText | None = None
    mission: OverlayText | None = None
    tone: OverlayText | None = None
    additional_rules: list[OverlayRule] = []


class CampaignAiAgents(Model):
    rep: AgentRef | None = None  # also the SMS agent of the campaign
    rep_test: AgentRef | None = None
    overlay: Overlay | None = None


# 2.1.3 firstIntakeAction

class EngageAction(Model):
    goal_id: str


class HumanReview(Model):
    reason: str | None = None
    priority: Literal["low", "normal", "high", "urgent"] = "normal"


class WorkflowAction(Model):
    workflow_definition_id: str


class FirstIntakeAction(Model):
    enabled: bool = False
    action: Literal["human_review", "engage", "workflow"] = "human_review"
    engage: EngageAction | None = None
    human_review: HumanReview | None = None
    workflow: WorkflowAction | None = None

    def __post_init__(self) -> None:
        # engage and workflow hand the lead to a plugin hook, which needs to know what to run.
        if self.enabled and self.action == "engage" and self.engage is None:
            invalid("engage", "required when action is engage")
        if self.enabled and self.action == "workflow" and self.workflow is None:
            invalid("workflow", "required when action is workflow")


class Recovery(Model):
    engage_on_route: bool = False
    collect_sequence_id: str | None = None


# 2.1.4 qualification

class DeliveryPolicy(Model):
    required: bool = False


class IngestionPolicy(Model):
    require_source_attestation: bool = False
    # Claim compliance.trustedFormCertUrl with TrustedForm before qualifying (the job loop does it).
    verify_certificate: bool = False


class CampaignAttestation(Model):
    enabled: bool = False
    attested_by: str | None = None
    attested_at: str | None = None
    note: str | None = None

    def __post_init__(self) -> None:
        check_timestamp("attestedAt", self.attested_at)


class TcpaPolicy(Model):
    delivery_policy: DeliveryPolicy = msgspec.field(default_factory=DeliveryPolicy)
    ingestion_policy: IngestionPolicy = msgspec.field(default_factory=IngestionPolicy)
    campaign_attestation: CampaignAttestation | None = None


MAX_VERIFICATION_TIMEOUT_MS = 60_000
MAX_VERIFICATION_CACHE_SECONDS = 2_592_000  # 30 days


class Verification(Model):
    """One verification step (`qualification.verifications[]`): a verifier checks the lead at
    intake; what its `fail` and `unknown` outcomes do is the step's own policy."""

    verifier: str
    config: dict[str, Any] = {}
    on_fail: Literal["disqualify", "review", "flag"] = "disqualify"
    on_unknown: Literal["pass", "review", "error"] = "pass"
    sample: int | float = 1  # the share of leads checked
    cache_seconds: int = 0  # how long a pass or fail is reused for the same value (the verifier's key)
    timeout_ms: int = 2000  # past it the step is `unknown`

    def __post_init__(self) -> None:
        if not self.verifier.strip():
            invalid("verifier", "must not be empty")
        if not 0 <= self.sample <= 1:
            invalid("sample", "must be between 0 and 1")
        if not 0 <= self.cache_seconds <= MAX_VERIFICATION_CACHE_SECONDS:
            invalid("cacheSeconds", f"must be between 0 and {MAX_VERIFICATION_CACHE_SECONDS} (30 days)")
        if not 1 <= self.timeout_ms <= MAX_VERIFICATION_TIMEOUT_MS:
            invalid("timeoutMs", f"must be between 1 and {MAX_VERIFICATION_TIMEOUT_MS}")


class Qualification(Model):
    rules: list[RuleSet] = []
    tcpa_policy: TcpaPolicy = msgspec.field(default_factory=TcpaPolicy)
    dedupe_override: DedupeOverride | None = None  # None: the tenant default applies
    auto_routing_enabled: bool = False
    routing_rules: list[RoutingRule] = []
    fallback_campaigns: list[str] = []
    # Suppression lists (POST /api/v1/suppression-lists) checked at intake and before delivery.
    suppression_list_ids: list[str] = []
    verifications: list[Verification] = []

    def __post_init__(self) -> None:
        # A step's result is kept on the lead under its verifier's name: one step per verifier.
        seen: set[str] = set()
        for i, step in enumerate(self.verifications):
            if step.verifier in seen:
                invalid(f"verifications[{i}].verifier", f"{step.verifier!r} is already a step of this campaign")
            seen.add(step.verifier)


# 2.1.5 ingestion

class EncryptedSecret(Model):
    ciphertext: str
    encrypted_data_key: str
    iv: str
    auth_tag: str
    kms_key_id: str | None = None


class Placement(Model):
    apply_routing_rules: bool = True
    apply_fallback_campaigns: bool = True


class IngestionSource(Model):
    source_id: str
    name: str | None = None
    supplier_id: str | None = None
    posting_spec_id: str | None = None
    mode: Literal["direct_post"] = "direct_post"
    api_key: str | None = None  # plaintext only in an import bundle; stored sealed
    api_key_encrypted: EncryptedSecret | None = None
    key_prefix: str | None = None
    spec_share_hash: str | None = None
    caps: list[SourceCap] = []
    cost_milestones: list[Milestone] = []
    short_circuit_sync_evaluation: bool = False
    placement: Placement = msgspec.field(default_factory=Placement)
    active: bool = True
    created_at: str | None = None
    updated_at: str | None = None
    payout: int | float | None = None  # offered to a ping of this source when its campaign does not auction
    ping_limits: list[PingLimit] = []

    def __post_init__(self) -> None:
        if not self.source_id.strip():
            invalid("sourceId", "must not be empty")
        if self.payout is not None and not 0 <= self.payout <= MAX_BID:
            invalid("payout", f"must be between 0 and {MAX_BID:,}")
        check_timestamp("createdAt", self.created_at)
        check_timestamp("updatedAt", self.updated_at)

    def __repr__(self) -> str:
        return redacted_repr(self, ("api_key",))


class Ingestion(Model):
    sources: list[IngestionSource] = []


# 2.1.6 delivery

MAX_WEIGHT = 1_000_000  # the rotation adds weights up: keep the sums exact in a float
MAX_BID = 1_000_000  # a bid, floor or fixed bid above this is a buyer's (or a typist's) mistake


class DistributionEndpoint(Model):
    """One buyer of a campaign that sells to several. Its own limits and schedule, when set,
    only move a lead on to the next buyer (and queue it when no buyer has room); its
    `conditions` are the buyer's filter, checked just before sending."""

    delivery_endpoint_id: str
    priority: int = 0  # lower first; equal priorities keep the list's order
    weight: int | float = 1
    active: bool = True
    delivery_limits: list[DeliveryLimit] = []
    delivery_schedule: DeliverySchedule | None = None
    conditions: RuleSet | None = None
    bid: int | float | None = None  # in an auction: what this buyer pays, when its endpoint is not pinged

    def __post_init__(self) -> None:
        if not self.delivery_endpoint_id.strip():
            invalid("deliveryEndpointId", "must not be empty")
        if self.bid is not None and not 0 <= self.bid <= MAX_BID:
            invalid("bid", f"must be between 0 and {MAX_BID:,}")
        if not 0 < self.weight <= MAX_WEIGHT:
            invalid("weight", f"must be greater than 0 and at most {MAX_WEIGHT:,}")
        if any(limit.action != "queue" for limit in self.delivery_limits):
            invalid("deliveryLimits", "a buyer's own limits can only queue (the lead moves on to the next buyer)")
        if self.delivery_schedule is not None and self.delivery_schedule.action != "queue":
            invalid("deliverySchedule", "a buyer's own schedule can only queue (the lead moves on to the next buyer)")


class AuctionMargin(Model):
    """What the agency keeps of a winning bid when it offers a pinging supplier a payout: a
    fixed amount, a percentage of the bid (20 = 20 %), or both (the percentage first)."""

    amount: int | float | None = None
    percent: int | float | None = None

    def __post_init__(self) -> None:
        if self.amount is not None and not 0 <= self.amount <= MAX_BID:
            invalid("amount", f"must be between 0 and {MAX_BID:,}")
        if self.percent is not None and not 0 <= self.percent <= 100:
            invalid("percent", "must be between 0 and 100")


class Auction(Model):
    """How a campaign sells at auction: `exclusive` to the highest bid, `shared` to the top
    `maxWinners`; bids under `floor` lose; a standing bid is good for `bidTtlSeconds`; with no
    bid, `noBid` fails the lead (repostable) or queues it for another round."""

    mode: Literal["exclusive", "shared"] = "exclusive"
    max_winners: int = 3
    floor: int | float = 0
    currency: str = "USD"
    timeout_ms: int | None = None  # the whole ping round; None: the largest buyer's ping timeout
    bid_ttl_seconds: int = 60
    no_bid: Literal["fail", "queue"] = "fail"
    margin: AuctionMargin | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.max_winners <= 10:
            invalid("maxWinners", "must be between 1 and 10")
        if not 0 <= self.floor <= MAX_BID:
            invalid("floor", f"must be between 0 and {MAX_BID:,}")
        if not re.fullmatch(r"[A-Z]{3}", self.currency):
            invalid("currency", "must be a three-letter ISO 4217 code such as USD")
        if self.timeout_ms is not None and not MIN_PING_MS <= self.timeout_ms <= MAX_PING_MS:
            invalid("timeoutMs", f"must be between {MIN_PING_MS} and {MAX_PING_MS}")
        if not 1 <= self.bid_ttl_seconds <= 86_400:
            invalid("bidTtlSeconds", "must be between 1 and 86400")


MIN_PING_MS, MAX_PING_MS = 50, 10_000


class Distribution(Model):
    """How a lead picks among several buyers: `priority` tries the lowest priority first;
    `round_robin` and `weighted` rotate the first choice. After a `failure` or `duplicate`
    answer (or retries exhausted on errors) the lead goes on down the list (the waterfall).
    `auction` pings the buyers and sells to the highest bids (`auction` says how)."""

    method: Literal["priority", "round_robin", "weighted", "auction"] = "priority"
    endpoints: list[DistributionEndpoint] = []
    auction: Auction | None = None

    def __post_init__(self) -> None:
        if self.auction is not None and self.method != "auction":
            invalid("auction", "only with method auction")
        if self.method == "auction" and self.auction is None:
            self.auction = Auction()
        if not any(entry.active for entry in self.endpoints):
            invalid("endpoints", "must name at least one active delivery endpoint")
        seen: set[str] = set()
        for entry in self.endpoints:
            if entry.delivery_endpoint_id in seen:
                invalid("endpoints", f"names {entry.delivery_endpoint_id!r} twice")
            seen.add(entry.delivery_endpoint_id)


def sells_at_auction(campaign: Campaign) -> bool:
    distribution = campaign.delivery.distribution
    return distribution is not None and distribution.method == "auction"


class Delivery(Model):
    delivery_endpoint_id: str | None = None
    distribution: Distribution | None = None  # several buyers; when set, deliveryEndpointId is not used
    delivery_limits: list[DeliveryLimit] = []
    delivery_schedule: DeliverySchedule | None = None
    revenue_milestones: list[Milestone] = []
    discrepancy_hold: Literal["off", "on"] = "off"


class Campaign(Model):
    campaign_id: str
    name: str
    active: bool = True
    offer: Offer | None = None
    client: Client | None = None
    manager_id: str | None = None
    brief: str | None = None
    disambiguation_hint: str | None = None
    questionnaire_id: str | None = None
    documents: list[CampaignDocument] = []
    knowledge_base_ids: list[str] = []
    campaign_ai_agents: CampaignAiAgents = msgspec.field(default_factory=CampaignAiAgents)
    first_intake_action: FirstIntakeAction = msgspec.field(default_factory=FirstIntakeAction)
    recovery: Recovery = msgspec.field(default_factory=Recovery)
    qualification: Qualification = msgspec.field(default_factory=Qualification)
    ingestion: Ingestion = msgspec.field(default_factory=Ingestion)
    delivery: Delivery = msgspec.field(default_factory=Delivery)
    notes: str | None = None
    tags: list[str] = []
    external_id: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    archived_at: str | None = None  # set: the campaign is archived
    last_lead_received_at: str | None = None

    def __post_init__(self) -> None:
        if not _CAMPAIGN_CODE.match(self.campaign_id):
            invalid("campaignId", "must be 3 to 5 letters, digits, underscores or hyphens")
        if not self.name.strip():
            invalid("name", "must not be empty")
        check_timestamp("createdAt", self.created_at)
        check_timestamp("updatedAt", self.updated_at)
        check_timestamp("archivedAt", self.archived_at)
        check_timestamp("lastLeadReceivedAt", self.last_lead_received_at)


def public_campaign(c: Campaign) -> Campaign:
    """The campaign as GET /campaigns shows it: ingestion sources keep keyPrefix, lose the key."""
    sources = [
        msgspec.structs.replace(s, api_key=None, api_key_encrypted=None) for s in c.ingestion.sources
    ]
    return msgspec.structs.replace(c, ingestion=msgspec.structs.replace(c.ingestion, sources=sources))
