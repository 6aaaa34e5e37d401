"""Webhook subscriptions: create, list, change and delete them, and read their attempts.

A subscription is tenant configuration (changing one moves the tenant's config revision, so the
status paths see it at once); its secret is sealed in the secret store, shown once when the
appliance makes it, and never shown again."""

from __future__ import annotations

import secrets
from typing import Annotated

import msgspec
from msgspec import UNSET, Meta, UnsetType

from appliance.adapters import netguard
from appliance.clock import iso
from appliance.domain.secret_refs import webhook_secret_ref
from appliance.domain.webhooks import (
    ALL_EVENTS, MIN_SECRET_BYTES, Webhook, check_event_names, check_secret, check_webhook_url, new_secret,
)
from appliance.errors import NotFound, ValidationFailed
from appliance.ids import new_id
from appliance.model import Model, invalid
from appliance.runtime import Runtime
from appliance.services import audit
from appliance.storage import WEBHOOKS, Session

Description = Annotated[str, Meta(max_length=500)]


class WebhookCreate(Model):
    url: str
    events: list[str] = msgspec.field(default_factory=lambda: [ALL_EVENTS])
    webhook_id: str | None = None
    secret: str | None = None
    active: bool = True
    description: Description | None = None

    def __post_init__(self) -> None:
        check_webhook_url("url", self.url)
        check_event_names("events", self.events)
        if self.secret is not None:
            check_secret("secret", self.secret)
        if self.webhook_id is not None:
            try:
                Webhook(webhook_id=self.webhook_id, url=self.url)
            except ValueError:
                invalid("webhookId", "1 to 100 letters, digits, '_', '.', ':' or '-'")


class WebhookChange(Model):
    url: str | UnsetType = UNSET
    events: list[str] | UnsetType = UNSET
    active: bool | UnsetType = UNSET
    description: Description | None | UnsetType = UNSET
    secret: str | UnsetType = UNSET  # a new secret of your own; the old one stops signing at once

    def __post_init__(self) -> None:
        if self.url is not UNSET:
            check_webhook_url("url", self.url)
        if self.events is not UNSET:
            check_event_names("events", self.events)
        if self.secret is not UNSET:
            check_secret("secret", self.secret)


class CreatedWebhook(Webhook):
    secret: str = ""  # shown this once


class WebhookPage(Model):
    items: list[Webhook]
    next_cursor: str | None
    has_more: bool


class DeletedWebhook(Model):
    webhook_id: str
    deleted: bool
    dropped_events: int


class WebhookAttempt(Model):
    attempt_id: str
    event_id: str
    type: str
    attempt: int
    status_code: int | None
    error: str | None
    created_at: str
    next_attempt_at: str | None
    state: str


class AttemptPage(Model):
    items: list[WebhookAttempt]
    next_cursor: str | None
    has_more: bool


def url_problem(url: str, allow_private: bool, field: str = "url") -> str | None:
    """Receivers get lead data: https only, and no private address, unless the install allows
    private addresses ([delivery] allow_private_addresses, as for delivery endpoints)."""
    if not allow_private and not url.lower().startswith("https://"):
        return f"{field}: must be an https URL (http only with [delivery] allow_private_addresses)"
    reason = netguard.refused_without_dns(url, allow_private)
    return f"{field}: {reason}" if reason else None


def _audited(webhook: Webhook, secret_set: bool) -> dict:
    """The subscription as the audit log keeps it: a secret this change set shows as masked."""
    shown = msgspec.to_builtins(webhook)
    return {**shown, "secret": audit.MASK} if secret_set else shown


def _announce(runtime: Runtime) -> None:
    runtime.store.announce_admin_change()


async def create(runtime: Runtime, tenant_id: str, actor: str, body: WebhookCreate) -> CreatedWebhook:
    problem = url_problem(body.url, runtime.config.delivery.allow_private_addresses)
    if problem:
        raise ValidationFailed([problem])
    webhook_id = body.webhook_id or new_id("wh")
    secret = body.secret or new_secret(secrets.token_bytes(MIN_SECRET_BYTES))
    ref = webhook_secret_ref(webhook_id)
    sealed = runtime.box.seal_bytes(secret, f"{tenant_id}/{ref}")
    now = iso(runtime.clock.now())
    webhook = Webhook(webhook_id=webhook_id, url=body.url, events=list(dict.fromkeys(body.events)),
                      active=body.active, description=body.description, created_at=now, updated_at=now)

    def unit(tx: Session) -> None:
        if tx.catalog.get_doc(WEBHOOKS, tenant_id, webhook_id) is not None:
            raise ValidationFailed(["webhookId: already in use by another subscription"])
        tx.secrets.put(tenant_id, ref, sealed, now)
        tx.catalog.upsert_doc(WEBHOOKS, tenant_id, webhook_id, webhook, None)
        tx.tenants.bump_config_rev(tenant_id)
        audit.record(tx, tenant_id, actor, "webhook.create", webhook_id, now, after=_audited(webhook, True))

    await runtime.store.write(unit, may_refuse=True)
    _announce(runtime)
    return CreatedWebhook(**msgspec.structs.asdict(webhook), secret=secret)


