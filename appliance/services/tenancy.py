"""Admin operations on tenants: create, API keys, bundle import and export. The CLI drives them;
each is one write transaction, so a failed import changes nothing."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from appliance import apikeys, sdk
from appliance.adapters import netguard
from appliance.domain.webhooks import MIN_SECRET_BYTES, BundleWebhook, Webhook, new_secret
from appliance.services.bundle import BundleError, TenantBundle, load_bundle, split_secrets
from appliance.clock import iso
from appliance.ids import is_id
from appliance.domain.endpoint import AUTH_FIELDS, SEALED, sealed_fields
from appliance.domain.permissions import ADMIN, KEY_ROLES
from appliance.domain.secret_refs import endpoint_secret_ref, webhook_secret_ref
from appliance.domain.standard_fields import STANDARD_FIELDS
from appliance.crypto import SecretBox, SecretError
from appliance.runtime import Runtime
from appliance.services import audit
from appliance.services.webhooks import url_problem
from appliance.storage import CLIENTS, DELIVERY_ENDPOINTS, FIELD_LIBRARY, PIXELS, QUESTIONNAIRES, VALUE_SETS, WEBHOOKS


class AdminError(Exception):
    """A refused admin request; the message is for the operator and never holds a secret."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else problems
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class NewKey:
    key_id: str
    key: str  # shown once, never stored
    prefix: str
    tenant_id: str
    kind: str
    source_id: str | None
    name: str
    role: str = ADMIN


def create_tenant(runtime: Runtime, name: str) -> str:
    if not name.strip():
        raise AdminError("name: must not be empty")
    now = iso(runtime.clock.now())

    def unit(tx):
        tenant_id = tx.tenants.create_tenant(name.strip(), now)
        for entry in STANDARD_FIELDS:
            tx.catalog.upsert_field(tenant_id, entry, now)
        return tenant_id

    return runtime.store.write_sync(unit)


def require_tenant(runtime: Runtime, tenant_id: str) -> None:
    if not runtime.store.reader().tenants.tenant_exists(tenant_id):
        raise AdminError(f"tenant {tenant_id} does not exist")


def _source_ids(runtime: Runtime, tenant_id: str) -> set[str]:
    return {
        source.source_id
        for campaign in runtime.store.reader().catalog.all_campaigns(tenant_id)
        for source in campaign.ingestion.sources
    }


def create_key(runtime: Runtime, tenant_id: str, *, name: str = "", source_id: str | None = None,
               role: str = ADMIN) -> NewKey:
    """A tenant key of `role` (a source key has none: it submits and pings, nothing else)."""
    require_tenant(runtime, tenant_id)
    if role not in KEY_ROLES:
        raise AdminError(f"role {role!r} is not a key role: one of {', '.join(KEY_ROLES)}")
    if source_id is not None and source_id not in _source_ids(runtime, tenant_id):
        raise AdminError(f"source {source_id} is not an ingestion source of any campaign of {tenant_id}")
    kind = "source" if source_id else "tenant"
    key = apikeys.generate(kind)
    prefix = apikeys.display_prefix(key)
    now = iso(runtime.clock.now())

    def unit(tx):
        key_id = tx.tenants.insert_key(tenant_id=tenant_id, name=name, kind=kind, source_id=source_id,
                                       prefix=prefix, key_hash=apikeys.key_hash(key), now=now,
                                       role=role)
        audit.record(tx, tenant_id, audit.CLI, "key.create", key_id, now,
                     after={"name": name, "kind": kind, "role": None if source_id else role, "sourceId": source_id,
                            "prefix": prefix})
        if source_id:
            tx.catalog.refresh_public_docs(tenant_id)
            tx.tenants.bump_config_rev(tenant_id)  # campaigns now show another keyPrefix
        return key_id

    key_id = runtime.store.write_sync(unit)
    if source_id:
        runtime.store.announce_admin_change()
    return NewKey(key_id=key_id, key=key, prefix=prefix, tenant_id=tenant_id, kind=kind, source_id=source_id, name=name,
                  role=role)


