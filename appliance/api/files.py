"""File references; the rules are in appliance/services/files.py."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, get, post
from litestar.params import PathParameter

from appliance.services import files
from appliance.api.auth import principal
from appliance.api.io import ok, ok_raw, read_json

LeadId = Annotated[str, PathParameter(name="leadId")]
FileKey = Annotated[str, PathParameter(name="fileKey")]


@post("/api/v1/files", operation_id="upsertFile", status_code=201,
      opt={"body": files.FileBody, "data": files.FileReference, "status": 201, "also_status": [200]})
async def upsert_file(request: Request) -> Response:
    """Creates (201) or updates (200, same fileId) the file reference of (leadId, fileKey)."""
    who = principal(request.scope)
    body = await read_json(request, files.FileBody)
    reference, created = await files.upsert(request.app.state.runtime, who.tenant_id, body)
    return ok(reference, 201 if created else 200)


@get("/api/v1/files/{leadId:str}/{fileKey:str}", operation_id="getFile", sync_to_thread=False,
     opt={"data": files.FileReference, "errors": ["NOT_FOUND"]})
def get_file(request: Request, lead_id: LeadId, file_key: FileKey) -> Response:
    tx = request.app.state.runtime.store.reader()
    return ok_raw(files.get_doc(tx, principal(request.scope).tenant_id, lead_id, file_key))


@get("/api/v1/files/{leadId:str}", operation_id="listFiles", sync_to_thread=False,
     opt={"data": files.FileList, "errors": ["NOT_FOUND"]})
def list_files(request: Request, lead_id: LeadId) -> Response:
    tx = request.app.state.runtime.store.reader()
    return ok_raw(files.list_json(tx, principal(request.scope).tenant_id, lead_id))


ROUTES = [upsert_file, get_file, list_files]
