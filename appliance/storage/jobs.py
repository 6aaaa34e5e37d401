"""The durable job queue: deliver and evaluate jobs claimed by the worker. State survives
restarts; a job found `running` at start was interrupted and runs again (at-least-once)."""

from __future__ import annotations

from typing import NamedTuple

import apsw
import msgspec

from appliance.storage.leads import take_from_counter


class Job(NamedTuple):
    job_id: int
    tenant_id: str
    kind: str
    lead_id: str
    submission_id: str
    attempts: int  # including the one just claimed


def claim_due(conn: apsw.Connection, now: str, limit: int) -> list[Job]:
    return [Job(*row) for row in conn.execute(
        "UPDATE jobs SET state = 'running', attempts = attempts + 1, updated_at = ?1"
        " WHERE job_id IN (SELECT job_id FROM jobs WHERE state = 'ready' AND due_at <= ?1"
        "                  ORDER BY due_at, job_id LIMIT ?2)"
        " RETURNING job_id, tenant_id, kind, lead_id, submission_id, attempts",
        (now, limit),
    )]


def requeue_interrupted(conn: apsw.Connection, now: str) -> int:
    for job_id, tenant_id in conn.execute(
            "SELECT job_id, tenant_id FROM jobs WHERE state = 'running' AND reservations IS NOT NULL").fetchall():
        release_reservations(conn, tenant_id, job_id)
    conn.execute("UPDATE jobs SET state = 'ready', due_at = ?1, updated_at = ?1 WHERE state = 'running'", (now,))
    return conn.changes()


def reschedule(conn: apsw.Connection, job_id: int, due_at: str, now: str, *, error: str | None = None,
               keep_attempts: bool = False) -> bool:
    """Back to `ready` at `due_at` (a wait for a window or a cap is not an attempt). Only a job
    still running moves: one cancelled meanwhile stays cancelled."""
    conn.execute(
        "UPDATE jobs SET state = 'ready', due_at = ?, updated_at = ?, last_error = ?,"
        " attempts = attempts - ? WHERE job_id = ? AND state = 'running'",
        (due_at, now, error, 1 if keep_attempts else 0, job_id),
    )
    return conn.changes() > 0


def finish(conn: apsw.Connection, job_id: int, state: str, now: str, error: str | None = None) -> bool:
    conn.execute("UPDATE jobs SET state = ?, updated_at = ?, last_error = ?, reservations = NULL"
                 " WHERE job_id = ? AND state = 'running'", (state, now, error, job_id))
    return conn.changes() > 0


def hold_reservations(conn: apsw.Connection, job_id: int, scopes: list[tuple[str, str]]) -> None:
    conn.execute("UPDATE jobs SET reservations = ? WHERE job_id = ?", (msgspec.json.encode(scopes), job_id))


def release_reservations(conn: apsw.Connection, tenant_id: str, job_id: int) -> None:
    """Give back the delivery-limit slots an attempt took but did not use."""
    found = conn.execute("SELECT reservations FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
    if found and found[0]:
        for scope, period in msgspec.json.decode(found[0]):
            take_from_counter(conn, tenant_id, scope, period)
        conn.execute("UPDATE jobs SET reservations = NULL WHERE job_id = ?", (job_id,))


def job_state(conn: apsw.Connection, job_id: int) -> str | None:
    found = conn.execute("SELECT state FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
    return found[0] if found else None


def next_due(conn: apsw.Connection) -> str | None:
    found = conn.execute("SELECT min(due_at) FROM jobs WHERE state = 'ready'").fetchone()
    return found[0] if found else None


def open_jobs_by_kind_and_state(conn: apsw.Connection) -> list[tuple[str, str, int]]:
    return conn.execute("SELECT kind, state, count(*) FROM jobs WHERE state IN ('ready', 'held', 'running')"
                        " GROUP BY kind, state ORDER BY kind, state").fetchall()


def lead_has_running_job(conn: apsw.Connection, tenant_id: str, lead_id: str) -> bool:
    return conn.execute(
        "SELECT 1 FROM jobs WHERE tenant_id = ? AND lead_id = ? AND state = 'running' LIMIT 1", (tenant_id, lead_id)
    ).fetchone() is not None
