"""The portal's pages under /portal (docs/portal.md): what a buyer or a supplier user sees of its
agency's leads, server-rendered from templates/ with the console's stylesheet. People sign in at
the console's sign-in form, which sends buyers and suppliers here with a session cookie scoped to
/portal; the console's session, CSRF and security-header rules apply unchanged
(console/session.py). Staff have the console: a staff session here gets 403, as a portal
session does in the console. Reads run on a worker thread (each thread has its own read session)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import date
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

from jinja2 import ChoiceLoader, FileSystemLoader, PrefixLoader
from litestar import Request, Response, Router, get, post
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.params import PathParameter
from litestar.response import Redirect, Stream, Template
from litestar.template import TemplateConfig
from markupsafe import Markup

from appliance.api import audit as audit_api
from appliance.api.auth import PING_PATH, SUBMIT_PATH
from appliance.api.io import query_str
from appliance.api.leads import MAX_SEARCH, search_filter
from appliance.console import routes as console_routes
from appliance.console.session import (
    COOKIE,
    CSRF_FIELD,
    PORTAL_PATH,
    CsrfRefused,
    SignInRequired,
    StepOwed,
    check_csrf,
)
from appliance.domain.permissions import PARTY_ROLES
from appliance.errors import ApiError, NotFound, ValidationFailed
from appliance.services import balances, console, portal, posting_spec, two_factor
from appliance.storage import LeadFilter, Principal

log = logging.getLogger("appliance.portal")
TEMPLATES = Path(__file__).resolve().parent / "templates"
PER_PAGE = 25
PathText = Annotated[str, PathParameter()]
NOTICES = {
    "return_requested": "Your return request was sent to the agency.",
    "return_approved": "Your return request was approved: the lead is returned.",
    "two_factor_off": "Two-factor sign-in is off.",
}
SIGN_IN = "/admin/sign-in"
_TITLES = {400: "Please check what you entered", 409: "That cannot be done now", 413: "Too large",
           415: "Not a form this page takes"}


def template_config() -> TemplateConfig:
    """The console's template engine, which also finds the portal's templates as `portal/<name>`
    (one engine serves the whole app)."""
    config = console_routes.template_config()
    engine = config.instance.engine
    engine.loader = ChoiceLoader([engine.loader, PrefixLoader({"portal": FileSystemLoader(TEMPLATES)})])
    return config


# ---- who may see a page ---------------------------------------------------------------------------

class PartyOnly(Exception):
    """A signed-in person whose role is not the one the page is for: 403."""

    def __init__(self, needed: str, role: str) -> None:
        super().__init__(needed)
        self.needed, self.role = needed, role


def party_guard(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
    """Every portal page needs a live session (opt `stages`: the steps a page serves) of a buyer
    or supplier user; opt `role` narrows a page to one of them. The request then runs as that
    user, its client or supplier read from its user record."""
    token = connection.cookies.get(COOKIE)
    runtime = connection.app.state.runtime
    found = console.find_session(runtime, token) if token else None
    if found is None:
        raise SignInRequired()
    connection.scope["state"]["console"] = found
    if found.role not in PARTY_ROLES:
        raise PartyOnly(" or ".join(PARTY_ROLES), found.role)
    if found.stage not in handler.opt.get("stages", (console.LIVE,)):
        raise StepOwed(found.stage)
    connection.scope["state"]["principal"] = Principal(found.user_id, found.tenant_id, "user", None,
                                                       found.config_rev, found.role)
    party = portal.party_of(runtime, found)
    needed = handler.opt.get("role")
    if needed is not None and party.role != needed:
        raise PartyOnly(needed, party.role)
    connection.scope["state"]["party"] = party


def _party(request: Request) -> portal.Party:
    return request.scope["state"]["party"]


def _settings(request: Request):
    found = request.scope["state"]["console"]
    return request.app.state.settings.get(found.tenant_id, found.config_rev)


def _page(request: Request, name: str, status: int = 200, **context: Any) -> Template:
    found = request.scope["state"].get("console")
    context.update(csrf=found.csrf_token if found else None, me=found,
                   party=request.scope["state"].get("party"), path=request.url.path,
                   notice=NOTICES.get(request.query_params.get("notice", "")))
    return Template(template_name=f"portal/{name}", context=context, status_code=status, media_type="text/html")


async def _form(request: Request) -> dict[str, Any]:
    """A URL-encoded form whose CSRF token is the session's (else 403)."""
    form = await request.form()
    check_csrf(request.scope["state"]["console"].csrf_token, form.get(CSRF_FIELD))
    return {key: form.get(key) for key in form}


