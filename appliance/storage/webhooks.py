"""The event outbox and its attempts log (subscriptions themselves are catalog documents).

An outbox row holds the events one change caused for one subscriber, in order; `sent` of them
are delivered. The event at `sent` is the row's next one."""

from __future__ import annotations

from dataclasses import dataclass

import apsw

from appliance.ids import new_id


@dataclass(frozen=True)
class OutboxEvent:
    """The next event of an outbox row, as the sender sends it."""
    seq: int
    tenant_id: str
    webhook_id: str
    lane: int
    row_event_id: str
    types: tuple[str, ...]
    sent: int
    lead_id: str | None
    submission_id: str | None
    status: str | None
    created_at: str
    attempts: int
    next_attempt_at: str | None  # None: never tried, due at once
    payload: bytes | None = None  # an endpoint event's data, as it was (a lead event has none)

    @property
    def type(self) -> str:
        return self.types[self.sent]

    @property
    def event_id(self) -> str:
        """Stable per event and subscriber: the same on every retry (`webhook-id`)."""
        return self.row_event_id if self.sent == 0 else f"{self.row_event_id}-{self.sent}"

    @property
    def last(self) -> bool:
        return self.sent + 1 >= len(self.types)


@dataclass(frozen=True)
class NewEvents:
    """What one change queues for one subscriber."""
    webhook_id: str
    lane: int
    types: tuple[str, ...]


_COLUMNS = ("seq, tenant_id, webhook_id, lane, event_id, types, sent, lead_id, submission_id, status, created_at,"
            " attempts, next_attempt_at, payload")


_EVENTS_LEFT = "length(types) - length(replace(types, ',', '')) + 1 - sent"  # of a row


def _event(row: tuple) -> OutboxEvent:
    seq, tenant_id, webhook_id, lane, event_id, types, *rest = row
    return OutboxEvent(seq, tenant_id, webhook_id, lane, event_id, tuple(types.split(",")), *rest)


