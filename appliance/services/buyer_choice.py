"""Where a lead's buyer is chosen, in the write transaction that takes the delivery limits'
slots: first the campaign with room (the lead's own, or one its limits and schedule send it on
to), then, when that campaign has a distribution, the endpoint for this attempt (a retry keeps
its endpoint, a first try may rotate). A lead whose buyer is paused parks its job until the
resume (`park`); after a refusal it moves down the waterfall to the distribution's next endpoint
(`move_down_the_waterfall`). What the order, the rotation and an endpoint's own limits say is
decided in domain/distribution.py, what a campaign's limits say in domain/constraints.py."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import msgspec

from appliance.clock import Clock, iso
from appliance.domain.auction import AuctionRecord, Bid, expired, ranked, sale_of, standing, summary
from appliance.domain.campaign import Auction, Campaign, Distribution, DistributionEndpoint, sells_at_auction
from appliance.domain.constraints import Blocked, LimitCheck, limit_blocked
from appliance.domain.delivery_target import endpoint_override
from appliance.domain.distribution import EndpointGate, endpoint_gate, full, rotate, rotates, untried, waterfall
from appliance.domain.ledger import expected_sale
from appliance.domain.lead import JourneyError
from appliance.domain.pipeline import event, snapshot
from appliance.domain.submission import facts_of
from appliance.domain.client import ClientRecord
from appliance.services import balances
from appliance.services.delivery_attempt import Attempt, settle
from appliance.services.tenant_settings import TenantSettings
from appliance.storage import Session

STOPPED = object()  # the attempt goes nowhere this time (parked, queued or ended)
AUCTION = object()  # the buyer comes from an auction: a new round, or the last round's next standing bid
NO_BID_AGAIN_SECONDS = 300  # noBid = "queue": the next round after five minutes
NO_BID_ROUNDS = 12  # ... and the lead fails after this many rounds without a bid


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
    named one); AUCTION when an auction chooses it (`auction_field`, then `sell_at_auction` or
    `next_standing_bid`); STOPPED when the job was queued, parked or ended; the one endpoint
    when its client's money is held for the sale."""
    reserved = reserve_campaign(tx, clock, attempt, campaign, candidates, checks) \
        if checks[campaign.campaign_id] != ([], None) else Reserved(campaign, attempt)
    if reserved is None:
        return None, STOPPED
    distribution = reserved.campaign.delivery.distribution
    if distribution is None or named is not None:
        target = named or reserved.campaign.delivery.delivery_endpoint_id
        if not target or reserved.attempt.settings.billed(target, reserved.campaign) is None:
            return reserved, None
        # Its client's hold in this unit (a unit of its own would cost each such delivery a write).
        if park(tx, clock, reserved.attempt, target, attempted=False):
            return reserved, STOPPED
        funded = hold_or_wait_for_funds(tx, clock, reserved.attempt, reserved.campaign, target)
        return reserved, target if funded else STOPPED
    if distribution.method == "auction" and not _pinned_and_open(tx, attempt.job, distribution):
        return reserved, AUCTION
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
    open_entries, blocks, unfunded = [], [], []
    funds = _Funds(tx, attempt, campaign)
    for entry in entries:
        if tx.endpoints.is_paused(tenant_id, entry.delivery_endpoint_id):
            continue
        gate = endpoint_gate(campaign, entry, now)
        blocked = full(gate, lambda scope, period: tx.caps.counter_value(tenant_id, scope, period))
        if blocked is not None:
            blocks.append(blocked)
        elif funds.short(entry.delivery_endpoint_id):
            unfunded.append(attempt.settings.client_of(entry.delivery_endpoint_id, campaign))
        else:
            open_entries.append((entry, gate))
    if not open_entries:
        if blocks:
            first = min(blocks, key=lambda b: b.release_at)
            tx.jobs.release_reservations(tenant_id, job.job_id)
            tx.jobs.reschedule(job.job_id, iso(first.release_at), iso(now), error=first.reason, keep_attempts=True)
            settle(tx, clock, attempt, None, "queued", f"{first.reason}; released at {iso(first.release_at)}",
                   job_state=None, event_kind="queued")
        elif unfunded:
            wait_for_funds(tx, clock, attempt, entries[0].delivery_endpoint_id if entries is pinned else None,
                           clients=sorted(set(unfunded)))
        else:
            park(tx, clock, attempt, entries[0].delivery_endpoint_id if entries is pinned else None, attempted=False)
        return None
    chosen, gate = open_entries[0]
    if entries is not pinned and not job.tried and rotates(distribution):
        ids = [entry.delivery_endpoint_id for entry, _ in open_entries]
        chosen_id, weights = rotate(distribution, ids, tx.endpoints.rotation(tenant_id, campaign.campaign_id))
        tx.endpoints.save_rotation(tenant_id, campaign.campaign_id, weights)
        chosen, gate = open_entries[ids.index(chosen_id)]
    _hold(tx, tenant_id, job.job_id, gate)
    funds.hold(chosen.delivery_endpoint_id)
    tx.jobs.choose_endpoint(job.job_id, chosen.delivery_endpoint_id)
    return chosen.delivery_endpoint_id


