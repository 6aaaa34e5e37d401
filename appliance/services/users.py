"""People of a tenant (CONTRACT 9.3): users with a role, created by an admin (or the CLI) with a
one-time setup link where they choose their password; changed, disabled, and signed in to the
console by email and password (services/console.py holds the sessions). Every change is in the
audit log in its own transaction, and no password or link token is ever in an answer, a log
line or the audit log: a link is shown once, to whoever created it."""

from __future__ import annotations

import hashlib
import secrets
import socket
from datetime import datetime, timedelta
from typing import Literal

import msgspec

from appliance import passwords
from appliance.clock import iso
from appliance.domain.normalize import is_valid_email, normalize_email
from appliance.domain.permissions import OWNER, PARTY_ROLES, ROLES, may_manage
from appliance.errors import Forbidden, InvalidState, NotFound, ValidationFailed
from appliance.ids import new_id
from appliance.model import Model
from appliance.runtime import Runtime
from appliance.services import audit, sign_in_throttle
from appliance.storage import CLIENTS, Session, UserRecord

SETUP_LIFETIME = timedelta(hours=24)
SETUP_KEPT = timedelta(days=7)  # a used or expired setup link is kept this long, then purged
SETUP_PATH = "/admin/setup/"
MAX_NAME = 200
MAX_ID = 100
Role = Literal[ROLES]  # type: ignore[valid-type] - the roles of domain/permissions.py


class User(Model):
    user_id: str
    email: str
    name: str
    role: str
    client_id: str | None = None
    supplier_id: str | None = None
    active: bool
    two_factor: bool
    created_at: str
    last_sign_in_at: str | None = None


class CreatedUser(User):
    setup_url: str  # shown this once


class UserPage(Model):
    items: list[User]
    next_cursor: str | None
    has_more: bool


class NewUser(Model):
    email: str
    name: str = ""
    role: Role
    client_id: str | None = None
    supplier_id: str | None = None


class UserChange(Model):
    name: str | None = None
    role: Role | None = None
    active: bool | None = None


class SetupLink(Model):
    user_id: str
    email: str
    setup_url: str


def view(record: UserRecord) -> User:
    return User(user_id=record.user_id, email=record.email, name=record.name, role=record.role,
                client_id=record.client_id, supplier_id=record.supplier_id, active=record.active,
                two_factor=record.totp_secret is not None, created_at=record.created_at,
                last_sign_in_at=record.last_sign_in_at)


def _shown(record: UserRecord) -> dict:
    """What the audit log keeps of a user: never its password hash, secrets or codes."""
    return msgspec.to_builtins(view(record))


def token_digest(token: str) -> bytes:
    """How setup links' and sessions' tokens are stored: only their SHA-256."""
    return hashlib.sha256(token.encode()).digest()


def base_url(runtime: Runtime) -> str:
    """Where people reach this server: `[server] public_url`, else its own scheme, host and port
    (a wildcard host named by the machine's name)."""
    server = runtime.config.server
    if server.public_url:
        return server.public_url.rstrip("/")
    host = server.host
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    elif ":" in host:
        host = f"[{host}]"
    return f"{'https' if server.tls else 'http'}://{host}:{server.port}"


def _checked_new(body: NewUser) -> NewUser:
    problems = []
    email = normalize_email(body.email)
    if not is_valid_email(email):
        problems.append("email: must be an email address")
    if len(body.name) > MAX_NAME:
        problems.append(f"name: must be at most {MAX_NAME} characters")
    if body.role == "buyer" and not body.client_id:
        problems.append("clientId: a buyer user needs the clientId of its buyer")
    if body.role == "supplier" and not body.supplier_id:
        problems.append("supplierId: a supplier user needs the supplierId of its source")
    if body.client_id is not None and body.role != "buyer":
        problems.append("clientId: only a buyer user has one")
    if body.supplier_id is not None and body.role != "supplier":
        problems.append("supplierId: only a supplier user has one")
    for name, value in (("clientId", body.client_id), ("supplierId", body.supplier_id)):
        if value is not None and not 1 <= len(value) <= MAX_ID:
            problems.append(f"{name}: must be 1 to {MAX_ID} characters")
    if problems:
        raise ValidationFailed(problems)
    return msgspec.structs.replace(body, email=email)


