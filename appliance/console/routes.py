"""The admin console's pages under /admin (docs/console.md): server-rendered HTML from
templates/, one stylesheet from static/. The pages call the same services as the API; this
module reads forms and query strings, checks the session and CSRF token, and picks a template.
Reads that may touch many rows run on a worker thread (each thread has its own read session)."""

from __future__ import annotations

import asyncio
import logging
import secrets
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode

import msgspec
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from litestar import Request, Response, Router, get, post
from litestar.params import PathParameter
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.response import Redirect, Template
from litestar.static_files import create_static_files_router
from litestar.template import TemplateConfig

from appliance import passwords
from appliance.api import audit as audit_api, imports as import_api
from appliance.api.leads import MAX_SEARCH, query_csv, query_id_range, search_filter
from appliance.api.files import kept_file
from appliance.api.io import query_int, query_str
from appliance.console.charts import bar_chart
from appliance.console.session import (
    CONSOLE_PATH, COOKIE, CSRF_FIELD, SIGN_IN_COOKIE, CsrfRefused, RoleTooLow, SignInRequired, StepOwed,
    can, check_csrf, cookie_options, home_of, session_guard, signed_in, who,
)
from appliance.domain.lead import LEAD_STATUSES
from appliance.domain.permissions import ROLES, may_manage
from appliance.domain.report import GROUP_BY
from appliance.errors import ApiError, NotFound, ValidationFailed
from appliance.model import describe_validation_error
from appliance.services import (
    approvals, audit, balances, clients, console, endpoints, lead_import, reports, reposts, return_requests,
    two_factor, users,
)
from appliance.storage import LeadFilter

log = logging.getLogger("appliance.console")
HERE = Path(__file__).resolve().parent
TEMPLATES, STATIC = HERE / "templates", HERE / "static"
PER_PAGE = 25
AUDIT_PER_PAGE = 50
RETURN_STATES = ("pending", "approved", "rejected")
PathText = Annotated[str, PathParameter()]
# What a POST did, shown on the page it redirects to (fixed texts: a link cannot inject words).
NOTICES = {
    "approved": "The lead was approved; its delivery is under way.",
    "rejected": "The lead was rejected.",
    "reposted": "The lead was sent again.",
    "reposted_many": "{sent} of the leads shown were sent again; {skipped} could not be (their status changed).",
    "paused": "The endpoint is paused: its deliveries wait until it is resumed.",
    "resumed": "The endpoint is active again; the deliveries that waited are on their way.",
    "password_set": "Your password is set: sign in with it.",
    "signed_out_everywhere": "You are signed out on every device.",
    "user_changed": "The user was changed.",
    "two_factor_off": "Two-factor sign-in is off.",
    "return_approved": "The return was approved: the lead is returned and its revenue reversed.",
    "return_rejected": "The return request was rejected.",
    "credited": "The credit was added to the client's balance.",
}
SIGN_IN_CHALLENGE = 'Form realm="appliance console"'  # the sign-in form is how to authenticate here
# Where each stage of a session goes after sign-in (and when a page is asked for too early).
STEP_PAGES = {console.LIVE: "/admin", "code": "/admin/sign-in/code", "enrol": "/admin/account/two-factor"}
# The same for buyers and suppliers, whose pages are the portal's (appliance/portal/routes.py); no
# tenant requires their enrolment.
PORTAL_STEP_PAGES = {console.LIVE: "/portal", "code": "/portal/sign-in/code"}
ALL_STAGES = tuple(STEP_PAGES)


def template_config() -> TemplateConfig:
    """Jinja2 with autoescape on for every template: data is always shown as text."""
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(default=True),
                      trim_blocks=True, lstrip_blocks=True)
    return TemplateConfig(instance=JinjaTemplateEngine.from_environment(env))


def _page(request: Request, name: str, status: int = 200, **context: Any) -> Template:
    found = request.scope["state"].get("console")
    notice = NOTICES.get(request.query_params.get("notice", ""))
    if notice is not None and "{" in notice:  # counts only: a link can put nothing else in the words
        counts = {name: request.query_params.get(name, "") for name in ("sent", "skipped")}
        notice = notice.format(**{k: int(v) if v.isdigit() and len(v) < 7 else "?" for k, v in counts.items()})
    context.update(csrf=found.csrf_token if found else None, signed_in=found is not None and found.stage == console.LIVE,
                   me=found, can=lambda permission: can(request, permission), notice=notice, path=request.url.path)
    return Template(template_name=name, context=context, status_code=status, media_type="text/html")


