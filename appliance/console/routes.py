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
from urllib.parse import urlencode

import msgspec
from jinja2 import Environment, FileSystemLoader, select_autoescape
from litestar import Request, Response, Router, get, post
from litestar.params import PathParameter
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.response import Redirect, Template
from litestar.static_files import create_static_files_router
from litestar.template import TemplateConfig

from appliance import apikeys
from appliance.api import imports as import_api
from appliance.api.leads import MAX_SEARCH, query_csv, query_id_range, search_filter
from appliance.api.io import query_str
from appliance.console.charts import bar_chart
from appliance.console.session import (
    COOKIE, CSRF_FIELD, SIGN_IN_COOKIE, CsrfRefused, SignInRequired, check_csrf, cookie_options,
    session_guard, signed_in, who,
)
from appliance.domain.lead import LEAD_STATUSES
from appliance.domain.report import GROUP_BY
from appliance.errors import ApiError, NotFound, Unauthorized, ValidationFailed
from appliance.services import approvals, console, endpoints, lead_import, reports, reposts
from appliance.storage import LeadFilter

log = logging.getLogger("appliance.console")
HERE = Path(__file__).resolve().parent
TEMPLATES, STATIC = HERE / "templates", HERE / "static"
PER_PAGE = 25
PathText = Annotated[str, PathParameter()]
# What a POST did, shown on the page it redirects to (fixed texts: a link cannot inject words).
NOTICES = {
    "approved": "The lead was approved; its delivery is under way.",
    "rejected": "The lead was rejected.",
    "reposted": "The lead was sent again.",
    "reposted_many": "{sent} of the leads shown were sent again; {skipped} could not be (their status changed).",
    "paused": "The endpoint is paused: its deliveries wait until it is resumed.",
    "resumed": "The endpoint is active again; the deliveries that waited are on their way.",
}


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
    context.update(csrf=found.csrf_token if found else None, signed_in=found is not None,
                   notice=notice, path=request.url.path)
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
    """A tenant key checked exactly as the API checks X-API-Key; a source key is refused."""
    form = await request.form()
    check_csrf(request.cookies.get(SIGN_IN_COOKIE), form.get(CSRF_FIELD))
    key = (form.get("apiKey") or "").strip()
    record = (request.app.state.key_cache.lookup(apikeys.key_hash(key))
              if apikeys.MIN_LENGTH <= len(key) <= apikeys.MAX_LENGTH else None)
    if record is None:
        refused = _sign_in(request, "That key is not a live API key of this appliance.", 401)
        refused.headers["WWW-Authenticate"] = Unauthorized.API_KEY_CHALLENGE  # HTTP asks one of every 401
        return refused
    if record.kind != "tenant":
        return _sign_in(request, "That is a source key; sign in with a tenant key.", 403)
    if request.cookies.get(COOKIE):  # signed in again: the session before ends now, not in 12 h
        await console.end_session(request.app.state.runtime, request.cookies[COOKIE])
    made = await console.start_session(request.app.state.runtime, record)
    response = Redirect(path="/admin", status_code=303)
    response.set_cookie(COOKIE, made.token,
                        **cookie_options(request, int(console.SESSION_LIFETIME.total_seconds())))
    response.delete_cookie(SIGN_IN_COOKIE, path="/admin")
    return response


@post("/sign-out", status_code=303)
async def sign_out(request: Request) -> Response:
    await _form(request)
    await console.end_session(request.app.state.runtime, request.cookies[COOKIE])
    response = Redirect(path="/admin/sign-in", status_code=303)
    response.delete_cookie(COOKIE, path="/admin")
    return response


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


def _lead_fields(lead: dict[str, Any]) -> list[tuple[str, str]]:
    """The record's fields as (name, text) for the page, nested values as compact JSON."""
    return [(name, value if isinstance(value, str) else msgspec.json.encode(value).decode())
            for name, value in lead.items() if value not in (None, "", [], {})]


