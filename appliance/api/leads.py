"""Leads."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Annotated

import msgspec
from litestar import Request, Response, get, patch, post
from litestar.datastructures import State
from litestar.params import PathParameter, QueryParameter

from appliance.services import approvals, intake, lead_updates, reposts, returns
from appliance.api.auth import principal
from appliance.api.io import decode_json, ok, ok_body, ok_raw, query_int, query_str, read_json, require_json
from appliance.domain.lead import LEAD_STATUSES, LeadDetail, LeadRecord
from appliance.domain.normalize import to_e164
from appliance.domain.submission import SubmitLead
from appliance.errors import JSON, NotFound, ValidationFailed
from appliance.ids import floor_id
from appliance.model import Model
from appliance.storage import Principal, LeadFilter, Store

LeadId = Annotated[str, PathParameter(name="leadId")]
TAGS = ["Leads"]  # this module's group in the OpenAPI document


@post("/api/v1/leads/submit", operation_id="submitLead",
      summary="Submit a lead", tags=TAGS,
      description=("Stores a lead for a campaign and runs intake (validation, normalization, dedupe, routing, "
                   "qualification) before answering with its id and status; with `leadId` it resubmits a stored "
                   "lead; with `pingId` it is sold as that ping was offered. A source key may call it and the ping: "
                   "403 FORBIDDEN for a campaign or lead that is not its source's, 400 names every bad field, 409 "
                   "INVALID_STATE (nothing stored) for a `pingId` unknown, of another source, for another campaign, "
                   "not accepted, already posted or expired."),
      status_code=201,
      opt={"body": SubmitLead, "data": intake.SubmitResult, "status": 201, "errors": ["FORBIDDEN", "INVALID_STATE"]})
async def submit_lead(request: Request) -> Response:
    # Declared here for the OpenAPI document and for what the edge leaves to Litestar (a trailing
    # slash); a plain POST is answered by appliance/api/submit_edge.py with the same submit_json.
    require_json(request.headers.get("content-type", ""))
    body = await submit_json(request.app.state, principal(request.scope), await request.body())
    return Response(body, status_code=201, media_type=JSON)


async def submit_json(state: State, who: Principal, body: bytes) -> bytes:
    """A submit request's body (Content-Type checked) in, the 201 response's body out (errors are
    raised)."""
    lead = decode_json(body, SubmitLead)
    # Items, not attributes: State answers an attribute only after the normal lookup has failed
    # (0.48 us each against 0.08 us), and this runs on every submit.
    runtime = state["runtime"]
    result = await intake.submit(runtime, state["settings"].get(who.tenant_id, who.config_rev), who, lead,
                                 state["registry"])
    state["worker"].wake()
    runtime.metrics.submits[result.status] += 1
    return ok_body(result)


@post("/api/v1/leads/{leadId:str}/approve", operation_id="approveLead",
      summary="Approve or reject a held lead", tags=TAGS,
      description=("Records a person's decision on a lead held for review: `approved` lets its delivery go ahead, "
                   "`rejected` stops it, `pending` opens the question again. 409 INVALID_STATE, nothing recorded, "
                   "when the lead has no approval, when approving or rejecting a lead with no pending decision, or "
                   "when the decision comes too late: a delivery attempt running, the lead delivered (a `pending` "
                   "is recorded there) or failed."),
      status_code=200,
      opt={"body": approvals.ApproveBody, "data": approvals.ApproveResult, "errors": ["NOT_FOUND", "INVALID_STATE"]})
async def approve_lead(request: Request, lead_id: LeadId) -> Response:
    who = principal(request.scope)
    body = await read_json(request, approvals.ApproveBody)
    state = request.app.state
    result = await approvals.decide(state.runtime, state.settings.get(who.tenant_id, who.config_rev), who.tenant_id,
                                    who.actor, lead_id, body)
    request.app.state.worker.wake()  # an approval may have scheduled the delivery
    return ok(result)


@post("/api/v1/leads/{leadId:str}/return", operation_id="returnLead",
      summary="Return a delivered lead", tags=TAGS,
      description=("A buyer sent a delivered lead back: within the endpoint's return window the lead becomes "
                   "`returned` and a return ledger entry cancels the delivery's revenue. 409 INVALID_STATE when it "
                   "is not delivered, already returned, past the window or the endpoint takes no returns."),
      status_code=200,
      opt={"body": returns.ReturnBody, "data": returns.ReturnResult, "errors": ["NOT_FOUND", "INVALID_STATE"]})
async def return_lead(request: Request, lead_id: LeadId) -> Response:
    """See appliance/services/returns.py: a delivered lead sent back within its return window."""
    who = principal(request.scope)
    body = await read_json(request, returns.ReturnBody)
    state = request.app.state
    return ok(await returns.return_lead(state.runtime, state.settings.get(who.tenant_id, who.config_rev),
                                        who.tenant_id, who.actor, lead_id, body))


# ---- GET /api/v1/leads --------------------------------------------------------

DEFAULT_LIMIT, MAX_LIMIT = 25, 100
MAX_LIST_VALUES = 100
MAX_SEARCH = 200
MAX_NAME_TOKENS = 8
Query = Annotated[str | None, QueryParameter()]
_PHONE_PUNCTUATION = re.compile(r"[\s+\-().]")
_NAME_TOKEN = re.compile(r"[^\W_]+")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class LeadPage(Model):
    leads: list[LeadRecord]
    next_cursor: str | None
    has_more: bool


def query_date_bound(request: Request, name: str, *, end: bool) -> int | None:
    """The bound as epoch milliseconds (exclusive for the end)."""
    raw = query_str(request, name)
    if raw is None:
        return None
    parsed = lead_updates.parse_iso(raw)
    if parsed is None:
        raise ValidationFailed([f"{name}: must be an ISO 8601 date or timestamp"])
    moment, bare_date = parsed
    epoch_ms = (moment - _EPOCH) // timedelta(milliseconds=1)
    if end:  # inclusive: a date means through the end of that UTC day, a timestamp through its millisecond
        epoch_ms += 86_400_000 if bare_date else 1
    return epoch_ms


def query_id_range(request: Request, prefix: str) -> tuple[str | None, str | None]:
    """`startDate` and `endDate` as bounds on time-ordered ids of `prefix`: (inclusive lower,
    exclusive upper), each None when not given."""
    after_ms = query_date_bound(request, "startDate", end=False)
    before_ms = query_date_bound(request, "endDate", end=True)
    # Compared as times: ids cannot go below the epoch, so two pre-1970 dates share an id bound.
    if after_ms is not None and before_ms is not None and before_ms <= after_ms:
        raise ValidationFailed(["endDate: must not be before startDate"])
    return (floor_id(prefix, after_ms) if after_ms is not None else None,
            floor_id(prefix, before_ms) if before_ms is not None else None)


def query_csv(request: Request, name: str) -> tuple[str, ...]:
    raw = query_str(request, name)
    if raw is None:
        return ()
    values = tuple(dict.fromkeys(v.strip() for v in raw.split(",") if v.strip()))
    if len(values) > MAX_LIST_VALUES:
        raise ValidationFailed([f"{name}: at most {MAX_LIST_VALUES} values"])
    return values


def name_query(text: str) -> str | None:
    """A safe FTS5 query for the words of `text`: each one quoted and prefix-matched, all
    required (`"jan"* "doe"*`). User text never reaches FTS5 as syntax. None: no words."""
    tokens = _NAME_TOKEN.findall(text)[:MAX_NAME_TOKENS]
    return " ".join(f'"{token}"*' for token in tokens) or None


def search_filter(text: str, region: str) -> dict[str, str] | None:
    """LeadFilter fields for `search`; None when nothing can match. `@`: exact email; `lead_`:
    exact id; 7+ digits once phone punctuation is removed: exact E.164 phone; else names."""
    if "@" in text:
        return {"email": text.lower()}
    if text[:5].lower() == "lead_":
        return {"lead_id": "lead_" + text[5:].upper()}
    digits = _PHONE_PUNCTUATION.sub("", text)
    if len(digits) >= 7 and digits.isascii() and digits.isdigit():
        phone = to_e164(text, region)
        return {"phone_e164": phone} if phone else None
    query = name_query(text)
    return {"name_query": query} if query else None


def _page_json(rows: list[tuple[str, bytes]], limit: int) -> bytes:
    has_more = len(rows) > limit
    rows = rows[:limit]
    cursor = msgspec.json.encode(rows[-1][0] if has_more else None)
    return (b'{"leads":[' + b",".join(doc for _, doc in rows) + b'],"nextCursor":' + cursor
            + b',"hasMore":' + (b"true" if has_more else b"false") + b"}")


@get("/api/v1/leads", operation_id="listLeads",
     summary="List leads", tags=TAGS,
     description=("The tenant's leads newest first, without their submissions, filtered by campaign, client, offer,"
                  " status, creation dates or a search on email, phone, id or name; `nextCursor` gives the next "
                  "page. 400 names a bad filter or a cursor that is not one of the tenant's leads."),
     opt={"data": LeadPage})
async def list_leads(
    request: Request,
    cursor: Query = None,
    limit: Query = None,
    campaign_ids: Annotated[str | None, QueryParameter(name="campaignIds")] = None,
    client_ids: Annotated[str | None, QueryParameter(name="clientIds")] = None,
    offer_ids: Annotated[str | None, QueryParameter(name="offerIds")] = None,
    status: Query = None,
    search: Query = None,
    start_date: Annotated[str | None, QueryParameter(name="startDate")] = None,
    end_date: Annotated[str | None, QueryParameter(name="endDate")] = None,
) -> Response:
    """Newest first, `limit` (default 25, at most 100) per page, `cursor` = leadId of the last
    item of the previous page. Ids are time-ordered, so the cursor and the dates are id bounds."""
    tenant_id = principal(request.scope).tenant_id
    runtime = request.app.state.runtime
    per_page = query_int(request, "limit", DEFAULT_LIMIT, maximum=MAX_LIMIT)
    after_id, before_id = query_id_range(request, "lead")
    text = (query_str(request, "search") or "").strip()
    if len(text) > MAX_SEARCH:
        raise ValidationFailed([f"search: at most {MAX_SEARCH} characters"])
    found = search_filter(text, runtime.config.defaults.region) if text else {}
    after = query_str(request, "cursor")
    where = LeadFilter(
        campaign_ids=query_csv(request, "campaignIds"), client_ids=query_csv(request, "clientIds"),
        offer_ids=query_csv(request, "offerIds"), status=query_str(request, "status", choices=LEAD_STATUSES),
        after_id=after_id, before_id=min(filter(None, (before_id, after))) if before_id or after else None,
        **(found or {}))

    def read(tx) -> list[tuple[str, bytes]]:
        if after is not None and not tx.leads.lead_exists(tenant_id, after):
            raise ValidationFailed(["cursor: not a lead id of this tenant (use nextCursor of the previous page)"])
        if found is None:
            return []
        return tx.leads.lead_page(tenant_id, where, per_page + 1)

    return ok_raw(_page_json(await runtime.store.read_off_loop(read), per_page))


# ---- GET /api/v1/leads/{leadId} ----------------------------------------------------------------

@get("/api/v1/leads/{leadId:str}", operation_id="getLead",
     summary="Get a lead", tags=TAGS,
     description=("One lead with every submission it had, oldest first; 404 NOT_FOUND when it does not exist or "
                  "belongs to another tenant."),
     sync_to_thread=False,
     opt={"data": LeadDetail, "errors": ["NOT_FOUND"]})
def get_lead(request: Request, lead_id: LeadId) -> Response:
    """The lead record with its submissions, oldest first."""
    return ok_raw(_lead_detail(request.app.state.runtime.store, principal(request.scope).tenant_id, lead_id))


def _lead_detail(store: Store, tenant_id: str, lead_id: str) -> bytes:
    tx = store.reader()
    with tx:  # one read transaction: the lead and its submissions as of the same commit
        doc = tx.leads.lead_doc(tenant_id, lead_id)
        submissions = tx.leads.submission_docs_of(tenant_id, lead_id) if doc is not None else []
    if doc is None:
        raise NotFound()
    return doc[:-1] + b',"submissions":[' + b",".join(submissions) + b"]}"


def _allowed_keys(exc: ValidationFailed, prefix: str, keys: tuple[str, ...]) -> ValidationFailed:
    """An unknown key's problem (`<prefix><key>: unknown field`) lists the keys that may be set."""
    def said(detail: str) -> str:
        path = detail.split(":", 1)[0]
        top = path.startswith(prefix) and "." not in path[len(prefix):]
        return f"{detail} (allowed: {', '.join(keys)})" if top and detail.endswith(": unknown field") else detail

    return ValidationFailed([said(d) for d in exc.details or []])


