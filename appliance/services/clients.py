"""Clients (buyers) as records (CONTRACT 9.4): made and changed through the API or a bundle,
each change in the audit log in its own transaction."""

from __future__ import annotations

from typing import Any

import msgspec

from appliance.clock import iso
from appliance.domain.client import Billing, ClientRecord, ReturnPolicy
from appliance.errors import NotFound, ValidationFailed
from appliance.model import Model, describe_validation_error
from appliance.runtime import Runtime
from appliance.services import audit
from appliance.storage import CLIENTS, Session


class ClientPage(Model):
    items: list[ClientRecord]
    next_cursor: str | None
    has_more: bool


class ClientChange(Model):
    """PATCH: the members given replace the stored ones (`billing` and `returnPolicy` whole)."""

    name: str | None = None
    active: bool | None = None
    billing: Billing | None = None
    return_policy: ReturnPolicy | None = None


def _shown(client: ClientRecord) -> dict[str, Any]:
    plain = msgspec.to_builtins(client)
    plain.pop("createdAt", None)
    plain.pop("updatedAt", None)
    return plain


def page(runtime: Runtime, tenant_id: str, after: str | None, limit: int) -> ClientPage:
    clients = [c for c in runtime.store.reader().catalog.load_docs(CLIENTS, tenant_id) if after is None
               or c.client_id > after]
    return ClientPage(items=clients[:limit], next_cursor=clients[limit - 1].client_id if len(clients) > limit else None,
                      has_more=len(clients) > limit)


def get(runtime: Runtime, tenant_id: str, client_id: str) -> ClientRecord:
    found = runtime.store.reader().catalog.get_doc(CLIENTS, tenant_id, client_id)
    if found is None:
        raise NotFound()
    return found


async def create(runtime: Runtime, tenant_id: str, actor: str, client: ClientRecord) -> ClientRecord:
    now = iso(runtime.clock.now())

    def unit(tx: Session) -> ClientRecord:
        if tx.catalog.get_doc(CLIENTS, tenant_id, client.client_id) is not None:
            raise ValidationFailed(["clientId: a client of this tenant already has this id"])
        tx.catalog.upsert_doc(CLIENTS, tenant_id, client.client_id, client, now)
        tx.tenants.bump_config_rev(tenant_id)  # deliveries read clients' billing from the cached settings
        stored = tx.catalog.get_doc(CLIENTS, tenant_id, client.client_id)
        audit.record(tx, tenant_id, actor, "client.create", client.client_id, now, after=_shown(stored))
        return stored

    return await runtime.store.write(unit, may_refuse=True)


async def change(runtime: Runtime, tenant_id: str, actor: str, client_id: str, body: ClientChange) -> ClientRecord:
    now = iso(runtime.clock.now())
    given = {name: value for name in ClientChange.__struct_fields__ if (value := getattr(body, name)) is not None}

    def unit(tx: Session) -> ClientRecord:
        stored = tx.catalog.get_doc(CLIENTS, tenant_id, client_id)
        if stored is None:
            raise NotFound()
        try:  # the whole record checked again: a name emptied, a credit limit on a prepaid client
            changed = msgspec.convert({**msgspec.to_builtins(stored), **msgspec.to_builtins(given)}, ClientRecord)
        except msgspec.ValidationError as exc:
            raise ValidationFailed([describe_validation_error(exc)]) from None
        tx.catalog.upsert_doc(CLIENTS, tenant_id, client_id, changed, now)
        tx.tenants.bump_config_rev(tenant_id)
        if changed.billing != stored.billing:  # a higher limit, or no limit: waiting leads may go now
            tx.jobs.release_paused(tenant_id, None, now)
        after = tx.catalog.get_doc(CLIENTS, tenant_id, client_id)
        if _shown(after) != _shown(stored):
            audit.record(tx, tenant_id, actor, "client.update", client_id, now, before=_shown(stored),
                         after=_shown(after))
        return after

    return await runtime.store.write(unit, may_refuse=True)
