"""A tenant's configuration: campaigns, questionnaires, field library, value sets, delivery
endpoints, SMS settings and pixels. Documents are stored as msgspec JSON; campaigns also keep the
exact JSON that GET /campaigns returns, so listing never re-encodes them."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

import apsw
import msgspec

from appliance.domain.campaign import Campaign, public_campaign
from appliance.domain.catalog import FieldLibraryEntry, Questionnaire, ValueSet
from appliance.domain.client import ClientRecord
from appliance.domain.endpoint import DeliveryEndpoint
from appliance.domain.messaging import Pixel, SmsConfig
from appliance.domain.webhooks import Webhook
from appliance.storage.tenants import Tenants

T = TypeVar("T")
_encode = msgspec.json.Encoder().encode
_campaign_decoder = msgspec.json.Decoder(Campaign)
_pixel_decoder = msgspec.json.Decoder(Pixel)


@lru_cache(maxsize=256)
def _sms_config(doc: bytes) -> SmsConfig:
    """Decoding checks every number with phonenumbers (~50 us each), and every SMS webhook reads
    the configuration: one decode per stored document (configuration is never changed in place)."""
    return msgspec.json.decode(doc, type=SmsConfig)


def _like(term: str) -> str:
    escaped = term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _public_doc(campaign: Campaign, prefixes: dict[str, str]) -> bytes:
    shown = public_campaign(campaign)
    sources = [
        msgspec.structs.replace(source, key_prefix=prefixes.get(source.source_id, source.key_prefix))
        for source in shown.ingestion.sources
    ]
    return _encode(msgspec.structs.replace(shown, ingestion=msgspec.structs.replace(shown.ingestion, sources=sources)))


@dataclass(frozen=True)
class CampaignFilter:
    active: bool | None = None
    client_id: str | None = None
    offer_id: str | None = None
    include_archived: bool = False
    search: str | None = None


@dataclass(frozen=True)
class _DocTable:
    table: str
    id_column: str
    kind: type


QUESTIONNAIRES = _DocTable("questionnaires", "questionnaire_id", Questionnaire)
VALUE_SETS = _DocTable("value_sets", "value_set_id", ValueSet)


FIELD_LIBRARY = _DocTable("field_library", "key", FieldLibraryEntry)


DELIVERY_ENDPOINTS = _DocTable("delivery_endpoints", "endpoint_id", DeliveryEndpoint)
PIXELS = _DocTable("pixels", "pixel_id", Pixel)
WEBHOOKS = _DocTable("webhooks", "webhook_id", Webhook)
CLIENTS = _DocTable("clients", "client_id", ClientRecord)


class Catalog:
    """A tenant's configuration documents."""

    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def _existing_created_at(self, table: str, id_column: str, tenant_id: str, item_id: str) -> str | None:
        found = self._conn.execute(
            f"SELECT json_extract(doc, '$.createdAt') FROM {table} WHERE tenant_id = ? AND {id_column} = ?",
            (tenant_id, item_id),
        ).fetchone()
        return found[0] if found else None

    def upsert_campaign(self, tenant_id: str, campaign: Campaign, now: str) -> None:
        """`campaign` must carry no plaintext secret (see appliance.tenancy)."""
        created = self._existing_created_at("campaigns", "campaign_id", tenant_id, campaign.campaign_id)
        campaign = msgspec.structs.replace(campaign, created_at=created or campaign.created_at or now, updated_at=now)
        self._conn.execute(
            """INSERT INTO campaigns(tenant_id, campaign_id, name, client_id, client_name, offer_id, offer_name,
                                     active, archived_at, created_at, updated_at, doc, public_doc)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT(tenant_id, campaign_id) DO UPDATE SET
                 name = excluded.name, client_id = excluded.client_id, client_name = excluded.client_name,
                 offer_id = excluded.offer_id, offer_name = excluded.offer_name, active = excluded.active,
                 archived_at = excluded.archived_at, updated_at = excluded.updated_at, doc = excluded.doc,
                 public_doc = excluded.public_doc""",
            (
                tenant_id, campaign.campaign_id, campaign.name,
                campaign.client.client_id if campaign.client else None,
                campaign.client.client_name if campaign.client else None,
                campaign.offer.offer_id if campaign.offer else None,
                campaign.offer.offer_name if campaign.offer else None,
                int(campaign.active), campaign.archived_at, campaign.created_at, now,
                _encode(campaign), _public_doc(campaign, Tenants(self._conn).source_key_prefixes(tenant_id)),
            ),
        )

    def refresh_public_docs(self, tenant_id: str) -> None:
        """Re-encode what GET /campaigns shows after source keys change (their keyPrefix)."""
        prefixes = Tenants(self._conn).source_key_prefixes(tenant_id)
        for campaign_id, doc in self._conn.execute(
            "SELECT campaign_id, doc FROM campaigns WHERE tenant_id = ?", (tenant_id,)
        ).fetchall():
            self._conn.execute(
                "UPDATE campaigns SET public_doc = ? WHERE tenant_id = ? AND campaign_id = ?",
                (_public_doc(_campaign_decoder.decode(doc), prefixes), tenant_id, campaign_id),
            )

    def list_campaigns(self, tenant_id: str, where: CampaignFilter, page: int, limit: int) -> tuple[int, list[bytes]]:
        clauses = ["tenant_id = ?"]
        params: list[Any] = [tenant_id]
        if where.active is not None:
            clauses.append("active = ?")
            params.append(int(where.active))
        if where.client_id is not None:
            clauses.append("client_id = ?")
            params.append(where.client_id)
        if where.offer_id is not None:
            clauses.append("offer_id = ?")
            params.append(where.offer_id)
        if not where.include_archived:
            clauses.append("archived_at IS NULL")
        if where.search:
            clauses.append(
                "(name LIKE ? ESCAPE '\\' OR campaign_id LIKE ? ESCAPE '\\'"
                " OR client_name LIKE ? ESCAPE '\\' OR offer_name LIKE ? ESCAPE '\\')"
            )
            params.extend([_like(where.search)] * 4)
        sql_where = " AND ".join(clauses)
        (total,) = self._conn.execute(f"SELECT count(*) FROM campaigns WHERE {sql_where}", params).fetchone()
        docs = [
            doc
            for (doc,) in self._conn.execute(
                f"SELECT public_doc FROM campaigns WHERE {sql_where} ORDER BY campaign_id LIMIT ? OFFSET ?",
                [*params, limit, (page - 1) * limit],
            )
        ]
        return total, docs

    def get_campaign(self, tenant_id: str, campaign_id: str) -> Campaign | None:
        found = self._conn.execute(
            "SELECT doc FROM campaigns WHERE tenant_id = ? AND campaign_id = ?", (tenant_id, campaign_id)
        ).fetchone()
        return _campaign_decoder.decode(found[0]) if found else None

    def campaign_ids(self, tenant_id: str) -> set[str]:
        return {cid for (cid,) in self._conn.execute("SELECT campaign_id FROM campaigns WHERE tenant_id = ?", (tenant_id,))}

    def all_campaigns(self, tenant_id: str) -> list[Campaign]:
        return [
            _campaign_decoder.decode(doc)
            for (doc,) in self._conn.execute("SELECT doc FROM campaigns WHERE tenant_id = ? ORDER BY campaign_id", (tenant_id,))
        ]

    def upsert_doc(self, where: _DocTable, tenant_id: str, item_id: str, item: msgspec.Struct,
                   now: str | None, extra: dict[str, Any] | None = None) -> None:
        """Insert or replace one document; stamps createdAt (kept) / updatedAt when `now` is given."""
        if now is not None:
            created = self._existing_created_at(where.table, where.id_column, tenant_id, item_id)
            item = msgspec.structs.replace(item, created_at=created or getattr(item, "created_at", None) or now, updated_at=now)
        columns = {"tenant_id": tenant_id, where.id_column: item_id, "doc": _encode(item), **(extra or {})}
        names = ", ".join(columns)
        marks = ", ".join("?" for _ in columns)
        updates = ", ".join(f"{name} = excluded.{name}" for name in columns if name not in ("tenant_id", where.id_column))
        self._conn.execute(
            f"INSERT INTO {where.table}({names}) VALUES ({marks})"
            f" ON CONFLICT(tenant_id, {where.id_column}) DO UPDATE SET {updates}",
            list(columns.values()),
        )

    def list_docs(self, where: _DocTable, tenant_id: str) -> list[bytes]:
        return [
            doc for (doc,) in self._conn.execute(
                f"SELECT doc FROM {where.table} WHERE tenant_id = ? ORDER BY {where.id_column}", (tenant_id,)
            )
        ]

    def load_docs(self, where: _DocTable, tenant_id: str) -> list[Any]:
        decoder = msgspec.json.Decoder(where.kind)
        return [decoder.decode(doc) for doc in self.list_docs(where, tenant_id)]

    def get_doc(self, where: _DocTable, tenant_id: str, item_id: str) -> Any | None:
        found = self._conn.execute(
            f"SELECT doc FROM {where.table} WHERE tenant_id = ? AND {where.id_column} = ?", (tenant_id, item_id)
        ).fetchone()
        return msgspec.json.decode(found[0], type=where.kind) if found else None

    def delete_doc(self, where: _DocTable, tenant_id: str, item_id: str) -> bool:
        self._conn.execute(f"DELETE FROM {where.table} WHERE tenant_id = ? AND {where.id_column} = ?",
                           (tenant_id, item_id))
        return self._conn.changes() > 0

    def tenants_with_docs(self, where: _DocTable) -> list[str]:
        return [t for (t,) in self._conn.execute(f"SELECT DISTINCT tenant_id FROM {where.table} ORDER BY tenant_id")]

    def doc_ids(self, where: _DocTable, tenant_id: str) -> set[str]:
        return {
            item_id for (item_id,) in self._conn.execute(
                f"SELECT {where.id_column} FROM {where.table} WHERE tenant_id = ?", (tenant_id,)
            )
        }

    def upsert_field(self, tenant_id: str, entry: FieldLibraryEntry, now: str) -> None:
        self.upsert_doc(FIELD_LIBRARY, tenant_id, entry.key, entry, now,
                        extra={"category": entry.category, "active": int(entry.active), "label": entry.label})

    def list_fields(self, tenant_id: str, *, category: str | None, active: bool | None,
                    search: str | None) -> list[bytes]:
        clauses, params = ["tenant_id = ?"], [tenant_id]
        if category is not None:
            clauses.append("category = ?")
            params.append(category)
        if active is not None:
            clauses.append("active = ?")
            params.append(int(active))
        if search:
            # LIKE is case-insensitive for ASCII; lower() on both sides covers the rest of Unicode.
            clauses.append("(lower(key) LIKE lower(?) ESCAPE '\\' OR lower(label) LIKE lower(?) ESCAPE '\\')")
            params.extend([_like(search)] * 2)
        return [
            doc for (doc,) in self._conn.execute(
                f"SELECT doc FROM field_library WHERE {' AND '.join(clauses)} ORDER BY key", params
            )
        ]

    def get_field(self, tenant_id: str, key: str) -> bytes | None:
        found = self._conn.execute("SELECT doc FROM field_library WHERE tenant_id = ? AND key = ?", (tenant_id, key)).fetchone()
        return found[0] if found else None

    def put_sms_config(self, tenant_id: str, sms: SmsConfig) -> None:
        self._conn.execute(
            "INSERT INTO sms_settings(tenant_id, doc) VALUES (?, ?)"
            " ON CONFLICT(tenant_id) DO UPDATE SET doc = excluded.doc",
            (tenant_id, _encode(sms)),
        )

    def get_sms_config(self, tenant_id: str) -> SmsConfig | None:
        found = self._conn.execute("SELECT doc FROM sms_settings WHERE tenant_id = ?", (tenant_id,)).fetchone()
        return _sms_config(bytes(found[0])) if found else None

    def get_pixel(self, tenant_id: str, pixel_id: str) -> Pixel | None:
        found = self._conn.execute("SELECT doc FROM pixels WHERE tenant_id = ? AND pixel_id = ?",
                                   (tenant_id, pixel_id)).fetchone()
        return _pixel_decoder.decode(found[0]) if found else None