def _next_link(request: Request, cursor: str | None) -> str | None:
    if cursor is None:
        return None
    query = {k: v for k, v in request.query_params.items() if k not in ("cursor", "notice")}
    return f"{request.url.path}?{urlencode({**query, 'cursor': cursor})}"


# ---- signing in and out ---------------------------------------------------------------------------

@get("/sign-in/code", opt={"stages": ("code",)})
async def code_page(request: Request) -> Template:
    return _page(request, "code.html")


@post("/sign-in/code", opt={"stages": ("code",)}, status_code=303)
async def enter_code(request: Request) -> Response:
    """The sign-in's second step for a person who turned two-factor on: a code of the
    authenticator app, or a recovery code."""
    form = await _form(request)
    client = request.scope.get("client")
    checked = await two_factor.check(request.app.state.runtime, request.scope["state"]["console"],
                                     form.get("code") or "", client[0] if client else None,
                                     console.session_hash(request.cookies[COOKIE]))
    if checked.wait is not None:
        refused = _page(request, "code.html", 429, problem=f"Too many failed sign-ins. Try again in {checked.wait} seconds.")
        refused.headers["Retry-After"] = str(checked.wait)
        return refused
    if not checked.passed:
        refused = _page(request, "code.html", 401, problem="That code is not right (or was used already).")
        refused.headers["WWW-Authenticate"] = console_routes.SIGN_IN_CHALLENGE
        return refused
    return Redirect(path=PORTAL_PATH, status_code=303)


@post("/sign-out", opt={"stages": tuple(console_routes.PORTAL_STEP_PAGES)}, status_code=303)
async def sign_out(request: Request) -> Response:
    await _form(request)
    await console.end_session(request.app.state.runtime, request.cookies[COOKIE])
    response = Redirect(path=SIGN_IN, status_code=303)
    response.delete_cookie(COOKIE, path=PORTAL_PATH)
    return response


# ---- one's own account: two-factor sign-in --------------------------------------------------------

@get("/account")
async def account_page(request: Request) -> Template:
    """Two-factor sign-in on: how to turn it off. Off: a new secret to scan, and the form for its
    first code."""
    found, runtime = request.scope["state"]["console"], request.app.state.runtime
    if found.two_factor:
        return _page(request, "account.html", enrolment=None)
    enrolment = await two_factor.begin(runtime, found)
    return _page(request, "account.html", enrolment=enrolment, qr=Markup(enrolment.qr_svg))


@post("/account/two-factor")
async def confirm_two_factor(request: Request) -> Template:
    """The first code of the new secret turns two-factor on; the recovery codes are shown once."""
    form = await _form(request)
    codes = await two_factor.confirm(request.app.state.runtime, request.scope["state"]["console"],
                                     form.get("code") or "", console.session_hash(request.cookies[COOKIE]))
    return _page(request, "recovery_codes.html", codes=codes)


@post("/account/two-factor/off", status_code=303)
async def two_factor_off(request: Request) -> Response:
    form = await _form(request)
    await two_factor.turn_off(request.app.state.runtime, request.scope["state"]["console"], form.get("code") or "")
    return Redirect(path=f"{PORTAL_PATH}/account?notice=two_factor_off", status_code=303)


# ---- leads ----------------------------------------------------------------------------------------