def _settings(request: Request):
    key = who(request)
    return request.app.state.settings.get(key.tenant_id, key.config_rev)


async def _form(request: Request) -> dict[str, Any]:
    """A URL-encoded form whose CSRF token is the session's (else 403)."""
    form = await request.form()
    check_csrf(signed_in(request).csrf_token, form.get(CSRF_FIELD))
    return {key: form.getall(key) if key == "leadId" else form.get(key) for key in form}


def _back(path: str, notice: str, **query: str) -> Redirect:
    return Redirect(path=f"{path}?{urlencode({**query, 'notice': notice})}", status_code=303)


# ---- sign-in and sign-out ------------------------------------------------------------------------

@get("/sign-in", opt={"signed_out": True})
async def sign_in_page(request: Request) -> Template:
    return _sign_in(request, None)


def _sign_in(request: Request, problem: str | None, status: int = 200) -> Template:
    token = secrets.token_urlsafe(32)
    response = _page(request, "sign_in.html", status, sign_in_token=token, problem=problem)
    response.set_cookie(SIGN_IN_COOKIE, token, **cookie_options(request, 3600))
    return response


@post("/sign-in", opt={"signed_out": True}, status_code=303)
async def sign_in(request: Request) -> Response:
    """Email and password (services/console.sign_in): one answer for an unknown email and a
    wrong password, 429 while the address or the client must wait."""
    form = await request.form()
    check_csrf(request.cookies.get(SIGN_IN_COOKIE), form.get(CSRF_FIELD))
    email, password = form.get("email"), form.get("password")
    if not isinstance(email, str) or not isinstance(password, str) or not email.strip() or not password:
        return _sign_in(request, "Enter your email address and your password.", 400)
    runtime = request.app.state.runtime
    client = request.scope.get("client")
    outcome = await console.sign_in(runtime, email, password, client[0] if client else None)
    if outcome.wait is not None:
        refused = _sign_in(request, f"Too many failed sign-ins. Try again in {outcome.wait} seconds.", 429)
        refused.headers["Retry-After"] = str(outcome.wait)
        return refused
    if outcome.session is None:
        refused = _sign_in(request, "That email address and password do not match an active account.", 401)
        refused.headers["WWW-Authenticate"] = SIGN_IN_CHALLENGE  # HTTP asks one of every 401
        return refused
    if request.cookies.get(COOKIE):  # signed in again: the session before ends now, not in 12 h
        await console.end_session(runtime, request.cookies[COOKIE])
    made = outcome.session
    home = home_of(made.role)
    response = Redirect(path=(STEP_PAGES if home == CONSOLE_PATH else PORTAL_STEP_PAGES)[made.stage], status_code=303)
    response.set_cookie(COOKIE, made.token,
                        **cookie_options(request, int(console.SESSION_LIFETIME.total_seconds()), home))
    response.delete_cookie(SIGN_IN_COOKIE, path="/admin")
    return response


@post("/sign-out", opt={"stages": ALL_STAGES}, status_code=303)
async def sign_out(request: Request) -> Response:
    await _form(request)
    await console.end_session(request.app.state.runtime, request.cookies[COOKIE])
    response = Redirect(path="/admin/sign-in", status_code=303)
    response.delete_cookie(COOKIE, path="/admin")
    return response


# ---- two-factor ----------------------------------------------------------------------------------

@get("/sign-in/code", opt={"stages": ("code",)})
async def code_page(request: Request) -> Template:
    return _page(request, "code.html")


