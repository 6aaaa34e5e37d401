"""GET /api/v1/leads/{leadId}/auctions; rounds are held by services/auction.py."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, get
from litestar.params import PathParameter, QueryParameter

from appliance.api.auth import principal
from appliance.api.io import ok, query_int, query_str
from appliance.api.leads import DEFAULT_LIMIT, MAX_LIMIT
from appliance.errors import ValidationFailed
from appliance.services import lead_auctions

LeadId = Annotated[str, PathParameter(name="leadId")]
Query = Annotated[str | None, QueryParameter()]
TAGS = ["Auctions"]  # this module's group in the OpenAPI document


@get("/api/v1/leads/{leadId:str}/auctions", operation_id="listLeadAuctions",
     summary="List a lead's auction rounds", tags=TAGS,
     description=("Each ping round of an auction campaign for this lead, newest first: every buyer of the "
                  "distribution with its outcome (bid, no_bid, below_floor, timeout, error, skipped), its bid, its "
                  "answer time and the reason, and the buyers the lead was sold to. 404 NOT_FOUND for an unknown "
                  "lead, 400 for a cursor that is not an auction id."),
     sync_to_thread=False,
     opt={"data": lead_auctions.LeadAuctionPage, "errors": ["NOT_FOUND", "VALIDATION_ERROR"],
          "query": {"cursor": {"type": "string", "pattern": "^auc_",
                               "description": "nextCursor of the previous page (an auctionId)."}}})
def list_lead_auctions(request: Request, lead_id: LeadId, cursor: Query = None, limit: Query = None) -> Response:
    per_page = query_int(request, "limit", DEFAULT_LIMIT, maximum=MAX_LIMIT)
    before = query_str(request, "cursor")
    if before is not None and not before.startswith("auc_"):
        raise ValidationFailed(["cursor: not an auction id (use nextCursor of the previous page)"])
    return ok(lead_auctions.lead_auctions(request.app.state.runtime, principal(request.scope).tenant_id, lead_id,
                                          before, per_page))


ROUTES = [list_lead_auctions]