@get("/")
async def home(request: Request) -> Template:
    """A buyer's leads (the sales to its client), searchable; a supplier's leads with what became
    of them. Newest first."""
    party, runtime = _party(request), request.app.state.runtime
    cursor = query_str(request, "cursor")
    if party.role == "supplier":
        supply = portal.supply_of(_settings(request), party.supplier_id)
        page = await asyncio.to_thread(portal.supplied_page, runtime, party.tenant_id, supply, cursor, PER_PAGE)
        return _page(request, "supplied.html", page=page, supply=supply, next_link=_next_link(request, page.next_cursor))
    text = (query_str(request, "search") or "").strip()
    if len(text) > MAX_SEARCH:
        raise ValidationFailed([f"search: at most {MAX_SEARCH} characters"])
    if text:
        found = search_filter(text, runtime.config.defaults.region)
        sales = [] if found is None else await asyncio.to_thread(
            portal.search_sales, runtime, party.tenant_id, party.client_id, LeadFilter(**found))
        return _page(request, "sales.html", sales=sales, search=text, next_link=None)
    page = await asyncio.to_thread(portal.sales_page, runtime, party.tenant_id, party.client_id, cursor, PER_PAGE)
    return _page(request, "sales.html", sales=page.sales, search="", next_link=_next_link(request, page.next_cursor))


@get("/leads/{lead_id:str}")
async def lead_page(request: Request, lead_id: PathText) -> Template:
    """One of the buyer's or supplier's leads; any other lead is missing (404)."""
    party, runtime = _party(request), request.app.state.runtime
    if party.role == "supplier":
        supply = portal.supply_of(_settings(request), party.supplier_id)
        view = await asyncio.to_thread(portal.supplied_lead, runtime, party.tenant_id, supply, lead_id)
        return _page(request, "supplied_lead.html", view=view)
    bought = await asyncio.to_thread(portal.bought_lead, runtime, party.tenant_id, party.client_id, lead_id)
    return _page(request, "sale.html", bought=bought, labels=_settings(request).labels)


@get("/leads.csv", opt={"role": "buyer"})
async def leads_csv(request: Request) -> Stream:
    """Every lead sold to the buyer's client, newest first, streamed a page of sales at a time."""
    party, runtime = _party(request), request.app.state.runtime

    async def rows() -> AsyncIterator[str]:
        yield portal.csv_header()
        cursor = None
        while True:
            text, cursor = await asyncio.to_thread(portal.csv_chunk, runtime, party.tenant_id, party.client_id,
                                                   cursor)
            yield text
            if cursor is None:
                return

    return Stream(rows(), media_type="text/csv; charset=utf-8",
                  headers={"content-disposition": 'attachment; filename="leads.csv"'})


@post("/leads/{lead_id:str}/return-request", opt={"role": "buyer"}, status_code=303)
async def request_return(request: Request, lead_id: PathText) -> Response:
    """A return request of one of the buyer's delivered leads, under its client's return policy."""
    form = await _form(request)
    note = (form.get("note") or "").strip() or None
    made = await portal.request_return(request.app.state.runtime, _settings(request), _party(request), lead_id,
                                       (form.get("reason") or "").strip(), note)
    notice = "return_approved" if made.state == "approved" else "return_requested"
    return Redirect(path=f"{PORTAL_PATH}/leads/{lead_id}?notice={notice}", status_code=303)


@get("/statement", opt={"role": "buyer"})
async def statement_page(request: Request) -> Template:
    """The client's balance entries between two dates (UTC days, both included; by default the
    last 30 days)."""
    party = _party(request)
    _day(request, "startDate"), _day(request, "endDate")  # the form's fields are dates
    start, end = audit_api.date_range(request)
    try:
        shown = await asyncio.to_thread(balances.statement, request.app.state.runtime, party.tenant_id,
                                        party.client_id, start, end)
    except NotFound:
        shown = None  # the agency keeps no client record (and so no balance) for this client
    return _page(request, "statement.html", statement=shown,
                 query={k: request.query_params.get(k, "") for k in ("startDate", "endDate")})


def _day(request: Request, name: str) -> date | None:
    text = query_str(request, name)
    if not text:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise ValidationFailed([f"{name}: must be a date (YYYY-MM-DD)"]) from None