@post("/sign-in/code", opt={"stages": ("code",)}, status_code=303)
async def enter_code(request: Request) -> Response:
    """The sign-in's second step: a code of the authenticator app, or a recovery code."""
    form = await _form(request)
    client = request.scope.get("client")
    checked = await two_factor.check(request.app.state.runtime, signed_in(request), form.get("code") or "",
                                     client[0] if client else None, console.session_hash(request.cookies[COOKIE]))
    if checked.wait is not None:
        refused = _page(request, "code.html", 429,
                        problem=f"Too many failed sign-ins. Try again in {checked.wait} seconds.")
        refused.headers["Retry-After"] = str(checked.wait)
        return refused
    if not checked.passed:
        refused = _page(request, "code.html", 401, problem="That code is not right (or was used already).")
        refused.headers["WWW-Authenticate"] = SIGN_IN_CHALLENGE
        return refused
    return Redirect(path="/admin", status_code=303)


@get("/account/two-factor", opt={"stages": ("enrol", console.LIVE)})
async def two_factor_page(request: Request) -> Template:
    """Two-factor on: how to turn it off. Off: a new secret to scan, and the form for its first code."""
    found, runtime = signed_in(request), request.app.state.runtime
    user = users.get(runtime, found.tenant_id, found.user_id)
    if user.two_factor:
        return _page(request, "two_factor.html", user=user, enrolment=None)
    enrolment = await two_factor.begin(runtime, found)
    return _page(request, "two_factor.html", user=user, enrolment=enrolment, qr=Markup(enrolment.qr_svg),
                 required=found.stage == "enrol")


@post("/account/two-factor", opt={"stages": ("enrol", console.LIVE)})
async def confirm_two_factor(request: Request) -> Template:
    """The first code of the new secret turns two-factor on; the recovery codes are shown once."""
    form = await _form(request)
    found, runtime = signed_in(request), request.app.state.runtime
    codes = await two_factor.confirm(runtime, found, form.get("code") or "",
                                     console.session_hash(request.cookies[COOKIE]))
    return _page(request, "recovery_codes.html", codes=codes)


@post("/account/two-factor/off", status_code=303)
async def two_factor_off(request: Request) -> Response:
    form = await _form(request)
    await two_factor.turn_off(request.app.state.runtime, signed_in(request), form.get("code") or "")
    return _back("/admin/account", "two_factor_off")


# ---- the setup link and one's own account --------------------------------------------------------

@get("/setup/{token:str}", opt={"signed_out": True})
async def setup_page(request: Request, token: PathText) -> Template:
    user = users.setup_user(request.app.state.runtime, token)
    return _setup(request, token, user, None, 200 if user is not None else 404)


def _setup(request: Request, token: str, user: Any, problem: str | None, status: int = 200) -> Template:
    form_token = secrets.token_urlsafe(32)
    response = _page(request, "setup.html", status, sign_in_token=form_token, token=token, user=user,
                     problem=problem, min_length=passwords.MIN_LENGTH)
    response.set_cookie(SIGN_IN_COOKIE, form_token, **cookie_options(request, 3600))
    return response


@post("/setup/{token:str}", opt={"signed_out": True}, status_code=303)
async def choose_password(request: Request, token: PathText) -> Response:
    """The password chosen at a setup link; the person then signs in with it."""
    form = await request.form()
    check_csrf(request.cookies.get(SIGN_IN_COOKIE), form.get(CSRF_FIELD))
    runtime = request.app.state.runtime
    try:
        await users.choose_password(runtime, token, form.get("password") or "", form.get("repeat") or "")
    except ValidationFailed as refused:
        user = users.setup_user(runtime, token)
        return _setup(request, token, user, "; ".join(refused.details or []), 400 if user is not None else 404)
    response = Redirect(path="/admin/sign-in?notice=password_set", status_code=303)
    response.delete_cookie(SIGN_IN_COOKIE, path="/admin")
    return response


@get("/account")
async def account_page(request: Request) -> Template:
    found = signed_in(request)
    user = users.get(request.app.state.runtime, found.tenant_id, found.user_id)
    return _page(request, "account.html", user=user)


@post("/account/sign-out-everywhere", status_code=303)
async def sign_out_everywhere(request: Request) -> Response:
    """Every session of the person ends, this one too (a lost laptop, a shared computer)."""
    await _form(request)
    await console.sign_out_everywhere(request.app.state.runtime, signed_in(request))
    response = Redirect(path="/admin/sign-in?notice=signed_out_everywhere", status_code=303)
    response.delete_cookie(COOKIE, path="/admin")
    return response