_UNREAD = object()  # the submission's latest auction round, not read yet


class _Funds:
    """Whether the clients of a lead's buyers can pay for it, in the transaction that chooses the
    buyer; the chosen one's client, when its billing limits what it buys, holds the sale's amount."""

    __slots__ = ("_attempt", "_campaign", "_tx", "_amounts", "_round")

    def __init__(self, tx: Session, attempt: Attempt, campaign: Campaign) -> None:
        self._tx, self._attempt, self._campaign = tx, attempt, campaign
        self._amounts: dict[str, float] = {}  # by client: what the sale would charge it
        self._round: AuctionRecord | None | object = _UNREAD

    def _amount(self, client: ClientRecord, endpoint_id: str) -> float:
        """The buyer's bid in the submission's last round, when the campaign sells at auction (a won
        bid's post: retried, resumed, or a shared sale's other buyer); else the campaign's revenue."""
        if sells_at_auction(self._campaign):
            if self._round is _UNREAD:
                job = self._attempt.job
                self._round = self._tx.auctions.latest_of_submission(job.tenant_id, job.submission_id)
            sale = sale_of(self._round, endpoint_id)  # type: ignore[arg-type]
            if sale is not None:
                return sale.bid
        if client.client_id not in self._amounts:
            attempt = self._attempt
            self._amounts[client.client_id] = expected_sale(self._campaign, facts_of(attempt.lead),
                                                            attempt.settings.value_sets, attempt.now,
                                                            client.billing.currency)
        return self._amounts[client.client_id]

    def short(self, endpoint_id: str) -> bool:
        client = self._attempt.settings.billed(endpoint_id, self._campaign)
        return client is not None and balances.short_of_funds(
            self._tx, self._attempt.job.tenant_id, client, self._amount(client, endpoint_id), self._attempt.job.job_id)

    def hold(self, endpoint_id: str) -> None:
        client = self._attempt.settings.billed(endpoint_id, self._campaign)
        if client is not None:
            self._tx.balances.hold(self._attempt.job.job_id, client.client_id, self._amount(client, endpoint_id))


def hold_or_wait_for_funds(tx: Session, clock: Clock, attempt: Attempt, campaign: Campaign, endpoint_id: str) -> bool:
    """In a write transaction, for a sale to one named buyer (a campaign without a distribution, a
    repost that names it, a shared auction's other winner): its client's hold taken, True; or
    the job parked until money comes, False."""
    funds = _Funds(tx, attempt, campaign)
    if funds.short(endpoint_id):
        wait_for_funds(tx, clock, attempt, endpoint_id)
        return False
    funds.hold(endpoint_id)
    return True


def wait_for_funds(tx: Session, clock: Clock, attempt: Attempt, endpoint_id: str | None, *,
                   clients: list[str] | None = None, said: str | None = None, details: dict | None = None) -> None:
    """The lead waits, as for a paused buyer, until money comes to the client (a credit, a
    return, a higher limit). `clients`: those that cannot pay, named in the reason."""
    job = attempt.job
    if endpoint_id is not None:
        waits_for = f"the client of delivery endpoint {endpoint_id}"
    else:
        waits_for = "the clients of the buyers left for the lead" + (f" ({', '.join(clients)})" if clients else "")
    waits_for += " cannot cover the sale (balance)"
    if tx.jobs.park(job.tenant_id, job.job_id, endpoint_id, iso(clock.now()), waits_for, attempted=False):
        settle(tx, clock, attempt, None, "queued", f"{said + '; ' if said else ''}{waits_for}; the lead waits for"
               " money", job_state=None, event_kind="balance",
               details=details or {"deliveryEndpointId": endpoint_id, "clientIds": clients})


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
    tried = (*job.tried, target) if tried_target or distribution.method == "auction" else job.tried
    if distribution.method == "auction":
        # Exclusive: the next bid still standing (never a new round); shared: each sale is its own.
        shared = distribution.auction is not None and distribution.auction.mode == "shared"
        if shared or not standing_bids_left(tx, attempt, tried):
            return False
    elif not any(e.delivery_endpoint_id != target for e in untried(
            distribution, tried, facts_of(attempt.lead), value_sets=attempt.settings.value_sets,
            today=attempt.now.date())):
        return False
    now = iso(clock.now())
    tx.jobs.insert_job(tenant_id=job.tenant_id, kind="deliver", lead_id=job.lead_id,
                       submission_id=job.submission_id, due_at=now, now=now, tried=tried)
    return True


