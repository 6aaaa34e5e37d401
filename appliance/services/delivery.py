"""Delivering a lead to a buyer, the use case the claim loop (jobs/delivery.py) runs for each
`deliver` job it claims. `prepare` checks what may have changed since the submit (the lead's
approval, its campaign, suppression lists, delivery-time rules), reserves the delivery limits'
slots and chooses the buyer (services/buyer_choice.py), and opens its endpoint; the loop asks the
buyer under a deadline and hands the answer to `record` (services/delivery_outcome.py), which
also moves the lead down the waterfall. `success` delivers; `failure`/`duplicate` fail without
retry; `error` retries on the endpoint's backoff, then fails."""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import httpx
import msgspec

from appliance.adapters.outbound import Scrubber
from appliance.clock import iso
from appliance.domain.approval import holds_delivery
from appliance.domain.auction import AuctionRecord, expired, sale_of
from appliance.domain.campaign import Auction, Campaign, sells_at_auction
from appliance.domain.constraints import campaigns_in_reach, limit_checks, schedule_blocked
from appliance.domain.delivery_target import endpoint_override
from appliance.domain.distribution import untried
from appliance.domain.endpoint import DeliveryEndpoint
from appliance.domain.lead import JourneyError
from appliance.domain.rules import qualify
from appliance.domain.submission import facts_of
from appliance.domain.suppression import lead_hashes
from appliance.ids import new_id
from appliance.plugins import Registry
from appliance.runtime import Runtime
from appliance.sdk import DeliveryAdapter, DeliveryRequest, DeliveryResult
from appliance.services.auction import Bidder, hold_round
from appliance.services.buyer_choice import (
    AUCTION, STOPPED, Reserved, auction_field, hold_or_wait_for_funds, next_standing_bid, nobody_to_ask, park,
    reserve_and_choose, sell_at_auction,
)
from appliance.services.delivery_attempt import Attempt, ClaimedWrite, settle
from appliance.services.delivery_outcome import log_recorded, record_answer
from appliance.services.opened_endpoints import OpenedEndpoint, OpenedEndpoints
from appliance.storage import Job, Session


class Sending(NamedTuple):
    """An attempt on its way to its buyer, the limits' slots held: the adapter to ask and what to
    send it, or (`request` None: the buyer cannot be asked) the `answer` to record instead."""
    attempt: Attempt
    target: str | None  # the endpoint meant
    endpoint: DeliveryEndpoint | None  # with its credentials filled in
    scrubber: Scrubber | None  # masks those credentials in the buyer's answer
    adapter: DeliveryAdapter | None
    request: DeliveryRequest | None
    answer: DeliveryResult | None = None