# ---- people (admins) -----------------------------------------------------------------------------

@get("/users", opt={"permission": "console:users"})
async def users_page(request: Request) -> Template:
    runtime, me = request.app.state.runtime, who(request)
    listed = users.page(runtime, me.tenant_id, query_str(request, "cursor"), 100)
    return _users(request, listed, None)


def _users(request: Request, listed: Any, made: Any, status: int = 200, problem: list[str] | None = None) -> Template:
    me = who(request)
    return _page(request, "users.html", status, users=listed.items, made=made, problem=problem,
                 my_id=me.id, roles=[r for r in ROLES if may_manage(me.role, r)],
                 next_link=_next_link(request, listed.next_cursor))


@post("/users", opt={"permission": "console:users"}, status_code=303)
async def add_user(request: Request) -> Response:
    """A new user; the page shows its setup link once, to pass on to the person."""
    form = await _form(request)
    runtime, me = request.app.state.runtime, who(request)
    try:
        body = msgspec.convert({k: v for k, v in {
            "email": (form.get("email") or "").strip(), "name": (form.get("name") or "").strip(),
            "role": form.get("role"), "clientId": (form.get("clientId") or "").strip() or None,
            "supplierId": (form.get("supplierId") or "").strip() or None}.items() if v is not None},
            users.NewUser)
        made = await users.create(runtime, me.tenant_id, me.actor, me.role, body)
    except (msgspec.ValidationError, ValidationFailed) as refused:
        problem = refused.details if isinstance(refused, ValidationFailed) else [str(refused)]
        return _users(request, users.page(runtime, me.tenant_id, None, 100), None, 400, problem)
    return _users(request, users.page(runtime, me.tenant_id, None, 100), made, 201)


@post("/users/{user_id:str}", opt={"permission": "console:users"}, status_code=303)
async def change_user(request: Request, user_id: PathText) -> Response:
    """Change a user's role, disable or enable it, or give it a new setup link."""
    form = await _form(request)
    runtime, me = request.app.state.runtime, who(request)
    action = form.get("action")
    if action == "reset":
        link = await users.reset_password(runtime, me.tenant_id, me.actor, me.role, user_id=user_id)
        listed = users.page(runtime, me.tenant_id, None, 100)
        return _users(request, listed, link)
    if action == "role":
        if form.get("role") not in ROLES:
            raise ValidationFailed(["role: not a role"])
        change = users.UserChange(role=form.get("role"))
    elif action in ("disable", "enable"):
        change = users.UserChange(active=action == "enable")
    else:
        raise ValidationFailed(["action: must be role, disable, enable or reset"])
    await users.change(runtime, me.tenant_id, me.actor, me.role, user_id, change)
    return _back("/admin/users", "user_changed")


# ---- overview ------------------------------------------------------------------------------------

@get("/")
async def overview(request: Request) -> Template:
    tenant_id = who(request).tenant_id
    view = await asyncio.to_thread(console.overview, request.app.state.runtime, tenant_id)
    chart = bar_chart([day[5:] for day, _, _ in view.per_day], [("leads", [n for _, n, _ in view.per_day]),
                                                             ("delivered", [d for _, _, d in view.per_day])])
    return _page(request, "overview.html", view=view, chart=chart, statuses=console.STATUSES)


# ---- leads ---------------------------------------------------------------------------------------

def _lead_filter(request: Request, status_choices: tuple[str, ...] = LEAD_STATUSES) -> LeadFilter | None:
    """The list's filters from the query string, as GET /api/v1/leads reads them (None: a search
    that cannot match anything)."""
    after_id, before_id = query_id_range(request, "lead")
    text = (query_str(request, "search") or "").strip()
    if len(text) > MAX_SEARCH:
        raise ValidationFailed([f"search: at most {MAX_SEARCH} characters"])
    found = search_filter(text, request.app.state.runtime.config.defaults.region) if text else {}
    if found is None:
        return None
    cursor = query_str(request, "cursor")
    return LeadFilter(campaign_ids=query_csv(request, "campaignIds"),
                      status=query_str(request, "status", choices=status_choices),
                      after_id=after_id, before_id=min(filter(None, (before_id, cursor)), default=None), **found)