def revoke_key(runtime: Runtime, key_or_id: str) -> tuple[str, str]:
    """Revoke the key named by its key id, or by the key itself (one found where it should not be:
    looked up by its hash, as a request's key is, and never shown). Returns (key id, tenant)."""
    now = iso(runtime.clock.now())

    def unit(tx):
        # Anything but a key id is looked up by its hash only: a secret never reaches SQL (where a
        # PostgreSQL server's statement log could keep it).
        key_id: str | None = key_or_id if is_id("key", key_or_id) else None
        tenant_id = tx.tenants.key_tenant(key_id) if key_id else None
        if tenant_id is None:
            key_id = tx.tenants.key_id_by_hash(apikeys.key_hash(key_or_id))
            tenant_id = tx.tenants.key_tenant(key_id) if key_id else None
        if tenant_id is None:
            # Only a key id is named back: anything else may be a secret (of another install, mistyped).
            raise AdminError(f"key {key_or_id} does not exist" if is_id("key", key_or_id) else
                             "no key has that key id, and no key is that key (not shown): "
                             "`key list --tenant T` lists the key ids")
        tx.tenants.revoke_key(key_id, now)
        audit.record(tx, tenant_id, audit.CLI, "key.revoke", key_id, now, after={"revokedAt": now})
        tx.catalog.refresh_public_docs(tenant_id)
        tx.tenants.bump_config_rev(tenant_id)
        tx.jobs.release_paused(tenant_id, None, now)  # each looks again where it goes now
        return key_id, tenant_id

    revoked = runtime.store.write_sync(unit, may_refuse=True)
    runtime.store.announce_admin_change()
    return revoked


def import_bundle(runtime: Runtime, tenant_id: str, raw: bytes, fmt: str, *,
                  esign_adapters: frozenset[str] | None = None,
                  verifiers: Mapping[str, sdk.Verifier] | None = None) -> dict[str, Any]:
    """Validate the whole bundle first, then upsert it in one transaction. Plaintext secrets are
    sealed before they reach storage; a source `apiKey` becomes that source's key. A new webhook
    without a secret gets one, returned (once) under `webhookSecrets`. `esign_adapters`: the
    e-signature adapters loaded, which campaign documents must name; `verifiers`: the verifiers
    loaded, which verification steps must name and whose configs they check (None: not checked)."""
    require_tenant(runtime, tenant_id)
    reader = runtime.store.reader()
    bundle = load_bundle(
        raw, fmt,
        known_value_sets=frozenset(reader.catalog.doc_ids(VALUE_SETS, tenant_id)),
        known_endpoints=frozenset(reader.catalog.doc_ids(DELIVERY_ENDPOINTS, tenant_id)),
        known_campaigns=frozenset(reader.catalog.campaign_ids(tenant_id)),
        known_suppression_lists=frozenset(reader.suppression.list_ids(tenant_id)),
        known_clients=frozenset(reader.catalog.doc_ids(CLIENTS, tenant_id)),
        known_pinging_endpoints=frozenset(e.delivery_endpoint_id for e in
                                          reader.catalog.load_docs(DELIVERY_ENDPOINTS, tenant_id)
                                          if e.ping is not None),
        stored_campaigns=reader.catalog.all_campaigns(tenant_id),
        known_field_keys=frozenset(f.key for f in STANDARD_FIELDS) | frozenset(reader.catalog.doc_ids(FIELD_LIBRARY,
                                                                                                   tenant_id)),
        known_esign_adapters=esign_adapters,
        verifiers=verifiers,
    )
    unsendable = _unsendable_urls(bundle) + [
        problem for i, w in enumerate(bundle.webhooks)
        if (problem := url_problem(w.url, runtime.config.delivery.allow_private_addresses, f"webhooks[{i}].url"))]
    if unsendable:
        raise BundleError(unsendable)
    bundle, plaintexts = split_secrets(bundle)
    generated = {
        w.webhook_id: new_secret(secrets.token_bytes(MIN_SECRET_BYTES)) for w in bundle.webhooks
        if webhook_secret_ref(w.webhook_id) not in plaintexts
        and reader.secrets.get(tenant_id, webhook_secret_ref(w.webhook_id)) is None}
    plaintexts.update({webhook_secret_ref(webhook_id): secret for webhook_id, secret in generated.items()})
    unstored = _sealed_without_secret(reader, tenant_id, bundle, plaintexts)
    if unstored:
        raise BundleError(unstored)
    sealed = {ref: runtime.box.seal_bytes(plain, f"{tenant_id}/{ref}") for ref, plain in plaintexts.items()}
    source_keys = [
        (ref.split(":")[2], plain) for ref, plain in plaintexts.items()
        if ref.startswith("source:") and ref.endswith(":apiKey")
    ]
    now = iso(runtime.clock.now())

    def unit(tx):
        before = _catalog(tx, tenant_id)
        for source_id, plain in source_keys:
            digest = apikeys.key_hash(plain)
            owner = tx.tenants.key_owner_by_hash(digest)
            if owner is None:
                name, shown = f"imported for {source_id}", apikeys.display_prefix(plain)
                key_id = tx.tenants.insert_key(tenant_id=tenant_id, name=name, kind="source", source_id=source_id,
                                               prefix=shown, key_hash=digest, now=now)
                audit.record(tx, tenant_id, audit.CLI, "key.create", key_id, now,
                             after={"name": name, "kind": "source", "role": None, "sourceId": source_id,
                                    "prefix": shown})
            elif owner != (tenant_id, source_id):
                raise AdminError(f"the apiKey of source {source_id} is already in use by another key")
        for ref, blob in sealed.items():
            change = _secret_change(tx, runtime.box, tenant_id, ref, plaintexts[ref])
            tx.secrets.put(tenant_id, ref, blob, now)
            if change is not None:  # the ref names the credential, never its value
                audit.record(tx, tenant_id, audit.CLI, f"bundle.secret.{change}", ref, now)
        for client in bundle.clients:
            tx.catalog.upsert_doc(CLIENTS, tenant_id, client.client_id, client, now)
        for item in bundle.value_sets:
            tx.catalog.upsert_doc(VALUE_SETS, tenant_id, item.value_set_id, item, None)
        for item in bundle.questionnaires:
            tx.catalog.upsert_doc(QUESTIONNAIRES, tenant_id, item.questionnaire_id, item, now)
        for entry in bundle.field_library:
            tx.catalog.upsert_field(tenant_id, entry, now)
        for endpoint in bundle.delivery_endpoints:
            tx.catalog.upsert_doc(DELIVERY_ENDPOINTS, tenant_id, endpoint.delivery_endpoint_id, endpoint, None)
        for pixel in bundle.pixels:
            tx.catalog.upsert_doc(PIXELS, tenant_id, pixel.pixel_id, pixel, None,
                                  extra={"platform": pixel.platform})
        if bundle.sms is not None:
            tx.catalog.put_sms_config(tenant_id, bundle.sms)
        if bundle.settings is not None:
            tx.tenants.put_settings(tenant_id, bundle.settings)
        for hook in bundle.webhooks:
            stored = Webhook(**{f: getattr(hook, f) for f in Webhook.__struct_fields__})
            tx.catalog.upsert_doc(WEBHOOKS, tenant_id, hook.webhook_id, stored, now)
        for campaign in bundle.campaigns:
            tx.catalog.upsert_campaign(tenant_id, campaign, now)
        _audit_items(tx, tenant_id, before, _catalog(tx, tenant_id), now)
        tx.catalog.refresh_public_docs(tenant_id)
        tx.tenants.bump_config_rev(tenant_id)
        tx.jobs.release_paused(tenant_id, None, now)  # each looks again where it goes now

    runtime.store.write_sync(unit, may_refuse=True)
    runtime.store.announce_admin_change()
    return {
        "campaigns": len(bundle.campaigns), "questionnaires": len(bundle.questionnaires),
        "fieldLibrary": len(bundle.field_library), "valueSets": len(bundle.value_sets),
        "deliveryEndpoints": len(bundle.delivery_endpoints), "pixels": len(bundle.pixels),
        "sms": int(bundle.sms is not None), "webhooks": len(bundle.webhooks), "secrets": len(sealed),
        "settings": int(bundle.settings is not None), "clients": len(bundle.clients),
        **({"webhookSecrets": generated} if generated else {}),
    }