# ---- PATCH /api/v1/leads/{leadId} ---------------------------------------------

@patch("/api/v1/leads/{leadId:str}", operation_id="updateLead",
       summary="Change a lead", tags=TAGS,
       description=("Changes a lead's status, notes and other bulk-update keys, or its contact fields, checked and "
                    "normalized as a submit does; a status change reaches its latest submission and its waiting "
                    "delivery. 400 names each bad field (an unknown key lists the allowed ones)."),
       status_code=200,
       opt={"body": lead_updates.LeadPatch, "data": LeadDetail, "errors": ["NOT_FOUND"]})
async def update_lead(request: Request, lead_id: LeadId) -> Response:
    """See appliance/services/lead_updates.py: the bulk-update keys and the contact fields."""
    who = principal(request.scope)
    try:
        body = await read_json(request, lead_updates.LeadPatch)
    except ValidationFailed as exc:
        raise _allowed_keys(exc, "", lead_updates.LEAD_PATCH_KEYS) from None
    runtime = request.app.state.runtime
    settings = request.app.state.settings.get(who.tenant_id, who.config_rev)
    lead_updates.check_lead_patch(body, settings.checked_fields, runtime.clock.now().date())
    await lead_updates.patch_lead(runtime, settings, who.tenant_id, who.actor, lead_id, body)
    return ok_raw(_lead_detail(runtime.store, who.tenant_id, lead_id))