async def _lead_list(request: Request, where: LeadFilter | None) -> console.LeadList:
    runtime, tenant_id = request.app.state.runtime, who(request).tenant_id
    return await asyncio.to_thread(console.lead_list, runtime, tenant_id, where, PER_PAGE)


def _next_link(request: Request, cursor: str | None) -> str | None:
    if cursor is None:
        return None
    query = {k: v for k, v in request.query_params.items() if k not in ("cursor", "notice")}
    return f"{request.url.path}?{urlencode({**query, 'cursor': cursor})}"


@get("/leads")
async def leads_page(request: Request) -> Template:
    page = await _lead_list(request, _lead_filter(request))
    return _page(request, "leads.html", page=page, next_link=_next_link(request, page.next_cursor),
                 statuses=LEAD_STATUSES, campaigns=sorted(_settings(request).campaigns.values(),
                                                          key=lambda c: c.name),
                 query=dict(request.query_params))


@get("/leads/{lead_id:str}")
async def lead_page(request: Request, lead_id: PathText) -> Template:
    runtime, tenant_id = request.app.state.runtime, who(request).tenant_id
    view = await asyncio.to_thread(console.lead_view, runtime, tenant_id, lead_id)
    if view is None:
        raise NotFound()
    return _page(request, "lead.html", view=view, repostable=view.lead["status"] in console.REPOST_ONE,
                 fields=_lead_fields(view.lead))


@get("/leads/{lead_id:str}/files/{file_key:str}")
async def lead_file(request: Request, lead_id: PathText, file_key: PathText) -> Response:
    """A kept file of the lead (a signed document), as the API's getFileContent answers it."""
    return kept_file(request, who(request).tenant_id, lead_id, file_key)


def _lead_fields(lead: dict[str, Any]) -> list[tuple[str, str]]:
    """The record's fields as (name, text) for the page, nested values as compact JSON."""
    return [(name, value if isinstance(value, str) else msgspec.json.encode(value).decode())
            for name, value in lead.items() if value not in (None, "", [], {})]


@post("/leads/{lead_id:str}/decision", opt={"permission": "console:decide"}, status_code=303)
async def decide(request: Request, lead_id: PathText) -> Response:
    """Approve or reject a lead held for review; a rejection needs a reason."""
    form = await _form(request)
    decision, reason = form.get("decision"), (form.get("reason") or "").strip() or None
    if decision not in ("approved", "rejected"):
        raise ValidationFailed(["decision: must be approved or rejected"])
    if decision == "rejected" and reason is None:
        raise ValidationFailed(["reason: say why the lead is rejected"])
    key, state = who(request), request.app.state
    await approvals.decide(state.runtime, _settings(request), key.tenant_id, key.actor, lead_id,
                           approvals.ApproveBody(status=decision, reason=reason))
    state.worker.wake()
    return _back("/admin/review" if form.get("back") == "review" else f"/admin/leads/{lead_id}", decision)


@post("/leads/{lead_id:str}/repost", opt={"permission": "console:repost"}, status_code=303)
async def repost(request: Request, lead_id: PathText) -> Response:
    form = await _form(request)
    key, state = who(request), request.app.state
    await reposts.repost(state.runtime, _settings(request), key.tenant_id, key.actor, lead_id, reposts.RepostBody(),
                         state.registry.prompt_evaluator())
    state.worker.wake()
    return _back("/admin/failures" if form.get("back") == "failures" else f"/admin/leads/{lead_id}", "reposted")


# ---- review queue and failures -------------------------------------------------------------------

@get("/review")
async def review_page(request: Request) -> Template:
    page = await _lead_list(request, LeadFilter(status="pending_action", before_id=query_str(request, "cursor")))
    return _page(request, "review.html", page=page, next_link=_next_link(request, page.next_cursor))


@get("/failures")
async def failures_page(request: Request) -> Template:
    status = query_str(request, "status", choices=console.REPOSTABLE) or "failed"
    page = await _lead_list(request, LeadFilter(status=status, before_id=query_str(request, "cursor")))
    return _page(request, "failures.html", page=page, shown=status, statuses=console.REPOSTABLE,
                 next_link=_next_link(request, page.next_cursor))