def _check_party(tx: Session, tenant_id: str, body: NewUser) -> None:
    """A buyer's client and a supplier must be the tenant's: a client record or a campaign's
    client; a supplier named by a source's `supplierId`, or by its `sourceId` when it names none."""
    campaigns = tx.catalog.all_campaigns(tenant_id)
    if body.client_id is not None and body.client_id not in {c.client.client_id for c in campaigns if c.client} \
            and tx.catalog.get_doc(CLIENTS, tenant_id, body.client_id) is None:
        raise ValidationFailed(["clientId: the tenant has no client record or campaign of this client"])
    if body.supplier_id is not None and body.supplier_id not in {
            s.supplier_id or s.source_id for c in campaigns for s in c.ingestion.sources}:
        raise ValidationFailed(["supplierId: no campaign of this tenant has an ingestion source of this supplier"])


def _may(actor_role: str | None, target_role: str, what: str) -> None:
    """403 unless the actor may manage users of `target_role` (the CLI, role None, may all)."""
    if actor_role is not None and not may_manage(actor_role, target_role):
        raise Forbidden([f"role: {what} a user of role {target_role} needs the owner role"],
                        message=f"Only an owner may {what} a user of role {target_role}")


def _new_link(tx: Session, runtime: Runtime, user_id: str, now: datetime) -> str:
    token = secrets.token_urlsafe(32)
    tx.users.insert_setup_token(token_digest(token), user_id, iso(now), iso(now + SETUP_LIFETIME))
    return base_url(runtime) + SETUP_PATH + token


async def create(runtime: Runtime, tenant_id: str, actor: str, actor_role: str | None, body: NewUser) -> CreatedUser:
    body = _checked_new(body)
    _may(actor_role, body.role, "create")
    now = runtime.clock.now()
    user_id = new_id("usr")

    def unit(tx: Session) -> CreatedUser:
        if tx.users.by_email(tenant_id, body.email) is not None:
            raise ValidationFailed(["email: a user of this tenant already has this address"])
        _check_party(tx, tenant_id, body)
        tx.users.insert(user_id, tenant_id, body.email, body.name, body.role, body.client_id, body.supplier_id,
                        iso(now))
        url = _new_link(tx, runtime, user_id, now)
        record = tx.users.get(tenant_id, user_id)
        audit.record(tx, tenant_id, actor, "user.create", user_id, iso(now), after=_shown(record))
        return CreatedUser(**msgspec.structs.asdict(view(record)), setup_url=url)

    return await runtime.store.write(unit, may_refuse=True)


def page(runtime: Runtime, tenant_id: str, after: str | None, limit: int) -> UserPage:
    rows = runtime.store.reader().users.page(tenant_id, after, limit + 1)
    items = [view(row) for row in rows[:limit]]
    more = len(rows) > limit
    return UserPage(items=items, next_cursor=items[-1].user_id if more else None, has_more=more)


def get(runtime: Runtime, tenant_id: str, user_id: str) -> User:
    record = runtime.store.reader().users.get(tenant_id, user_id)
    if record is None:
        raise NotFound()
    return view(record)


def _find(tx: Session, tenant_id: str, user_id: str | None, email: str | None) -> UserRecord:
    record = (tx.users.get(tenant_id, user_id) if user_id is not None
              else tx.users.by_email(tenant_id, normalize_email(email or "")))
    if record is None:
        raise NotFound()
    return record


async def change(runtime: Runtime, tenant_id: str, actor: str, actor_role: str | None, user_id: str,
                 body: UserChange) -> User:
    """Name, role or active flag. Disabling ends the user's sessions. An admin cannot touch an
    owner or make one; nobody leaves the tenant without an active owner (409)."""
    if body.name is not None and len(body.name) > MAX_NAME:
        raise ValidationFailed([f"name: must be at most {MAX_NAME} characters"])
    now = iso(runtime.clock.now())

    def unit(tx: Session) -> User:
        record = _find(tx, tenant_id, user_id, None)
        role = body.role if body.role is not None else record.role
        active = body.active if body.active is not None else record.active
        _may(actor_role, record.role, "change")
        _may(actor_role, role, "change")
        if role != record.role and (role in PARTY_ROLES or record.role in PARTY_ROLES):
            # a party's user is bound to its client or source: another party or staff is another person
            raise ValidationFailed([f"role: a {record.role} user cannot become a {role}: create a user instead"])
        if record.role == OWNER and record.active and (role != OWNER or not active) \
                and tx.users.count_active_owners(tenant_id) <= 1:
            raise InvalidState(["role: the tenant's last active owner cannot be demoted or disabled"],
                               message="This is the tenant's last active owner: make another owner first")
        tx.users.update(record.user_id, name=body.name if body.name is not None else record.name, role=role,
                        active=active)
        if not active or role != record.role:
            tx.console_sessions.delete_of_user(record.user_id)  # its sessions carried the old rights
        changed = tx.users.get(tenant_id, record.user_id)
        action = "user.disable" if record.active and not active else "user.enable" if active and not record.active \
            else "user.update"
        audit.record(tx, tenant_id, actor, action, record.user_id, now, before=_shown(record), after=_shown(changed))
        return view(changed)

    return await runtime.store.write(unit, may_refuse=True)


