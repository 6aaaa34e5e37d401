"""POST /api/v1/sms/send, a lead's messages, opt-out checks and orphan messages; the rules are in
appliance/services/sms.py."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, get, post
from litestar.params import PathParameter, QueryParameter

from appliance.services import sms
from appliance.api.auth import principal
from appliance.api.io import ok, query_int, query_str, read_json
from appliance.api.leads import DEFAULT_LIMIT, MAX_LIMIT
from appliance.errors import ValidationFailed

LeadId = Annotated[str, PathParameter(name="leadId")]
Query = Annotated[str | None, QueryParameter()]
TAGS = ["SMS"]  # this module's group in the OpenAPI document


def _page_of(request: Request) -> tuple[str | None, int]:
    """A message list's `cursor` (the previous page's last messageId; ids are time-ordered) and
    `limit`."""
    before = query_str(request, "cursor")
    if before is not None and not before.startswith("msg_"):
        raise ValidationFailed(["cursor: not a message id (use nextCursor of the previous page)"])
    return before, query_int(request, "limit", DEFAULT_LIMIT, maximum=MAX_LIMIT)


@post("/api/v1/sms/send", operation_id="sendSms",
      summary="Send a text message to a lead", tags=TAGS,
      description=("Sends an SMS to the lead's phone through the tenant's provider and stores it. 404 NOT_FOUND for"
                   " an unknown lead; 502 PROVIDER_ERROR when the provider refuses it or cannot be reached."),
      status_code=201,
      opt={"body": sms.SmsSendBody, "data": sms.SmsSendResult, "status": 201,
           "errors": ["NOT_FOUND", "PROVIDER_ERROR"]})
async def send_sms(request: Request) -> Response:
    who = principal(request.scope)
    body = await read_json(request, sms.SmsSendBody)
    state = request.app.state
    return ok(await sms.send(state.runtime, state.registry, who.tenant_id, body), 201)


@get("/api/v1/leads/{leadId:str}/messages", operation_id="listLeadMessages",
     summary="List a lead's text messages", tags=TAGS,
     description=("The SMS messages of the lead's conversations, newest first, a page at a time; 404 NOT_FOUND for "
                  "an unknown lead, 400 for a cursor that is not a message id."),
     sync_to_thread=False,
     opt={"data": sms.LeadMessagePage, "errors": ["NOT_FOUND", "VALIDATION_ERROR"],
          "query": {"cursor": {"type": "string", "pattern": "^msg_",
                               "description": "nextCursor of the previous page (a messageId)."}}})
def list_lead_messages(request: Request, lead_id: LeadId, cursor: Query = None, limit: Query = None) -> Response:
    """The SMS messages of the lead's conversations, newest first; `cursor` = messageId of the
    previous page's last item (ids are time-ordered)."""
    before, per_page = _page_of(request)
    return ok(sms.lead_messages(request.app.state.runtime, principal(request.scope).tenant_id, lead_id, before,
                                per_page))


@get("/api/v1/sms/opt-outs/check", operation_id="checkSmsOptOut",
     summary="Whether a phone opted out of texts", tags=TAGS,
     description=("`optedOut` true when the phone answered STOP (or another opt-out keyword) to one of the tenant's "
                  "texts and has not answered START since; `since` is when. Texts to it are refused with 409. 400 "
                  "VALIDATION_ERROR naming `phone` for a value that is not a phone number."),
     sync_to_thread=False,
     opt={"data": sms.OptOutStatus, "errors": ["VALIDATION_ERROR"],
          "query": {"phone": {"type": "string", "minLength": 1,
                              "description": "Required: E.164 (+14155552671) or national in the install's region."}}})
def check_sms_opt_out(request: Request, phone: Query = None) -> Response:
    value = query_str(request, "phone")
    if not value:
        raise ValidationFailed(["phone: required"])
    return ok(sms.opt_out_status(request.app.state.runtime, principal(request.scope).tenant_id, value))


@get("/api/v1/sms/orphan-messages", operation_id="listSmsOrphanMessages",
     summary="List texts from numbers no lead has", tags=TAGS,
     description=("Texts the tenant received from a phone no lead of it has (and HELP answers sent back to them), "
                  "newest first, a page at a time; 400 for a cursor that is not a message id."),
     sync_to_thread=False,
     opt={"data": sms.OrphanMessagePage, "errors": ["VALIDATION_ERROR"],
          "query": {"cursor": {"type": "string", "pattern": "^msg_",
                               "description": "nextCursor of the previous page (a messageId)."}}})
def list_sms_orphan_messages(request: Request, cursor: Query = None, limit: Query = None) -> Response:
    before, per_page = _page_of(request)
    return ok(sms.orphan_messages(request.app.state.runtime, principal(request.scope).tenant_id, before, per_page))


ROUTES = [send_sms, list_lead_messages, check_sms_opt_out, list_sms_orphan_messages]
