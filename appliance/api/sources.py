"""GET /api/v1/sources/{sourceId}/spec: what a supplier's source posts; built in
services/posting_spec.py."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, get
from litestar.params import PathParameter, QueryParameter

from appliance.api.auth import PING_PATH, SUBMIT_PATH, principal
from appliance.api.io import ok, query_str
from appliance.domain.posting_spec import PostingSpec
from appliance.services import posting_spec

TAGS = ["Sources"]


@get("/api/v1/sources/{sourceId:str}/spec", operation_id="getSourceSpec",
     summary="Get a source's posting spec", tags=TAGS,
     description=("What the ingestion source posts to a campaign that lists it: the submit URL (and the ping URL "
                  "when a ping gets an offer), every field with its type, whether it is required, the values the "
                  "campaign's rules allow and an example, and a curl line that submits the example body with "
                  "the key in `$KEY`. `campaignId` names the campaign; without it, the only campaign that lists the "
                  "source (preferring those that take its leads now). 404 NOT_FOUND when no campaign of the "
                  "tenant lists the source; 400 VALIDATION_ERROR when `campaignId` names a campaign that does "
                  "not, or is needed to choose among several."),
     sync_to_thread=False,
     opt={"data": PostingSpec, "errors": ["VALIDATION_ERROR", "NOT_FOUND"],
          "query": {"campaignId": {"type": "string", "description": "The campaign to post to (a campaign code)."}}})
def get_source_spec(request: Request, source_id: Annotated[str, PathParameter(name="sourceId")],
                    campaign_id: Annotated[str | None, QueryParameter(name="campaignId")] = None) -> Response:
    who = principal(request.scope)
    state = request.app.state
    return ok(posting_spec.source_spec(
        state.runtime, state.settings.get(who.tenant_id, who.config_rev), who.tenant_id, source_id,
        query_str(request, "campaignId"), submit_path=SUBMIT_PATH, ping_path=PING_PATH))


ROUTES = [get_source_spec]
