"""Two-factor sign-in (CONTRACT 9.3): TOTP (RFC 6238: 30 s steps, 6 digits, SHA-1, as every
authenticator app reads an `otpauth://totp/` URI) through pyotp, with a QR code drawn by segno
inside the install, and 10 one-time recovery codes. The secret is sealed with the master key
like every stored credential; a code is accepted once (its time step is remembered), a
recovery code once (74 random bits; only its SHA-256 HMAC under the user's id is kept, dropped
when used). Codes at sign-in are throttled like passwords (services/sign_in_throttle.py), per
person (`code:<userId>`: a password sign-in does not clear it) and per client."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

import msgspec
import pyotp
import segno

from appliance.clock import iso
from appliance.domain.tenant_options import owes_enrolment
from appliance.errors import InvalidState, ValidationFailed
from appliance.runtime import Runtime
from appliance.services import audit, sign_in_throttle
from appliance.services.console import LIVE, SESSION_LIFETIME
from appliance.storage import ConsoleSessionRecord, Session, UserRecord

ISSUER = "Lead appliance"
RECOVERY_CODES = 10
STEP_SECONDS = 30
_RECOVERY_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"  # no 0/o, 1/l/i: typed by hand from paper


@dataclass(frozen=True)
class Enrolment:
    uri: str      # otpauth://totp/...
    qr_svg: str   # the same URI as an inline SVG QR code
    secret: str   # for typing in by hand


@dataclass(frozen=True)
class CodeCheck:
    """A sign-in's second step: passed, refused, or refused until `wait` seconds pass."""

    passed: bool = False
    wait: int | None = None


def _owner(user_id: str) -> str:
    return f"user:{user_id}:totp"


def _hash(user_id: str, code: str) -> str:
    return hmac.new(user_id.encode(), code.encode(), hashlib.sha256).hexdigest()


def _normalized(code: str) -> str:
    return "".join(code.split()).replace("-", "").lower()[:64]


