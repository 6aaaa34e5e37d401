"""The durable job queue: deliver and evaluate jobs claimed by the worker. State survives
restarts; a job found `running` at start was interrupted and runs again (at-least-once)."""

from __future__ import annotations

from typing import NamedTuple

import apsw
import msgspec

from appliance.storage.caps import Caps


class Job(NamedTuple):
    job_id: int
    tenant_id: str
    kind: str
    lead_id: str
    submission_id: str
    attempts: int  # including the one just claimed
    endpoint_id: str | None = None  # the endpoint this delivery goes to, once chosen
    tried: tuple[str, ...] = ()  # endpoints this round of the waterfall already tried


class ClaimLost(Exception):
    """The process working on a job no longer holds its claim (PostgreSQL: its lease ended and
    another process took the job over), so it writes nothing more for it."""


class Jobs:
    """The durable job queue: scheduling, claiming, finishing, and the delivery-limit slots an attempt holds."""

    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def insert_job(self, *, tenant_id: str, kind: str, lead_id: str, submission_id: str,
                   due_at: str, now: str, state: str = "ready", tried: tuple[str, ...] = (),
                   endpoint_id: str | None = None) -> None:
        self._conn.execute(
            "INSERT INTO jobs(tenant_id, kind, lead_id, submission_id, state, due_at, created_at, updated_at, tried,"
            " endpoint_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (tenant_id, kind, lead_id, submission_id, state, due_at, now, now,
             msgspec.json.encode(tried) if tried else None, endpoint_id),
        )

    def cancel_open_jobs(self, submission_id: str, now: str) -> int:
        """Cancel the submission's waiting and running jobs. A running attempt finishes its call, but
        the worker then records nothing over the lead and never retries a cancelled job."""
        self._conn.execute(
            "UPDATE jobs SET state = 'cancelled', updated_at = ? WHERE submission_id = ?"
            " AND state IN ('ready', 'held', 'paused', 'running')",
            (now, submission_id),
        )
        return self._conn.changes()

    def cancel_waiting_jobs(self, submission_id: str, now: str) -> int:
        """Cancel the submission's jobs that have not started; a running one goes on."""
        self._conn.execute(
            "UPDATE jobs SET state = 'cancelled', updated_at = ? WHERE submission_id = ?"
            " AND state IN ('ready', 'held', 'paused')",
            (now, submission_id),
        )
        return self._conn.changes()

    def has_open_job(self, submission_id: str, kind: str) -> bool:
        """Whether a job of `kind` for the submission waits or runs."""
        return self._conn.execute(
            "SELECT 1 FROM jobs WHERE submission_id = ? AND kind = ? AND state IN ('ready', 'held', 'paused', 'running')"
            " LIMIT 1",
            (submission_id, kind),
        ).fetchone() is not None

    def wake_waiting(self, submission_id: str, kind: str, now: str) -> int:
        """The submission's waiting jobs of `kind` due now (a job that waits for a time, woken
        early by what it waits on)."""
        self._conn.execute("UPDATE jobs SET due_at = ?, updated_at = ? WHERE submission_id = ? AND kind = ?"
                           " AND state = 'ready' AND due_at > ?", (now, now, submission_id, kind, now))
        return self._conn.changes()

    def has_other_open_job(self, submission_id: str, job_id: int, kind: str) -> bool:
        """Whether another job of `kind` for the submission waits or runs (a shared sale's others)."""
        return self._conn.execute(
            "SELECT 1 FROM jobs WHERE submission_id = ? AND kind = ? AND job_id <> ?"
            " AND state IN ('ready', 'held', 'paused', 'running') LIMIT 1",
            (submission_id, kind, job_id),
        ).fetchone() is not None

    def jobs_of(self, submission_id: str) -> list[tuple[str, str, str]]:
        return self._conn.execute(
            "SELECT kind, state, due_at FROM jobs WHERE submission_id = ? ORDER BY job_id", (submission_id,)
        ).fetchall()

    def claim_due(self, now: str, limit: int) -> list[Job]:
        # A claim starts without a balance hold: one left by the job's last claim ended with it.
        return [Job(*row[:7], tuple(msgspec.json.decode(row[7])) if row[7] else ()) for row in self._conn.execute(
            "UPDATE jobs SET state = 'running', attempts = attempts + 1, updated_at = ?1, hold_client = NULL"
            " WHERE job_id IN (SELECT job_id FROM jobs WHERE state = 'ready' AND due_at <= ?1"
            "                  ORDER BY due_at, job_id LIMIT ?2)"
            " RETURNING job_id, tenant_id, kind, lead_id, submission_id, attempts, endpoint_id, tried",
            (now, limit),
        )]

    def choose_endpoint(self, job_id: int, endpoint_id: str) -> None:
        """The endpoint this delivery goes to: kept, so an attempt run again goes to the same buyer."""
        self._conn.execute("UPDATE jobs SET endpoint_id = ? WHERE job_id = ?", (endpoint_id, job_id))

    def park(self, tenant_id: str, job_id: int, endpoint_id: str | None, now: str, reason: str, *,
             attempted: bool) -> bool:
        """A running job waits for its paused endpoint (None: for any endpoint of its campaign's
        distribution), its limit slots given back; `release_paused` wakes it. `attempted`: the
        endpoint was tried this time (the attempt counts)."""
        self.release_reservations(tenant_id, job_id)
        if self.job_state(job_id) != "running":
            return False  # cancelled meanwhile: stays cancelled
        self._conn.execute(
            "UPDATE jobs SET state = 'paused', endpoint_id = ?, updated_at = ?, last_error = ?,"
            " attempts = attempts - ? WHERE job_id = ?", (endpoint_id, now, reason, 0 if attempted else 1, job_id))
        return True

    def release_paused(self, tenant_id: str, endpoint_id: str | None, now: str) -> int:
        """The jobs waiting for the endpoint, and those waiting for any endpoint of a distribution,
        due at once; `endpoint_id` None: every waiting job of the tenant (its configuration
        changed: a job may no longer go where it waited to go)."""
        self._conn.execute(
            "UPDATE jobs SET state = 'ready', due_at = ?1, updated_at = ?1 WHERE tenant_id = ?2 AND state = 'paused'"
            " AND (?3 IS NULL OR endpoint_id IS NULL OR endpoint_id = ?3)", (now, tenant_id, endpoint_id))
        return self._conn.changes()

    def paused_counts(self, tenant_id: str) -> dict[str, int]:
        """Jobs waiting per paused endpoint."""
        return dict(self._conn.execute(
            "SELECT endpoint_id, count(*) FROM jobs WHERE tenant_id = ? AND state = 'paused' GROUP BY endpoint_id",
            (tenant_id,)).fetchall())

    def requeue_interrupted(self, now: str) -> int:
        for job_id, tenant_id in self._conn.execute(
                "SELECT job_id, tenant_id FROM jobs WHERE state = 'running' AND reservations IS NOT NULL").fetchall():
            self.release_reservations(tenant_id, job_id)
        self._conn.execute("UPDATE jobs SET state = 'ready', due_at = ?1, updated_at = ?1 WHERE state = 'running'", (now,))
        return self._conn.changes()

    def reschedule(self, job_id: int, due_at: str, now: str, *, error: str | None = None,
                   keep_attempts: bool = False) -> bool:
        """Back to `ready` at `due_at` (a wait for a window or a cap is not an attempt). Only a job
        still running moves: one cancelled meanwhile stays cancelled."""
        self._conn.execute(
            "UPDATE jobs SET state = 'ready', due_at = ?, updated_at = ?, last_error = ?,"
            " attempts = attempts - ? WHERE job_id = ? AND state = 'running'",
            (due_at, now, error, 1 if keep_attempts else 0, job_id),
        )
        return self._conn.changes() > 0

    def holds(self, job: Job) -> bool:
        """Whether this process still holds the claim it took on `job`: always, on SQLite, where
        one process owns the database and a claim ends only with it."""
        return True

    def fence(self, job: Job) -> None:
        """The unit writing for `job` stands only while this process holds its claim: raises
        ClaimLost (by the unit's end at the latest) when it does not."""
        if not self.holds(job):
            raise ClaimLost

    def finish(self, job_id: int, state: str, now: str, error: str | None = None) -> bool:
        self._conn.execute("UPDATE jobs SET state = ?, updated_at = ?, last_error = ?, reservations = NULL"
                           " WHERE job_id = ? AND state = 'running'", (state, now, error, job_id))
        return self._conn.changes() > 0

    def hold_reservations(self, job_id: int, scopes: list[tuple[str, str]]) -> None:
        """Note the slots an attempt took (the campaign's, then its endpoint's), to give back."""
        found = self._conn.execute("SELECT reservations FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        held = msgspec.json.decode(found[0]) if found and found[0] else []
        self._conn.execute("UPDATE jobs SET reservations = ? WHERE job_id = ?",
                           (msgspec.json.encode([*held, *scopes]), job_id))

    def release_reservations(self, tenant_id: str, job_id: int) -> None:
        """Give back the delivery-limit slots an attempt took but did not use."""
        found = self._conn.execute("SELECT reservations FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        if found and found[0]:
            for scope, period in msgspec.json.decode(found[0]):
                Caps(self._conn).take_from_counter(tenant_id, scope, period)
            self._conn.execute("UPDATE jobs SET reservations = NULL WHERE job_id = ?", (job_id,))

    def due_now(self, submission_id: str, now: str) -> int:
        """A submission's waiting delivery job (queued for a window or a limit, or parked for a
        paused endpoint) tried at once; a paused endpoint parks it again."""
        self._conn.execute("UPDATE jobs SET state = 'ready', due_at = ?1, updated_at = ?1 WHERE submission_id = ?2"
                           " AND kind = 'deliver' AND ((state = 'ready' AND due_at > ?1) OR state = 'paused')",
                           (now, submission_id))
        return self._conn.changes()

    def job_state(self, job_id: int) -> str | None:
        found = self._conn.execute("SELECT state FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return found[0] if found else None

    def next_due(self) -> str | None:
        found = self._conn.execute("SELECT min(due_at) FROM jobs WHERE state = 'ready'").fetchone()
        return found[0] if found else None

    def open_jobs_by_kind_and_state(self) -> list[tuple[str, str, int]]:
        return self._conn.execute("SELECT kind, state, count(*) FROM jobs WHERE state IN ('ready', 'held', 'paused', 'running')"
                                  " GROUP BY kind, state ORDER BY kind, state").fetchall()

    def open_count(self, tenant_id: str) -> int:
        """The tenant's jobs not finished: waiting, held, parked for a paused endpoint or running."""
        return self._conn.execute(
            "SELECT count(*) FROM jobs WHERE tenant_id = ? AND state IN ('ready', 'held', 'paused', 'running')",
            (tenant_id,)).fetchone()[0]

    def lead_has_running_job(self, tenant_id: str, lead_id: str, kind: str | None = None) -> bool:
        """Whether a job of the lead (of `kind`, given one) is running: claimed, its attempt under way."""
        if kind is None:
            return self._conn.execute(
                "SELECT 1 FROM jobs WHERE tenant_id = ? AND lead_id = ? AND state = 'running' LIMIT 1",
                (tenant_id, lead_id)).fetchone() is not None
        return self._conn.execute(
            "SELECT 1 FROM jobs WHERE tenant_id = ? AND lead_id = ? AND kind = ? AND state = 'running' LIMIT 1",
            (tenant_id, lead_id, kind)).fetchone() is not None