# The bundle's items by their kind in the audit log (`bundle.<kind>.<change>`) and id attribute.
_AUDITED_DOCS = (("valueSet", VALUE_SETS, "value_set_id"), ("questionnaire", QUESTIONNAIRES, "questionnaire_id"),
                 ("field", FIELD_LIBRARY, "key"), ("deliveryEndpoint", DELIVERY_ENDPOINTS, "delivery_endpoint_id"),
                 ("pixel", PIXELS, "pixel_id"), ("webhook", WEBHOOKS, "webhook_id"), ("client", CLIENTS, "client_id"))


def _catalog(tx, tenant_id: str) -> dict[tuple[str, str], dict[str, Any]]:
    """The tenant's configuration items by (kind, id) as plain data, without the stamps every
    import moves. Stored items hold no secret: split_secrets took them off before storing."""
    items: dict[tuple[str, str], Any] = {
        (kind, getattr(doc, id_name)): doc
        for kind, table, id_name in _AUDITED_DOCS for doc in tx.catalog.load_docs(table, tenant_id)}
    items.update({("campaign", c.campaign_id): c for c in tx.catalog.all_campaigns(tenant_id)})
    sms = tx.catalog.get_sms_config(tenant_id)
    if sms is not None:
        items[("sms", "sms")] = sms
    items[("settings", "settings")] = tx.tenants.settings(tenant_id)
    plain = {key: msgspec.to_builtins(item) for key, item in items.items()}
    for doc in plain.values():
        doc.pop("createdAt", None)
        doc.pop("updatedAt", None)
    return plain