# ---- suppliers ------------------------------------------------------------------------------------

@get("/payouts", opt={"role": "supplier"})
async def payouts_page(request: Request) -> Template:
    party = _party(request)
    supply = portal.supply_of(_settings(request), party.supplier_id)
    page = await asyncio.to_thread(portal.payouts, request.app.state.runtime, party.tenant_id, supply,
                                   query_str(request, "cursor"), PER_PAGE)
    return _page(request, "payouts.html", page=page, days=portal.DAYS_SHOWN,
                 next_link=_next_link(request, page.next_cursor))


@get("/acceptance", opt={"role": "supplier"})
async def acceptance_page(request: Request) -> Template:
    party = _party(request)
    supply = portal.supply_of(_settings(request), party.supplier_id)
    days = await asyncio.to_thread(portal.acceptance, request.app.state.runtime, party.tenant_id, supply)
    return _page(request, "acceptance.html", days=days, outcomes=portal.OUTCOMES)


@get("/sources", opt={"role": "supplier"})
async def sources_page(request: Request) -> Template:
    """Each of the supplier's sources: its caps, ping limits, what it is paid, and its posting spec."""
    party, settings, runtime = _party(request), _settings(request), request.app.state.runtime
    supply = portal.supply_of(settings, party.supplier_id)
    specs = [await asyncio.to_thread(posting_spec.source_spec, runtime, settings, party.tenant_id,
                                     own.source.source_id, own.campaign_id, submit_path=SUBMIT_PATH,
                                     ping_path=PING_PATH)
             for own in supply.sources]
    return _page(request, "sources.html", sources=list(zip(supply.sources, specs)))


# ---- errors ---------------------------------------------------------------------------------------

def _sign_in_again(request: Request, _exc: Exception) -> Response:
    response = Redirect(path=SIGN_IN, status_code=303)
    if request.cookies.get(COOKIE):
        response.delete_cookie(COOKIE, path=PORTAL_PATH)
    return response


def _step_owed(request: Request, exc: StepOwed) -> Response:
    return Redirect(path=console_routes.PORTAL_STEP_PAGES.get(exc.stage, SIGN_IN), status_code=303)


def _party_only(request: Request, exc: PartyOnly) -> Response:
    return _page(request, "error.html", 403, title="This page is not for your role",
                 details=[f"This page is for {exc.needed} users; your role is {exc.role}.",
                          *(["Staff use the console at /admin."] if exc.role not in PARTY_ROLES else [])])


def _refused(request: Request, _exc: Exception) -> Response:
    return _page(request, "error.html", 403, title="This form was refused",
                 details=[("It did not carry this session's security token (it may be old, or it was sent from"
                           " another site). Go back, reload the page and try again.")])


def _api_error(request: Request, exc: ApiError) -> Response:
    if exc.status == 404:
        return _page(request, "error.html", 404, title="Not found",
                     details=["There is nothing here, or it is not yours to see."])
    title = _TITLES.get(exc.status, "Something went wrong")
    return _page(request, "error.html", exc.status, title=title, details=exc.details or [exc.message])


def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("portal page failed on %s %s", request.method, request.scope.get("path_template"), exc_info=exc)
    return _page(request, "error.html", 500, title="Something went wrong",
                 details=[f"The appliance could not show this page (request {request.scope['state']['request_id']})."])


def router() -> Router:
    """Every /portal route: no API key (the auth middleware leaves opt `console` to this guard),
    left out of the OpenAPI document; the app's edge puts the console's headers on every answer."""
    return Router(
        path=PORTAL_PATH,
        route_handlers=[code_page, enter_code, sign_out, account_page, confirm_two_factor, two_factor_off, home, lead_page, leads_csv, request_return, statement_page,
                        payouts_page, acceptance_page, sources_page],
        guards=[party_guard],
        opt={"console": True},
        include_in_schema=False,
        exception_handlers={SignInRequired: _sign_in_again, StepOwed: _step_owed, PartyOnly: _party_only,
                            CsrfRefused: _refused, ApiError: _api_error, Exception: _unexpected},
    )