class Webhooks:
    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def enqueue(self, tenant_id: str, lead_id: str, submission_id: str | None, status: str, queued: list[NewEvents],
                now: str) -> None:
        for q in queued:  # nearly always one subscriber: execute, not executemany
            self._conn.execute(
                "INSERT INTO webhook_outbox(tenant_id, webhook_id, lane, event_id, types, lead_id, submission_id, status,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (tenant_id, q.webhook_id, q.lane, new_id("evt"), ",".join(q.types), lead_id, submission_id, status, now))

    def enqueue_payload(self, tenant_id: str, queued: list[NewEvents], payload: bytes, now: str) -> None:
        """Events about something other than a lead (an endpoint paused): their data is kept as it
        was when they happened."""
        for q in queued:
            self._conn.execute(
                "INSERT INTO webhook_outbox(tenant_id, webhook_id, lane, event_id, types, payload, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (tenant_id, q.webhook_id, q.lane, new_id("evt"), ",".join(q.types), payload, now))

    def lane_heads(self, limit: int = 10_000) -> list[OutboxEvent]:
        """The oldest row of every lane that has one: the index is walked from lane to lane, one
        probe each, whatever the number of rows waiting."""
        heads: list[OutboxEvent] = []
        key: tuple = ("", "", -1)
        while len(heads) < limit:
            row = self._conn.execute(
                f"SELECT {_COLUMNS} FROM webhook_outbox INDEXED BY webhook_outbox_lanes"
                " WHERE (tenant_id, webhook_id, lane) > (?, ?, ?) ORDER BY tenant_id, webhook_id, lane, seq LIMIT 1",
                key).fetchone()
            if row is None:
                break
            head = _event(row)
            heads.append(head)
            key = (head.tenant_id, head.webhook_id, head.lane)
        return heads

    def lane_after(self, event: OutboxEvent, limit: int) -> list[OutboxEvent]:
        """The rows queued behind `event`'s in its lane, oldest first."""
        rows = self._conn.execute(
            f"SELECT {_COLUMNS} FROM webhook_outbox INDEXED BY webhook_outbox_lanes"
            " WHERE tenant_id = ? AND webhook_id = ? AND lane = ? AND seq > ? ORDER BY seq LIMIT ?",
            (event.tenant_id, event.webhook_id, event.lane, event.seq, limit))
        return [_event(row) for row in rows]

    def is_next(self, event: OutboxEvent) -> bool:
        """Whether `event` is still its row's next one (not already recorded by an earlier run)."""
        return self._conn.execute("SELECT 1 FROM webhook_outbox WHERE seq = ? AND sent = ? AND event_id = ?",
                                  (event.seq, event.sent, event.row_event_id)).fetchone() is not None

    def sent_one(self, event: OutboxEvent, *, attempt: int, status_code: int | None, error: str | None, state: str,
                 next_attempt_at: str | None, now: str) -> None:
        """Record an attempt: `retrying` keeps the event next in its row until `next_attempt_at`;
        `delivered` and `failed` move the row on to its next event, or remove it after its last."""
        if state == "retrying":
            self._conn.execute("UPDATE webhook_outbox SET attempts = ?, next_attempt_at = ? WHERE seq = ?",
                               (attempt, next_attempt_at, event.seq))
        elif event.last:
            self._conn.execute("DELETE FROM webhook_outbox WHERE seq = ?", (event.seq,))
        else:
            self._conn.execute("UPDATE webhook_outbox SET sent = sent + 1, attempts = 0 WHERE seq = ?", (event.seq,))
        if event.webhook_id.startswith("~"):
            return  # the plugins' hook: nothing to show through the API
        self._conn.execute(
            "INSERT INTO webhook_attempts(attempt_id, tenant_id, webhook_id, event_id, type, attempt, status_code,"
            " error, state, next_attempt_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (new_id("wha"), event.tenant_id, event.webhook_id, event.event_id, event.type, attempt, status_code,
             error, state, next_attempt_at, now))

    def backlog(self) -> tuple[int, int]:
        """Events not yet delivered: (queued for a first try, waiting for a retry)."""
        found = self._conn.execute(
            f"SELECT coalesce(sum(CASE WHEN attempts = 0 THEN {_EVENTS_LEFT} END), 0),"
            f" coalesce(sum(CASE WHEN attempts > 0 THEN {_EVENTS_LEFT} END), 0) FROM webhook_outbox").fetchone()
        return found[0], found[1]

    def drop_events(self, tenant_id: str, webhook_id: str) -> int:
        """Every event still queued for the subscriber; how many."""
        found = self._conn.execute(
            f"SELECT coalesce(sum({_EVENTS_LEFT}), 0) FROM webhook_outbox"
            " WHERE tenant_id = ? AND webhook_id = ?", (tenant_id, webhook_id)).fetchone()[0]
        self._conn.execute("DELETE FROM webhook_outbox WHERE tenant_id = ? AND webhook_id = ?", (tenant_id, webhook_id))
        return found

    def attempts_page(self, tenant_id: str, webhook_id: str, before: str | None, limit: int) -> list[tuple]:
        """(attemptId, eventId, type, attempt, statusCode, error, createdAt, nextAttemptAt, state),
        newest first; `before`: an attemptId cursor."""
        return self._conn.execute(
            "SELECT attempt_id, event_id, type, attempt, status_code, error, created_at, next_attempt_at, state"
            " FROM webhook_attempts WHERE tenant_id = ? AND webhook_id = ? AND attempt_id < ?"
            " ORDER BY attempt_id DESC LIMIT ?", (tenant_id, webhook_id, before or "~", limit)).fetchall()

    def purge_attempts(self, before: str) -> int:
        self._conn.execute("DELETE FROM webhook_attempts WHERE created_at < ?", (before,))
        return self._conn.changes()
