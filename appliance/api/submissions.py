"""GET and PATCH /api/v1/submissions/{submissionId}."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, get, patch
from litestar.params import PathParameter

from appliance.services import lead_updates
from appliance.api.auth import principal
from appliance.api.io import ok, ok_raw, read_json
from appliance.domain.lead import Submission
from appliance.errors import NotFound

SubmissionId = Annotated[str, PathParameter(name="submissionId")]
TAGS = ["Submissions"]  # this module's group in the OpenAPI document


@get("/api/v1/submissions/{submissionId:str}", operation_id="getSubmission",
     summary="Get a submission", tags=TAGS,
     description=("One pass of a lead through intake: its qualification, routing, posting, delivery and journey "
                  "events; 404 NOT_FOUND when it is not the tenant's."),
     sync_to_thread=False,
     opt={"data": Submission, "errors": ["NOT_FOUND"]})
def get_submission(request: Request, submission_id: SubmissionId) -> Response:
    doc = request.app.state.runtime.store.reader().leads.submission_doc(principal(request.scope).tenant_id,
                                                                        submission_id)
    if doc is None:
        raise NotFound()
    return ok_raw(doc)


@patch("/api/v1/submissions/{submissionId:str}", operation_id="updateSubmission",
       summary="Record a submission's outcome", tags=TAGS,
       description=("A merge patch for outcomes learned elsewhere (a buyer's callback, a CRM): objects are merged, "
                    "journey events and actions appended, and a status change reaches the lead; it never schedules "
                    "a delivery. 404 NOT_FOUND when it is not the tenant's."),
       status_code=200,
       opt={"body": lead_updates.SubmissionPatch, "data": Submission, "errors": ["NOT_FOUND"]})
async def update_submission(request: Request, submission_id: SubmissionId) -> Response:
    """Merge patch; journeyEvents and firstSubmissionActions are appended (see lead_updates)."""
    who = principal(request.scope)
    body = await read_json(request, lead_updates.SubmissionPatch)
    state = request.app.state
    return ok(await lead_updates.patch_submission(state.runtime, state.settings.get(who.tenant_id, who.config_rev),
                                                  who.tenant_id, submission_id, body, who.actor))


ROUTES = [get_submission, update_submission]
