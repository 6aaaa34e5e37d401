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
from appliance.domain.webhooks import PLUGIN_SUBSCRIBER, Webhook, event_body, retry_delay, signature
from appliance.runtime import Runtime
from appliance.services.bundle import webhook_secret_ref
from appliance.services.lead_events import lead_summary
from appliance.storage import WEBHOOKS, OutboxEvent

log = logging.getLogger("appliance.webhooks")

LANE_BATCH = 64  # outbox rows of one lane read at once; only a lane's head can be waiting for a retry


@dataclass(frozen=True)
class OpenedWebhook:
    webhook: Webhook
    secret: str | None  # None: the store has no secret for it (events wait until one is set)


class WebhookSender:
    def __init__(self, runtime: Runtime, registry, *, poll_seconds: float = 0.25) -> None:
        self.runtime = runtime
        self.registry = registry
        self.concurrency = runtime.config.webhooks.concurrency
        self.timeout = runtime.config.webhooks.timeout_seconds
        self.poll_seconds = poll_seconds
        self._wake = asyncio.Event()
        self._subscriptions: dict[tuple[str, str], tuple[int, OpenedWebhook | None]] = {}

    def wake(self) -> None:
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        client = WebhookClient()
        in_flight: dict[tuple[str, str, int], asyncio.Task] = {}
        try:
            while not stop.is_set():
                self._wake.clear()
                try:
                    heads = self.runtime.store.reader().webhooks.lane_heads()
                except Exception as exc:  # the loop must survive a storage hiccup
                    log.error("reading the webhook outbox failed: %s", type(exc).__name__)
                    heads = []
                now = iso(self.runtime.clock.now())
                for head in heads:
                    lane = (head.tenant_id, head.webhook_id, head.lane)
                    if lane in in_flight or head.next_attempt_at > now or len(in_flight) >= self.concurrency:
                        continue
                    opened = None
                    if head.webhook_id != PLUGIN_SUBSCRIBER:
                        opened = self._subscription(head.tenant_id, head.webhook_id)
                        if opened is not None and (not opened.webhook.active or opened.secret is None):
                            continue  # waits, in order, until the subscription is active again
                    task = asyncio.create_task(self._drain_lane(head, opened, client, stop))
                    in_flight[lane] = task
                    task.add_done_callback(lambda _t, lane=lane: (in_flight.pop(lane, None), self.wake()))
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=self.poll_seconds)
                except asyncio.TimeoutError:
                    pass
            if in_flight:
                await asyncio.wait(in_flight.values(), timeout=self.timeout)
            for task in in_flight.values():
                task.cancel()  # still queued: sent again after the restart
        finally:
            await client.aclose()

    def _subscription(self, tenant_id: str, webhook_id: str) -> OpenedWebhook | None:
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

    async def _drain_lane(self, head: OutboxEvent, opened: OpenedWebhook | None, client: WebhookClient,
                          stop: asyncio.Event) -> None:
        """Send a lane's events oldest first, until one is not taken (it waits for its retry, and
        the lane with it), the lane is empty, or the sender stops."""
        batch = [head]
        while batch and not stop.is_set():
            for event in batch:
                data = self._data(event)
                while True:  # the row's events, in order
                    if not await self._send(event, data, opened, client) or stop.is_set():
                        return
                    if event.last:
                        break
                    event = replace(event, sent=event.sent + 1, attempts=0)
            batch = self.runtime.store.reader().webhooks.lane_after(batch[-1], LANE_BATCH)
            if batch and head.webhook_id != PLUGIN_SUBSCRIBER:  # changed meanwhile (url, secret, active)?
                opened = self._subscription(head.tenant_id, head.webhook_id)
                if opened is not None and not opened.webhook.active:
                    return

    def _data(self, event: OutboxEvent) -> bytes | None:
        """The events' `data`: the lead as it is now, with the status and submission they are
        about; None when the lead is gone."""
        tx = self.runtime.store.reader()
        with tx:
            lead = tx.leads.get_lead(event.tenant_id, event.lead_id) if event.lead_id else None
            submission = tx.leads.get_submission(event.tenant_id, event.submission_id) if event.submission_id else None
        return lead_summary(lead, submission, event.status) if lead is not None else None

    async def _send(self, event: OutboxEvent, data: bytes | None, opened: OpenedWebhook | None,
                    client: WebhookClient) -> bool:
        """One event; True when it left the outbox (delivered, or given up)."""
        try:
            if data is None:
                return await self._record(event, SendResult(None, "the lead no longer exists"), final=True)
            if event.webhook_id == PLUGIN_SUBSCRIBER:
                self.registry.call_lead_event(event.tenant_id, msgspec.json.decode(
                    event_body(event.type, event.created_at, data)))
                return await self._record(event, SendResult(None, None))
            if opened is None or opened.secret is None:
                return await self._record(event, SendResult(None, "the subscription was deleted"), final=True)
            body = event_body(event.type, event.created_at, data)
            sent_at = int(time.time())  # the receiver checks it against its own wall clock (replays)
            headers = [("webhook-id", event.event_id), ("webhook-timestamp", str(sent_at)),
                       ("webhook-signature", signature(opened.secret, event.event_id, sent_at, body))]
            result = await client.post(opened.webhook.url, headers, body, timeout=self.timeout,
                                       allow_private=self.runtime.config.delivery.allow_private_addresses)
            return await self._record(event, result)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one event's trouble must not stop the sender
            log.error("sending event %s to %s failed: %s", event.event_id, event.webhook_id, type(exc).__name__)
            return False

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

        def unit(tx) -> None:
            if tx.webhooks.is_next(event):
                tx.webhooks.sent_one(event, attempt=attempt, status_code=result.status_code, error=result.error,
                                 state=state, next_attempt_at=next_at, now=iso(now_dt))

        await self.runtime.store.write(unit)
        if state == "failed":
            log.error("event %s (%s) to webhook %s given up after %d attempts: %s", event.event_id, event.type,
                      event.webhook_id, attempt, result.error)
        elif state == "retrying":
            log.warning("event %s (%s) to webhook %s not taken (attempt %d), retried at %s: %s", event.event_id,
                        event.type, event.webhook_id, attempt, next_at, result.error)
        return state != "retrying"