@post("/failures/repost", opt={"permission": "console:redeliver"}, status_code=303)
async def repost_many(request: Request) -> Response:
    """The leads the page showed, sent again (simple retry), as POST /api/v1/leads/redeliver."""
    form = await _form(request)
    status = form.get("status")
    if status not in console.REPOSTABLE:
        raise ValidationFailed([f"status: must be one of {', '.join(console.REPOSTABLE)}"])
    lead_ids = form.get("leadId") or []
    if not lead_ids or len(lead_ids) > 100:
        raise ValidationFailed(["leadId: between 1 and 100 leads"])
    key, state = who(request), request.app.state
    done = await reposts.redeliver(state.runtime, _settings(request), key.tenant_id, key.actor,
                                   reposts.RedeliverBody(status=status, lead_ids=lead_ids))
    state.worker.wake()
    return _back("/admin/failures", "reposted_many", status=status, sent=str(done.reposted),
                 skipped=str(len(lead_ids) - done.reposted))


# ---- endpoints -----------------------------------------------------------------------------------

@get("/endpoints")
async def endpoints_page(request: Request) -> Template:
    items = endpoints.page(request.app.state.runtime, who(request).tenant_id, None, 100).items
    return _page(request, "endpoints.html", items=items)


@post("/endpoints/{endpoint_id:str}/{action:str}", opt={"permission": "console:pause"}, status_code=303)
async def pause_or_resume(request: Request, endpoint_id: PathText, action: PathText) -> Response:
    form = await _form(request)
    if action not in ("pause", "resume"):
        raise NotFound()
    reason = (form.get("reason") or "").strip()[:500] or None
    key, state = who(request), request.app.state
    change = endpoints.pause if action == "pause" else endpoints.resume
    await change(state.runtime, _settings(request), key.tenant_id, key.actor, endpoint_id, reason)
    state.worker.wake()
    return _back("/admin/endpoints", "paused" if action == "pause" else "resumed")


# ---- webhooks and reports ------------------------------------------------------------------------

@get("/webhooks")
async def webhooks_page(request: Request) -> Template:
    runtime, tenant_id = request.app.state.runtime, who(request).tenant_id
    views = await asyncio.to_thread(console.webhook_views, runtime, tenant_id)
    return _page(request, "webhooks.html", views=views)


async def _summary(request: Request) -> tuple[Any, reports.ReportRange]:
    runtime, key = request.app.state.runtime, who(request)
    span = reports.summary_range(query_str(request, "groupBy"), query_str(request, "startDate"),
                                 query_str(request, "endDate"), query_str(request, "timezone"), runtime.clock.now())
    return await reports.summary(runtime.store, key.tenant_id, span, _settings(request).campaigns), span


@get("/reports")
async def reports_page(request: Request) -> Template:
    summary, span = await _summary(request)
    rows = summary.rows[:40]  # the chart's bars stay readable; the table and the CSV have every row
    chart = bar_chart([r.label for r in rows], [("leads", [r.leads for r in rows]),
                                                ("delivered", [r.delivered for r in rows])])
    query = {k: v for k, v in request.query_params.items() if k != "notice"}
    return _page(request, "reports.html", summary=summary, chart=chart, query=query,
                 group_by=span.group_by, group_choices=GROUP_BY, csv_link="/admin/reports.csv?" + urlencode(query))


@get("/reports.csv")
async def report_csv(request: Request) -> Response:
    summary, span = await _summary(request)
    return Response(reports.summary_csv(msgspec.to_builtins(summary)), media_type="text/csv",
                    headers={"content-disposition": f'attachment; filename="report-{span.group_by}.csv"'})


# ---- return requests ------------------------------------------------------------------------------

@get("/returns")
async def returns_page(request: Request) -> Template:
    """Return requests waiting for a decision (or of the state asked for), newest first."""
    shown = query_str(request, "state", choices=RETURN_STATES) or "pending"
    listed = return_requests.page(request.app.state.runtime, who(request).tenant_id, shown,
                                  query_str(request, "cursor"), PER_PAGE)
    return _page(request, "returns.html", requests=listed.items, shown=shown, states=RETURN_STATES,
                 next_link=_next_link(request, listed.next_cursor))


