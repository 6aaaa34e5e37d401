"""Tenants and their API keys."""

from __future__ import annotations

from typing import NamedTuple

import apsw
import msgspec

from appliance.domain.tenant_options import TenantOptions
from appliance.ids import new_id


class Principal(NamedTuple):
    """Who makes a request: an API key (kind `tenant` or `source`), a signed-in user (`user`), or
    the command line (`cli`, a CSV import run by `appliance import-leads`)."""

    id: str  # the key's id, or the user's
    tenant_id: str
    kind: str
    source_id: str | None
    config_rev: int  # the tenant's, read with the key so config caches check freshness for free
    role: str = "admin"

    @property
    def actor(self) -> str:
        """How records name who did something: `user:<userId>` or `key:<keyId>` (`cli` for the CLI)."""
        if self.kind == "user":
            return "user:" + self.id
        return "cli" if self.kind == "cli" else "key:" + self.id


class KeyListing(NamedTuple):
    key_id: str
    name: str
    kind: str
    role: str
    source_id: str | None
    prefix: str
    created_at: str
    revoked_at: str | None
    last_used_at: str | None


class Tenants:
    """Tenants, their configuration revision and their API keys."""

    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def create_tenant(self, name: str, now: str) -> str:
        tenant_id = new_id("tnt")
        self._conn.execute(
            "INSERT INTO tenants(tenant_id, name, created_at) VALUES (?, ?, ?)", (tenant_id, name, now)
        )
        return tenant_id

    def list_tenants(self) -> list[tuple[str, str, str]]:
        return self._conn.execute("SELECT tenant_id, name, created_at FROM tenants ORDER BY tenant_id").fetchall()

    def tenant_exists(self, tenant_id: str) -> bool:
        return self._conn.execute("SELECT 1 FROM tenants WHERE tenant_id = ?", (tenant_id,)).fetchone() is not None

    def settings(self, tenant_id: str) -> TenantOptions:
        found = self._conn.execute("SELECT settings FROM tenants WHERE tenant_id = ?", (tenant_id,)).fetchone()
        return msgspec.json.decode(found[0], type=TenantOptions) if found else TenantOptions()

    def put_settings(self, tenant_id: str, options: TenantOptions) -> None:
        self._conn.execute("UPDATE tenants SET settings = ? WHERE tenant_id = ?",
                           (msgspec.json.encode(options).decode(), tenant_id))

    def bump_config_rev(self, tenant_id: str) -> None:
        self._conn.execute("UPDATE tenants SET config_rev = config_rev + 1 WHERE tenant_id = ?", (tenant_id,))

    def config_rev(self, tenant_id: str) -> int:
        found = self._conn.execute("SELECT config_rev FROM tenants WHERE tenant_id = ?", (tenant_id,)).fetchone()
        return found[0] if found else -1

    def insert_key(
        self,
        *,
        tenant_id: str,
        name: str,
        kind: str,
        source_id: str | None,
        prefix: str,
        key_hash: bytes,
        now: str,
        role: str = "admin",
    ) -> str:
        key_id = new_id("key")
        self._conn.execute(
            "INSERT INTO api_keys(key_id, tenant_id, name, kind, source_id, prefix, key_hash, created_at, role)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (key_id, tenant_id, name, kind, source_id, prefix, key_hash, now, role),
        )
        return key_id

    def find_active_key(self, key_hash: bytes) -> Principal | None:
        found = self._conn.execute(
            "SELECT k.key_id, k.tenant_id, k.kind, k.source_id, t.config_rev, k.role FROM api_keys k"
            " JOIN tenants t ON t.tenant_id = k.tenant_id WHERE k.key_hash = ? AND k.revoked_at IS NULL",
            (key_hash,),
        ).fetchone()
        return Principal(*found) if found else None

    def list_keys(self, tenant_id: str) -> list[KeyListing]:
        return [
            KeyListing(*row)
            for row in self._conn.execute(
                "SELECT key_id, name, kind, role, source_id, prefix, created_at, revoked_at, last_used_at"
                " FROM api_keys WHERE tenant_id = ? ORDER BY created_at, key_id",
                (tenant_id,),
            )
        ]

    def revoke_key(self, key_id: str, now: str) -> bool:
        self._conn.execute(
            "UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL", (now, key_id)
        )
        return self._conn.changes() > 0

    def key_tenant(self, key_id: str) -> str | None:
        found = self._conn.execute("SELECT tenant_id FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
        return found[0] if found else None

    def key_id_by_hash(self, key_hash: bytes) -> str | None:
        found = self._conn.execute("SELECT key_id FROM api_keys WHERE key_hash = ?", (key_hash,)).fetchone()
        return found[0] if found else None

    def key_owner_by_hash(self, key_hash: bytes) -> tuple[str, str | None] | None:
        """(tenant, source) of the key with this hash, live or revoked."""
        found = self._conn.execute("SELECT tenant_id, source_id FROM api_keys WHERE key_hash = ?", (key_hash,)).fetchone()
        return tuple(found) if found else None

    def source_key_prefixes(self, tenant_id: str) -> dict[str, str]:
        """sourceId -> prefix of its newest live key, for the `keyPrefix` campaigns show."""
        return {
            source_id: prefix
            for source_id, prefix in self._conn.execute(
                "SELECT source_id, prefix FROM api_keys WHERE tenant_id = ? AND kind = 'source'"
                " AND revoked_at IS NULL ORDER BY created_at",
                (tenant_id,),
            )
        }
