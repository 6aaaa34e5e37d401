"""POST /api/v1/leads/submit behind the HTTP layer: everything that needs no earlier data runs
on the event loop (normalization, the campaign's verification steps, routing, qualification); caps and dedupe are decided inside
the write transaction, where concurrent submits are serialized, so caps are never overrun and a
burst of identical leads yields exactly one original. A 201 means the lead, its submission, its
ledger entries and its delivery job are committed together."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import msgspec

from appliance.clock import iso
from appliance.domain import caps as caps_rules
from appliance.domain.intake_decision import decide_intake
from appliance.domain.campaign import Campaign, IngestionSource
from appliance.domain.constraints import campaign_zone
from appliance.domain.dedupe import DedupePolicy, effective_policy, find_duplicate, window_start
from appliance.domain.lead import LeadRecord, Submission
from appliance.domain.pipeline import (
    Evaluation, attestation_problem, evaluate, event, snapshot, usable,
)
from appliance.domain.submission import SubmitLead, build_lead, facts_of, with_field_library_problems
from appliance.domain.suppression import lead_hashes
from appliance.domain.verification import apply_verdict
from appliance.errors import Forbidden, InvalidState, ValidationFailed
from appliance.ids import new_id
from appliance.plugins import Registry
from appliance.runtime import Runtime
from appliance.sdk import IntakeAction
from appliance.services.tenant_settings import TenantSettings
from appliance.services.lead_events import record_lead_events
from appliance.services.ledger import earn
from appliance.services.verification import costly, verify_lead
from appliance.storage import locks
from appliance.storage import Principal, PingRecord, Session

log = logging.getLogger("appliance.intake")


class SubmitResult(msgspec.Struct, rename="camel"):
    lead_id: str
    submission_id: str
    status: str


@dataclass(frozen=True)
class CapCheck:
    scope: str
    period_start: str
    cap: int
    label: str


def source_cap_checks(tenant_campaign: Campaign, source: IngestionSource | None, now: datetime) -> list[CapCheck]:
    if source is None:
        return []
    tz = caps_rules.zone(campaign_zone(tenant_campaign))
    checks = []
    for cap in source.caps:
        if not caps_rules.cap_applies(cap, now, tz):
            continue
        start, _ = caps_rules.period_bounds(cap.type, now, tz)
        checks.append(CapCheck(
            scope=f"source:{tenant_campaign.campaign_id}:{source.source_id}:{cap.type}",
            period_start=iso(start) if start else "", cap=cap.cap, label=f"{cap.type} source cap of {cap.cap}"))
    return checks


def resolve_campaign(settings: TenantSettings, campaign_id: str,
                      principal: Principal) -> tuple[Campaign, IngestionSource | None]:
    """The campaign a body names and, for a source key, its source. A source key may submit only
    to usable campaigns that have its source: anything else is a 403, whether the
    campaign is another's, unknown or inactive, so the key learns nothing of what exists."""
    if principal.kind != "source":
        return settings.usable_campaign(campaign_id), None
    campaign = settings.campaigns.get(campaign_id)
    source = None if campaign is None or not usable(campaign) else next(
        (s for s in campaign.ingestion.sources if s.source_id == principal.source_id), None)
    if campaign is None or source is None or not source.active:
        raise Forbidden(message="This source key may not submit to this campaign")
    return campaign, source