def page(runtime: Runtime, tenant_id: str, after: str | None, limit: int) -> WebhookPage:
    found = [w for w in runtime.store.reader().catalog.load_docs(WEBHOOKS, tenant_id)
             if after is None or w.webhook_id > after]
    items = found[:limit]
    more = len(found) > limit
    return WebhookPage(items=items, next_cursor=items[-1].webhook_id if more else None, has_more=more)


def get(runtime: Runtime, tenant_id: str, webhook_id: str) -> Webhook:
    found = runtime.store.reader().catalog.get_doc(WEBHOOKS, tenant_id, webhook_id)
    if found is None:
        raise NotFound()
    return found


async def change(runtime: Runtime, tenant_id: str, actor: str, webhook_id: str, body: WebhookChange) -> Webhook:
    if body.url is not UNSET:
        problem = url_problem(body.url, runtime.config.delivery.allow_private_addresses)
        if problem:
            raise ValidationFailed([problem])
    ref = webhook_secret_ref(webhook_id)
    sealed = runtime.box.seal_bytes(body.secret, f"{tenant_id}/{ref}") if body.secret is not UNSET else None
    now = iso(runtime.clock.now())
    given = {name: value for name, value in msgspec.structs.asdict(body).items()
             if value is not UNSET and name != "secret"}
    if "events" in given:
        given["events"] = list(dict.fromkeys(given["events"]))

    def unit(tx: Session) -> Webhook:
        stored = tx.catalog.get_doc(WEBHOOKS, tenant_id, webhook_id)
        if stored is None:
            raise NotFound()
        changed = msgspec.structs.replace(stored, **given, updated_at=now)
        if sealed is not None:
            tx.secrets.put(tenant_id, ref, sealed, now)
        tx.catalog.upsert_doc(WEBHOOKS, tenant_id, webhook_id, changed, None)
        tx.tenants.bump_config_rev(tenant_id)
        audit.record(tx, tenant_id, actor, "webhook.update", webhook_id, now, before=_audited(stored, False),
                     after=_audited(changed, sealed is not None))
        return changed

    changed = await runtime.store.write(unit, may_refuse=True)
    _announce(runtime)
    return changed


async def delete(runtime: Runtime, tenant_id: str, actor: str, webhook_id: str) -> DeletedWebhook:
    """The subscription, its secret and the events still waiting for it go; its attempts log stays."""
    now = iso(runtime.clock.now())

    def unit(tx: Session) -> int:
        stored = tx.catalog.get_doc(WEBHOOKS, tenant_id, webhook_id)
        if stored is None:
            raise NotFound()
        tx.catalog.delete_doc(WEBHOOKS, tenant_id, webhook_id)
        tx.secrets.delete(tenant_id, webhook_secret_ref(webhook_id))
        tx.tenants.bump_config_rev(tenant_id)
        dropped = tx.webhooks.drop_events(tenant_id, webhook_id)
        audit.record(tx, tenant_id, actor, "webhook.delete", webhook_id, now, before=_audited(stored, False),
                     after={"droppedEvents": dropped})
        return dropped

    dropped = await runtime.store.write(unit, may_refuse=True)
    _announce(runtime)
    return DeletedWebhook(webhook_id=webhook_id, deleted=True, dropped_events=dropped)


def attempts(runtime: Runtime, tenant_id: str, webhook_id: str, before: str | None, limit: int) -> AttemptPage:
    tx = runtime.store.reader()
    with tx:
        if tx.catalog.get_doc(WEBHOOKS, tenant_id, webhook_id) is None:
            raise NotFound()
        rows = tx.webhooks.attempts_page(tenant_id, webhook_id, before, limit + 1)
    items = [WebhookAttempt(**dict(zip(WebhookAttempt.__struct_fields__, row))) for row in rows[:limit]]
    more = len(rows) > limit
    return AttemptPage(items=items, next_cursor=items[-1].attempt_id if more else None, has_more=more)