class Deliveries:
    """One claim loop's deliveries: `prepare` each job, then, once the loop has asked the buyer,
    `record` its answer. Opened endpoints are kept by the tenant's config revision. `write`: the
    loop's writes, each committed only while it holds the job."""

    def __init__(self, runtime: Runtime, registry: Registry, write: ClaimedWrite) -> None:
        self.runtime = runtime
        self.registry = registry
        self.write = write
        self.endpoints = OpenedEndpoints(runtime)

    async def prepare(self, job: Job, attempt: Attempt | None, http: httpx.AsyncClient) -> Sending | None:
        """The attempt ready for its buyer; None when it goes nowhere this time (ended, held for
        an approval, queued until a window opens or a limit resets, or parked for a paused buyer)."""
        clock = self.runtime.clock
        if attempt is None:
            now = iso(clock.now())
            await self.write(job, lambda tx: tx.jobs.finish(job.job_id, "dead", now, "lead or submission missing"))
            return None
        if holds_delivery(attempt.lead.approval, attempt.lead.status):
            await self.write(job, lambda tx: self._wait_for_decision(tx, job))
            return None
        settings, now = attempt.settings, attempt.now
        campaign = settings.campaigns.get(attempt.submission.campaign.campaign_id)
        if campaign is None:
            return Sending(attempt, None, None, None, None, None,
                           DeliveryResult(outcome="failure", reason="campaign no longer exists"))
        suppressed = self._suppressed_by(attempt, campaign)
        if suppressed is not None:
            await self.write(job, lambda tx: settle(tx, clock, attempt, None, "suppressed", suppressed,
                                                    job_state="done", event_kind="suppressed"))
            return None
        problem = self._delivery_time_problem(attempt, campaign)
        if problem is not None:
            await self.write(job, lambda tx: settle(tx, clock, attempt, None, "disqualified", problem,
                                                    job_state="done"))
            return None
        named = endpoint_override(attempt.submission)
        if attempt.lead.is_test:
            return await self._test_post(attempt, campaign, named)
        # The submission's latest round, read once: the round a won bid's post sells from, the
        # supplier's ping that held one already, or the last round without a bid.
        record = self.runtime.store.reader().auctions.latest_of_submission(job.tenant_id, job.submission_id) \
            if sells_at_auction(campaign) else None
        if record is not None and record.mode == "shared" and job.endpoint_id in record.winners[1:]:
            # Another buyer's share of a lead sold already: the campaign's limits and hours took it once.
            candidates, checks = {campaign.campaign_id: campaign}, {campaign.campaign_id: ([], None)}
        else:
            candidates = campaigns_in_reach(campaign, settings.campaigns)
            checks = {cid: (limit_checks(c, now), schedule_blocked(c, now)) for cid, c in candidates.items()}
        chosen: str | None | object = None
        if checks[campaign.campaign_id] == ([], None) and (campaign.delivery.distribution is None or named):
            reserved = Reserved(campaign, attempt)  # no limit applies and the window is open: nothing to take
        else:  # one write unit takes the campaign's slots and chooses the buyer
            reserved, chosen = await self.write(
                job, lambda tx: reserve_and_choose(tx, clock, attempt, campaign, candidates, checks, named))
            if reserved is not None:  # that unit waited its turn: the pause is read again when chosen
                reserved = replace(reserved, attempt=replace(reserved.attempt, paused=None))
        if reserved is None or chosen is STOPPED:
            return None
        attempt = reserved.attempt
        if chosen is AUCTION:
            chosen, record = await self._auction(attempt, reserved.campaign, http, record)
            if chosen is STOPPED:
                return None
        target = chosen if isinstance(chosen, str) else await self._campaign_endpoint(attempt, reserved.campaign, named)
        if not isinstance(target, str | None):  # STOPPED: the job waits for its paused endpoint
            return None
        expired_bid = None
        if target is not None and sells_at_auction(reserved.campaign):
            attempt = replace(attempt, sale=sale_of(record, target))
            if record is not None and expired(record, attempt.now):
                expired_bid = DeliveryResult(outcome="failure", reason=f"the bid of {target} expired (bids stand "
                                                                       f"{record.bid_ttl_seconds} s); not posted")
        opened = self.endpoints.get(attempt.job.tenant_id, attempt.settings.rev, target)
        return self._sending(attempt, target, opened, expired_bid)

    def _sending(self, attempt: Attempt, target: str | None, opened: OpenedEndpoint | None,
                 expired_bid: DeliveryResult | None = None) -> Sending:
        """What to ask the buyer, or the answer to record when it cannot be asked."""
        job = attempt.job
        endpoint = opened.endpoint if opened is not None else None
        if endpoint is not None and attempt.lead.is_test:
            endpoint = msgspec.structs.replace(endpoint, url=endpoint.test_url)
        adapter = self.registry.delivery_adapter(endpoint.adapter) if endpoint is not None else None
        if opened is None or endpoint is None:
            answer = DeliveryResult(outcome="failure", reason="the campaign has no delivery endpoint")
        elif opened.missing:
            answer = DeliveryResult(outcome="failure", reason="the endpoint's stored credentials are missing: "
                                                              + ", ".join(opened.missing))
        elif adapter is None:
            answer = DeliveryResult(outcome="error", reason=f"no delivery adapter named {endpoint.adapter!r}")
        elif expired_bid is not None:
            answer = expired_bid
        else:
            lead = facts_of(attempt.lead)
            if attempt.sale is not None:
                lead = {**lead, "auction": attempt.sale.fields()}
            request = DeliveryRequest(
                lead=lead, submission_id=attempt.submission.submission_id, attempt=job.attempts,
                endpoint=endpoint, secrets=opened.secrets,
                settings=self.registry.adapter_settings("delivery", endpoint.adapter),
                allow_private_addresses=self.runtime.config.delivery.allow_private_addresses, now=attempt.now)
            return Sending(attempt, target, endpoint, opened.scrubber, adapter, request)
        return Sending(attempt, target, endpoint, None, None, None, answer)

    async def _test_post(self, attempt: Attempt, campaign: Campaign, named: str | None) -> Sending | None:
        """A test lead goes to the first of its buyers (the one a repost named, the campaign's, or
        the distribution's in order, not tried yet) that has a `testUrl`, without pings, limits
        or money; with none, it stays `qualified` ("test lead")."""
        job, clock = attempt.job, self.runtime.clock
        distribution = campaign.delivery.distribution
        if named or distribution is None:
            candidates = [named or campaign.delivery.delivery_endpoint_id]
        else:  # the buyers whose filters take the lead, in the distribution's order
            candidates = [e.delivery_endpoint_id for e in untried(
                distribution, (), facts_of(attempt.lead), value_sets=attempt.settings.value_sets,
                today=attempt.now.date())]
        for endpoint_id in candidates:
            opened = self.endpoints.get(job.tenant_id, attempt.settings.rev, endpoint_id) if endpoint_id else None
            if opened is not None and opened.endpoint.test_url and endpoint_id not in job.tried:
                return self._sending(attempt, endpoint_id, opened)
        if job.tried:
            status, reason = "failed", "test lead: no endpoint with a testUrl is left to try"
        else:
            status, reason = "qualified", "test lead"
        await self.write(job, lambda tx: settle(tx, clock, attempt, None, status, reason, job_state="done",
                                                event_kind="test_lead"))
        return None

    async def record(self, sending: Sending, result: DeliveryResult, crash: JourneyError | None) -> None:
        """The buyer's answer (or the one `prepare` gave when it could not be asked) recorded;
        only an adapter that was asked moves its buyer's health, not our own problems (nor a
        test post's answer, from the buyer's test address)."""
        attempt, target, endpoint = sending.attempt, sending.target, sending.endpoint
        asked = target if sending.request is not None and not attempt.lead.is_test else None
        clock = self.runtime.clock
        recorded = await self.write(
            attempt.job, lambda tx: record_answer(tx, clock, attempt, result, endpoint, crash, asked, target))
        # Counted and logged once it is committed (a write unit may run more than once).
        self.runtime.metrics.deliveries[(result.outcome, target or "-")] += 1
        log_recorded(attempt.job, target, result, recorded, endpoint)

    # ---- before sending ---------------------------------------------------------------------

    def _wait_for_decision(self, tx: Session, job: Job) -> None:
        """A job whose lead an open or refused approval holds (a retry scheduled before the decision)
        ends here unsent; the decision that clears the lead schedules its delivery again. Read in
        the write unit, so a decision committed since the job was loaded is seen."""
        now = iso(self.runtime.clock.now())
        lead = tx.leads.get_lead(job.tenant_id, job.lead_id)
        if lead is not None and holds_delivery(lead.approval, lead.status):
            tx.jobs.finish(job.job_id, "cancelled", now, "waiting on the lead's approval")
        else:
            tx.jobs.reschedule(job.job_id, now, now, keep_attempts=True)

    def _suppressed_by(self, attempt: Attempt, campaign: Campaign) -> str | None:
        """The campaign's suppression lists, checked again just before sending (a value may have
        been added since the submit): the reason names the list, never the value."""
        list_ids = campaign.qualification.suppression_list_ids
        hashes = lead_hashes(attempt.lead.email, attempt.lead.phone_e164) if list_ids else []
        if not hashes:
            return None
        tx = self.runtime.store.reader()
        list_id = tx.suppression.first_match(attempt.job.tenant_id, list_ids, hashes)
        if list_id is None:
            return None
        found = tx.suppression.get_list(attempt.job.tenant_id, list_id)
        return f"suppressed by list {found[1] if found is not None else list_id}"

    def _delivery_time_problem(self, attempt: Attempt, campaign: Campaign) -> str | None:
        """`appliesAt: delivery` rules and the TCPA delivery policy, just before sending."""
        if campaign.qualification.tcpa_policy.delivery_policy.required and \
                attempt.lead.compliance.get("tcpaConsent") is not True:
            return "TCPA consent required for delivery: compliance.tcpaConsent is not true"
        rules = [r for r in campaign.qualification.rules if r.applies_at == "delivery"]
        if not rules:
            return None
        result = qualify(rules, facts_of(attempt.lead), applies_at="delivery", value_sets=attempt.settings.value_sets,
                         today=attempt.now.date(), prompt_evaluator=self.registry.prompt_evaluator())
        return None if result.passed else (result.reason or "a delivery rule failed")

    # ---- the buyer from an auction ---------------------------------------------------------------

    async def _auction(self, attempt: Attempt, campaign: Campaign, http: httpx.AsyncClient,
                       held: AuctionRecord | None) -> tuple[str | object, AuctionRecord | None]:
        """A new round for the lead's first try (or the round a supplier's ping `held`); after a
        winner refused it (or its buyer was paused), the same round's next standing bid. The
        buyer, or STOPPED; and the round it is sold from."""
        job, clock = attempt.job, self.runtime.clock
        distribution = campaign.delivery.distribution
        assert distribution is not None
        shared = distribution.auction is not None and distribution.auction.mode == "shared"
        if job.endpoint_id and shared:  # a shared sale's other buyer: paused, its post waits for the resume
            parked = await self.write(job, lambda tx: park(tx, clock, attempt, job.endpoint_id, attempted=False))
            if parked:
                return STOPPED, held
            return await self._funded(attempt, campaign, job.endpoint_id), held
        if job.tried or job.endpoint_id:
            chosen = await self.write(job, lambda tx: next_standing_bid(tx, clock, attempt, campaign, distribution))
            return chosen, held
        if held is not None and held.ping_id is not None and held.campaign_id == campaign.campaign_id:
            # The supplier's ping held the round already (for the campaign the lead went to).
            return await self.write(job, lambda tx: sell_at_auction(tx, clock, attempt, campaign, distribution, held))
        field = auction_field(self.runtime.store.reader(), attempt.settings, job.tenant_id, campaign, distribution,
                              facts_of(attempt.lead), attempt.now)
        if not field.asked:
            await self.write(job, lambda tx: nobody_to_ask(tx, clock, attempt, field))
            return STOPPED, None
        tenant_id, rev = job.tenant_id, attempt.settings.rev
        bidders = []
        for entry in field.asked:
            opened = self.endpoints.get(tenant_id, rev, entry.delivery_endpoint_id)
            adapter = self.registry.delivery_adapter(opened.endpoint.adapter) if opened is not None else None
            bidders.append(Bidder(entry, opened, adapter))
        record = await hold_round(
            auction_id=new_id("auc"), auction=distribution.auction or Auction(), bidders=bidders,
            skipped=field.skipped, facts=facts_of(attempt.lead), registry=self.registry, http=http, clock=clock,
            allow_private_addresses=self.runtime.config.delivery.allow_private_addresses,
            submission_id=job.submission_id, lead_id=job.lead_id)
        return await self.write(job, lambda tx: sell_at_auction(tx, clock, attempt, campaign, distribution, record))

    # ---- the buyer of a campaign without a distribution ----------------------------------------

    async def _campaign_endpoint(self, attempt: Attempt, campaign: Campaign, named: str | None) -> str | None | object:
        """The endpoint of a campaign without a distribution, or the one a repost named (None:
        none); STOPPED when it is paused and the job was parked instead."""
        target = named or campaign.delivery.delivery_endpoint_id
        if target and self._is_paused(attempt, target):
            clock = self.runtime.clock
            parked = await self.write(attempt.job, lambda tx: park(tx, clock, attempt, target, attempted=False))
            if parked:
                return STOPPED
        return await self._funded(attempt, campaign, target) if target else target

    async def _funded(self, attempt: Attempt, campaign: Campaign, target: str) -> str | object:
        """`target` when its client can pay (its hold taken) or is not limited; else STOPPED, the
        job waiting for money."""
        if attempt.settings.billed(target, campaign) is None:
            return target
        clock = self.runtime.clock
        funded = await self.write(attempt.job, lambda tx: hold_or_wait_for_funds(tx, clock, attempt, campaign, target))
        return target if funded else STOPPED

    def _is_paused(self, attempt: Attempt, endpoint_id: str) -> bool:
        if attempt.paused is not None:
            return endpoint_id in attempt.paused
        return self.runtime.store.reader().endpoints.is_paused(attempt.job.tenant_id, endpoint_id)
