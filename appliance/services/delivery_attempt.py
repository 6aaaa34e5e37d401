"""A claimed job's attempt, what every step of a delivery or a deferred evaluation works on: the
job's lead and submission as loaded (`load_attempts`, for a whole claim in one read), and
`settle`, which writes what a step did to the submission and, while it is the lead's latest, to
the lead, its money and its webhook events."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, Protocol, TypeVar

import msgspec

from appliance.clock import Clock, iso
from appliance.domain.auction import Sale
from appliance.domain.lead import JourneyError, LeadRecord, Submission
from appliance.domain.pipeline import event
from appliance.runtime import Runtime
from appliance.services.lead_events import record_lead_events
from appliance.services.ledger import earn
from appliance.services.tenant_settings import SettingsCache, TenantSettings
from appliance.storage import Job, Session

T = TypeVar("T")


class ClaimedWrite(Protocol):
    """How a step writes: `unit` committed only while this process still holds `job`'s claim
    (the claim loop's, jobs/delivery.py; raises ClaimLost when it does not)."""

    def __call__(self, job: Job, unit: Callable[[Session], T], /) -> Awaitable[T]: ...


class Loaded(NamedTuple):
    """A job's lead and submission as first read, rows and records: a write unit that reads a
    row again and finds it unchanged takes the record instead of decoding the row again."""
    lead_row: tuple
    lead: LeadRecord
    submission_row: tuple
    submission: Submission

    def read_again(self, tx: Session, tenant_id: str) -> Callable[[], tuple[LeadRecord | None, Submission | None]]:
        """The lead and submission as `tx` finds them, asked now and answered when called (with
        the unit's next wait on a store that does not wait for each statement)."""
        rows = tx.leads.rows_later(tenant_id, self.lead.lead_id, self.submission.submission_id)

        def records() -> tuple[LeadRecord | None, Submission | None]:
            lead_row, submission_row = rows()
            lead = self.lead if lead_row == self.lead_row else \
                tx.leads.lead_of(lead_row) if lead_row is not None else None
            submission = self.submission if submission_row == self.submission_row else \
                tx.leads.submission_of(submission_row) if submission_row is not None else None
            return lead, submission
        return records


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
    sale: Sale | None = None  # the won bid this attempt posts (an auction): its revenue and token


def load_attempts(runtime: Runtime, settings: SettingsCache, jobs: list[Job]) -> dict[int, Attempt | None]:
    """The jobs' attempts (None: the lead or submission is missing), read in one read
    transaction. SQLite empties a connection's page cache when a read transaction starts
    after a commit (each delivery makes one), and each statement outside a transaction is a
    transaction of its own: read job by job, every statement read its index pages again
    (bench/HISTORY.md). Each tenant's config revision and paused endpoints are read once."""
    tenants: dict[str, tuple[int, frozenset[str]]] = {}
    tx = runtime.store.reader()
    with tx:
        rows = tx.leads.rows_of([(job.tenant_id, job.lead_id, job.submission_id) for job in jobs])
        return {job.job_id: _attempt(job, found, tx, tenants, settings, runtime.clock)
                for job, found in zip(jobs, rows)}


def _attempt(job: Job, rows: tuple[tuple | None, tuple | None], tx: Session,
             tenants: dict[str, tuple[int, frozenset[str]]], settings: SettingsCache, clock: Clock) -> Attempt | None:
    lead_row, submission_row = rows
    if lead_row is None or submission_row is None:
        return None
    lead, submission = tx.leads.lead_of(lead_row), tx.leads.submission_of(submission_row)
    if job.tenant_id not in tenants:
        tenants[job.tenant_id] = (tx.tenants.config_rev(job.tenant_id), frozenset(
            endpoint_id for endpoint_id, health in tx.endpoints.all_health(job.tenant_id).items()
            if health.paused))
    rev, paused = tenants[job.tenant_id]
    return Attempt(job=job, lead=lead, submission=submission, settings=settings.get(job.tenant_id, rev),
                   now=clock.now(), loaded=Loaded(lead_row, lead, submission_row, submission), paused=paused)


def settle(tx: Session, clock: Clock, attempt: Attempt, outcome: tuple | None, status: str | None, reason: str, *,
           job_state: str | None, event_kind: str | None = None, details: dict | None = None,
           error: JourneyError | None = None, endpoint_id: str | None = None) -> None:
    """Write the submission (and the lead, when this is its latest submission) after a step;
    `endpoint_id`: the endpoint a delivery went to (its revenue is booked to it)."""
    tenant_id, now_dt = attempt.job.tenant_id, clock.now()
    now = iso(now_dt)
    # Asked before the job is finished, so one wait answers both (nothing below writes the lead
    # before it is used).
    stored_now = attempt.loaded.read_again(tx, tenant_id)
    # Finished first: only a running job finishes, so the state is read only when it did not
    # (one statement less per delivery).
    finished = job_state is not None and tx.jobs.finish(attempt.job.job_id, job_state, now,
                                                        None if job_state == "done" else reason)
    if not finished and tx.jobs.job_state(attempt.job.job_id) == "cancelled":
        # An operator changed the lead while this attempt ran: keep their status, note ours.
        status, event_kind = None, f"{event_kind or 'update'}_after_cancel"
    stored, submission = stored_now()
    submission = submission or attempt.submission
    if status in ("queued", "failed") and submission.status == "delivered":
        status = None  # another sale of a lead sold to several buyers: it stays delivered
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
    sale = (attempt.sale.bid, attempt.sale.currency) if attempt.sale is not None else None
    earn(tx, attempt.settings, tenant_id, attempt.lead, submission.submission_id, (status,), now_dt,
         campaign=attempt.settings.campaigns.get(submission.campaign.campaign_id), price=price,
         endpoint_id=endpoint_id, sale=sale)
    if stored is None or stored.submission_count != submission.submission_number:
        return  # a newer submission owns the lead's status
    changed = stored.status != status
    lead = msgspec.structs.replace(stored, status=status, campaign_id=submission.campaign.campaign_id,
                                   client_id=submission.campaign.client_id, offer_id=submission.campaign.offer_id,
                                   updated_at=now)
    tx.leads.update_lead(tenant_id, lead, was=stored)
    if changed:  # a lead queued again (a cap still full) is not news
        record_lead_events(tx, attempt.settings, tenant_id, lead, submission, (status,), now)
