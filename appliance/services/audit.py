"""The audit trail of CONTRACT 9.3: every change names its actor (`user:<userId>`, `key:<keyId>`,
or `cli` for the command line) and appends an entry in the same transaction as the change, so
the log holds exactly the changes that committed. `before` and `after` are JSON documents with
every secret-looking member masked: the log is read by admins who must not learn a password,
a key or a token from it."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import msgspec

from appliance import logs
from appliance.clock import iso
from appliance.ids import new_id
from appliance.model import Model
from appliance.runtime import Runtime
from appliance.storage import AuditFilter, AuditRow, Session

MASK = "********"
CLI = "cli"  # the actor of every change made with the command line
ANONYMOUS = "anonymous"  # the actor of a failed sign-in: whoever tried is not known
# Members whose values are credentials wherever they appear (matched on the name, any case). The
# bundle's own secret fields (auth.password, auth.token, a source's apiKey, an SMS provider's
# authToken and apiKey, a pixel's accessToken, a webhook's secret) are all caught by it; imports
# also split them off before anything is stored (services/bundle.split_secrets).
_SECRET_NAME = re.compile(r"(secret|password|passwd|token|api_?key|apikey|auth|credential|signature|private|"
                          r"recovery|totp|cookie|session|ciphertext|encrypted)", re.IGNORECASE)
# Names that match but hold no secret: header names, paths, kinds.
_SAFE_NAMES = frozenset(("authType", "pingTokenPath", "tokenPath", "auth_type", "secretHeaders"))


def masked(value: Any) -> Any:
    """`value` (plain JSON data) with the value of every secret-looking member replaced by MASK.
    An object under such a name is a group (an endpoint's `auth`, a campaign's `recovery`): its
    own members are masked by their names, so `auth.username` stays readable and `auth.password`
    does not."""
    if isinstance(value, dict):
        return {k: (MASK if v is not None and not isinstance(v, dict) and k not in _SAFE_NAMES
                    and _SECRET_NAME.search(k) else masked(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [masked(item) for item in value]
    return value


def _json(value: Any) -> str | None:
    if value is None:
        return None
    return msgspec.json.encode(masked(msgspec.to_builtins(value))).decode()


def record(tx: Session, tenant_id: str, actor: str, action: str, target: str | None, at: str, *,
           before: Any = None, after: Any = None) -> None:
    """Append one entry inside the caller's unit of work. The request's address and id come
    from the request being served (none for the CLI and background work)."""
    request_id, ip = logs.request_origin()
    tx.audit.append(tenant_id, new_id("aud"), at, actor, action, target, _json(before), _json(after), ip,
                    request_id)


class AuditEntry(Model):
    audit_id: str
    at: str
    actor: str                     # user:<userId>, key:<keyId> or cli
    action: str                    # dotted: lead.approve, webhook.update, bundle.campaign.create...
    target: str | None             # the id of what changed
    before: dict[str, Any] | None  # secret-looking members masked
    after: dict[str, Any] | None
    ip: str | None                 # the request's client address; null for the CLI
    request_id: str | None


class AuditPage(Model):
    items: list[AuditEntry]
    next_cursor: str | None
    has_more: bool


def _entry(row: AuditRow) -> AuditEntry:
    return AuditEntry(audit_id=row.audit_id, at=row.at, actor=row.actor, action=row.action, target=row.target,
                      before=msgspec.json.decode(row.before) if row.before is not None else None,
                      after=msgspec.json.decode(row.after) if row.after is not None else None,
                      ip=row.ip, request_id=row.request_id)


async def page(runtime: Runtime, tenant_id: str, where: AuditFilter, before: int | None, limit: int) -> AuditPage:
    """Newest first; the cursor is the position of the previous page's last entry in the log."""
    rows = await runtime.store.read_off_loop(lambda tx: tx.audit.page(tenant_id, where, before, limit + 1))
    more = len(rows) > limit
    return AuditPage(items=[_entry(row) for row in rows[:limit]],
                     next_cursor=str(rows[limit - 1].seq) if more else None, has_more=more)


async def purge_old(runtime: Runtime) -> int:
    """Entries older than `[retention] audit_days`."""
    before = iso(runtime.clock.now() - timedelta(days=runtime.config.retention.audit_days))
    return await runtime.store.write(lambda tx: tx.audit.purge(before))