def _audit_items(tx, tenant_id: str, before: dict[tuple[str, str], Any], after: dict[tuple[str, str], Any],
                 now: str) -> None:
    """One audit entry per item the import created, changed or removed, with its before and after."""
    for key in [*after, *(key for key in before if key not in after)]:
        old, new = before.get(key), after.get(key)
        if old != new:
            change = "create" if old is None else "delete" if new is None else "update"
            audit.record(tx, tenant_id, audit.CLI, f"bundle.{key[0]}.{change}", key[1], now, before=old, after=new)


def _secret_change(tx, box: SecretBox, tenant_id: str, ref: str, plain: str) -> str | None:
    """`create` or `update` for a credential the import stores; None when it is the one stored."""
    stored = tx.secrets.get(tenant_id, ref)
    if stored is None:
        return "create"
    try:
        return None if box.open_bytes(stored, f"{tenant_id}/{ref}") == plain else "update"
    except SecretError:  # sealed under another master key: replaced
        return "update"


def _unsendable_urls(bundle: TenantBundle) -> list[str]:
    """URLs the outbound clients would refuse on every attempt, whatever the configuration."""
    urls = [(f"deliveryEndpoints[{i}].url", e.url) for i, e in enumerate(bundle.delivery_endpoints)]
    urls += [(f"deliveryEndpoints[{i}].ping.url", e.ping.url) for i, e in enumerate(bundle.delivery_endpoints)
             if e.ping is not None]
    if bundle.sms is not None:
        urls += [(f"sms.providers[{i}].baseUrl", p.base_url) for i, p in enumerate(bundle.sms.providers)]
    problems = []
    for where, url in urls:
        reason = netguard.unsendable_reason(url) if url else None
        if reason:
            problems.append(f"{where}: can never be sent ({reason.removeprefix('destination refused: ')})")
    return problems


def _sealed_without_secret(tx, tenant_id: str, bundle: TenantBundle, plaintexts: dict[str, str]) -> list[str]:
    """`***` in an endpoint keeps the credential stored before (an export shows them so); where
    none is stored, the endpoint could never be sent."""
    problems = []
    for i, endpoint in enumerate(bundle.delivery_endpoints):
        for field in sealed_fields(endpoint):
            ref = endpoint_secret_ref(endpoint.delivery_endpoint_id, field)
            if field not in AUTH_FIELDS and ref not in plaintexts and tx.secrets.get(tenant_id, ref) is None:
                problems.append(f"deliveryEndpoints[{i}].{field}: is {SEALED}, which keeps a stored credential, "
                                "and none is stored; give the value")
    return problems


def export_bundle(runtime: Runtime, tenant_id: str) -> TenantBundle:
    """Everything but secrets: they stay sealed in this install, and importing the export back
    leaves them as they are."""
    require_tenant(runtime, tenant_id)
    tx = runtime.store.reader()
    return TenantBundle(
        campaigns=tx.catalog.all_campaigns(tenant_id),
        questionnaires=tx.catalog.load_docs(QUESTIONNAIRES, tenant_id),
        field_library=tx.catalog.load_docs(FIELD_LIBRARY, tenant_id),
        value_sets=tx.catalog.load_docs(VALUE_SETS, tenant_id),
        delivery_endpoints=tx.catalog.load_docs(DELIVERY_ENDPOINTS, tenant_id),
        sms=tx.catalog.get_sms_config(tenant_id),
        pixels=tx.catalog.load_docs(PIXELS, tenant_id),
        webhooks=[BundleWebhook(**msgspec.structs.asdict(w)) for w in tx.catalog.load_docs(WEBHOOKS, tenant_id)],
        settings=tx.tenants.settings(tenant_id),
        clients=tx.catalog.load_docs(CLIENTS, tenant_id),
    )


def encode_bundle(bundle: TenantBundle, fmt: str) -> bytes:
    if fmt == "toml":
        return msgspec.toml.encode(_without_nulls(msgspec.to_builtins(bundle)))
    return msgspec.json.format(msgspec.json.encode(bundle), indent=2) + b"\n"


def _without_nulls(value):
    # TOML has no null: an absent key decodes back to the same default.
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