@post("/leads/{lead_id:str}/decision", status_code=303)
async def decide(request: Request, lead_id: PathText) -> Response:
    """Approve or reject a lead held for review; a rejection needs a reason."""
    form = await _form(request)
    decision, reason = form.get("decision"), (form.get("reason") or "").strip() or None
    if decision not in ("approved", "rejected"):
        raise ValidationFailed(["decision: must be approved or rejected"])
    if decision == "rejected" and reason is None:
        raise ValidationFailed(["reason: say why the lead is rejected"])
    key, state = who(request), request.app.state
    await approvals.decide(state.runtime, _settings(request), key.tenant_id, key.key_id, lead_id,
                           approvals.ApproveBody(status=decision, reason=reason))
    state.worker.wake()
    return _back("/admin/review" if form.get("back") == "review" else f"/admin/leads/{lead_id}", decision)


@post("/leads/{lead_id:str}/repost", status_code=303)
async def repost(request: Request, lead_id: PathText) -> Response:
    form = await _form(request)
    key, state = who(request), request.app.state
    await reposts.repost(state.runtime, _settings(request), key.tenant_id, key.key_id, lead_id, reposts.RepostBody(),
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


@post("/failures/repost", status_code=303)
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
    done = await reposts.redeliver(state.runtime, _settings(request), key.tenant_id, key.key_id,
                                   reposts.RedeliverBody(status=status, lead_ids=lead_ids))
    state.worker.wake()
    return _back("/admin/failures", "reposted_many", status=status, sent=str(done.reposted),
                 skipped=str(len(lead_ids) - done.reposted))


# ---- endpoints -----------------------------------------------------------------------------------

@get("/endpoints")
async def endpoints_page(request: Request) -> Template:
    items = endpoints.page(request.app.state.runtime, who(request).tenant_id, None, 100).items
    return _page(request, "endpoints.html", items=items)


@post("/endpoints/{endpoint_id:str}/{action:str}", status_code=303)
async def pause_or_resume(request: Request, endpoint_id: PathText, action: PathText) -> Response:
    form = await _form(request)
    if action not in ("pause", "resume"):
        raise NotFound()
    reason = (form.get("reason") or "").strip()[:500] or None
    key, state = who(request), request.app.state
    change = endpoints.pause if action == "pause" else endpoints.resume
    await change(state.runtime, _settings(request), key.tenant_id, endpoint_id, reason)
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


# ---- CSV import ----------------------------------------------------------------------------------

@get("/import")
async def import_page(request: Request) -> Template:
    campaigns = [c for c in _settings(request).campaigns.values() if c.active and not c.archived_at]
    return _page(request, "import.html", campaigns=sorted(campaigns, key=lambda c: c.name),
                 max_mb=request.app.state.runtime.config.imports.max_file_mb)


@post("/import", request_max_body_size=None, status_code=303)
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


@get("/imports/{import_id:str}")
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
    log.exception("console page failed on %s %s", request.method, request.url.path, exc_info=exc)
    return _page(request, "error.html", 500, title="Something went wrong",
                 details=[f"The appliance could not show this page (request {request.scope['state']['request_id']})."])


def router() -> Router:
    """Every /admin route: no API key (the auth middleware leaves opt `console` to these guards),
    left out of the OpenAPI document, the security headers on every answer."""
    static = create_static_files_router(path="/static", directories=[STATIC], opt={"signed_out": True},
                                        include_in_schema=False, cache_control=None)
    return Router(
        path="/admin",
        route_handlers=[sign_in_page, sign_in, sign_out, overview, leads_page, lead_page, decide, repost, review_page,
                        failures_page, repost_many, endpoints_page, pause_or_resume, webhooks_page, reports_page,
                        report_csv, import_page, start_import, import_progress, static],
        guards=[session_guard],
        opt={"console": True},
        include_in_schema=False,
        exception_handlers={SignInRequired: _sign_in_again, CsrfRefused: _refused, ApiError: _api_error,
                            Exception: _unexpected},
    )
