"""The webhook sender: sends the outbox's events, the head of each lane at a time (see
appliance/domain/webhooks), signed as Standard Webhooks asks, and records every attempt.

An event leaves the outbox only in the transaction that records its answer, so a crash between
the commit that queued it and its send, or during the send, leaves it queued: it is sent after the
restart, under the same `webhook-id` (at least once; receivers drop repeats by that id). The
plugins' `on_lead_event` hook is a subscriber like the others, called here after the commit."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from datetime import timedelta

import msgspec

from appliance.adapters.webhook_client import SendResult, WebhookClient
from appliance.clock import iso
from appliance.domain.secret_refs import webhook_secret_ref
from appliance.domain.webhooks import PLUGIN_SUBSCRIBER, Webhook, event_body, retry_delay, signature
from appliance.runtime import Runtime
from appliance.services.lead_events import lead_summary
from appliance.jobs.outage import Outage
from appliance.storage import locks
from appliance.storage import WEBHOOKS, OutboxEvent, StorageUnavailable

log = logging.getLogger("appliance.webhooks")

LANE_TURN = 64  # events a lane sends in one turn before the other lanes' heads are looked at again
TROUBLE_PAUSE_SECONDS = 5.0  # a lane whose turn broke on an unexpected error rests this long


@dataclass(frozen=True)
class OpenedWebhook:
    webhook: Webhook
    secret: str | None  # None: the store has no secret for it (events wait until one is set)


class WebhookSender:
    """`[webhooks] concurrency` lanes in flight at once, at most half of them (at least one) of
    any one subscription, taken in turns: a busy or slow receiver cannot hold up the others.
    With concurrency 0 only the plugins' hook is served (its events are never left unread)."""

    def __init__(self, runtime: Runtime, registry, *, poll_seconds: float = 0.25) -> None:
        self.runtime = runtime
        self.registry = registry
        self.concurrency = runtime.config.webhooks.concurrency
        self.timeout = runtime.config.webhooks.timeout_seconds
        self.poll_seconds = poll_seconds
        self._wake = asyncio.Event()
        self._subscriptions: dict[tuple[str, str], tuple[int, OpenedWebhook | None]] = {}
        self._resting: dict[tuple[str, str, int], float] = {}  # lane -> monotonic time it may go again
        self._turn = 0

    def wake(self) -> None:
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        client = WebhookClient()
        in_flight: dict[tuple[str, str, int], asyncio.Task] = {}
        outage = Outage(log, "webhooks")
        try:
            while not stop.is_set():
                self._wake.clear()
                wait = self.poll_seconds
                try:
                    # One sender per database, as for the timed work: on PostgreSQL several
                    # processes read the same outbox, and each would send every event.
                    if await self.runtime.store.runs_timed_work():
                        self._start_lanes(in_flight, client, stop)
                    outage.succeeded()
                except StorageUnavailable as exc:
                    wait = outage.failed(exc)
                except Exception as exc:  # the loop must survive a storage hiccup
                    log.error("reading the webhook outbox failed: %s", type(exc).__name__)
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=wait)
                except asyncio.TimeoutError:
                    pass
            if in_flight:
                await asyncio.wait(in_flight.values(), timeout=self.timeout)
            for task in in_flight.values():
                task.cancel()  # still queued: sent again after the restart
        finally:
            await client.aclose()

    def _start_lanes(self, in_flight: dict, client: WebhookClient, stop: asyncio.Event) -> None:
        heads = self.runtime.store.reader().webhooks.lane_heads()
        if heads:  # start the walk somewhere else each time: no subscription always comes first
            self._turn = (self._turn + 1) % len(heads)
            heads = heads[self._turn:] + heads[:self._turn]
        now, clock = iso(self.runtime.clock.now()), time.monotonic()
        per_subscription: dict[tuple[str, str], int] = {}
        for lane in in_flight:
            per_subscription[lane[:2]] = per_subscription.get(lane[:2], 0) + 1
        for head in heads:
            lane, subscriber = (head.tenant_id, head.webhook_id, head.lane), (head.tenant_id, head.webhook_id)
            plugins = head.webhook_id == PLUGIN_SUBSCRIBER
            limit = max(1, self.concurrency)
            due = head.next_attempt_at is None or head.next_attempt_at <= now
            if lane in in_flight or not due or self._resting.get(lane, 0.0) > clock:
                continue
            if len(in_flight) >= limit or per_subscription.get(subscriber, 0) >= max(1, limit // 2):
                continue
            if not plugins and (self.concurrency == 0 or not self._sendable(head)):
                continue  # an inactive subscription's events wait, in order, until it is active again
            self._resting.pop(lane, None)
            task = asyncio.create_task(self._take_turn(head, client, stop))
            in_flight[lane] = task
            per_subscription[subscriber] = per_subscription.get(subscriber, 0) + 1
            task.add_done_callback(lambda done, lane=lane: self._turn_over(in_flight, lane, done))

    def _turn_over(self, in_flight: dict, lane: tuple[str, str, int], done: asyncio.Task) -> None:
        in_flight.pop(lane, None)
        if not done.cancelled() and done.exception() is not None:
            log.error("webhook lane %s/%s/%d stopped on %s; it rests %g s", *lane,
                      type(done.exception()).__name__, TROUBLE_PAUSE_SECONDS)
            self._resting[lane] = time.monotonic() + TROUBLE_PAUSE_SECONDS
        self.wake()

    def _sendable(self, head: OutboxEvent) -> bool:
        opened = self._subscription(head.tenant_id, head.webhook_id)
        return opened is None or (opened.webhook.active and opened.secret is not None)

    def _subscription(self, tenant_id: str, webhook_id: str) -> OpenedWebhook | None:
        """The subscription as it is now (cached per config revision); None once deleted."""
        tx = self.runtime.store.reader()
        rev = tx.tenants.config_rev(tenant_id)
        cached = self._subscriptions.get((tenant_id, webhook_id))
        if cached is not None and cached[0] == rev:
            return cached[1]
        webhook = tx.catalog.get_doc(WEBHOOKS, tenant_id, webhook_id)
        opened = None
        if webhook is not None:
            ref = webhook_secret_ref(webhook_id)
            blob = tx.secrets.get(tenant_id, ref)
            secret = self.runtime.box.open_bytes(blob, f"{tenant_id}/{ref}") if blob is not None else None
            opened = OpenedWebhook(webhook, secret)
        if len(self._subscriptions) > 1024:
            self._subscriptions.clear()
        self._subscriptions[(tenant_id, webhook_id)] = (rev, opened)
        return opened

    async def _take_turn(self, head: OutboxEvent, client: WebhookClient, stop: asyncio.Event) -> None:
        """Send up to LANE_TURN of a lane's events, oldest first. The turn ends early when one is
        not taken (it waits for its retry, and the lane with it), when the subscription changed
        so that it must not be sent to (inactive, no secret), or when the sender stops."""
        sent, rows = 0, [head]
        while rows and sent < LANE_TURN and not stop.is_set():
            for row in rows:
                event, data = row, self._data(row)
                while True:  # the row's events, in order
                    if not await self._send(event, data, client):
                        return
                    sent += 1
                    if event.last or stop.is_set():
                        break
                    event = replace(event, sent=event.sent + 1, attempts=0)
                if stop.is_set():
                    return
            rows = self.runtime.store.reader().webhooks.lane_after(rows[-1], LANE_TURN - sent)

    def _data(self, event: OutboxEvent) -> bytes | None:
        """The events' `data`: the lead as it is now, with the status and submission they are
        about; None when the lead is gone. An endpoint event carries its own."""
        if event.payload is not None:
            return event.payload
        tx = self.runtime.store.reader()
        with tx:
            lead = tx.leads.get_lead(event.tenant_id, event.lead_id) if event.lead_id else None
            submission = tx.leads.get_submission(event.tenant_id, event.submission_id) if event.submission_id else None
        return lead_summary(lead, submission, event.status) if lead is not None else None

    async def _send(self, event: OutboxEvent, data: bytes | None, client: WebhookClient) -> bool:
        """One event; True when it left the outbox (delivered, or given up) and the lane goes on."""
        if data is None:
            return await self._record(event, SendResult(None, "the lead no longer exists"), final=True)
        if event.webhook_id == PLUGIN_SUBSCRIBER:
            self.registry.call_lead_event(event.tenant_id, msgspec.json.decode(
                event_body(event.type, event.created_at, data)))
            return await self._record(event, SendResult(None, None))
        opened = self._subscription(event.tenant_id, event.webhook_id)  # a PATCH or DELETE counts at once
        if opened is None:
            return await self._record(event, SendResult(None, "the subscription was deleted"), final=True)
        if not opened.webhook.active or opened.secret is None:
            return False
        body = event_body(event.type, event.created_at, data)
        sent_at = int(time.time())  # the receiver checks it against its own wall clock (replays)
        headers = [("webhook-id", event.event_id), ("webhook-timestamp", str(sent_at)),
                   ("webhook-signature", signature(opened.secret, event.event_id, sent_at, body))]
        result = await client.post(opened.webhook.url, headers, body, timeout=self.timeout,
                                   allow_private=self.runtime.config.delivery.allow_private_addresses)
        return await self._record(event, result)

    async def _record(self, event: OutboxEvent, result: SendResult, *, final: bool = False) -> bool:
        now_dt = self.runtime.clock.now()
        attempt = event.attempts + 1
        delay = None if final or result.error is None else retry_delay(attempt)
        if result.error is None:
            state, next_at = "delivered", None
        elif delay is None:
            state, next_at = "failed", None
        else:
            state, next_at = "retrying", iso(now_dt + timedelta(seconds=delay))

        def unit(tx) -> bool:
            if not tx.webhooks.is_next(event):
                return False  # recorded already, or its subscription's events were dropped
            tx.webhooks.sent_one(event, attempt=attempt, status_code=result.status_code, error=result.error,
                                 state=state, next_attempt_at=next_at, now=iso(now_dt))
            return True

        # Scoped by the event's lane: one unit an event sent must not stop every process's writes.
        if not await self.runtime.store.write(unit, locks=[locks.webhook_lane(event.tenant_id, event.webhook_id,
                                                                                  event.lane)]):
            return False
        if state == "failed":
            log.error("event %s (%s) to webhook %s given up after %d attempts: %s", event.event_id, event.type,
                      event.webhook_id, attempt, result.error)
        elif state == "retrying":
            log.warning("event %s (%s) to webhook %s not taken (attempt %d), retried at %s: %s", event.event_id,
                        event.type, event.webhook_id, attempt, next_at, result.error)
        return state != "retrying"
