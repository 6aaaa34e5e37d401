"""Buyers: each delivery endpoint's health as the API and the CLI show it, and pausing and
resuming one by hand. Recording a buyer's answer pauses its endpoint when its `healthPolicy`
says so (services/delivery_outcome.py, domain/endpoint_health.py); every pause and resume emits
`endpoint.paused` / `endpoint.resumed` to the tenant's webhooks, in the transaction that made it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

from appliance.clock import iso
from appliance.domain.endpoint import DeliveryEndpoint
from appliance.domain.endpoint_health import EndpointHealth, paused, resumed
from appliance.domain.webhooks import PLUGIN_SUBSCRIBER, lane_of, subscribed
from appliance.errors import NotFound
from appliance.model import Model
from appliance.runtime import Runtime
from appliance.services import audit
from appliance.services.tenant_settings import TenantSettings
from appliance.storage import DELIVERY_ENDPOINTS, NewEvents, Session

log = logging.getLogger("appliance.delivery")


class RecentAnswers(Model):
    delivered: int = 0
    failed: int = 0
    error: int = 0


class EndpointItem(Model):
    delivery_endpoint_id: str
    adapter: str
    host: str | None  # the URL's host only: the rest may carry credentials
    state: str  # active | paused
    paused_reason: str | None
    consecutive_errors: int
    consecutive_failures: int
    last_success_at: str | None
    last_error_at: str | None
    last24h: RecentAnswers
    waiting: int  # delivery jobs parked until the endpoint resumes


class EndpointPage(Model):
    items: list[EndpointItem]
    next_cursor: str | None
    has_more: bool


class PauseBody(Model):
    reason: Annotated[str, Meta(max_length=500)] | None = None


def hour_of(now: datetime) -> str:
    """The hour an answer is counted in (UTC, `YYYY-MM-DDTHH`)."""
    return now.strftime("%Y-%m-%dT%H")


def _host(endpoint: DeliveryEndpoint) -> str | None:
    try:
        return urlsplit(endpoint.url).hostname if endpoint.url else None
    except ValueError:
        return None


def _item(endpoint: DeliveryEndpoint, health: EndpointHealth, answers: tuple[int, int, int] | None,
          waiting: int) -> EndpointItem:
    delivered, failed, error = answers or (0, 0, 0)
    return EndpointItem(
        delivery_endpoint_id=endpoint.delivery_endpoint_id, adapter=endpoint.adapter, host=_host(endpoint),
        state=health.state, paused_reason=health.paused_reason, consecutive_errors=health.consecutive_errors,
        consecutive_failures=health.consecutive_failures, last_success_at=health.last_success_at,
        last_error_at=health.last_error_at, last24h=RecentAnswers(delivered=delivered, failed=failed, error=error),
        waiting=waiting)


def _since(now: datetime) -> str:
    return hour_of(now - timedelta(hours=23))  # this hour and the 23 before it


def item_of(tx: Session, tenant_id: str, endpoint: DeliveryEndpoint, now: datetime) -> EndpointItem:
    eid = endpoint.delivery_endpoint_id
    return _item(endpoint, tx.endpoints.health(tenant_id, eid), tx.endpoints.answers_since(tenant_id, _since(now))
                 .get(eid), tx.jobs.paused_counts(tenant_id).get(eid, 0))


def page(runtime: Runtime, tenant_id: str, after: str | None, limit: int) -> EndpointPage:
    """The tenant's endpoints in id order; `after`: the last id of the previous page."""
    with runtime.store.reader() as tx:
        endpoints = [e for e in tx.catalog.load_docs(DELIVERY_ENDPOINTS, tenant_id)
                     if after is None or e.delivery_endpoint_id > after]
        health = tx.endpoints.all_health(tenant_id)
        answers = tx.endpoints.answers_since(tenant_id, _since(runtime.clock.now()))
        waiting = tx.jobs.paused_counts(tenant_id)
    shown = endpoints[:limit]
    items = [_item(e, health.get(e.delivery_endpoint_id, EndpointHealth()), answers.get(e.delivery_endpoint_id),
                   waiting.get(e.delivery_endpoint_id, 0)) for e in shown]
    more = len(endpoints) > limit
    return EndpointPage(items=items, next_cursor=shown[-1].delivery_endpoint_id if more else None, has_more=more)


def record_endpoint_event(tx: Session, settings: TenantSettings, tenant_id: str, event_type: str,
                          item: EndpointItem, now: str) -> None:
    """Queue `endpoint.paused` / `endpoint.resumed` for the subscribers that want it; its data is
    the endpoint as it was then. (The plugins' `on_lead_event` hook gets lead events only.)"""
    queued = [NewEvents(webhook_id, lane_of(item.delivery_endpoint_id), (event_type,))
              for webhook_id, events in settings.subscribers
              if webhook_id != PLUGIN_SUBSCRIBER and subscribed(events, event_type)]
    if queued:
        tx.webhooks.enqueue_payload(tenant_id, queued, msgspec.json.encode(item), now)