async def submit(runtime: Runtime, settings: TenantSettings, principal: Principal, body: SubmitLead,
                 registry: Registry, *, also: Callable[[Session], None] | None = None) -> SubmitResult:
    """`also` runs in the lead's own transaction after it is written (an import counts the lead)."""
    tenant_id = principal.tenant_id
    intake, source = resolve_campaign(settings, body.campaign_id, principal)
    now_dt = runtime.clock.now()
    now, today = iso(now_dt), now_dt.date()

    existing = None
    if body.lead_id is not None:
        existing = runtime.store.reader().leads.get_lead(tenant_id, body.lead_id)
        if source is not None and (existing is None or existing.source_id != source.source_id):
            raise Forbidden(message="This source key may only resubmit leads of its own source")
        if existing is None:
            raise ValidationFailed(["leadId: unknown lead"])
    lead, problems = build_lead(body, lead_id=existing.lead_id if existing else new_id("lead"), existing=existing,
                                labels=settings.labels, region=runtime.config.defaults.region, now=now)
    if source is not None:
        lead = msgspec.structs.replace(lead, source_id=source.source_id)
    facts = facts_of(lead)
    problems = with_field_library_problems(problems, facts, settings.checked_fields, today)
    if problems:
        raise ValidationFailed(problems)
    ping = None if body.ping_id is None else ping_to_post(
        runtime.store.reader(), tenant_id, body.ping_id, source.source_id if source is not None else None,
        intake.campaign_id, now)

    rejected_at_source = attestation_problem(intake, lead.compliance)
    evaluation = None
    dedupe = None if lead.is_test or existing is not None else effective_policy(
        runtime.config.defaults.dedupe_window_days, intake.qualification.dedupe_override)
    dedupe_since = iso(window_start(dedupe, now_dt)) if dedupe and dedupe.enabled else None
    duplicate_seen = None
    # A campaign that verifies TrustedForm certificates qualifies in the job loop, after the claim.
    deferred = bool(source and source.short_circuit_sync_evaluation) \
        or intake.qualification.tcpa_policy.ingestion_policy.verify_certificate
    if rejected_at_source is None and not deferred:
        verdict = None
        steps = intake.qualification.verifications
        if steps:
            # Steps that call out or block (time, money) are not spent on a duplicate: one query
            # first. Steps that only compute (`phone`) cost no more than that query (bench/README.md),
            # so they just run and the transaction finds the duplicate.
            if dedupe is not None and dedupe_since is not None and costly(registry, steps):
                earlier = runtime.store.reader().leads.earlier_leads(tenant_id, intake.campaign_id, lead.email,
                                                                     lead.phone_e164, dedupe_since)
                duplicate_seen = find_duplicate(dedupe, lead.email, lead.phone_e164, earlier)
            if duplicate_seen is None:
                lead, verdict = await verify_lead(runtime, registry, intake, lead, facts, tenant_id, now_dt)
        evaluation = evaluate(facts, intake, settings.campaigns, source, value_sets=settings.value_sets,
                              today=today, now=now, prompt_evaluator=registry.prompt_evaluator())
        if verdict is not None:
            evaluation = apply_verdict(evaluation, verdict, now)
    # Suppression costs nothing unless a campaign names lists: then one query in the transaction.
    suppression_lists = _suppression_lists(intake, evaluation)
    plan = _Plan(
        tenant_id=tenant_id, lead=lead, facts=facts, intake=intake, source=source, existing=existing is not None,
        based_on=existing.updated_at if existing is not None else None,
        evaluation=evaluation, rejected_at_source=rejected_at_source, caps=source_cap_checks(intake, source, now_dt),
        dedupe=dedupe, dedupe_since=dedupe_since, duplicate_seen=duplicate_seen,
        settings=settings, now_dt=now_dt, now=now, submission_id=new_id("sub"),
        suppression_lists=suppression_lists,
        suppression_hashes=lead_hashes(lead.email, lead.phone_e164) if suppression_lists else [],
        ping=ping,
    )
    # Only a resubmission (its lead changed meanwhile) or a ping (taken meanwhile) can be refused
    # in the transaction.
    result = await runtime.store.write(plan.commit if also is None else _and_then(plan.commit, also),
                                       may_refuse=plan.existing or ping is not None,
                                       locks=plan.locks() if runtime.store.names_locks else ())
    if evaluation is not None and result.status == "pending_action" and evaluation.intake_action in ("engage", "workflow"):
        run_intake_action(registry, evaluation.campaign, msgspec.structs.replace(lead, status=result.status),
                          result.submission_id, evaluation.intake_action)
    return result


_NOT_SOLD = frozenset(("disqualified", "duplicate", "suppressed"))