@post("/returns/{request_id:str}", opt={"permission": "console:returns"}, status_code=303)
async def decide_return(request: Request, request_id: PathText) -> Response:
    form = await _form(request)
    decision = form.get("decision")
    if decision not in ("approve", "reject"):
        raise ValidationFailed(["decision: must be approve or reject"])
    me, state = who(request), request.app.state
    await return_requests.decide(state.runtime, _settings(request), me.tenant_id, me.actor, request_id,
                                 return_requests.DecisionBody(decision=decision,
                                                              note=(form.get("note") or "").strip()[:2000] or None))
    return _back("/admin/returns", "return_approved" if decision == "approve" else "return_rejected")


# ---- clients: balances and statements --------------------------------------------------------------

@get("/clients")
async def clients_page(request: Request) -> Template:
    """Every client with its billing, its balance and what it may still buy for."""
    listed = balances.balances_of(request.app.state.runtime, who(request).tenant_id)
    return _page(request, "clients.html", clients=listed)


@get("/clients/{client_id:str}")
async def client_page(request: Request, client_id: PathText) -> Template:
    """A client's statement, with the API's `startDate` and `endDate`, and (managers) a credit form."""
    runtime, me = request.app.state.runtime, who(request)
    start, end = audit_api.date_range(request)
    shown = balances.statement(runtime, me.tenant_id, client_id, start, end)
    record = clients.get(runtime, me.tenant_id, client_id)
    query = {k: v for k, v in request.query_params.items() if k in ("startDate", "endDate")}
    return _page(request, "client.html", client=record, statement=shown, query=query)


@post("/clients/{client_id:str}/credits", opt={"permission": "console:credit"}, status_code=303)
async def credit_client(request: Request, client_id: PathText) -> Response:
    form = await _form(request)
    try:
        body = msgspec.convert({"amount": _number(form.get("amount")), "note": (form.get("note") or "").strip() or None},
                               balances.CreditBody)
    except msgspec.ValidationError as exc:
        raise ValidationFailed([describe_validation_error(exc)]) from None
    me = who(request)
    await balances.credit(request.app.state.runtime, _settings(request), me.tenant_id, me.actor, client_id, body)
    return _back(f"/admin/clients/{quote(client_id, safe='')}", "credited")


def _number(text: str | None) -> Any:
    """A form's number as a number (the struct then names what is wrong with it), else the text."""
    try:
        return float(text) if text is not None else None
    except ValueError:
        return text


# ---- the audit log (admins) ----------------------------------------------------------------------

@get("/audit", opt={"permission": "console:audit"})
async def audit_page(request: Request) -> Template:
    """Who changed what, newest first, with GET /api/v1/audit's filters."""
    runtime, me = request.app.state.runtime, who(request)
    before = query_int(request, "cursor", 0, minimum=1) or None
    page = await audit.page(runtime, me.tenant_id, audit_api.audit_filter(request), before, AUDIT_PER_PAGE)
    entries = [(entry, _changes(entry.before, entry.after)) for entry in page.items]
    query = {k: v for k, v in request.query_params.items() if k not in ("cursor", "notice")}
    return _page(request, "audit.html", entries=entries, query=query, next_link=_next_link(request, page.next_cursor))