# ---- auctions ----------------------------------------------------------------------------------

def _pinned_and_open(tx: Session, job, distribution: Distribution) -> bool:
    """Whether the job already goes to a buyer of the distribution that is not paused (a won bid
    whose post is retried, or taken up again after a restart)."""
    return job.endpoint_id is not None and not tx.endpoints.is_paused(job.tenant_id, job.endpoint_id) and any(
        e.delivery_endpoint_id == job.endpoint_id for e in distribution.endpoints)


@dataclass(frozen=True)
class AuctionField:
    """Who a new round asks: the buyers the lead may go to now, and why each other one is left out."""
    asked: list[DistributionEndpoint]
    skipped: list[Bid]
    blocks: list[Blocked]  # the limits and schedules that left buyers out, for when nobody is left
    paused: int  # buyers left out because they are paused
    unfunded: list[str]  # the clients left out because they cannot pay


def auction_field(tx: Session, settings: TenantSettings, tenant_id: str, campaign: Campaign,
                  distribution: Distribution, facts: dict, now: datetime) -> AuctionField:
    """Read before the round: every active buyer of the distribution whose filter the lead passes,
    that is not paused, whose own limits and schedule have room now and whose client's money
    covers the floor."""
    value_sets = settings.value_sets
    floor = float((distribution.auction or Auction()).floor)
    passing = {e.delivery_endpoint_id for e in untried(distribution, (), facts, value_sets=value_sets,
                                                      today=now.date())}
    asked: list[DistributionEndpoint] = []
    skipped: list[Bid] = []
    blocks: list[Blocked] = []
    paused, unfunded = 0, []
    paused_now = tx.endpoints.paused_ids(tenant_id)
    for entry in waterfall(distribution):
        endpoint_id = entry.delivery_endpoint_id
        if endpoint_id not in passing:
            skipped.append(Bid(delivery_endpoint_id=endpoint_id, outcome="skipped", reason="the buyer's filter"))
            continue
        if endpoint_id in paused_now:
            paused += 1
            skipped.append(Bid(delivery_endpoint_id=endpoint_id, outcome="skipped", reason="paused"))
            continue
        blocked = full(endpoint_gate(campaign, entry, now),
                       lambda scope, period: tx.caps.counter_value(tenant_id, scope, period))
        if blocked is not None:
            blocks.append(blocked)
            skipped.append(Bid(delivery_endpoint_id=endpoint_id, outcome="skipped", reason=blocked.reason))
            continue
        client = settings.billed(endpoint_id, campaign)
        if client is not None and not balances.may_be_pinged(tx, tenant_id, client, floor):
            unfunded.append(client.client_id)  # like a paused buyer: the lead may wait for its money
            skipped.append(Bid(delivery_endpoint_id=endpoint_id, outcome="skipped", reason="balance"))
            continue
        asked.append(entry)
    return AuctionField(asked, skipped, blocks, paused, unfunded)


def nobody_to_ask(tx: Session, clock: Clock, attempt: Attempt, field: AuctionField) -> None:
    """No buyer can be asked now: the lead waits for the first limit or window to open, or for a
    paused buyer to resume; with neither, no buyer of the distribution takes it."""
    job, now = attempt.job, attempt.now
    tx.jobs.release_reservations(job.tenant_id, job.job_id)
    if field.blocks:
        first = min(field.blocks, key=lambda b: b.release_at)
        tx.jobs.reschedule(job.job_id, iso(first.release_at), iso(now), error=first.reason, keep_attempts=True)
        settle(tx, clock, attempt, None, "queued", f"{first.reason}; released at {iso(first.release_at)}",
               job_state=None, event_kind="queued")
    elif field.paused:
        park(tx, clock, attempt, None, attempted=False)
    elif field.unfunded:
        wait_for_funds(tx, clock, attempt, None, clients=sorted(set(field.unfunded)))
    else:
        settle(tx, clock, attempt, None, "failed", "no buyer of the auction takes this lead (each one's filter)",
               job_state="done", event_kind="distribution_exhausted")