# ---- PATCH /api/v1/leads/bulk -------------------------------------------------

@patch("/api/v1/leads/bulk", operation_id="bulkUpdateLeads",
       summary="Change many leads", tags=TAGS,
       description=("Applies the same changes to up to 1,000 leads named by id and answers how many changed; ids "
                    "that are not the tenant's change nothing."),
       status_code=200,
       opt={"body": lead_updates.BulkUpdateBody, "data": lead_updates.BulkUpdateResult})
async def bulk_update_leads(request: Request) -> Response:
    """See appliance/services/lead_updates.py for the keys and what a status change does."""
    who = principal(request.scope)
    try:
        body = await read_json(request, lead_updates.BulkUpdateBody)
    except ValidationFailed as exc:
        raise _allowed_keys(exc, "updates.", lead_updates.BULK_KEYS) from None
    runtime = request.app.state.runtime
    settings = request.app.state.settings.get(who.tenant_id, who.config_rev)
    lead_updates.check_bulk(body, settings.checked_fields, runtime.clock.now().date())
    return ok(await lead_updates.bulk_update(runtime, settings, who.tenant_id, who.actor, body))


# ---- POST /api/v1/leads/{leadId}/repost and /deliver -------------------

@post("/api/v1/leads/{leadId:str}/repost", operation_id="repostLead",
      summary="Send a lead again", tags=TAGS,
      description=("Makes a new submission of a failed, rejected, errored or returned lead and schedules its "
                   "delivery, optionally to another campaign or endpoint or with changed fields; no body is a plain"
                   " retry. 409 INVALID_STATE when the lead's status does not allow it."),
      status_code=201,
      opt={"body": reposts.RepostBody, "body_optional": True, "data": reposts.RepostResult, "status": 201,
           "errors": ["NOT_FOUND", "INVALID_STATE"]})
