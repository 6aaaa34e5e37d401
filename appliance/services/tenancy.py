"""Admin operations on tenants: create, API keys, bundle import and export. The CLI drives them;
each is one write transaction, so a failed import changes nothing."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from appliance import apikeys
from appliance.adapters import netguard
from appliance.services.bundle import BundleError, TenantBundle, endpoint_secret_ref, load_bundle, split_secrets
from appliance.clock import iso
from appliance.domain.endpoint import AUTH_FIELDS, SEALED, sealed_fields
from appliance.domain.standard_fields import STANDARD_FIELDS
from appliance.runtime import Runtime
from appliance.storage import catalog, secrets, tenants


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


def create_tenant(runtime: Runtime, name: str) -> str:
    if not name.strip():
        raise AdminError("name: must not be empty")
    now = iso(runtime.clock.now())

    def unit(conn):
        tenant_id = tenants.create_tenant(conn, name.strip(), now)
        for entry in STANDARD_FIELDS:
            catalog.upsert_field(conn, tenant_id, entry, now)
        return tenant_id

    return runtime.db.write_sync(unit)


def _require_tenant(runtime: Runtime, tenant_id: str) -> None:
    if not tenants.tenant_exists(runtime.db.reader(), tenant_id):
        raise AdminError(f"tenant {tenant_id} does not exist")


def _source_ids(runtime: Runtime, tenant_id: str) -> set[str]:
    return {
        source.source_id
        for campaign in catalog.all_campaigns(runtime.db.reader(), tenant_id)
        for source in campaign.ingestion.sources
    }


def create_key(runtime: Runtime, tenant_id: str, *, name: str = "", source_id: str | None = None) -> NewKey:
    _require_tenant(runtime, tenant_id)
    if source_id is not None and source_id not in _source_ids(runtime, tenant_id):
        raise AdminError(f"source {source_id} is not an ingestion source of any campaign of {tenant_id}")
    kind = "source" if source_id else "tenant"
    key = apikeys.generate(kind)
    prefix = apikeys.display_prefix(key)
    now = iso(runtime.clock.now())

    def unit(conn):
        key_id = tenants.insert_key(conn, tenant_id=tenant_id, name=name, kind=kind, source_id=source_id,
                                    prefix=prefix, key_hash=apikeys.key_hash(key), now=now)
        if source_id:
            catalog.refresh_public_docs(conn, tenant_id)
            tenants.bump_config_rev(conn, tenant_id)  # campaigns now show another keyPrefix
        return key_id

    key_id = runtime.db.write_sync(unit)
    if source_id:
        runtime.db.announce_admin_change()
    return NewKey(key_id=key_id, key=key, prefix=prefix, tenant_id=tenant_id, kind=kind, source_id=source_id, name=name)


def revoke_key(runtime: Runtime, key_id: str) -> None:
    now = iso(runtime.clock.now())

    def unit(conn):
        tenant_id = tenants.key_tenant(conn, key_id)
        if tenant_id is None:
            raise AdminError(f"key {key_id} does not exist")
        tenants.revoke_key(conn, key_id, now)
        catalog.refresh_public_docs(conn, tenant_id)
        tenants.bump_config_rev(conn, tenant_id)

    runtime.db.write_sync(unit, may_refuse=True)
    runtime.db.announce_admin_change()


def import_bundle(runtime: Runtime, tenant_id: str, raw: bytes, fmt: str) -> dict[str, int]:
    """Validate the whole bundle first, then upsert it in one transaction. Plaintext secrets are
    sealed before they reach storage; a source `apiKey` becomes that source's key."""
    _require_tenant(runtime, tenant_id)
    reader = runtime.db.reader()
    bundle = load_bundle(
        raw, fmt,
        known_value_sets=frozenset(catalog.doc_ids(reader, catalog.VALUE_SETS, tenant_id)),
        known_endpoints=frozenset(catalog.doc_ids(reader, catalog.DELIVERY_ENDPOINTS, tenant_id)),
        known_campaigns=frozenset(catalog.campaign_ids(reader, tenant_id)),
    )
    unsendable = _unsendable_urls(bundle)
    if unsendable:
        raise BundleError(unsendable)
    bundle, plaintexts = split_secrets(bundle)
    unstored = _sealed_without_secret(reader, tenant_id, bundle, plaintexts)
    if unstored:
        raise BundleError(unstored)
    sealed = {ref: runtime.box.seal_bytes(plain, f"{tenant_id}/{ref}") for ref, plain in plaintexts.items()}
    source_keys = [
        (ref.split(":")[2], plain) for ref, plain in plaintexts.items()
        if ref.startswith("source:") and ref.endswith(":apiKey")
    ]
    now = iso(runtime.clock.now())

    def unit(conn):
        for source_id, plain in source_keys:
            digest = apikeys.key_hash(plain)
            owner = tenants.key_owner_by_hash(conn, digest)
            if owner is None:
                tenants.insert_key(conn, tenant_id=tenant_id, name=f"imported for {source_id}", kind="source",
                                   source_id=source_id, prefix=apikeys.display_prefix(plain), key_hash=digest, now=now)
            elif owner != (tenant_id, source_id):
                raise AdminError(f"the apiKey of source {source_id} is already in use by another key")
        for ref, blob in sealed.items():
            secrets.put_sealed(conn, tenant_id, ref, blob, now)
        for item in bundle.value_sets:
            catalog.upsert_doc(conn, catalog.VALUE_SETS, tenant_id, item.value_set_id, item, None)
        for item in bundle.questionnaires:
            catalog.upsert_doc(conn, catalog.QUESTIONNAIRES, tenant_id, item.questionnaire_id, item, now)
        for entry in bundle.field_library:
            catalog.upsert_field(conn, tenant_id, entry, now)
        for endpoint in bundle.delivery_endpoints:
            catalog.upsert_doc(conn, catalog.DELIVERY_ENDPOINTS, tenant_id, endpoint.delivery_endpoint_id, endpoint, None)
        for pixel in bundle.pixels:
            catalog.upsert_doc(conn, catalog.PIXELS, tenant_id, pixel.pixel_id, pixel, None,
                               extra={"platform": pixel.platform})
        if bundle.sms is not None:
            catalog.put_sms_config(conn, tenant_id, bundle.sms)
        for campaign in bundle.campaigns:
            catalog.upsert_campaign(conn, tenant_id, campaign, now)
        catalog.refresh_public_docs(conn, tenant_id)
        tenants.bump_config_rev(conn, tenant_id)

    runtime.db.write_sync(unit, may_refuse=True)
    runtime.db.announce_admin_change()
    return {
        "campaigns": len(bundle.campaigns), "questionnaires": len(bundle.questionnaires),
        "fieldLibrary": len(bundle.field_library), "valueSets": len(bundle.value_sets),
        "deliveryEndpoints": len(bundle.delivery_endpoints), "pixels": len(bundle.pixels),
        "sms": int(bundle.sms is not None), "secrets": len(sealed),
    }