async def disable(runtime: Runtime, tenant_id: str, actor: str, actor_role: str | None, user_id: str) -> User:
    return await change(runtime, tenant_id, actor, actor_role, user_id, UserChange(active=False))


async def reset_password(runtime: Runtime, tenant_id: str, actor: str, actor_role: str | None, *,
                         user_id: str | None = None, email: str | None = None) -> SetupLink:
    """A new setup link; the old password and two-factor stop working and the user's sessions
    end, so a suspected leak is closed at once."""
    now = runtime.clock.now()

    def unit(tx: Session) -> SetupLink:
        record = _find(tx, tenant_id, user_id, email)
        _may(actor_role, record.role, "reset the password of")
        tx.users.set_password(record.user_id, None)
        # Two-factor too: a person who lost the phone is reset this way, and enrols again.
        tx.users.set_two_factor(record.user_id, secret=None, pending=None, last_step=None, recovery_codes="[]")
        tx.console_sessions.delete_of_user(record.user_id)
        url = _new_link(tx, runtime, record.user_id, now)
        audit.record(tx, tenant_id, actor, "user.reset_password", record.user_id, iso(now))
        return SetupLink(user_id=record.user_id, email=record.email, setup_url=url)

    return await runtime.store.write(unit, may_refuse=True)


def purge_stale(tx: Session, now: datetime) -> int:
    """Expired console sessions, spent setup links and forgotten throttle counts (the ticker's)."""
    return (tx.console_sessions.purge_expired(iso(now)) + tx.users.purge_setup_tokens(iso(now - SETUP_KEPT))
            + sign_in_throttle.purge(tx, now))


# ---- the setup link ------------------------------------------------------------------------------

def setup_user(runtime: Runtime, token: str) -> UserRecord | None:
    """The user a setup link is for, while it is unused, unexpired and the user active."""
    found = runtime.store.reader().users.setup_token(token_digest(token)) if 20 <= len(token) <= 100 else None
    if found is None:
        return None
    user_id, expires_at, used_at = found
    if used_at is not None or expires_at <= iso(runtime.clock.now()):
        return None
    record = runtime.store.reader().users.get_any(user_id)
    return record if record is not None and record.active else None


async def choose_password(runtime: Runtime, token: str, password: str, repeated: str) -> UserRecord:
    """Set the password of a setup link's user (the link then works no more) and end the user's
    sessions. ValidationFailed names `password` or `token`."""
    if password != repeated:
        raise ValidationFailed(["password: the two entries differ"])
    problem = passwords.problem(password)
    if problem is not None:
        raise ValidationFailed([f"password: {problem}"])
    if setup_user(runtime, token) is None:
        raise ValidationFailed(["token: this setup link is unknown, used or expired; ask an admin for a new one"])
    hashed = await passwords.hash_async(password)
    now = iso(runtime.clock.now())

    def unit(tx: Session) -> UserRecord:
        found = tx.users.setup_token(token_digest(token))
        if found is None or not tx.users.use_setup_token(token_digest(token), now):
            raise ValidationFailed(["token: this setup link is unknown, used or expired; ask an admin for a new one"])
        record = tx.users.get_any(found[0])
        if not record.active:  # disabled since the link was checked
            raise ValidationFailed(["token: this setup link is unknown, used or expired; ask an admin for a new one"])
        tx.users.set_password(record.user_id, hashed)
        tx.console_sessions.delete_of_user(record.user_id)
        audit.record(tx, record.tenant_id, "user:" + record.user_id, "user.set_password", record.user_id, now)
        return record

    return await runtime.store.write(unit, may_refuse=True)
