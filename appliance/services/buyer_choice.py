"""Where a lead's buyer is chosen, in the write transaction that takes the delivery limits'
slots: first the campaign with room (the lead's own, or one its limits and schedule send it on
to), then, when that campaign has a distribution, the endpoint for this attempt (a retry keeps
its endpoint, a first try may rotate). A lead whose buyer is paused parks its job until the
resume (`park`); after a refusal it moves down the waterfall to the distribution's next endpoint
(`move_down_the_waterfall`). What the order, the rotation and an endpoint's own limits say is
decided in domain/distribution.py, what a campaign's limits say in domain/constraints.py."""

from __future__ import annotations

from dataclasses import dataclass, replace

import msgspec

from appliance.clock import Clock, iso
from appliance.domain.campaign import Campaign, Distribution
from appliance.domain.constraints import Blocked, LimitCheck, limit_blocked
from appliance.domain.delivery_target import endpoint_override
from appliance.domain.distribution import endpoint_gate, full, rotate, rotates, untried
from appliance.domain.lead import JourneyError
from appliance.domain.pipeline import event, snapshot
from appliance.domain.submission import facts_of
from appliance.services.delivery_attempt import Attempt, settle
from appliance.storage import Session

STOPPED = object()  # the attempt goes nowhere this time (parked, queued or ended)


@dataclass(frozen=True)
class Reserved:
    campaign: Campaign  # the campaign with room; its slots are held on the job row until the outcome
    attempt: Attempt  # the attempt to record, moved to `campaign` when that is another campaign


def reserve_and_choose(tx: Session, clock: Clock, attempt: Attempt, campaign: Campaign,
                       candidates: dict[str, Campaign], checks: dict[str, tuple[list[LimitCheck], Blocked | None]],
                       named: str | None) -> tuple[Reserved | None, str | None | object]:
    """In one write transaction: the campaign's slots (`reserve_campaign`, which may move the
    lead to another campaign), then, when that campaign has a distribution, its buyer
    (`choose_endpoint`). The buyer is None when the campaign has no distribution (or a repost
    named one); STOPPED when the job was queued, parked or ended."""
    reserved = reserve_campaign(tx, clock, attempt, campaign, candidates, checks) \
        if checks[campaign.campaign_id] != ([], None) else Reserved(campaign, attempt)
    if reserved is None:
        return None, STOPPED
    distribution = reserved.campaign.delivery.distribution
    if distribution is None or named is not None:
        return reserved, None
    chosen = choose_endpoint(tx, clock, reserved.attempt, reserved.campaign, distribution)
    return reserved, STOPPED if chosen is None else chosen


def reserve_campaign(tx: Session, clock: Clock, attempt: Attempt, campaign: Campaign, candidates: dict[str, Campaign],
                     checks: dict[str, tuple[list[LimitCheck], Blocked | None]]) -> Reserved | None:
    """In the write transaction: find a campaign with room now and take its slots, or queue."""
    tenant_id, now = attempt.job.tenant_id, attempt.now
    current, tried = campaign, {campaign.campaign_id}
    first_block: Blocked | None = None  # what stopped the lead's own campaign
    while True:
        limits, schedule = checks[current.campaign_id]
        blocked = next((limit_blocked(check) for check in limits
                        if tx.caps.counter_value(tenant_id, check.scope, check.period_start) >= check.cap),
                       None) or schedule
        if blocked is None:
            for check in limits:
                tx.caps.add_to_counter(tenant_id, check.scope, check.period_start)
            if limits:
                tx.jobs.hold_reservations(attempt.job.job_id, [(c.scope, c.period_start) for c in limits])
            if first_block is None:
                return Reserved(current, attempt)
            return Reserved(current, _moved(attempt, current, f"{campaign.campaign_id}: {first_block.reason}"))
        if first_block is None:
            first_block = blocked
        if blocked.action == "route":
            following = [blocked.route_to] if blocked.route_to else []
        elif blocked.action == "next_priority":
            following = list(current.qualification.fallback_campaigns)
        else:
            following = []
        current = next((candidates[cid] for cid in following if cid in candidates and cid not in tried), None)
        if current is None:
            break
        tried.add(current.campaign_id)
    release = first_block.release_at
    tx.jobs.reschedule(attempt.job.job_id, iso(release), iso(now), error=first_block.reason, keep_attempts=True)
    settle(tx, clock, attempt, None, "queued", f"{first_block.reason}; released at {iso(release)}", job_state=None,
           event_kind="queued")
    return None


def _moved(attempt: Attempt, target: Campaign, reason: str) -> Attempt:
    moved = event(iso(attempt.now), "rerouted_for_delivery", reason, target)
    return replace(attempt, events=(*attempt.events, moved),
                   submission=msgspec.structs.replace(attempt.submission, campaign=snapshot(target)))