def _matching_step(secret: str, code: str, now: float, after_step: int | None) -> int | None:
    """The time step (this one, or one either side for clock drift) whose code `code` is, if it
    is later than `after_step` (a code is good once)."""
    if not (len(code) == 6 and code.isdigit()):
        return None
    totp = pyotp.TOTP(secret)
    current = int(now // STEP_SECONDS)
    for step in (current - 1, current, current + 1):
        if (after_step is None or step > after_step) and hmac.compare_digest(totp.at(step * STEP_SECONDS), code):
            return step
    return None


def _recovery_left(user: UserRecord, code: str) -> list[str] | None:
    """The user's unused recovery codes without `code`, or None when `code` is not one of them."""
    hashes: list[str] = msgspec.json.decode(user.recovery_codes)
    digest = _hash(user.user_id, code)
    if not any(hmac.compare_digest(digest, h) for h in hashes):
        return None
    return [h for h in hashes if h != digest]


async def begin(runtime: Runtime, found: ConsoleSessionRecord) -> Enrolment:
    """The secret being enrolled: the pending one (the page shown again, in another tab), else a
    new one, pending until a code made from it is confirmed."""
    user = runtime.store.reader().users.get(found.tenant_id, found.user_id)
    if user.totp_pending is not None:
        secret = runtime.box.open_bytes(user.totp_pending, _owner(user.user_id))
    else:
        secret = pyotp.random_base32()
        sealed = runtime.box.seal_bytes(secret, _owner(found.user_id))

        def unit(tx: Session) -> None:
            current = tx.users.get(found.tenant_id, found.user_id)
            tx.users.set_two_factor(current.user_id, secret=current.totp_secret, pending=sealed,
                                    last_step=current.totp_last_step, recovery_codes=current.recovery_codes)

        await runtime.store.write(unit)
    uri = pyotp.TOTP(secret).provisioning_uri(name=found.email, issuer_name=ISSUER)
    qr = segno.make(uri, error="m").svg_inline(scale=4, border=2, dark="#000", light="#fff")
    return Enrolment(uri, qr, secret)


async def confirm(runtime: Runtime, found: ConsoleSessionRecord, code: str, session_hash: bytes) -> list[str]:
    """Turn two-factor on with a code from the pending secret; returns the 10 recovery codes
    (shown once). A session that owed enrolment becomes live."""
    user = runtime.store.reader().users.get(found.tenant_id, found.user_id)
    if user is None or user.totp_pending is None:
        raise InvalidState(["code: start the enrolment again"], message="There is no enrolment under way")
    secret = runtime.box.open_bytes(user.totp_pending, _owner(user.user_id))
    step = _matching_step(secret, _normalized(code), runtime.clock.now().timestamp(), None)
    if step is None:
        raise ValidationFailed(["code: not the current code of the authenticator app; check its clock and try again"])
    codes = ["-".join("".join(secrets.choice(_RECOVERY_ALPHABET) for _ in range(5)) for _ in range(3))
             for _ in range(RECOVERY_CODES)]
    now_dt = runtime.clock.now()
    now = iso(now_dt)

    def unit(tx: Session) -> None:
        tx.users.set_two_factor(user.user_id, secret=user.totp_pending, pending=None, last_step=step,
                                recovery_codes=msgspec.json.encode([_hash(user.user_id, _normalized(c))
                                                                    for c in codes]).decode())
        if found.stage != LIVE:
            tx.console_sessions.set_stage(session_hash, LIVE, iso(now_dt + SESSION_LIFETIME))
            tx.users.signed_in(user.user_id, now)
        audit.record(tx, user.tenant_id, "user:" + user.user_id, "user.two_factor_on", user.user_id, now)

    await runtime.store.write(unit)
    return codes


async def check(runtime: Runtime, found: ConsoleSessionRecord, code: str, address: str | None,
                session_hash: bytes) -> CodeCheck:
    """The second step of a sign-in: a current TOTP code not used before, or an unused recovery
    code. Passing makes the session live. The throttle is asked, and the try counted, in the
    same unit that checks the code."""
    code = _normalized(code)
    now_dt = runtime.clock.now()
    now = iso(now_dt)
    names = sign_in_throttle.subjects(f"code:{found.user_id}", address)

    def unit(tx: Session) -> CodeCheck:
        wait = sign_in_throttle.attempt(tx, names, now_dt)
        if wait is not None:
            return CodeCheck(wait=wait)
        user = tx.users.get(found.tenant_id, found.user_id)  # as of this transaction: a code works once
        secret = runtime.box.open_bytes(user.totp_secret, _owner(user.user_id)) if user.totp_secret else None
        step = _matching_step(secret, code, now_dt.timestamp(), user.totp_last_step) if secret else None
        left = _recovery_left(user, code) if step is None else None
        if step is None and left is None:
            audit.record(tx, user.tenant_id, "user:" + user.user_id, "user.sign_in_failed", user.user_id, now,
                         after={"step": "code"})
            return CodeCheck()
        sign_in_throttle.succeeded(tx, names, now_dt)
        tx.users.set_two_factor(user.user_id, secret=user.totp_secret, pending=user.totp_pending,
                                last_step=step if step is not None else user.totp_last_step,
                                recovery_codes=user.recovery_codes if left is None
                                else msgspec.json.encode(left).decode())
        tx.console_sessions.set_stage(session_hash, LIVE, iso(now_dt + SESSION_LIFETIME))
        tx.users.signed_in(user.user_id, now)
        audit.record(tx, user.tenant_id, "user:" + user.user_id, "user.sign_in_code", user.user_id, now,
                     after={"with": "recovery code" if step is None else "authenticator",
                            **({"codesLeft": len(left)} if left is not None else {})})
        return CodeCheck(passed=True)

    return await runtime.store.write(unit)


async def turn_off(runtime: Runtime, found: ConsoleSessionRecord, code: str) -> None:
    """Two-factor off, proven with a current code or a recovery code; refused (409) where the
    tenant requires it."""
    user = runtime.store.reader().users.get(found.tenant_id, found.user_id)
    if user is None or user.totp_secret is None:
        raise InvalidState(message="Two-factor sign-in is not on")
    if owes_enrolment(runtime.store.reader().tenants.settings(user.tenant_id), user.role, enrolled=False):
        raise InvalidState(message="Your agency requires two-factor sign-in: it cannot be turned off")
    secret = runtime.box.open_bytes(user.totp_secret, _owner(user.user_id))
    code = _normalized(code)
    now_dt = runtime.clock.now()

    def unit(tx: Session) -> None:
        current = tx.users.get(found.tenant_id, found.user_id)
        if _matching_step(secret, code, now_dt.timestamp(), current.totp_last_step) is None \
                and _recovery_left(current, code) is None:
            raise ValidationFailed(["code: not a current code or an unused recovery code"])
        tx.users.set_two_factor(current.user_id, secret=None, pending=None, last_step=None, recovery_codes="[]")
        audit.record(tx, current.tenant_id, "user:" + current.user_id, "user.two_factor_off", current.user_id,
                     iso(now_dt))

    await runtime.store.write(unit, may_refuse=True)
