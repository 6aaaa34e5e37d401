"""Leads (interface 4.3, 4.6, 4.12, 4.13 and GET one)."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, post
from litestar.params import PathParameter

from appliance import approvals, intake
from appliance.api.auth import principal
from appliance.api.io import ok, read_json
from appliance.domain.submission import SubmitLead

LeadId = Annotated[str, PathParameter(name="leadId")]


@post("/api/v1/leads/submit", operation_id="submitLead", status_code=201,
      opt={"body": SubmitLead, "data": intake.SubmitResult, "status": 201, "errors": ["FORBIDDEN"]})
async def submit_lead(request: Request) -> Response:
    who = principal(request.scope)
    body = await read_json(request, SubmitLead)
    state = request.app.state
    result = await intake.submit(state.runtime, state.settings.get(who.tenant_id, who.config_rev), who, body)
    return ok(result, 201)


@post("/api/v1/leads/{leadId:str}/approve", operation_id="approveLead", status_code=200,
      opt={"body": approvals.ApproveBody, "data": approvals.ApproveResult, "errors": ["NOT_FOUND", "INVALID_STATE"]})
async def approve_lead(request: Request, lead_id: LeadId) -> Response:
    who = principal(request.scope)
    body = await read_json(request, approvals.ApproveBody)
    return ok(await approvals.decide(request.app.state.runtime, who.tenant_id, who.key_id, lead_id, body))


ROUTES = [submit_lead, approve_lead]