async def repost_lead(request: Request, lead_id: LeadId) -> Response:
    """Every body field is optional: an empty body (no content at all) is a simple retry.
    See appliance/services/reposts.py for the modes and the rules."""
    who = principal(request.scope)
    raw = await request.body()
    body = await read_json(request, reposts.RepostBody) if raw.strip() else reposts.RepostBody()
    state = request.app.state
    result = await reposts.repost(state.runtime, state.settings.get(who.tenant_id, who.config_rev),
                                  who.tenant_id, who.actor, lead_id, body, state.registry.prompt_evaluator())
    state.worker.wake()
    return ok(result, 201)


@post("/api/v1/leads/{leadId:str}/deliver", operation_id="deliverLead",
      summary="Deliver a lead by hand", tags=TAGS,
      description=("Makes a new submission of the lead to the campaign given, without routing, and schedules its "
                   "delivery. 409 INVALID_STATE when the lead is delivered or a delivery is already scheduled."),
      status_code=201,
      opt={"body": reposts.DeliverBody, "data": reposts.DeliverResult, "status": 201,
           "errors": ["NOT_FOUND", "INVALID_STATE"]})
async def deliver_lead(request: Request, lead_id: LeadId) -> Response:
    """See appliance/services/reposts.py for which leads may be delivered manually."""
    who = principal(request.scope)
    body = await read_json(request, reposts.DeliverBody)
    state = request.app.state
    result = await reposts.deliver(state.runtime, state.settings.get(who.tenant_id, who.config_rev),
                                   who.tenant_id, who.actor, lead_id, body, state.registry.prompt_evaluator())
    state.worker.wake()
    return ok(result, 201)


@post("/api/v1/leads/redeliver", operation_id="redeliverLeads",
      summary="Send matching leads again", tags=TAGS,
      description=("Sends again every failed, error or queued lead that matches the filters (at most 10,000 a call,"
                   " oldest first) and answers how many matched, were sent and were skipped, with why. 400 names an"
                   " unknown campaign, endpoint or status."),
      status_code=200,
      opt={"body": reposts.RedeliverBody, "data": reposts.RedeliverResult, "errors": ["VALIDATION_ERROR"]})
async def redeliver_leads(request: Request) -> Response:
    """Failed, error or queued leads by filter, sent again (at most 10,000 a call); see
    appliance/services/reposts.py."""
    who = principal(request.scope)
    body = await read_json(request, reposts.RedeliverBody)
    state = request.app.state
    result = await reposts.redeliver(state.runtime, state.settings.get(who.tenant_id, who.config_rev),
                                     who.tenant_id, who.actor, body)
    state.worker.wake()
    return ok(result)


ROUTES = [submit_lead, approve_lead, return_lead, list_leads, get_lead, update_lead, bulk_update_leads, repost_lead, deliver_lead,
          redeliver_leads]
