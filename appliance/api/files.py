"""File references; the rules are in appliance/services/files.py."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, get, post
from litestar.params import PathParameter

from appliance.services import files
from appliance.api.auth import principal
from appliance.api.io import ok, ok_raw, read_json
from appliance.errors import NotFound

LeadId = Annotated[str, PathParameter(name="leadId")]
FileKey = Annotated[str, PathParameter(name="fileKey")]
TAGS = ["Files"]  # this module's group in the OpenAPI document


@post("/api/v1/files", operation_id="upsertFile",
      summary="Create or replace a file reference", tags=TAGS,
      description=("Stores the reference to a lead's document (its URL, name and type) under a file key: 201 when "
                   "new, 200 with the same fileId when it replaced one. A lead that is not the tenant's is a 400 "
                   "naming leadId; a document the appliance sent for e-signature under that key is a 409 "
                   "INVALID_STATE (its provider's callbacks change it)."),
      status_code=201,
      opt={"body": files.FileBody, "data": files.FileReference, "status": 201, "also_status": [200],
           "errors": ["INVALID_STATE"]})
async def upsert_file(request: Request) -> Response:
    """Creates (201) or updates (200, same fileId) the file reference of (leadId, fileKey)."""
    who = principal(request.scope)
    body = await read_json(request, files.FileBody)
    reference, created = await files.upsert(request.app.state.runtime, who.tenant_id, body)
    return ok(reference, 201 if created else 200)


@get("/api/v1/files/{leadId:str}/{fileKey:str}", operation_id="getFile",
     summary="Get a file reference", tags=TAGS,
     description="A lead's file reference for one file key; 404 NOT_FOUND when there is none.",
     sync_to_thread=False,
     opt={"data": files.FileReference, "errors": ["NOT_FOUND"]})
def get_file(request: Request, lead_id: LeadId, file_key: FileKey) -> Response:
    tx = request.app.state.runtime.store.reader()
    return ok_raw(files.get_doc(tx, principal(request.scope).tenant_id, lead_id, file_key))


@get("/api/v1/files/{leadId:str}", operation_id="listFiles",
     summary="List a lead's file references", tags=TAGS,
     description=("Every file reference of a lead, an empty list when it has none; 404 NOT_FOUND when the lead is "
                  "not the tenant's."),
     sync_to_thread=False,
     opt={"data": files.FileList, "errors": ["NOT_FOUND"]})
def list_files(request: Request, lead_id: LeadId) -> Response:
    tx = request.app.state.runtime.store.reader()
    return ok_raw(files.list_json(tx, principal(request.scope).tenant_id, lead_id))


@get("/api/v1/files/{leadId:str}/{fileKey:str}/content", operation_id="getFileContent",
     summary="Download a kept file", tags=TAGS,
     description=("The file the appliance keeps for a file reference: a document's signed PDF once its "
                  "e-signature provider reported it signed and the file was fetched. 404 NOT_FOUND while "
                  "there is none (and for a lead or file key that is not the tenant's)."),
     sync_to_thread=False,
     opt={"binary": "application/pdf", "errors": ["NOT_FOUND"]})
def get_file_content(request: Request, lead_id: LeadId, file_key: FileKey) -> Response:
    return kept_file(request, principal(request.scope).tenant_id, lead_id, file_key)


def kept_file(request: Request, tenant_id: str, lead_id: str, file_key: str) -> Response:
    """The kept file of a file reference as a download (the API's and the console's); 404 when
    none is kept."""
    kept = request.app.state.runtime.store.reader().files.content(tenant_id, lead_id, file_key)
    if kept is None:
        raise NotFound()
    content_type, content = kept
    return Response(content, media_type=content_type, headers={
        "Content-Disposition": f'attachment; filename="{file_key}.pdf"', "X-Content-Type-Options": "nosniff"})


ROUTES = [upsert_file, get_file, get_file_content, list_files]
