"""Who is signed in to the console, and the checks every console request passes: a live session
cookie (a guard on every page but sign-in), the CSRF token of every form, and the headers that
keep the pages out of frames, caches and other origins' scripts (HEADERS, or TLS_HEADERS over
TLS: the app's edge puts them on every answer under /admin and /portal, appliance/app.py). The
portal (appliance/portal/) signs its buyers and suppliers in with the same sessions."""

from __future__ import annotations

import hmac
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from appliance.domain import permissions
from appliance.services import console
from appliance.storage import ConsoleSessionRecord, Principal

COOKIE = "console_session"
CONSOLE_PATH, PORTAL_PATH = "/admin", "/portal"
SIGN_IN_COOKIE = "console_sign_in"  # the sign-in form's CSRF token, before any session exists
CSRF_FIELD = "csrf"
HEADERS = [
    (b"content-security-policy", b"default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self';"
                                 b" frame-ancestors 'none'; base-uri 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]
# Over TLS (the appliance's own, `[server] tls_cert_file`) also HSTS: a browser that saw it uses
# https for the host for a year, even when a link or a typed address says http. Not over plain
# HTTP, where browsers ignore it anyway.
TLS_HEADERS = [*HEADERS, (b"strict-transport-security", b"max-age=31536000")]


class SignInRequired(Exception):
    """No live session: the page redirects to sign-in."""


class StepOwed(Exception):
    """Signed in, but a step is still owed (the TOTP code, or two-factor enrolment): the page
    redirects to it."""

    def __init__(self, stage: str) -> None:
        super().__init__(stage)
        self.stage = stage


class RoleTooLow(Exception):
    """The signed-in user's role is short of what the page or action needs: 403."""

    def __init__(self, needed: str, role: str) -> None:
        super().__init__(needed)
        self.needed, self.role = needed, role


class CsrfRefused(Exception):
    """A form without its session's token (forged, stale or missing): 403."""


def session_guard(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
    """Every console page but sign-in and the setup link needs a live session (not signed out,
    not expired, its user active) that owes no step (opt `stages`: the stages a page of a step serves), and a
    role allowed the page's `permission` (domain/permissions.py; reading by default). The request
    then runs as that user."""
    if handler.opt.get("signed_out"):
        return
    token = connection.cookies.get(COOKIE)
    found = console.find_session(connection.app.state.runtime, token) if token else None
    if found is None:
        raise SignInRequired()
    connection.scope["state"]["console"] = found
    if found.stage not in handler.opt.get("stages", (console.LIVE,)):
        raise StepOwed(found.stage)
    connection.scope["state"]["principal"] = Principal(found.user_id, found.tenant_id, "user", None,
                                                       found.config_rev, found.role)
    needed = permissions.needed_for(handler.opt.get("permission", "console:read"))
    if not permissions.allows(found.role, needed):
        raise RoleTooLow(needed, found.role)


def can(connection: ASGIConnection, permission: str) -> bool:
    """Whether the signed-in user may do `permission` (pages hide what the role may not do)."""
    found = connection.scope["state"].get("console")
    return found is not None and permissions.allows(found.role, permissions.needed_for(permission))


def signed_in(connection: ASGIConnection) -> ConsoleSessionRecord:
    return connection.scope["state"]["console"]


def who(connection: ASGIConnection) -> Principal:
    return connection.scope["state"]["principal"]


def check_csrf(expected: str | None, sent: Any) -> None:
    if not (expected and isinstance(sent, str) and hmac.compare_digest(expected.encode(), sent.encode())):
        raise CsrfRefused()


def home_of(role: str) -> str:
    """Where a person of `role` works: staff in the console, buyers and suppliers in the portal.
    Their session cookie is scoped to that path alone."""
    return PORTAL_PATH if role in permissions.PARTY_ROLES else CONSOLE_PATH


def cookie_options(connection: ASGIConnection, max_age: int, path: str = CONSOLE_PATH) -> dict[str, Any]:
    """HttpOnly, SameSite=Strict, scoped to `path`; Secure when the request came over TLS: to
    the appliance itself, or to a TLS proxy in front that says so (`X-Forwarded-Proto: https`),
    or always with `[server] secure_cookies`. Believing the header from anyone is safe here: it
    can only make a cookie stricter."""
    forwarded = connection.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    secure = connection.scope.get("scheme") == "https" or forwarded == "https" \
        or connection.app.state.runtime.config.server.secure_cookies
    return {"max_age": max_age, "path": path, "httponly": True, "samesite": "strict", "secure": secure}
