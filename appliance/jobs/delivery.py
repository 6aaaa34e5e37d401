"""The delivery worker, a claim loop: claims due jobs from the jobs table, as many as its
concurrency allows, and hands each to its use case: a `deliver` job to services/delivery.py (which
checks, reserves, chooses the buyer and records the answer), asking the buyer in between under a
hard deadline; an `evaluate` job (a short-circuited submission) to
services/deferred_evaluation.py; an `esign` job (a lead's documents for signature) to
services/esign.py. Its writes are done only while it still holds the job's claim."""

from __future__ import annotations

import asyncio
import logging
import traceback
from datetime import timedelta
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
import msgspec

from appliance import logs
from appliance.adapters.outbound import Scrubber, adapter_crash
from appliance.clock import iso
from appliance.domain.documents import ESIGN_JOB
from appliance.domain.endpoint import DEFAULT_BACKOFF_SECONDS
from appliance.domain.lead import JourneyError
from appliance.runtime import Runtime
from appliance.sdk import DeliveryResult
from appliance.services.deferred_evaluation import evaluate_later
from appliance.services.esign import run_documents
from appliance.services.delivery import Deliveries, Sending
from appliance.services.delivery_attempt import Attempt, load_attempts
from appliance.services.tenant_settings import SettingsCache
from appliance.jobs.outage import Outage
from appliance.storage import locks
from appliance.storage import ClaimLost, Job, Session, StorageUnavailable

log = logging.getLogger("appliance.delivery")

DEADLINE_MARGIN = 2.0  # seconds beyond the endpoint's timeout before the worker gives up on an adapter
NOT_LOADED = object()  # a claimed job whose attempt its own task loads (see _load_claimed)
T = TypeVar("T")


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
        self.deliveries = Deliveries(runtime, registry, self._write)

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
                        # Scoped, naming nothing: claims skip the jobs other processes hold.
                        claimed = await store.write(lambda tx: tx.jobs.claim_due(now, free), locks=())
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
            attempt = loaded if loaded is not NOT_LOADED else \
                load_attempts(self.runtime, self.settings, [job])[job.job_id]
            if job.kind == "evaluate":
                await evaluate_later(self.runtime, self.registry, self._write, job, attempt, http)
            elif job.kind == ESIGN_JOB:
                await run_documents(self.runtime, self.registry, self._write, job, attempt, http)
            elif (sending := await self.deliveries.prepare(job, attempt, http)) is not None:
                await self._ask_buyer(sending, http)
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
            due = iso(self.runtime.clock.now() + timedelta(seconds=DEFAULT_BACKOFF_SECONDS[0]))

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
            tx.jobs.fence(job)
            return unit(tx)
        # A database that does not answer now (a full disk, an outage) is waited for, as the
        # loops do: given up, the job stayed `running` until the next start, its lead never
        # recorded delivered though the buyer had it.
        # Scoped by its lead: what else it decides on (limits, rotation, health, balances) the
        # store locks as the unit reads it (storage/locks.py).
        held = [locks.lead(job.tenant_id, job.lead_id)]
        return await Outage(log, f"job {job.job_id} ({job.kind})").retry(
            lambda: self.runtime.store.write(fenced, locks=held), None)  # type: ignore[return-value]

    def _load_claimed(self, jobs: list[Job]) -> dict[int, Attempt | None]:
        """The attempts of a whole claim, in one read; when the batch cannot be read, {}: each
        job's task then loads its own and meets the problem there."""
        if not jobs:
            return {}
        try:
            return load_attempts(self.runtime, self.settings, jobs)
        except Exception:  # noqa: BLE001 - handled per job by _process, which logs it
            return {}

    async def _ask_buyer(self, sending: Sending, http: httpx.AsyncClient) -> None:
        """Ask the buyer under a hard deadline (its endpoint's timeout and a margin) and hand
        the answer, credentials masked, back to the use case to record."""
        crash: JourneyError | None = None
        if sending.request is None:  # the buyer cannot be asked: the answer is given
            result = sending.answer
        else:
            endpoint, adapter = sending.endpoint, sending.adapter
            try:
                async with asyncio.timeout(float(endpoint.timeout_seconds) + DEADLINE_MARGIN):
                    result = checked(await adapter.deliver(sending.request, http), endpoint.adapter)
            except TimeoutError:
                result = DeliveryResult(outcome="error", reason="delivery deadline passed")
            except Exception as exc:  # an adapter bug is a retryable error, never a crash of the loop
                crash = adapter_crash(exc, sending.scrubber)
                log.error("delivery adapter %r raised %s\n%s", endpoint.adapter, crash.message, crash.stack)
                result = DeliveryResult(outcome="error", reason=f"adapter raised {crash.message}")
            result = scrubbed(result, sending.scrubber)
        await self.deliveries.record(sending, result, crash)


def where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else "?"


def scrubbed(result: DeliveryResult, scrub: Scrubber) -> DeliveryResult:
    """What an adapter answered, with credentials masked wherever the buyer's words are carried."""
    return msgspec.structs.replace(
        result, reason=scrub(result.reason), message=scrub(result.message),
        client_lead_id=scrub(result.client_lead_id), url=scrub(result.url),
        response_fields={k: scrub(v) or "" for k, v in result.response_fields.items()})


def checked(result: Any, adapter: str) -> DeliveryResult:
    """An adapter's answer with the types it declares: a plugin builds its DeliveryResult
    unchecked (or returns something else), and a wrong type stored on the submission would
    break every later read of it. Such an answer is a retryable error of the adapter."""
    try:
        return msgspec.convert(msgspec.to_builtins(result), DeliveryResult)
    except (msgspec.ValidationError, TypeError) as exc:
        return DeliveryResult(outcome="error", reason=f"adapter {adapter!r} returned an invalid result: {exc}")