def _stored(tx: Session, tenant_id: str, endpoint_id: str) -> DeliveryEndpoint:
    endpoint = tx.catalog.get_doc(DELIVERY_ENDPOINTS, tenant_id, endpoint_id)
    if endpoint is None:
        raise NotFound()
    return endpoint


def pause_unit(settings: TenantSettings, tenant_id: str, actor: str, endpoint_id: str, reason: str | None,
               now_dt: datetime):
    """The unit of work that pauses an endpoint by hand: (its item, whether it was active)."""
    now = iso(now_dt)

    def unit(tx: Session) -> tuple[EndpointItem, bool]:
        endpoint = _stored(tx, tenant_id, endpoint_id)
        health = tx.endpoints.health(tenant_id, endpoint_id)
        if health.paused:
            return item_of(tx, tenant_id, endpoint, now_dt), False
        tx.endpoints.save_health(tenant_id, endpoint_id, paused(health, reason or "paused by hand", now))
        item = item_of(tx, tenant_id, endpoint, now_dt)
        record_endpoint_event(tx, settings, tenant_id, "endpoint.paused", item, now)
        audit.record(tx, tenant_id, actor, "endpoint.pause", endpoint_id, now, before={"state": health.state},
                     after={"state": item.state, "pausedReason": item.paused_reason})
        return item, True

    return unit


def resume_unit(settings: TenantSettings, tenant_id: str, actor: str, endpoint_id: str, reason: str | None,
                now_dt: datetime):
    """The unit of work that resumes an endpoint: its waiting jobs are due at once. Answers
    (its item, how many jobs it released, whether it was paused)."""
    now = iso(now_dt)

    def unit(tx: Session) -> tuple[EndpointItem, int, bool]:
        endpoint = _stored(tx, tenant_id, endpoint_id)
        health = tx.endpoints.health(tenant_id, endpoint_id)
        released = tx.jobs.release_paused(tenant_id, endpoint_id, now)
        if not health.paused:
            return item_of(tx, tenant_id, endpoint, now_dt), released, False
        tx.endpoints.save_health(tenant_id, endpoint_id, resumed(health))
        item = item_of(tx, tenant_id, endpoint, now_dt)
        record_endpoint_event(tx, settings, tenant_id, "endpoint.resumed", item, now)
        audit.record(tx, tenant_id, actor, "endpoint.resume", endpoint_id, now,
                     before={"state": health.state, "pausedReason": health.paused_reason},
                     after={"state": item.state, "reason": reason, "released": released})
        return item, released, True

    return unit


@dataclass(frozen=True)
class Paused:
    item: EndpointItem
    changed: bool  # it was active


@dataclass(frozen=True)
class Resumed:
    item: EndpointItem
    released: int  # waiting deliveries made due
    changed: bool  # it was paused


def _paused(endpoint_id: str, found: tuple[EndpointItem, bool]) -> Paused:
    """What a pause unit did, logged once it is committed."""
    done = Paused(*found)
    if done.changed:
        log.warning("delivery endpoint %s paused by hand: %r", endpoint_id, done.item.paused_reason)
    return done


def _resumed(endpoint_id: str, reason: str | None, found: tuple[EndpointItem, int, bool]) -> Resumed:
    done = Resumed(*found)
    if done.changed:
        log.warning("delivery endpoint %s resumed (%r); %d waiting deliveries released", endpoint_id,
                    reason or "by hand", done.released)
    return done


async def pause(runtime: Runtime, settings: TenantSettings, tenant_id: str, actor: str, endpoint_id: str,
                reason: str | None) -> Paused:
    return _paused(endpoint_id, await runtime.store.write(
        pause_unit(settings, tenant_id, actor, endpoint_id, reason, runtime.clock.now()), may_refuse=True))


async def resume(runtime: Runtime, settings: TenantSettings, tenant_id: str, actor: str, endpoint_id: str,
                 reason: str | None) -> Resumed:
    return _resumed(endpoint_id, reason, await runtime.store.write(
        resume_unit(settings, tenant_id, actor, endpoint_id, reason, runtime.clock.now()), may_refuse=True))


def pause_now(runtime: Runtime, settings: TenantSettings, tenant_id: str, endpoint_id: str,
              reason: str | None) -> Paused:
    """`pause` for the CLI (no event loop; the actor is `cli`)."""
    return _paused(endpoint_id, runtime.store.write_sync(
        pause_unit(settings, tenant_id, audit.CLI, endpoint_id, reason, runtime.clock.now()), may_refuse=True))


def resume_now(runtime: Runtime, settings: TenantSettings, tenant_id: str, endpoint_id: str,
               reason: str | None) -> Resumed:
    """`resume` for the CLI (no event loop; the actor is `cli`)."""
    return _resumed(endpoint_id, reason, runtime.store.write_sync(
        resume_unit(settings, tenant_id, audit.CLI, endpoint_id, reason, runtime.clock.now()), may_refuse=True))
