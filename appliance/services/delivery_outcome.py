"""Where a buyer's answer is recorded, in one write transaction (`record_answer`): the buyer's
health when it was asked (an answer may pause it), then what comes of the attempt: delivered;
on a paused buyer, the next endpoint or a wait for the resume; an `error` retried on the
endpoint's backoff; after a refusal or the last retry, the waterfall's next endpoint; else
failed. `log_recorded` says what was recorded, once it is committed."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from appliance.clock import Clock, iso
from appliance.domain.endpoint import DeliveryEndpoint, HealthPolicy, retries_left, retry_delay
from appliance.domain.endpoint_health import after_answer
from appliance.domain.lead import DeliveryOutcome, JourneyError, PostingOutcome
from appliance.sdk import DeliveryResult
from appliance.services.buyer_choice import move_down_the_waterfall, park
from appliance.services.delivery_attempt import Attempt, settle
from appliance.services.endpoints import hour_of, item_of, record_endpoint_event
from appliance.storage import Job, Session

log = logging.getLogger("appliance.delivery")


@dataclass(frozen=True)
class Recorded:
    """What recording an answer did, for the log after the commit."""
    paused_reason: str | None  # this answer paused the endpoint
    waiting: bool = False  # the lead waits for its paused endpoint
    next_endpoint: bool = False  # the lead goes on to the distribution's next endpoint


def record_answer(tx: Session, clock: Clock, attempt: Attempt, result: DeliveryResult,
                  endpoint: DeliveryEndpoint | None, crash: JourneyError | None, asked: str | None,
                  target: str | None) -> Recorded:
    """`target`: the endpoint meant; `asked`: the endpoint whose adapter answered (its health)."""
    job, now_dt = attempt.job, clock.now()
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
    paused_reason = _buyer_health(tx, attempt, asked, endpoint, result, now_dt) if asked else None
    if result.outcome == "success":
        settle(tx, clock, attempt, outcome, "delivered", result.message or "delivered",
               job_state="done", event_kind="delivered", details=details, endpoint_id=target)
        return Recorded(paused_reason)
    tx.jobs.release_reservations(job.tenant_id, job.job_id)
    if result.outcome == "error" and target and tx.endpoints.is_paused(job.tenant_id, target):
        # The buyer is paused: the lead does not use up its retries on it. With a distribution
        # it goes on to another buyer (it may come back here after the resume), else it waits.
        said = result.reason or "error"
        if move_down_the_waterfall(tx, clock, attempt, target, tried_target=False):
            settle(tx, clock, attempt, outcome, None, f"{said}; delivery endpoint {target} is paused, the lead"
                   " goes on to another endpoint", job_state="done", event_kind="delivery_error",
                   details=details, error=crash)
            return Recorded(paused_reason, next_endpoint=True)
        if park(tx, clock, attempt, target, attempted=True, step=("delivery_error", said), outcome=outcome,
                details=details, error=crash):
            return Recorded(paused_reason, waiting=True)
    if result.outcome == "error" and retries_left(endpoint, job.attempts):
        due = iso(now_dt + timedelta(seconds=float(retry_delay(endpoint, job.attempts))))
        tx.jobs.reschedule(job.job_id, due, now, error=result.reason)
        settle(tx, clock, attempt, outcome, None, f"{result.reason or 'error'}; retry {job.attempts + 1} at {due}",
               job_state=None, event_kind="delivery_error", details=details, error=crash)
        return Recorded(paused_reason)
    reason = result.reason or result.outcome
    if result.outcome == "error":
        reason = f"{reason}; retries exhausted after {job.attempts} attempts"
    if target and move_down_the_waterfall(tx, clock, attempt, target):
        settle(tx, clock, attempt, outcome, None, f"{reason}; the lead goes on to the next endpoint",
               job_state="done", event_kind=f"delivery_{result.outcome}", details=details, error=crash)
        return Recorded(paused_reason, next_endpoint=True)
    status = None if _another_sale_stands(tx, attempt) else "failed"
    settle(tx, clock, attempt, outcome, status, reason, job_state="dead" if result.outcome == "error" else "done",
           event_kind=f"delivery_{result.outcome}", details=details, error=crash)
    return Recorded(paused_reason)


def _another_sale_stands(tx: Session, attempt: Attempt) -> bool:
    """A lead sold at a shared auction is several sales: one that fails while others are still
    under way leaves the lead to them (one already delivered keeps it delivered: `settle`)."""
    return attempt.sale is not None and tx.jobs.has_other_open_job(
        attempt.job.submission_id, attempt.job.job_id, "deliver")


def _buyer_health(tx: Session, attempt: Attempt, target: str, endpoint: DeliveryEndpoint | None,
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


def log_recorded(job: Job, target: str | None, result: DeliveryResult, recorded: Recorded,
                 endpoint: DeliveryEndpoint | None) -> None:
    """One line for the answer as recorded (after the commit: a write unit may run more than once)."""
    where_to = target or "-"
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