def _unsendable_urls(bundle: TenantBundle) -> list[str]:
    """URLs the outbound clients would refuse on every attempt, whatever the configuration."""
    urls = [(f"deliveryEndpoints[{i}].url", e.url) for i, e in enumerate(bundle.delivery_endpoints)]
    if bundle.sms is not None:
        urls += [(f"sms.providers[{i}].baseUrl", p.base_url) for i, p in enumerate(bundle.sms.providers)]
    problems = []
    for where, url in urls:
        reason = netguard.unsendable_reason(url) if url else None
        if reason:
            problems.append(f"{where}: can never be sent ({reason.removeprefix('destination refused: ')})")
    return problems


def _sealed_without_secret(conn, tenant_id: str, bundle: TenantBundle, plaintexts: dict[str, str]) -> list[str]:
    """`***` in an endpoint keeps the credential stored before (an export shows them so); where
    none is stored, the endpoint could never be sent."""
    problems = []
    for i, endpoint in enumerate(bundle.delivery_endpoints):
        for field in sealed_fields(endpoint):
            ref = endpoint_secret_ref(endpoint.delivery_endpoint_id, field)
            if field not in AUTH_FIELDS and ref not in plaintexts and secrets.get_sealed(conn, tenant_id, ref) is None:
                problems.append(f"deliveryEndpoints[{i}].{field}: is {SEALED}, which keeps a stored credential, "
                                "and none is stored; give the value")
    return problems


def export_bundle(runtime: Runtime, tenant_id: str) -> TenantBundle:
    """Everything but secrets: they stay sealed in this install, and importing the export back
    leaves them as they are."""
    _require_tenant(runtime, tenant_id)
    conn = runtime.db.reader()
    return TenantBundle(
        campaigns=catalog.all_campaigns(conn, tenant_id),
        questionnaires=catalog.load_docs(conn, catalog.QUESTIONNAIRES, tenant_id),
        field_library=catalog.load_docs(conn, catalog.FIELD_LIBRARY, tenant_id),
        value_sets=catalog.load_docs(conn, catalog.VALUE_SETS, tenant_id),
        delivery_endpoints=catalog.load_docs(conn, catalog.DELIVERY_ENDPOINTS, tenant_id),
        sms=catalog.get_sms_config(conn, tenant_id),
        pixels=catalog.load_docs(conn, catalog.PIXELS, tenant_id),
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