def choose_endpoint(tx: Session, clock: Clock, attempt: Attempt, campaign: Campaign,
                    distribution: Distribution) -> str | None:
    """In the write transaction: the distribution's endpoint for this attempt, its own limit
    slots taken and the choice kept on the job. A job that chose before (an error being
    retried) stays with its endpoint while it is in the distribution and not paused; else
    the first endpoint not tried yet that is not paused and has room, the rotation choosing
    among them for a lead's first try. None: every endpoint left is paused (parked), full or
    closed (queued), or none is left."""
    job, now = attempt.job, attempt.now
    tenant_id = job.tenant_id
    pinned = [e for e in distribution.endpoints if e.delivery_endpoint_id == job.endpoint_id]
    if pinned and not tx.endpoints.is_paused(tenant_id, pinned[0].delivery_endpoint_id):
        entries = pinned
    else:
        entries = untried(distribution, job.tried, facts_of(attempt.lead), value_sets=attempt.settings.value_sets,
                          today=now.date())
        if not entries:
            tx.jobs.release_reservations(tenant_id, job.job_id)
            tried = ", ".join(job.tried) or "none"
            settle(tx, clock, attempt, None, "failed", f"no delivery endpoint of the distribution is left to try"
                   f" (tried: {tried})", job_state="done", event_kind="distribution_exhausted")
            return None
    open_entries, blocks = [], []
    for entry in entries:
        if tx.endpoints.is_paused(tenant_id, entry.delivery_endpoint_id):
            continue
        gate = endpoint_gate(campaign, entry, now)
        blocked = full(gate, lambda scope, period: tx.caps.counter_value(tenant_id, scope, period))
        if blocked is not None:
            blocks.append(blocked)
        else:
            open_entries.append((entry, gate))
    if not open_entries:
        if blocks:
            first = min(blocks, key=lambda b: b.release_at)
            tx.jobs.release_reservations(tenant_id, job.job_id)
            tx.jobs.reschedule(job.job_id, iso(first.release_at), iso(now), error=first.reason, keep_attempts=True)
            settle(tx, clock, attempt, None, "queued", f"{first.reason}; released at {iso(first.release_at)}",
                   job_state=None, event_kind="queued")
        else:
            park(tx, clock, attempt, entries[0].delivery_endpoint_id if entries is pinned else None, attempted=False)
        return None
    chosen, gate = open_entries[0]
    if entries is not pinned and not job.tried and rotates(distribution):
        ids = [entry.delivery_endpoint_id for entry, _ in open_entries]
        chosen_id, weights = rotate(distribution, ids, tx.endpoints.rotation(tenant_id, campaign.campaign_id))
        tx.endpoints.save_rotation(tenant_id, campaign.campaign_id, weights)
        chosen, gate = open_entries[ids.index(chosen_id)]
    for check in gate.limits:
        tx.caps.add_to_counter(tenant_id, check.scope, check.period_start)
    if gate.limits:
        tx.jobs.hold_reservations(job.job_id, [(c.scope, c.period_start) for c in gate.limits])
    tx.jobs.choose_endpoint(job.job_id, chosen.delivery_endpoint_id)
    return chosen.delivery_endpoint_id


def park(tx: Session, clock: Clock, attempt: Attempt, endpoint_id: str | None, *, attempted: bool,
         step: tuple[str, str] | None = None, outcome: tuple | None = None, details: dict | None = None,
         error: JourneyError | None = None) -> bool:
    """The job waits for its paused endpoint (read again here, in the write transaction: a
    resume committed since is seen), or with None for any endpoint of its distribution, and
    the lead shows `queued`. `step`: the answer that came just before, as (event kind,
    reason), with its `outcome`, `details` and `error`."""
    job = attempt.job
    if endpoint_id is not None and not tx.endpoints.is_paused(job.tenant_id, endpoint_id):
        return False
    waits_for = f"delivery endpoint {endpoint_id} is paused" if endpoint_id is not None \
        else "every delivery endpoint left for the lead is paused"
    if not tx.jobs.park(job.tenant_id, job.job_id, endpoint_id, iso(clock.now()), waits_for, attempted=attempted):
        if step is not None:  # cancelled meanwhile: the buyer's answer is still noted
            settle(tx, clock, attempt, outcome, None, step[1], job_state=None, event_kind=step[0],
                   details=details, error=error)
        return True
    kind, said = step or ("endpoint_paused", "")
    reason = f"{said + '; ' if said else ''}{waits_for}; the lead waits for it"
    settle(tx, clock, attempt, outcome, "queued", reason, job_state=None, event_kind=kind,
           details=details or {"deliveryEndpointId": endpoint_id}, error=error)
    return True


def move_down_the_waterfall(tx: Session, clock: Clock, attempt: Attempt, target: str, *,
                            tried_target: bool = True) -> bool:
    """After a refusal (or retries exhausted): when the campaign's distribution has an endpoint
    left for this lead, a new job takes the lead there and True.
    `tried_target` False: the target paused, it stays among the endpoints to try."""
    campaign = attempt.settings.campaigns.get(attempt.submission.campaign.campaign_id)
    distribution = campaign.delivery.distribution if campaign is not None else None
    if distribution is None or endpoint_override(attempt.submission) is not None:
        return False
    job = attempt.job
    if tx.jobs.job_state(job.job_id) == "cancelled":
        return False  # an operator changed the lead meanwhile: nothing goes on
    tried = (*job.tried, target) if tried_target else job.tried
    others = untried(distribution, tried, facts_of(attempt.lead), value_sets=attempt.settings.value_sets,
                     today=attempt.now.date())
    if not any(e.delivery_endpoint_id != target for e in others):
        return False
    now = iso(clock.now())
    tx.jobs.insert_job(tenant_id=job.tenant_id, kind="deliver", lead_id=job.lead_id,
                       submission_id=job.submission_id, due_at=now, now=now, tried=tried)
    return True