class _Plan(msgspec.Struct, kw_only=True):
    """A submit's decisions made on the loop, and the write they lead to. (A struct: made on every
    submit, its 20 fields cost a fifth of a dataclass's Python __init__.)"""

    tenant_id: str
    lead: LeadRecord
    facts: dict
    intake: Campaign
    source: IngestionSource | None
    existing: bool
    based_on: str | None  # updatedAt of the stored lead this resubmission was merged into
    evaluation: Evaluation | None
    rejected_at_source: str | None
    caps: list[CapCheck]
    dedupe: DedupePolicy | None
    dedupe_since: str | None
    duplicate_seen: str | None  # the earlier lead found before the verification steps, which did not run
    settings: TenantSettings
    now_dt: datetime
    now: str
    submission_id: str
    suppression_lists: list[str]
    suppression_hashes: list[bytes]
    ping: PingRecord | None = None  # the supplier's ping this lead is posted with

    def locks(self) -> list[str]:
        """What the commit must be exact about (storage/locks.py): named before it runs, so the
        store takes them with the transaction's first statement."""
        tenant_id, lead = self.tenant_id, self.lead
        held = [locks.cap_counter(tenant_id, check.scope, check.period_start) for check in self.caps]
        if self.dedupe is not None and self.dedupe_since is not None:
            held += [locks.dedupe_key(tenant_id, self.intake.campaign_id, field, value)
                     for field, value in (("email", lead.email), ("phone", lead.phone_e164)) if value]
        if self.existing:
            held.append(locks.lead(tenant_id, lead.lead_id))
        if self.ping is not None:
            held.append(locks.ping(tenant_id, self.ping.ping_id))
        return held

    def commit(self, tx: Session) -> SubmitResult:
        """Runs on the writer thread inside the group transaction."""
        now, lead = self.now, self.lead
        if self.ping is not None and not tx.pings.mark_posted(self.tenant_id, self.ping.ping_id, lead.lead_id):
            raise InvalidState(["pingId: already posted"])
        if self.existing:
            stored = tx.leads.get_lead(self.tenant_id, lead.lead_id)
            if stored is None or stored.updated_at != self.based_on:
                # Merged into a copy that another change has since replaced: writing it would undo that.
                raise InvalidState(["leadId: the lead changed while this resubmission was handled; send it again"])
        refused = self.rejected_at_source or next(
            (f"{check.label} reached" for check in self.caps
             if tx.caps.counter_value(self.tenant_id, check.scope, check.period_start) >= check.cap), None)
        suppressed_by = None
        if refused is None and self.suppression_hashes:
            list_id = tx.suppression.first_match(self.tenant_id, self.suppression_lists, self.suppression_hashes)
            if list_id is not None:
                found = tx.suppression.get_list(self.tenant_id, list_id)
                suppressed_by = found[1] if found is not None else list_id
        duplicate_of = None
        if refused is None and suppressed_by is None and self.dedupe is not None and self.dedupe_since is not None:
            earlier = tx.leads.earlier_leads(self.tenant_id, self.intake.campaign_id, lead.email,
                                             lead.phone_e164, self.dedupe_since)
            # A duplicate the steps were skipped for stays one, whatever became of its original since.
            duplicate_of = find_duplicate(self.dedupe, lead.email, lead.phone_e164, earlier) or self.duplicate_seen
        decision = decide_intake(intake=self.intake, now=now, refused_at_source=refused, duplicate_of=duplicate_of,
                                 evaluation=self.evaluation, approval=lead.approval, suppressed_by=suppressed_by)
        if decision.counts_against_caps:
            for check in self.caps:
                tx.caps.add_to_counter(self.tenant_id, check.scope, check.period_start)
        events = [event(now, "received", f"submitted to {self.intake.campaign_id}", self.intake,
                        {"sourceId": lead.source_id, "resubmission": self.existing}), *decision.events]
        status, campaign, qualification = decision.status, decision.campaign, decision.qualification
        evaluation = self.evaluation if refused is None and duplicate_of is None and suppressed_by is None \
            else None  # it decided

        number = lead.submission_count + 1
        client, offer = campaign.client, campaign.offer
        lead = msgspec.structs.replace(
            lead, status=status, campaign_id=campaign.campaign_id,
            client_id=client.client_id if client else None, offer_id=offer.offer_id if offer else None,
            approval=decision.approval, submission_count=number, updated_at=now,
        )
        submission = Submission(
            submission_id=self.submission_id, lead_id=lead.lead_id, submission_number=number,
            campaign=snapshot(campaign), status=status, qualification=qualification, routing=decision.routing,
            result=decision.reason,
            journey_events=events,
            first_submission_actions=[{"action": evaluation.intake_action, "at": now}]
            if evaluation is not None and evaluation.intake_action else [],
            flow_type="standard", submitted_at=now,
            qualified_at=qualification.qualified_at if qualification and qualification.passed else None,
            created_at=now, updated_at=now,
        )
        if self.existing:
            previous = tx.leads.latest_submission(self.tenant_id, lead.lead_id)
            if previous is not None:  # one live delivery per lead: the new submission replaces it
                tx.jobs.cancel_open_jobs(previous.submission_id, now)
            tx.leads.update_lead(self.tenant_id, lead, names_changed=True)
        else:
            tx.leads.insert_lead(self.tenant_id, lead, self.intake.campaign_id)
        tx.leads.insert_submission(self.tenant_id, submission)
        if self.ping is not None and self.ping.auction_id is not None:
            # Its round, with the winners it reserved, is the one the delivery sells to.
            held = tx.auctions.get(self.tenant_id, self.ping.auction_id)
            if held is not None:
                tx.auctions.update(self.tenant_id, msgspec.structs.replace(
                    held, lead_id=lead.lead_id, submission_id=submission.submission_id))
        if decision.job is not None:
            tx.jobs.insert_job(tenant_id=self.tenant_id, kind=decision.job, lead_id=lead.lead_id,
                               submission_id=submission.submission_id, due_at=now, now=now)
        # The supplier is paid what its ping was offered for a lead that is sold, not for one refused here.
        paid = self.ping.bid if self.ping is not None and status not in _NOT_SOLD else None
        earn(tx, self.settings, self.tenant_id, lead, submission.submission_id, ("lead_ingested", status), self.now_dt,
             campaign=campaign, source=self.source, facts=self.facts,
             payout=(paid, self.ping.currency) if paid is not None else None)
        record_lead_events(tx, self.settings, self.tenant_id, lead, submission, (status,), now, processed=True)
        return SubmitResult(lead_id=lead.lead_id, submission_id=submission.submission_id, status=status)