def sell_at_auction(tx: Session, clock: Clock, attempt: Attempt, campaign: Campaign, distribution: Distribution,
                    record: AuctionRecord) -> tuple[str | object, AuctionRecord]:
    """In the write transaction after a round: the round recorded with its winners, the best
    bids whose buyers still have room (one, or `maxWinners` when shared) and their limits'
    slots taken. This job posts to the first winner; in shared mode a job of its own posts to
    each other one. No winner: `noBid` fails the lead or queues it for another round.
    A supplier's ping held the round (`record.pingId`): its stored round is sold as it stands,
    the winners it reserved first, without another round."""
    auction = distribution.auction or Auction()
    job = attempt.job
    count = auction.max_winners if auction.mode == "shared" else 1
    pinged = record.ping_id is not None
    bids = ranked(record.bids)
    if pinged:
        bids = standing(record, (), attempt.now)
        bids = [b for b in bids if b.delivery_endpoint_id in record.winners] + \
            [b for b in bids if b.delivery_endpoint_id not in record.winners]
    unfunded: list[str] = []
    winners = take_room(tx, attempt.settings, job.tenant_id, attempt.now, campaign, distribution, bids, count,
                        job.job_id, unfunded)
    record = msgspec.structs.replace(record, winners=[w for w, _ in winners])
    if pinged:
        tx.auctions.update(job.tenant_id, record)
    else:
        tx.auctions.record(job.tenant_id, record)
    said = _round_said(record) + (f"; the round of ping {record.ping_id}" if pinged else "")
    details = summary(record)
    if not winners and pinged:
        tx.jobs.release_reservations(job.tenant_id, job.job_id)
        why = "its bids expired" if expired(record, attempt.now) else "no buyer that bid has room now"
        settle(tx, clock, attempt, None, "failed", f"auction: the ping's round cannot be sold ({why}; {said})",
               job_state="done", event_kind="auction", details=details)
        return STOPPED, record
    if not winners and unfunded:  # bids stood, but no bidder can pay: the lead waits for money
        wait_for_funds(tx, clock, attempt, None, clients=sorted(set(unfunded)),
                       said=f"auction: no buyer that bid can pay its bid ({said})", details=details)
        return STOPPED, record
    if not winners:
        tx.jobs.release_reservations(job.tenant_id, job.job_id)
        reason = f"auction: no bid at or above the floor ({said})"
        if auction.no_bid == "queue" and tx.auctions.rounds_of_submission(job.tenant_id, job.submission_id) \
                < NO_BID_ROUNDS:
            due = iso(attempt.now + timedelta(seconds=NO_BID_AGAIN_SECONDS))
            # A round is no attempt to deliver: the winner's post later starts at attempt 1.
            tx.jobs.reschedule(job.job_id, due, iso(attempt.now), error="auction: no bid", keep_attempts=True)
            settle(tx, clock, attempt, None, "queued", f"{reason}; another round at {due}", job_state=None,
                   event_kind="auction", details=details)
        else:
            if auction.no_bid == "queue":
                reason += f"; {NO_BID_ROUNDS} rounds without a bid"
            settle(tx, clock, attempt, None, "failed", reason, job_state="done", event_kind="auction",
                   details=details)
        return STOPPED, record
    settle(tx, clock, attempt, None, None, f"auction: sold to {', '.join(record.winners)} ({said})",
           job_state=None, event_kind="auction", details=details)
    if tx.jobs.job_state(job.job_id) == "cancelled":  # an operator changed the lead during the round
        tx.jobs.release_reservations(job.tenant_id, job.job_id)
        return STOPPED, record
    (first, first_gate), *others = winners
    _hold(tx, job.tenant_id, job.job_id, first_gate)
    tx.jobs.choose_endpoint(job.job_id, first)
    now = iso(clock.now())
    for endpoint_id, _ in others:  # each takes its buyer's slots when it runs, as a retry does
        tx.jobs.insert_job(tenant_id=job.tenant_id, kind="deliver", lead_id=job.lead_id,
                           submission_id=job.submission_id, due_at=now, now=now, endpoint_id=endpoint_id)
    return first, record


