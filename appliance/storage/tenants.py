"""Tenants and their API keys."""

from __future__ import annotations

from typing import NamedTuple

import apsw

from appliance.ids import new_id


class KeyRecord(NamedTuple):
    key_id: str
    tenant_id: str
    kind: str
    source_id: str | None
    config_rev: int  # the tenant's, read with the key so config caches check freshness for free


class KeyListing(NamedTuple):
    key_id: str
    name: str
    kind: str
    source_id: str | None
    prefix: str
    created_at: str
    revoked_at: str | None
    last_used_at: str | None


def create_tenant(conn: apsw.Connection, name: str, now: str) -> str:
    tenant_id = new_id("tnt")
    conn.execute(
        "INSERT INTO tenants(tenant_id, name, created_at) VALUES (?, ?, ?)", (tenant_id, name, now)
    )
    return tenant_id


def list_tenants(conn: apsw.Connection) -> list[tuple[str, str, str]]:
    return conn.execute("SELECT tenant_id, name, created_at FROM tenants ORDER BY tenant_id").fetchall()


def tenant_exists(conn: apsw.Connection, tenant_id: str) -> bool:
    return conn.execute("SELECT 1 FROM tenants WHERE tenant_id = ?", (tenant_id,)).fetchone() is not None


def bump_config_rev(conn: apsw.Connection, tenant_id: str) -> None:
    conn.execute("UPDATE tenants SET config_rev = config_rev + 1 WHERE tenant_id = ?", (tenant_id,))


def config_rev(conn: apsw.Connection, tenant_id: str) -> int:
    found = conn.execute("SELECT config_rev FROM tenants WHERE tenant_id = ?", (tenant_id,)).fetchone()
    return found[0] if found else -1


def insert_key(
    conn: apsw.Connection,
    *,
    tenant_id: str,
    name: str,
    kind: str,
    source_id: str | None,
    prefix: str,
    key_hash: bytes,
    now: str,
) -> str:
    key_id = new_id("key")
    conn.execute(
        "INSERT INTO api_keys(key_id, tenant_id, name, kind, source_id, prefix, key_hash, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (key_id, tenant_id, name, kind, source_id, prefix, key_hash, now),
    )
    return key_id


def find_active_key(conn: apsw.Connection, key_hash: bytes) -> KeyRecord | None:
    found = conn.execute(
        "SELECT k.key_id, k.tenant_id, k.kind, k.source_id, t.config_rev FROM api_keys k"
        " JOIN tenants t ON t.tenant_id = k.tenant_id WHERE k.key_hash = ? AND k.revoked_at IS NULL",
        (key_hash,),
    ).fetchone()
    return KeyRecord(*found) if found else None


def list_keys(conn: apsw.Connection, tenant_id: str) -> list[KeyListing]:
    return [
        KeyListing(*row)
        for row in conn.execute(
            "SELECT key_id, name, kind, source_id, prefix, created_at, revoked_at, last_used_at"
            " FROM api_keys WHERE tenant_id = ? ORDER BY created_at, key_id",
            (tenant_id,),
        )
    ]


def revoke_key(conn: apsw.Connection, key_id: str, now: str) -> bool:
    conn.execute(
        "UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL", (now, key_id)
    )
    return conn.changes() > 0


def key_tenant(conn: apsw.Connection, key_id: str) -> str | None:
    found = conn.execute("SELECT tenant_id FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
    return found[0] if found else None


def key_owner_by_hash(conn: apsw.Connection, key_hash: bytes) -> tuple[str, str | None] | None:
    """(tenant, source) of the key with this hash, live or revoked."""
    found = conn.execute("SELECT tenant_id, source_id FROM api_keys WHERE key_hash = ?", (key_hash,)).fetchone()
    return tuple(found) if found else None


def source_key_prefixes(conn: apsw.Connection, tenant_id: str) -> dict[str, str]:
    """sourceId -> prefix of its newest live key, for the `keyPrefix` campaigns show."""
    return {
        source_id: prefix
        for source_id, prefix in conn.execute(
            "SELECT source_id, prefix FROM api_keys WHERE tenant_id = ? AND kind = 'source'"
            " AND revoked_at IS NULL ORDER BY created_at",
            (tenant_id,),
        )
    }
