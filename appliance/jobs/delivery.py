"""The delivery worker: claims due jobs from the jobs table, checks delivery limits and the
schedule (reserving a slot in the same transaction, so limits are never overrun), runs the
endpoint's adapter under a hard deadline and records the outcome. `success` delivers;
`failure`/`duplicate` fail without retry; `error` retries on the endpoint's backoff, then fails.
Short-circuited submissions (`evaluate` jobs) are routed and qualified here too."""

from __future__ import annotations

import asyncio
import logging
import traceback
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar
from urllib.parse import unquote

import httpx
import msgspec

from appliance import logs
from appliance.adapters import trustedform
from appliance.adapters.outbound import Scrubber, adapter_crash
from appliance.clock import iso
from appliance.domain.approval import held_by_approval, holds_delivery
from appliance.domain.campaign import Campaign, Distribution
from appliance.domain.constraints import Blocked, LimitCheck, limit_blocked, limit_checks, schedule_blocked
from appliance.domain.delivery_target import endpoint_override
from appliance.domain.distribution import endpoint_gate, full, rotate, rotates, untried
from appliance.domain.endpoint import DEFAULT_BACKOFF_SECONDS, DeliveryEndpoint, HealthPolicy, fill_credentials, sealed_fields
from appliance.domain.endpoint_health import after_answer
from appliance.domain.lead import DeliveryOutcome, JourneyError, LeadRecord, PostingOutcome, Submission
from appliance.domain.secret_refs import endpoint_secret_ref
from appliance.domain.pipeline import evaluate, event, snapshot, usable
from appliance.domain.rules import qualify
from appliance.domain.submission import facts_of
from appliance.domain.suppression import lead_hashes
from appliance.domain.webhooks import RETRY_SCHEDULE
from appliance.runtime import Runtime
from appliance.services.endpoints import hour_of, item_of, record_endpoint_event
from appliance.services.lead_events import record_lead_events
from appliance.services.ledger import earn
from appliance.services.intake import run_intake_action
from appliance.sdk import DeliveryRequest, DeliveryResult
from appliance.services.tenant_settings import SettingsCache, TenantSettings
from appliance.jobs.outage import Outage
from appliance.storage import DELIVERY_ENDPOINTS, ClaimLost, Job, Session, StorageUnavailable

log = logging.getLogger("appliance.delivery")

DEFAULT_BACKOFF = DEFAULT_BACKOFF_SECONDS
DEADLINE_MARGIN = 2.0  # seconds beyond the endpoint's timeout before the worker gives up on an adapter
STOPPED = object()  # the attempt goes nowhere this time (parked, queued or ended)
NOT_LOADED = object()  # a claimed job whose attempt its own task loads (see _load_claimed)
T = TypeVar("T")


@dataclass(frozen=True)
class OpenedEndpoint:
    """A stored endpoint with its credentials filled in from the secret store, ready to send."""
    endpoint: DeliveryEndpoint
    secrets: dict[str, str]  # opened credentials by field (the adapter's `request.secrets`)
    scrubber: Scrubber  # masks those credentials in whatever the buyer answers
    missing: list[str]  # credential fields the endpoint needs and the store does not have


class Loaded(NamedTuple):
    """A job's lead and submission as first read, rows and records: a write unit that reads a
    row again and finds it unchanged takes the record instead of decoding the row again."""
    lead_row: tuple
    lead: LeadRecord
    submission_row: tuple
    submission: Submission

    def lead_in(self, tx: Session, tenant_id: str) -> LeadRecord | None:
        row = tx.leads.lead_row(tenant_id, self.lead.lead_id)
        return self.lead if row == self.lead_row else tx.leads.lead_of(row) if row is not None else None

    def submission_in(self, tx: Session, tenant_id: str) -> Submission | None:
        row = tx.leads.submission_row(tenant_id, self.submission.submission_id)
        return self.submission if row == self.submission_row else \
            tx.leads.submission_of(row) if row is not None else None


@dataclass(frozen=True)
class Attempt:
    """One job's lead and submission as loaded; a step that changes them makes a new Attempt
    (write units may run again, so they never change what they were given)."""
    job: Job
    lead: LeadRecord
    submission: Submission
    settings: TenantSettings
    now: datetime
    loaded: Loaded  # as read from the store, before any step changed them
    events: tuple = ()  # journey events of earlier steps, written with the next settle
    # The tenant's paused endpoints as read with the attempt (a few ms before the buyer is
    # chosen; None: read when chosen, as after a write unit that waited its turn).
    paused: frozenset[str] | None = None


@dataclass(frozen=True)
class Recorded:
    """What recording an answer did, for the log after the commit."""
    paused_reason: str | None  # this answer paused the endpoint
    waiting: bool = False  # the lead waits for its paused endpoint
    next_endpoint: bool = False  # the lead goes on to the distribution's next endpoint


@dataclass(frozen=True)
class Reserved:
    campaign: Campaign  # the campaign with room; its slots are held on the job row until the outcome
    attempt: Attempt  # the attempt to record, moved to `campaign` when that is another campaign