def next_standing_bid(tx: Session, clock: Clock, attempt: Attempt, campaign: Campaign,
                      distribution: Distribution) -> str | object:
    """In the write transaction, after a winner refused the lead (or its bid expired): the
    next bid of the same round still standing whose buyer has room, never a new round."""
    job = attempt.job
    record = tx.auctions.latest_of_submission(job.tenant_id, job.submission_id)
    tried = (*job.tried, *((job.endpoint_id,) if job.endpoint_id else ()))
    # Never a buyer the round already sold to (a shared sale's other winners have their own posts).
    bids = standing(record, (*tried, *record.winners), attempt.now) if record is not None else []
    chosen = take_room(tx, attempt.settings, job.tenant_id, attempt.now, campaign, distribution, bids, 1, job.job_id)
    if not chosen:
        tx.jobs.release_reservations(job.tenant_id, job.job_id)
        why = "the bids expired" if record is not None and expired(record, attempt.now) else "none is left"
        settle(tx, clock, attempt, None, "failed", f"no standing bid of the auction to sell to ({why}; tried: "
               f"{', '.join(tried) or 'none'})", job_state="done", event_kind="distribution_exhausted")
        return STOPPED
    (endpoint_id, gate), = chosen
    _hold(tx, job.tenant_id, job.job_id, gate)
    tx.jobs.choose_endpoint(job.job_id, endpoint_id)
    return endpoint_id


def standing_bids_left(tx: Session, attempt: Attempt, tried: tuple[str, ...]) -> bool:
    """Whether the submission's last round has a bid standing for a buyer not tried yet."""
    record = tx.auctions.latest_of_submission(attempt.job.tenant_id, attempt.job.submission_id)
    return record is not None and bool(standing(record, tried, attempt.now))


def take_room(tx: Session, settings: TenantSettings, tenant_id: str, now: datetime, campaign: Campaign,
              distribution: Distribution, bids: list[Bid], count: int,
              job_id: int | None = None, unfunded: list[str] | None = None) -> list[tuple[str, EndpointGate]]:
    """The first `count` bidders, best first, that are still in the distribution, not paused,
    with room under their own limits and schedule and whose client's money covers the bid (read
    again in this transaction). `job_id`: the job that posts to the first, which holds its bid;
    `unfunded` gets the clients of the bids passed over for money."""
    entries = {e.delivery_endpoint_id: e for e in distribution.endpoints if e.active}
    taken: list[tuple[str, EndpointGate]] = []
    spent: dict[str, float] = {}  # by client: the bids of this round's winners so far
    for bid in bids:
        entry = entries.get(bid.delivery_endpoint_id)
        if entry is None or tx.endpoints.is_paused(tenant_id, entry.delivery_endpoint_id):
            continue
        gate = endpoint_gate(campaign, entry, now)
        if full(gate, lambda scope, period: tx.caps.counter_value(tenant_id, scope, period)) is not None:
            continue
        client = settings.billed(entry.delivery_endpoint_id, campaign)
        amount = float(bid.bid or 0)
        if client is not None:
            if balances.short_of_funds(tx, tenant_id, client, amount + spent.get(client.client_id, 0), job_id):
                if unfunded is not None:
                    unfunded.append(client.client_id)
                continue
            if job_id is not None and not taken:
                tx.balances.hold(job_id, client.client_id, amount)
            spent[client.client_id] = spent.get(client.client_id, 0) + amount
        taken.append((entry.delivery_endpoint_id, gate))
        if len(taken) == count:
            break
    return taken


def _hold(tx: Session, tenant_id: str, job_id: int, gate: EndpointGate) -> None:
    """The endpoint's limit slots taken and held on the job until its outcome."""
    for check in gate.limits:
        tx.caps.add_to_counter(tenant_id, check.scope, check.period_start)
    if gate.limits:
        tx.jobs.hold_reservations(job_id, [(c.scope, c.period_start) for c in gate.limits])


def _round_said(record: AuctionRecord) -> str:
    bids = [b for b in record.bids if b.outcome == "bid"]
    return f"{len(bids)} of {len(record.bids)} bid in {record.duration_ms} ms"