def _changes(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """(member, before, after) of each top-level member that differs, values as compact JSON."""
    before, after = before or {}, after or {}

    def text(value: Any) -> str:
        return "" if value is None else value if isinstance(value, str) else msgspec.json.encode(value).decode()

    return [(name, text(before.get(name)), text(after.get(name))) for name in dict.fromkeys([*before, *after])
            if before.get(name) != after.get(name)]


# ---- CSV import ----------------------------------------------------------------------------------

@get("/import", opt={"permission": "console:import"})
async def import_page(request: Request) -> Template:
    campaigns = [c for c in _settings(request).campaigns.values() if c.active and not c.archived_at]
    return _page(request, "import.html", campaigns=sorted(campaigns, key=lambda c: c.name),
                 max_mb=request.app.state.runtime.config.imports.max_file_mb)


@post("/import", opt={"permission": "console:import"}, request_max_body_size=None, status_code=303)
async def start_import(request: Request) -> Response:
    """The API's upload (api/imports.py) with the form's CSRF token, which is checked before the
    import starts."""
    state = request.app.state
    form = await import_api.read_form(request, state.runtime.config.imports.max_file_mb * 1024 * 1024,
                                      (*import_api.FIELDS, CSRF_FIELD))
    try:
        check_csrf(signed_in(request).csrf_token, form.fields.get(CSRF_FIELD))
    except CsrfRefused:
        import_api.close_form(form)
        raise
    form.fields["process"] = "true" if form.fields.get("process") == "true" else "false"
    if not (form.fields.get("mapping") or "").strip():
        form.fields.pop("mapping", None)
    import_id = await import_api.begin_import(state, who(request), form)
    return Redirect(path=f"/admin/imports/{import_id}", status_code=303)


@get("/imports/{import_id:str}", opt={"permission": "console:import"})
async def import_progress(request: Request, import_id: PathText) -> Template:
    found = lead_import.get(request.app.state.runtime, who(request).tenant_id, import_id)
    if found is None:
        raise NotFound()
    return _page(request, "import_progress.html", job=found, import_id=import_id)


# ---- errors --------------------------------------------------------------------------------------

def _sign_in_again(request: Request, _exc: Exception) -> Response:
    response = Redirect(path="/admin/sign-in", status_code=303)
    if request.cookies.get(COOKIE):
        response.delete_cookie(COOKIE, path="/admin")
    return response


def _step_owed(request: Request, exc: StepOwed) -> Response:
    return Redirect(path=STEP_PAGES.get(exc.stage, "/admin/sign-in"), status_code=303)


def _role_too_low(request: Request, exc: RoleTooLow) -> Response:
    return _page(request, "error.html", 403, title="Your role does not allow this",
                 details=[f"This needs the {exc.needed} role (or above); yours is {exc.role}. An admin can change it."])


def _refused(request: Request, _exc: Exception) -> Response:
    return _page(request, "error.html", 403, title="This form was refused",
                 details=["It did not carry this session's security token (it may be old, or it was sent from"
                          " another site). Go back, reload the page and try again."])


_TITLES = {404: "Not found", 400: "Please check what you entered", 409: "That cannot be done now",
           413: "Too large", 415: "Not a form this page takes"}


def _api_error(request: Request, exc: ApiError) -> Response:
    title = _TITLES.get(exc.status, "Something went wrong")
    details = exc.details or ([] if exc.status == 404 else [exc.message])
    if exc.status == 404:
        details = ["There is nothing here, or it is not yours to see."]
    return _page(request, "error.html", exc.status, title=title, details=details)


def _unexpected(request: Request, exc: Exception) -> Response:
    # The route's template, not the path: a setup link's path holds its token.
    log.exception("console page failed on %s %s", request.method, request.scope.get("path_template"), exc_info=exc)
    return _page(request, "error.html", 500, title="Something went wrong",
                 details=[f"The appliance could not show this page (request {request.scope['state']['request_id']})."])


def router() -> Router:
    """Every /admin route: no API key (the auth middleware leaves opt `console` to these guards),
    left out of the OpenAPI document, the security headers on every answer."""
    static = create_static_files_router(path="/static", directories=[STATIC], opt={"signed_out": True},
                                        include_in_schema=False, cache_control=None)
    return Router(
        path="/admin",
        route_handlers=[sign_in_page, sign_in, sign_out, code_page, enter_code, two_factor_page, confirm_two_factor,
                        two_factor_off, setup_page, choose_password, account_page,
                        sign_out_everywhere, users_page, add_user, change_user, audit_page, returns_page, decide_return,
                        clients_page, client_page, credit_client,
                        overview, leads_page, lead_page, lead_file, decide, repost, review_page,
                        failures_page, repost_many, endpoints_page, pause_or_resume, webhooks_page, reports_page,
                        report_csv, import_page, start_import, import_progress, static],
        guards=[session_guard],
        opt={"console": True},
        include_in_schema=False,
        exception_handlers={SignInRequired: _sign_in_again, StepOwed: _step_owed, RoleTooLow: _role_too_low,
                            CsrfRefused: _refused, ApiError: _api_error,
                            Exception: _unexpected},
    )
