"""One submission through the pipeline, the parts that need no storage: source attestation,
routing, qualification, fallback and the first intake action. Caps and dedupe need counts and
earlier leads, so intake.py decides them inside the write transaction with `source_caps_reached`
and dedupe.find_duplicate, then combines everything with `settle`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import date, datetime, timedelta, timezone
from typing import Any

import msgspec

from appliance.domain.campaign import Campaign, IngestionSource, Milestone
from appliance.domain.lead import (
    AlternativeCampaign, Approval, CampaignSnapshot, JourneyEvent, QualificationOutcome, RoutingOutcome,
)
from appliance.domain.routing import choose_route
from appliance.domain.rules import MISSING, IdentityCache, QualificationResult, matches, qualify

PromptEvaluator = Callable[[Any, dict], bool | None]


class Evaluation(msgspec.Struct, kw_only=True):
    """What routing and qualification decided; status is qualified, disqualified or pending_action."""

    campaign: Campaign
    status: str
    qualification: QualificationOutcome
    routing: RoutingOutcome
    approval: Approval | None = None
    intake_action: str | None = None  # human_review, engage or workflow when one holds the lead
    events: list[JourneyEvent] = []


def usable(campaign: Campaign | None) -> bool:
    return campaign is not None and campaign.active and campaign.archived_at is None


def abbreviation(name: str | None) -> str | None:
    """Initials of the words, up to five: "Smith & Partners" -> "SP" (campaigns carry no abbrev)."""
    if not name:
        return None
    initials = "".join(word[0] for word in name.split() if word[:1].isalnum()).upper()[:5]
    return initials or None


# Every submission carries its campaign's snapshot, which depends on the campaign alone: one per
# campaign object (configuration is never changed in place, and snapshots are not either).
_SNAPSHOTS = IdentityCache()


def snapshot(campaign: Campaign) -> CampaignSnapshot:
    made = _SNAPSHOTS.get(campaign)
    if made is MISSING:
        made = _SNAPSHOTS.put(campaign, None, _snapshot(campaign))
    return made


def _snapshot(campaign: Campaign) -> CampaignSnapshot:
    client, offer = campaign.client, campaign.offer
    client_name = client.client_name if client else None
    offer_name = offer.offer_name if offer else None
    return CampaignSnapshot(
        campaign_id=campaign.campaign_id, name=campaign.name,
        client_id=client.client_id if client else None, client_name=client_name,
        client_abbrev=abbreviation(client_name),
        offer_id=offer.offer_id if offer else None, offer_name=offer_name, offer_abbrev=abbreviation(offer_name),
    )


def event(now: str, kind: str, reason: str | None = None, campaign: Campaign | None = None,
          details: dict[str, Any] | None = None) -> JourneyEvent:
    return JourneyEvent(
        timestamp=now, type=kind, reason=reason, details=details,
        to_campaign_id=campaign.campaign_id if campaign else None,
        to_client=campaign.client.client_name if campaign and campaign.client else None,
        to_offer=campaign.offer.offer_name if campaign and campaign.offer else None,
    )


def attestation_problem(campaign: Campaign, compliance: Mapping[str, Any]) -> str | None:
    """Source checks: a campaign may require the source's TCPA attestation, and a TrustedForm
    certificate URL when it verifies certificates (the claim itself is the job loop's)."""
    policy = campaign.qualification.tcpa_policy.ingestion_policy
    if policy.verify_certificate and not compliance.get("trustedFormCertUrl"):
        return ("TrustedForm certificate could not be verified: "
                "compliance.trustedFormCertUrl is missing")
    if not policy.require_source_attestation:
        return None
    if compliance.get("tcpaConsent") is not True:
        return "TCPA attestation required: compliance.tcpaConsent must be true"
    if not compliance.get("consentTimestamp"):
        return "TCPA attestation required: compliance.consentTimestamp is missing"
    return None


def _qualify(campaign: Campaign, facts: Mapping[str, Any], value_sets: Mapping, today: date,
             prompt_evaluator: PromptEvaluator | None) -> QualificationResult:
    return qualify(campaign.qualification.rules, facts, applies_at="ingestion", value_sets=value_sets,
                   today=today, prompt_evaluator=prompt_evaluator)


def evaluate(facts: Mapping[str, Any], intake: Campaign, campaigns: Mapping[str, Campaign],
             source: IngestionSource | None, *, value_sets: Mapping, today: date, now: str,
             route: bool = True, prompt_evaluator: PromptEvaluator | None = None) -> Evaluation:
    """Routing (when allowed), qualification, fallback (one level), first intake action."""
    events: list[JourneyEvent] = []
    placement = source.placement if source else None
    current, method, rule_name, routing_reason = intake, "original", None, None

    if route and intake.qualification.auto_routing_enabled and (placement is None or placement.apply_routing_rules):
        rule = choose_route(intake.qualification.routing_rules, facts, value_sets=value_sets, today=today,
                            prompt_evaluator=prompt_evaluator)
        if rule is not None:
            target = campaigns.get(rule.route_to.campaign_id)
            if usable(target):
                current, method, rule_name = target, "rule", rule.route_name
                routing_reason = f"routing rule {rule.route_name or rule.route_to.campaign_id!r} matched"
                events.append(event(now, "routed", routing_reason, target, {"rule": rule.route_name}))
            else:
                events.append(event(now, "routing_skipped",
                                    f"routing rule target {rule.route_to.campaign_id} is not an active campaign"))

    result = _qualify(current, facts, value_sets, today, prompt_evaluator)
    first_passed = result.passed
    events.append(event(now, "qualification", result.reason or "passed every rule set", current,
                        {"score": result.score, "passed": result.passed, "holdForReview": result.hold_for_review,
                         "flags": result.flags}))
    alternatives: list[AlternativeCampaign] = []
    if not result.passed and (placement is None or placement.apply_fallback_campaigns):
        for priority, campaign_id in enumerate(current.qualification.fallback_campaigns, 1):
            candidate = campaigns.get(campaign_id)
            if not usable(candidate) or candidate is current:
                alternatives.append(AlternativeCampaign(campaign_id=campaign_id, qualified=False, priority=priority,
                                                        reason="not an active campaign"))
                continue
            tried = _qualify(candidate, facts, value_sets, today, prompt_evaluator)
            alternatives.append(AlternativeCampaign(
                campaign_id=campaign_id, qualified=tried.passed, priority=priority,
                client_name=candidate.client.client_name if candidate.client else None,
                offer_name=candidate.offer.offer_name if candidate.offer else None,
                reason=tried.reason or "passed every rule set"))
            if tried.passed:
                routing_reason = f"{current.campaign_id} did not qualify; fallback {campaign_id} did"
                events.append(event(now, "fallback", routing_reason, candidate))
                current, method, rule_name, result = candidate, "fallback", None, tried
                break

    routing = RoutingOutcome(
        was_routed=current is not intake, original_campaign_id=intake.campaign_id,
        routed_to_campaign_id=current.campaign_id if current is not intake else None,
        routing_reason=routing_reason, routing_method=method, routing_rule_name=rule_name,
        alternative_campaigns=alternatives, routing_evaluated_at=now,
    )
    qualification = QualificationOutcome(
        passed=result.passed, original_campaign_qualified=first_passed, score=result.score, method="rules",
        reason=result.reason, qualified_at=now,
    )
    if not result.passed:
        return Evaluation(campaign=current, status="disqualified", qualification=qualification, routing=routing,
                          events=events)
    if result.hold_for_review:
        events.append(event(now, "held_for_review", result.reason, current))
        return Evaluation(campaign=current, status="pending_action", qualification=qualification, routing=routing,
                          approval=Approval(status="pending", campaign_id=current.campaign_id, reason=result.reason),
                          intake_action="human_review", events=events)
    action = current.first_intake_action
    if action.enabled:
        reason = (action.human_review.reason if action.action == "human_review" and action.human_review else None)
        events.append(event(now, "first_intake_action", reason or action.action, current, {"action": action.action}))
        approval = (Approval(status="pending", campaign_id=current.campaign_id, reason=reason)
                    if action.action == "human_review" else None)
        return Evaluation(campaign=current, status="pending_action", qualification=qualification, routing=routing,
                          approval=approval, intake_action=action.action, events=events)
    return Evaluation(campaign=current, status="qualified", qualification=qualification, routing=routing,
                      events=events)


def milestones_due(milestones: list[Milestone], statuses: tuple[str, ...], facts: Mapping[str, Any], *,
                   value_sets: Mapping, now: datetime, today: date) -> list[Milestone]:
    """Active milestones for any of `statuses`, inside their validity window, whose conditions
    (when given) match the lead."""
    due = []
    for milestone in milestones:
        if not milestone.active or milestone.lead_status not in statuses:
            continue
        start = _bound(milestone.valid_from, end_of_day=False)
        end = _bound(milestone.valid_to, end_of_day=True)
        if (start and now < start) or (end and now > end):
            continue
        rules = milestone.conditions
        if rules is not None and rules.sub_rules and not matches(
                rules.logical_operator, rules.sub_rules, facts, value_sets=value_sets, today=today):
            continue
        due.append(milestone)
    return due


def _bound(text: str | None, *, end_of_day: bool) -> datetime | None:
    """A validity bound: a date covers its whole UTC day; a timestamp without zone is UTC."""
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if len(text) == 10 and end_of_day:
        parsed += timedelta(days=1, microseconds=-1)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