class DeliveryWorker:
    def __init__(self, runtime: Runtime, settings: SettingsCache, registry: Any, *, concurrency: int = 64,
                 poll_seconds: float = 0.5, grace_seconds: float = 5.0) -> None:
        self.runtime = runtime
        self.settings = settings
        self.registry = registry
        self.concurrency = concurrency
        self.poll_seconds = poll_seconds
        self.grace_seconds = grace_seconds
        self._wake = asyncio.Event()
        self._endpoints: dict[tuple[str, int, str], OpenedEndpoint | None] = {}
        self._trustedform = runtime.config.plugins.trustedform

    def wake(self) -> None:
        """New work may be due (a submit committed a job, a job finished)."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        store = self.runtime.store
        outage = Outage(log, "delivery")
        interrupted = await outage.retry(
            lambda: store.write(lambda tx: tx.jobs.requeue_interrupted(iso(self.runtime.clock.now()))), stop)
        if interrupted:
            log.warning("%d jobs were interrupted by the last stop and run again", interrupted)
        # httpcore walks its whole pool on every request and release (encode/httpcore#1035): a
        # pool as large as the concurrency, no larger, measured 4x faster than twice that.
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        active: set[asyncio.Task] = set()
        async with httpx.AsyncClient(follow_redirects=False, trust_env=False, limits=limits, timeout=None) as http:
            while not stop.is_set():
                self._wake.clear()
                free = self.concurrency - len(active)
                claimed: list[Job] = []
                wait = self.poll_seconds
                if free > 0:
                    now = iso(self.runtime.clock.now())
                    try:
                        claimed = await store.write(lambda tx: tx.jobs.claim_due(now, free))
                        outage.succeeded()
                    except StorageUnavailable as exc:
                        wait = outage.failed(exc)
                    except Exception as exc:  # the loop must survive a storage hiccup
                        log.error("claiming jobs failed: %s", type(exc).__name__)
                loaded = self._load_claimed(claimed)
                for job in claimed:
                    task = asyncio.create_task(self._process(job, http, loaded.get(job.job_id, NOT_LOADED)))
                    active.add(task)
                    task.add_done_callback(active.discard)
                if claimed and len(claimed) == free:
                    continue  # there may be more due right now
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=wait)
                except asyncio.TimeoutError:
                    pass
            if active:
                await asyncio.wait(active, timeout=self.grace_seconds)
            for task in active:
                task.cancel()  # left `running`: requeued at the next start
        for adapter in self.registry.delivery_adapters.values():
            try:
                await adapter.aclose()
            except Exception as exc:  # one adapter's cleanup must not keep the others open
                log.error("closing delivery adapter %r failed: %s", adapter.name, type(exc).__name__)

    async def _process(self, job: Job, http: httpx.AsyncClient, loaded: Attempt | None | object) -> None:
        """`loaded`: the job's attempt as `_load_claimed` read it, or NOT_LOADED."""
        logs.bind(tenantId=job.tenant_id, leadId=job.lead_id, submissionId=job.submission_id)
        try:
            attempt = self._load([job])[job.job_id] if loaded is NOT_LOADED else loaded
            if job.kind == "evaluate":
                await self._evaluate(job, attempt, http)
            else:
                await self._deliver(job, attempt, http)
        except asyncio.CancelledError:
            raise
        except ClaimLost:
            log.warning("job %d (%s): another process took it over (this one's claim ended); it records nothing more",
                        job.job_id, job.kind)
        except Exception as exc:
            if isinstance(exc, StorageUnavailable):  # a read met an outage: the job is not at fault
                error, keep_attempts = "the database was unavailable", True
                log.warning("job %d (%s) stopped: %s; it runs again", job.job_id, job.kind, error)
            else:
                error, keep_attempts = f"internal error: {type(exc).__name__}", False
                log.error("job %d (%s) failed: %s at %s", job.job_id, job.kind, error, where(exc))
            now = iso(self.runtime.clock.now())
            due = iso(self.runtime.clock.now() + timedelta(seconds=DEFAULT_BACKOFF[0]))

            def give_up_attempt(tx: Session) -> None:
                tx.jobs.release_reservations(job.tenant_id, job.job_id)
                tx.jobs.reschedule(job.job_id, due, now, error=error, keep_attempts=keep_attempts)

            try:
                await self._write(job, give_up_attempt)
            except Exception as storage_exc:  # left `running`: requeued (and released) at the next start
                log.error("job %d could not be rescheduled: %s", job.job_id, type(storage_exc).__name__)
        finally:
            self.wake()

    async def _write(self, job: Job, unit: Callable[[Session], T]) -> T:
        """A write unit for `job`, done only while this process still holds the job's claim: on a
        database several processes share, one whose claim ended (cut off past its lease) must not
        write over the outcome of the process that took the job over. Raises ClaimLost."""
        def fenced(tx: Session) -> T:
            if not tx.jobs.holds(job):
                raise ClaimLost
            return unit(tx)
        # A database that does not answer now (a full disk, an outage) is waited for, as the
        # loops do: given up, the job stayed `running` until the next start, its lead never
        # recorded delivered though the buyer had it.
        return await Outage(log, f"job {job.job_id} ({job.kind})").retry(
            lambda: self.runtime.store.write(fenced), None)  # type: ignore[return-value]

    # ---- loading --------------------------------------------------------------------------

    def _load_claimed(self, jobs: list[Job]) -> dict[int, Attempt | None]:
        """`_load` for a whole claim; when the batch cannot be read, {}: each job's task then
        loads its own and meets the problem there."""
        if not jobs:
            return {}
        try:
            return self._load(jobs)
        except Exception:  # noqa: BLE001 - handled per job by _process, which logs it
            return {}

    def _load(self, jobs: list[Job]) -> dict[int, Attempt | None]:
        """The jobs' attempts (None: the lead or submission is missing), read in one read
        transaction. SQLite empties a connection's page cache when a read transaction starts
        after a commit (each delivery makes one), and each statement outside a transaction is a
        transaction of its own: read job by job, every statement read its index pages again
        (bench/HISTORY.md). Each tenant's config revision and paused endpoints are read once."""
        tenants: dict[str, tuple[int, frozenset[str]]] = {}
        tx = self.runtime.store.reader()
        with tx:
            return {job.job_id: self._attempt(job, tx, tenants) for job in jobs}

    def _attempt(self, job: Job, tx: Session, tenants: dict[str, tuple[int, frozenset[str]]]) -> Attempt | None:
        lead_row = tx.leads.lead_row(job.tenant_id, job.lead_id)
        submission_row = tx.leads.submission_row(job.tenant_id, job.submission_id)
        if lead_row is None or submission_row is None:
            return None
        lead, submission = tx.leads.lead_of(lead_row), tx.leads.submission_of(submission_row)
        if job.tenant_id not in tenants:
            tenants[job.tenant_id] = (tx.tenants.config_rev(job.tenant_id), frozenset(
                endpoint_id for endpoint_id, health in tx.endpoints.all_health(job.tenant_id).items()
                if health.paused))
        rev, paused = tenants[job.tenant_id]
        return Attempt(job=job, lead=lead, submission=submission, settings=self.settings.get(job.tenant_id, rev),
                       now=self.runtime.clock.now(), loaded=Loaded(lead_row, lead, submission_row, submission),
                       paused=paused)

    def _endpoint(self, attempt: Attempt, endpoint_id: str | None) -> OpenedEndpoint | None:
        if not endpoint_id:
            return None
        # Endpoints and their opened secrets change only with the tenant's config revision.
        key = (attempt.job.tenant_id, attempt.settings.rev, endpoint_id)
        if key in self._endpoints:
            found = self._endpoints[key]
        else:
            found = self._endpoints[key] = self._load_endpoint(attempt.job.tenant_id, endpoint_id)
            if len(self._endpoints) > 1024:
                self._endpoints.pop(next(iter(self._endpoints)))
        return found

    def _load_endpoint(self, tenant_id: str, endpoint_id: str) -> OpenedEndpoint | None:
        tx = self.runtime.store.reader()
        stored = tx.catalog.get_doc(DELIVERY_ENDPOINTS, tenant_id, endpoint_id)
        if stored is None:
            return None
        opened: dict[str, str] = {}
        for field in sealed_fields(stored):
            ref = endpoint_secret_ref(endpoint_id, field)
            blob = tx.secrets.get(tenant_id, ref)
            if blob is not None:
                opened[field] = self.runtime.box.open_bytes(blob, f"{tenant_id}/{ref}")
        endpoint, missing = fill_credentials(stored, opened)
        # URL parts are stored as written (percent-encoded): a peer may echo them decoded.
        known = [*opened.values(), *(unquote(v) for f, v in opened.items() if f.startswith("url."))]
        username = stored.auth.username if stored.auth is not None else None
        pairs = [(username, opened.get("auth.password"))]
        return OpenedEndpoint(endpoint, opened, Scrubber(known, pairs), missing)

    # ---- delivery -------------------------------------------------------------------------

    async def _deliver(self, job: Job, attempt: Attempt | None, http: httpx.AsyncClient) -> None:
        if attempt is None:
            now = iso(self.runtime.clock.now())
            await self._write(job, lambda tx: tx.jobs.finish(job.job_id, "dead", now, "lead or submission missing"))
            return
        if holds_delivery(attempt.lead.approval, attempt.lead.status):
            await self._write(job, lambda tx: self._wait_for_decision(tx, job))
            return
        settings, now = attempt.settings, attempt.now
        campaign = settings.campaigns.get(attempt.submission.campaign.campaign_id)
        if campaign is None:
            await self._record(attempt, None, DeliveryResult(outcome="failure", reason="campaign no longer exists"))
            return
        suppressed = self._suppressed_by(attempt, campaign)
        if suppressed is not None:
            await self._write(job, lambda tx: self._settle(tx, attempt, None, "suppressed", suppressed, job_state="done",
                                                      event_kind="suppressed"))
            return
        problem = self._delivery_time_problem(attempt, campaign)
        if problem is not None:
            await self._write(job, lambda tx: self._settle(tx, attempt, None, "disqualified", problem, job_state="done"))
            return
        candidates = self._candidates(campaign, settings)
        checks = {cid: (limit_checks(c, now), schedule_blocked(c, now)) for cid, c in candidates.items()}
        named = endpoint_override(attempt.submission)
        chosen: str | None | object = None
        if checks[campaign.campaign_id] == ([], None) and (campaign.delivery.distribution is None or named):
            reserved = Reserved(campaign, attempt)  # no limit applies and the window is open: nothing to take
        else:  # one write unit takes the campaign's slots and chooses the buyer
            reserved, chosen = await self._write(job, 
                lambda tx: self._reserve_and_choose(tx, attempt, campaign, candidates, checks, named))
            if reserved is not None:  # that unit waited its turn: the pause is read again when chosen
                reserved = replace(reserved, attempt=replace(reserved.attempt, paused=None))
        if reserved is None or chosen is STOPPED:
            return  # queued until a window opens or a limit resets, parked for a paused buyer, or ended
        attempt = reserved.attempt
        target = chosen if isinstance(chosen, str) else await self._target(attempt, reserved.campaign, named)
        if not isinstance(target, str | None):  # STOPPED: the job waits for its paused endpoint
            return
        crash: JourneyError | None = None
        asked = False  # the buyer was asked: only its answers move its health, not our own problems
        opened = self._endpoint(attempt, target)
        endpoint = opened.endpoint if opened is not None else None
        adapter = self.registry.delivery_adapter(endpoint.adapter) if endpoint is not None else None
        if opened is None or endpoint is None:
            result = DeliveryResult(outcome="failure", reason="the campaign has no delivery endpoint")
        elif opened.missing:
            result = DeliveryResult(outcome="failure", reason="the endpoint's stored credentials are missing: "
                                                              + ", ".join(opened.missing))
        elif adapter is None:
            result = DeliveryResult(outcome="error", reason=f"no delivery adapter named {endpoint.adapter!r}")
        else:
            asked = True
            request = DeliveryRequest(
                lead=facts_of(attempt.lead), submission_id=attempt.submission.submission_id, attempt=job.attempts,
                endpoint=endpoint, secrets=opened.secrets,
                settings=self.registry.adapter_settings("delivery", endpoint.adapter),
                allow_private_addresses=self.runtime.config.delivery.allow_private_addresses, now=attempt.now)
            try:
                async with asyncio.timeout(float(endpoint.timeout_seconds) + DEADLINE_MARGIN):
                    result = _checked(await adapter.deliver(request, http), endpoint.adapter)
            except TimeoutError:
                result = DeliveryResult(outcome="error", reason="delivery deadline passed")
            except Exception as exc:  # an adapter bug is a retryable error, never a crash of the loop
                crash = adapter_crash(exc, opened.scrubber)
                log.error("delivery adapter %r raised %s\n%s", endpoint.adapter, crash.message, crash.stack)
                result = DeliveryResult(outcome="error", reason=f"adapter raised {crash.message}")
            result = scrubbed(result, opened.scrubber)
        await self._record(attempt, reserved, result, endpoint, crash, target if asked else None, target)

    # ---- which endpoint -----------------------------------------------------------------------

    def _reserve_and_choose(self, tx: Session, attempt: Attempt, campaign: Campaign, candidates: dict[str, Campaign],
                            checks: dict[str, tuple[list[LimitCheck], Blocked | None]],
                            named: str | None) -> tuple[Reserved | None, str | None | object]:
        """In one write transaction: the campaign's slots (`_reserve`, which may move the lead to
        another campaign), then, when that campaign has a distribution, its buyer (`_choose`).
        The buyer is None when the campaign has no distribution (or a repost named one); STOPPED
        when the job was queued, parked or ended."""
        reserved = self._reserve(tx, attempt, campaign, candidates, checks) \
            if checks[campaign.campaign_id] != ([], None) else Reserved(campaign, attempt)
        if reserved is None:
            return None, STOPPED
        distribution = reserved.campaign.delivery.distribution
        if distribution is None or named is not None:
            return reserved, None
        chosen = self._choose(tx, reserved.attempt, reserved.campaign, distribution)
        return reserved, STOPPED if chosen is None else chosen

    async def _target(self, attempt: Attempt, campaign: Campaign, named: str | None) -> str | None | object:
        """The endpoint of a campaign without a distribution, or the one a repost named (None:
        none); STOPPED when it is paused and the job was parked instead."""
        job = attempt.job
        target = named or campaign.delivery.delivery_endpoint_id
        if target and self._is_paused(attempt, target):
            parked = await self._write(job, lambda tx: self._park(tx, attempt, target, attempted=False))
            if parked:
                return STOPPED
        return target

    def _is_paused(self, attempt: Attempt, endpoint_id: str) -> bool:
        if attempt.paused is not None:
            return endpoint_id in attempt.paused
        return self.runtime.store.reader().endpoints.is_paused(attempt.job.tenant_id, endpoint_id)

    def _park(self, tx: Session, attempt: Attempt, endpoint_id: str | None, *, attempted: bool,
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
        if not tx.jobs.park(job.tenant_id, job.job_id, endpoint_id, iso(self.runtime.clock.now()), waits_for,
                            attempted=attempted):
            if step is not None:  # cancelled meanwhile: the buyer's answer is still noted
                self._settle(tx, attempt, outcome, None, step[1], job_state=None, event_kind=step[0],
                             details=details, error=error)
            return True
        kind, said = step or ("endpoint_paused", "")
        reason = f"{said + '; ' if said else ''}{waits_for}; the lead waits for it"
        self._settle(tx, attempt, outcome, "queued", reason, job_state=None, event_kind=kind,
                     details=details or {"deliveryEndpointId": endpoint_id}, error=error)
        return True

    def _choose(self, tx: Session, attempt: Attempt, campaign: Campaign, distribution: Distribution) -> str | None:
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
                self._settle(tx, attempt, None, "failed", f"no delivery endpoint of the distribution is left to try"
                             f" (tried: {tried})", job_state="done", event_kind="distribution_exhausted")
                return None
        open_entries, blocks, paused_ids = [], [], []
        for entry in entries:
            if tx.endpoints.is_paused(tenant_id, entry.delivery_endpoint_id):
                paused_ids.append(entry.delivery_endpoint_id)
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
                self._settle(tx, attempt, None, "queued", f"{first.reason}; released at {iso(first.release_at)}",
                             job_state=None, event_kind="queued")
            else:
                self._park(tx, attempt, entries[0].delivery_endpoint_id if entries is pinned else None,
                           attempted=False)
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

    @staticmethod
    def _candidates(campaign: Campaign, settings: TenantSettings) -> dict[str, Campaign]:
        """The campaign and those its constraints may send a lead on to (one level)."""
        ids = [campaign.campaign_id, *campaign.qualification.fallback_campaigns]
        ids += [limit.route_to_campaign_id for limit in campaign.delivery.delivery_limits if limit.route_to_campaign_id]
        schedule = campaign.delivery.delivery_schedule
        if schedule is not None and schedule.route_to_campaign_id:
            ids.append(schedule.route_to_campaign_id)
        found = {cid: settings.campaigns.get(cid) for cid in ids}
        return {cid: c for cid, c in found.items() if c is not None and (c is campaign or usable(c))}

    def _reserve(self, tx: Session, attempt: Attempt, campaign: Campaign, candidates: dict[str, Campaign],
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
                return Reserved(current, self._moved(attempt, current, f"{campaign.campaign_id}: {first_block.reason}"))
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
        self._settle(tx, attempt, None, "queued", f"{first_block.reason}; released at {iso(release)}", job_state=None,
                     event_kind="queued")
        return None

    @staticmethod
    def _moved(attempt: Attempt, target: Campaign, reason: str) -> Attempt:
        moved = event(iso(attempt.now), "rerouted_for_delivery", reason, target)
        return replace(attempt, events=(*attempt.events, moved),
                       submission=msgspec.structs.replace(attempt.submission, campaign=snapshot(target)))

    async def _record(self, attempt: Attempt, reserved: Reserved | None, result: DeliveryResult,
                      endpoint: DeliveryEndpoint | None = None, crash: JourneyError | None = None,
                      asked: str | None = None, target: str | None = None) -> None:
        """`target`: the endpoint meant; `asked`: the endpoint whose adapter answered (its health)."""
        recorded = await self._write(attempt.job, 
            lambda tx: self._record_unit(tx, attempt, reserved, result, endpoint, crash, asked, target))
        # Counted and logged once it is committed (a write unit may run more than once).
        job, where_to = attempt.job, target or "-"
        self.runtime.metrics.deliveries[(result.outcome, where_to)] += 1
        if recorded.paused_reason is not None:
            log.warning("delivery endpoint %s paused: %s", where_to, recorded.paused_reason)
        if result.outcome == "success":
            log.debug("delivered to %s (attempt %d)", where_to, job.attempts)
        elif recorded.next_endpoint:
            log.warning("delivery to %s ended in %s, the lead goes on to the next endpoint: %s", where_to,
                        result.outcome, result.reason)
        elif result.outcome == "error" and recorded.waiting:
            log.warning("delivery to %s failed with an error; the lead waits for the endpoint to resume: %s",
                        where_to, result.reason)
        elif result.outcome == "error" and retries_left(endpoint, job.attempts):
            log.warning("delivery to %s failed with an error, to be retried (attempt %d): %s", where_to,
                        job.attempts, result.reason)
        elif result.outcome == "error":
            log.error("delivery to %s gave up after %d attempts: %s", where_to, job.attempts, result.reason)
        else:
            log.warning("delivery to %s refused by the buyer (%s): %s", where_to, result.outcome, result.reason)

    def _record_unit(self, tx: Session, attempt: Attempt, reserved: Reserved | None, result: DeliveryResult,
                     endpoint: DeliveryEndpoint | None, crash: JourneyError | None, asked: str | None,
                     target: str | None) -> Recorded:
        job, now_dt = attempt.job, self.runtime.clock.now()
        now = iso(now_dt)
        posting = PostingOutcome(success=result.outcome == "success", client_lead_id=result.client_lead_id,
                                 status_code=result.status_code, posted_at=now)
        delivery = DeliveryOutcome(success=result.outcome == "success", client_lead_id=result.client_lead_id,
                                   status_code=result.status_code, response_message=result.message or result.reason,
                                   url=result.url, method=result.method, body_format=result.body_format,
                                   delivered_at=now if result.outcome == "success" else None)
        details = {"outcome": result.outcome, "attempt": job.attempts, "statusCode": result.status_code,
                   "deliveryEndpointId": target}
        outcome = (posting, delivery, result)
        paused_reason = self._answered(tx, attempt, asked, endpoint, result, now_dt) if asked else None
        if result.outcome == "success":
            self._settle(tx, attempt, outcome, "delivered", result.message or "delivered",
                         job_state="done", event_kind="delivered", details=details, endpoint_id=target)
            return Recorded(paused_reason)
        tx.jobs.release_reservations(job.tenant_id, job.job_id)
        if result.outcome == "error" and target and tx.endpoints.is_paused(job.tenant_id, target):
            # The buyer is paused: the lead does not use up its retries on it. With a distribution
            # it goes on to another buyer (it may come back here after the resume), else it waits.
            said = result.reason or "error"
            if self._next_endpoint(tx, attempt, target, tried_target=False):
                self._settle(tx, attempt, outcome, None, f"{said}; delivery endpoint {target} is paused, the lead"
                             " goes on to another endpoint", job_state="done", event_kind="delivery_error",
                             details=details, error=crash)
                return Recorded(paused_reason, next_endpoint=True)
            if self._park(tx, attempt, target, attempted=True, step=("delivery_error", said), outcome=outcome,
                          details=details, error=crash):
                return Recorded(paused_reason, waiting=True)
        if result.outcome == "error" and retries_left(endpoint, job.attempts):
            due = iso(now_dt + timedelta(seconds=float(retry_delay(endpoint, job.attempts))))
            tx.jobs.reschedule(job.job_id, due, now, error=result.reason)
            self._settle(tx, attempt, outcome, None,
                         f"{result.reason or 'error'}; retry {job.attempts + 1} at {due}", job_state=None,
                         event_kind="delivery_error", details=details, error=crash)
            return Recorded(paused_reason)
        reason = result.reason or result.outcome
        if result.outcome == "error":
            reason = f"{reason}; retries exhausted after {job.attempts} attempts"
        if target and self._next_endpoint(tx, attempt, target):
            self._settle(tx, attempt, outcome, None, f"{reason}; the lead goes on to the next endpoint",
                         job_state="done", event_kind=f"delivery_{result.outcome}", details=details, error=crash)
            return Recorded(paused_reason, next_endpoint=True)
        self._settle(tx, attempt, outcome, "failed", reason,
                     job_state="dead" if result.outcome == "error" else "done",
                     event_kind=f"delivery_{result.outcome}", details=details, error=crash)
        return Recorded(paused_reason)

    def _answered(self, tx: Session, attempt: Attempt, target: str, endpoint: DeliveryEndpoint | None,
                  result: DeliveryResult, now_dt: datetime) -> str | None:
        """The endpoint's health after this answer; the reason when the answer paused it."""
        tenant_id, now = attempt.job.tenant_id, iso(now_dt)
        tx.endpoints.count_answer(tenant_id, target, hour_of(now_dt), result.outcome)
        if result.outcome in ("success", "duplicate"):  # the usual answer: written without a read
            tx.endpoints.healthy_answer(tenant_id, target, now if result.outcome == "success" else None)
            return None
        policy = endpoint.health_policy if endpoint is not None else HealthPolicy()
        health, paused_now = after_answer(tx.endpoints.health(tenant_id, target), result.outcome, result.reason,
                                          policy, now)
        tx.endpoints.save_health(tenant_id, target, health)
        if not paused_now:
            return None
        if endpoint is not None:
            record_endpoint_event(tx, attempt.settings, tenant_id, "endpoint.paused",
                                  item_of(tx, tenant_id, endpoint, now_dt), now)
        return health.paused_reason

    def _next_endpoint(self, tx: Session, attempt: Attempt, target: str, *, tried_target: bool = True) -> bool:
        """After a refusal (or retries exhausted): when the campaign's distribution has an endpoint
        left for this lead, a new job takes the lead there (the waterfall) and True.
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
        now = iso(self.runtime.clock.now())
        tx.jobs.insert_job(tenant_id=job.tenant_id, kind="deliver", lead_id=job.lead_id,
                           submission_id=job.submission_id, due_at=now, now=now, tried=tried)
        return True

    def _settle(self, tx: Session, attempt: Attempt, outcome: tuple | None, status: str | None,
                reason: str, *, job_state: str | None, event_kind: str | None = None,
                details: dict | None = None, error: JourneyError | None = None,
                endpoint_id: str | None = None) -> None:
        """Write the submission (and the lead, when this is its latest submission) after a step;
        `endpoint_id`: the endpoint a delivery went to (its revenue is booked to it)."""
        tenant_id, now_dt = attempt.job.tenant_id, self.runtime.clock.now()
        now = iso(now_dt)
        # Finished first: only a running job finishes, so the state is read only when it did not
        # (one statement less per delivery).
        finished = job_state is not None and tx.jobs.finish(attempt.job.job_id, job_state, now,
                                                            None if job_state == "done" else reason)
        if not finished and tx.jobs.job_state(attempt.job.job_id) == "cancelled":
            # An operator changed the lead while this attempt ran: keep their status, note ours.
            status, event_kind = None, f"{event_kind or 'update'}_after_cancel"
        submission = attempt.loaded.submission_in(tx, tenant_id) or attempt.submission
        changes: dict[str, Any] = {"updated_at": now, "campaign": attempt.submission.campaign}
        if outcome is not None:
            posting, delivery, result = outcome
            changes.update(posting=posting, delivery=delivery, posted_at=posting.posted_at)
            if result.client_lead_id:
                changes["client_lead_id"] = result.client_lead_id
            if result.response_fields:
                changes["response_fields"] = dict(result.response_fields)
        if status is not None:
            changes.update(status=status, result=reason)
        step = event(now, event_kind or status or "update", reason, details=details)
        if error is not None:
            step = msgspec.structs.replace(step, error=error)
        changes["journey_events"] = [*submission.journey_events, *attempt.events, step]
        submission = msgspec.structs.replace(submission, **changes)
        tx.leads.update_submission(tenant_id, submission)
        if status is None:
            return
        price = outcome[2].price if outcome is not None and status == "delivered" else None
        earn(tx, attempt.settings, tenant_id, attempt.lead, submission.submission_id, (status,), now_dt,
             campaign=attempt.settings.campaigns.get(submission.campaign.campaign_id), price=price,
             endpoint_id=endpoint_id)
        stored = attempt.loaded.lead_in(tx, tenant_id)
        if stored is None or stored.submission_count != submission.submission_number:
            return  # a newer submission owns the lead's status
        changed = stored.status != status
        lead = msgspec.structs.replace(stored, status=status, campaign_id=submission.campaign.campaign_id,
                                       client_id=submission.campaign.client_id, offer_id=submission.campaign.offer_id,
                                       updated_at=now)
        tx.leads.update_lead(tenant_id, lead, was=stored)
        if changed:  # a lead queued again (a cap still full) is not news
            record_lead_events(tx, attempt.settings, tenant_id, lead, submission, (status,), now)

    # ---- deferred evaluation ------------------------------------------------------------------

    async def _evaluate(self, job: Job, attempt: Attempt | None, http: httpx.AsyncClient) -> None:
        now = iso(self.runtime.clock.now())
        if attempt is None:
            await self._write(job, lambda tx: tx.jobs.finish(job.job_id, "dead", now, "lead missing"))
            return
        intake = attempt.settings.campaigns.get(attempt.submission.campaign.campaign_id)
        if intake is None:
            await self._write(job, lambda tx: self._settle(
                tx, attempt, None, "error", "campaign no longer exists", job_state="dead"))
            return
        claimed: dict | None = None  # compliance.trustedForm, when the campaign verifies certificates
        if intake.qualification.tcpa_policy.ingestion_policy.verify_certificate:
            claim = await self._claim(attempt, http)
            if claim.kind == "retry":
                await self._write(job, lambda tx: self._claim_later(tx, attempt, claim))
                return
            claimed = claim.stored()
            attempt = replace(attempt, lead=msgspec.structs.replace(
                attempt.lead, compliance={**attempt.lead.compliance, "trustedForm": claimed}))
            if claim.kind == "failed":
                failed, reason = attempt, claim.reason or "TrustedForm certificate could not be verified"

                def disqualify(tx: Session) -> None:
                    self._store_claim(tx, failed, claimed)
                    self._settle(tx, failed, None, "disqualified", reason, job_state="done",
                                 event_kind="trustedform_failed", details={"statusCode": claim.status_code})

                await self._write(job, disqualify)
                log.info("TrustedForm certificate of %s not verified: %s", job.lead_id, reason)
                return
        source = next((s for s in intake.ingestion.sources if s.source_id == attempt.lead.source_id), None)
        evaluation = evaluate(facts_of(attempt.lead), intake, attempt.settings.campaigns, source,
                              value_sets=attempt.settings.value_sets, today=attempt.now.date(), now=now,
                              prompt_evaluator=self.registry.prompt_evaluator())

        def unit(tx: Session) -> None:
            status, reason = evaluation.status, evaluation.qualification.reason or evaluation.status
            if claimed is not None:
                self._store_claim(tx, attempt, claimed)
            stored = tx.leads.get_lead(job.tenant_id, job.lead_id)
            stored_approval = stored.approval if stored is not None and evaluation.approval is None else None
            if (held := held_by_approval(status, stored_approval)) is not None:
                status, reason = held, f"the lead's approval is {stored_approval.status}"
            evaluated = replace(attempt, events=(*attempt.events, *evaluation.events),
                                submission=msgspec.structs.replace(
                                    attempt.submission, campaign=snapshot(evaluation.campaign),
                                    qualification=evaluation.qualification, routing=evaluation.routing,
                                    qualified_at=evaluation.qualification.qualified_at))
            submission = tx.leads.get_submission(job.tenant_id, job.submission_id)
            if submission is not None:
                tx.leads.update_submission(job.tenant_id, msgspec.structs.replace(
                    submission, qualification=evaluation.qualification, routing=evaluation.routing,
                    qualified_at=evaluation.qualification.qualified_at))
            self._settle(tx, evaluated, None, status, reason, job_state="done", event_kind="evaluated")
            if evaluation.approval is not None:
                lead = tx.leads.get_lead(job.tenant_id, job.lead_id)
                if lead is not None:
                    tx.leads.update_lead(job.tenant_id, msgspec.structs.replace(lead, approval=evaluation.approval))
            if status == "qualified":
                tx.jobs.insert_job(tenant_id=job.tenant_id, kind="deliver", lead_id=job.lead_id,
                                   submission_id=job.submission_id, due_at=now, now=now)

        await self._write(job, unit)
        if evaluation.intake_action in ("engage", "workflow"):
            run_intake_action(self.registry, evaluation.campaign, attempt.lead, job.submission_id, evaluation.intake_action)

    async def _claim(self, attempt: Attempt, http: httpx.AsyncClient) -> trustedform.Claim:
        """Claim the lead's TrustedForm certificate (the submit made sure it has a URL)."""
        cert_url = attempt.lead.compliance.get("trustedFormCertUrl")
        if not isinstance(cert_url, str) or not cert_url:
            return trustedform.Claim("failed", "TrustedForm certificate could not be verified: "
                                               "compliance.trustedFormCertUrl is missing")
        return await trustedform.claim(http, self._trustedform, cert_url, lead_id=attempt.lead.lead_id,
                                       allow_private=self.runtime.config.delivery.allow_private_addresses)

    @staticmethod
    def _store_claim(tx: Session, attempt: Attempt, claimed: dict) -> None:
        """`compliance.trustedForm` on the stored lead, when this is still its latest submission."""
        lead = tx.leads.get_lead(attempt.job.tenant_id, attempt.lead.lead_id)
        if lead is None or lead.submission_count != attempt.submission.submission_number:
            return
        tx.leads.update_lead(attempt.job.tenant_id, msgspec.structs.replace(
            lead, compliance={**lead.compliance, "trustedForm": claimed}))

    def _claim_later(self, tx: Session, attempt: Attempt, claim: trustedform.Claim) -> None:
        """TrustedForm could not answer: the lead waits at `pending`, the claim is tried again on
        the webhooks' schedule (about a day and a half), then the lead ends at `error`."""
        now_dt = self.runtime.clock.now()
        attempts = attempt.job.attempts
        if attempts > len(RETRY_SCHEDULE):
            self._settle(tx, attempt, None, "error", f"{claim.reason}; TrustedForm did not answer after {attempts}"
                         " attempts", job_state="dead", event_kind="trustedform_error",
                         details={"attempt": attempts, "statusCode": claim.status_code})
            return
        due = iso(now_dt + timedelta(seconds=float(RETRY_SCHEDULE[attempts - 1])))
        tx.jobs.reschedule(attempt.job.job_id, due, iso(now_dt), error=claim.reason)
        self._settle(tx, attempt, None, None, f"{claim.reason}; claim retry {attempts + 1} at {due}",
                     job_state=None, event_kind="trustedform_error",
                     details={"attempt": attempts, "statusCode": claim.status_code})


def retries_left(endpoint: DeliveryEndpoint | None, attempts: int) -> bool:
    """Whether an `error` after `attempts` attempts is tried again (the endpoint's retry policy)."""
    max_attempts = endpoint.retry.max_attempts if endpoint is not None else len(DEFAULT_BACKOFF) + 1
    return attempts < max_attempts


def retry_delay(endpoint: DeliveryEndpoint | None, attempts: int) -> int | float:
    backoff = list(endpoint.retry.backoff_seconds) if endpoint is not None and endpoint.retry.backoff_seconds \
        else list(DEFAULT_BACKOFF)
    return backoff[min(attempts - 1, len(backoff) - 1)]


def where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else "?"


def scrubbed(result: DeliveryResult, scrub: Scrubber) -> DeliveryResult:
    """What an adapter answered, with credentials masked wherever the buyer's words are carried."""
    return msgspec.structs.replace(
        result, reason=scrub(result.reason), message=scrub(result.message),
        client_lead_id=scrub(result.client_lead_id), url=scrub(result.url),
        response_fields={k: scrub(v) or "" for k, v in result.response_fields.items()})


def _checked(result: Any, adapter: str) -> DeliveryResult:
    """An adapter's answer with the types it declares: a plugin builds its DeliveryResult
    unchecked (or returns something else), and a wrong type stored on the submission would
    break every later read of it. Such an answer is a retryable error of the adapter."""
    try:
        return msgspec.convert(msgspec.to_builtins(result), DeliveryResult)
    except (msgspec.ValidationError, TypeError) as exc:
        return DeliveryResult(outcome="error", reason=f"adapter {adapter!r} returned an invalid result: {exc}")