def ping_to_post(tx: Session, tenant_id: str, ping_id: str, source_id: str | None, campaign_id: str,
                 now: str) -> PingRecord:
    """The ping a submit names, if the lead may be posted with it; else 409 naming what is wrong,
    and nothing is stored."""
    found = tx.pings.get(tenant_id, ping_id)
    if found is None:
        raise InvalidState(["pingId: unknown ping"])
    if found.source_id != source_id:
        raise InvalidState(["pingId: the ping was made by another source"])
    if found.campaign_id != campaign_id:
        raise InvalidState([f"pingId: the ping was for campaign {found.campaign_id}"])
    if found.lead_id is not None:
        raise InvalidState(["pingId: already posted"])
    if not found.accepted:
        raise InvalidState(["pingId: the ping was not accepted"])
    if found.expires_at <= now:
        raise InvalidState([f"pingId: expired at {found.expires_at}"])
    return found


def _and_then(commit: Callable[[Session], SubmitResult], also: Callable[[Session], None]) -> Callable[[Session], SubmitResult]:
    def unit(tx: Session) -> SubmitResult:
        result = commit(tx)
        also(tx)
        return result
    return unit


def _suppression_lists(intake: Campaign, evaluation: Evaluation | None) -> list[str]:
    """The lists a submit is checked against: its campaign's and, when routing moved it, the
    campaign it was routed to."""
    lists = intake.qualification.suppression_list_ids
    routed = evaluation.campaign.qualification.suppression_list_ids if evaluation is not None else []
    if not routed or routed is lists:
        return lists
    return list(dict.fromkeys([*lists, *routed]))


def run_intake_action(registry: Registry, campaign: Campaign, lead: LeadRecord, submission_id: str, action: str) -> None:
    """The first intake action's plugin hooks (engage, workflow); their failures are logged, never raised."""
    config = campaign.first_intake_action.engage if action == "engage" else campaign.first_intake_action.workflow
    errors = registry.call_intake_action(IntakeAction(
        action=action, lead=facts_of(lead), campaign_id=campaign.campaign_id, submission_id=submission_id,
        config=msgspec.to_builtins(config) if config is not None else {}))
    for error in errors:
        log.error("intake action %s for %s: %s", action, lead.lead_id, error)
