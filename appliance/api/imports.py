"""POST /api/v1/leads/import (multipart/form-data) and GET /api/v1/imports/{importId}; the rules
are in appliance/services/lead_import.py."""

from __future__ import annotations

import asyncio
import tempfile
from typing import Annotated, BinaryIO

from litestar import Request, Response, get, post
from litestar.datastructures import State
from litestar.params import PathParameter
from multipart import MultipartError, MultipartSegment, PushMultipartParser, parse_options_header

from appliance.api.auth import principal
from appliance.api.io import ok
from appliance.errors import NotFound, UnsupportedMediaType, ValidationFailed
from appliance.services import lead_import
from appliance.storage import Principal

ImportId = Annotated[str, PathParameter(name="importId")]
FORM = "multipart/form-data"
FIELDS = ("file", "campaignId", "mapping", "process")
MAX_FIELD = 64 * 1024  # each form field but the file
FORM_SLACK = 1024 * 1024  # what the other fields and the part headers may add to the file's size
IMPORT_FORM = {
    "type": "object",
    "required": ["file", "campaignId"],
    "additionalProperties": False,
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "The CSV file (UTF-8, a header row)."},
        "campaignId": {"type": "string", "minLength": 1, "maxLength": 64},
        "mapping": {"type": "string", "description": "A JSON object of CSV column -> submit field (dotted paths"
                    " such as address.state; null leaves a column out). Columns map by name without it."},
        "process": {"type": "string", "enum": ["true", "false"], "default": "true",
                    "description": "true: each row through the submit pipeline; false: stored with status new."},
    },
}

TAGS = ["Imports"]  # this module's group in the OpenAPI document


class _Form:
    """The parts of an import form: small fields in memory, the file in a temporary file."""

    def __init__(self) -> None:
        self.fields: dict[str, str] = {}
        self.file: BinaryIO | None = None
        self.file_name: str | None = None


def _too_large(limit: int) -> ValidationFailed:
    return ValidationFailed([f"file: larger than the {limit // (1024 * 1024)} MB limit of an import"])


async def read_form(request: Request, limit: int, fields: tuple[str, ...] = FIELDS) -> _Form:
    """The form, streamed: the file goes to disk as it arrives and a file over `limit` bytes is
    refused as soon as that is known (from Content-Length before anything is read). `fields`: the
    parts allowed (the console's form adds its CSRF token)."""
    media, options = parse_options_header(request.headers.get("content-type", ""))
    if media != FORM or not options.get("boundary"):
        raise UnsupportedMediaType(message="Request body must be multipart/form-data")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit + FORM_SLACK:
        raise _too_large(limit)
    form = _Form()
    segment: MultipartSegment | None = None
    value = bytearray()
    try:
        # Leaving the block closes the parser: a body that ends inside the form is an error.
        with PushMultipartParser(options["boundary"], max_segment_count=len(fields) + 1) as parser:
            async for chunk in request.stream():
                for part in parser.parse(chunk):
                    if isinstance(part, MultipartSegment):
                        segment = part
                        if segment.name not in fields:
                            raise ValidationFailed([f"{segment.name}: unknown field (allowed: {', '.join(fields)})"])
                        if segment.name in form.fields or (segment.name == "file" and form.file is not None):
                            raise ValidationFailed([f"{segment.name}: given more than once"])
                        if segment.name == "file":
                            # In the data folder: its disk is sized for leads (a /tmp may be memory).
                            form.file = tempfile.TemporaryFile(dir=request.app.state.runtime.config.data_dir)
                            form.file_name = segment.filename
                    elif part:
                        if segment is not None and segment.name == "file" and form.file is not None:
                            form.file.write(part)
                            if form.file.tell() > limit:
                                raise _too_large(limit)
                        else:
                            value += part
                            if len(value) > MAX_FIELD:
                                raise ValidationFailed([f"{segment.name if segment else 'body'}: at most 64 KiB"])
                    elif segment is not None:
                        if segment.name != "file":
                            try:
                                form.fields[segment.name] = value.decode("utf-8")
                            except UnicodeDecodeError:
                                raise ValidationFailed([f"{segment.name}: must be valid UTF-8 text"]) from None
                        segment, value = None, bytearray()
    except MultipartError as exc:
        close_form(form)
        raise ValidationFailed([f"body: not a complete multipart/form-data body ({exc})"]) from None
    except BaseException:
        close_form(form)
        raise
    return form


def close_form(form: _Form) -> None:
    if form.file is not None:
        form.file.close()


def _process(text: str | None) -> bool:
    if text is None or text.strip().lower() in ("", "true"):
        return True
    if text.strip().lower() == "false":
        return False
    raise ValidationFailed(["process: must be true or false"])


@post("/api/v1/leads/import", operation_id="importLeads",
      summary="Import a CSV file of leads", tags=TAGS,
      description=("Uploads a CSV file (multipart/form-data) into a campaign: the whole file is checked, the answer"
                   " (202) gives the import's id and its rows are imported in the background. 400 names the bad "
                   f"part, 409 INVALID_STATE when {lead_import.MAX_RUNNING} imports of the tenant are running, 415 "
                   "for another body type."),
      status_code=202, request_max_body_size=None,
      opt={"form": IMPORT_FORM, "data": lead_import.ImportStarted, "status": 202, "errors": ["VALIDATION_ERROR", "INVALID_STATE"]})
async def import_leads(request: Request) -> Response:
    """Checks the whole file, records the import and answers at once; the rows are imported by
    a task on this loop (GET /api/v1/imports/{importId} follows it)."""
    who = principal(request.scope)
    form = await read_form(request, request.app.state.runtime.config.imports.max_file_mb * 1024 * 1024)
    return ok(lead_import.ImportStarted(import_id=await begin_import(request.app.state, who, form)), 202)


async def begin_import(state: State, who: Principal, form: _Form) -> str:
    """Checks the form and the whole file, records the import and starts its task (the API's
    upload and the console's); closes the form's file when it refuses."""
    runtime = state.runtime
    try:
        problems = [f"{name}: required" for name in ("file", "campaignId")
                    if (form.file if name == "file" else form.fields.get(name)) is None]
        if problems:
            raise ValidationFailed(problems)
        process = _process(form.fields.get("process"))
        mapping = lead_import.parse_mapping(form.fields.get("mapping"))
        settings = state.settings.get(who.tenant_id, who.config_rev)
        campaign = settings.usable_campaign(form.fields["campaignId"])
        checked = await asyncio.to_thread(lead_import.check_file, form.file, mapping)
        import_id = await lead_import.start(runtime, who, campaign.campaign_id, form.file_name, checked, process)
    except BaseException:
        close_form(form)
        raise
    state.imports.start(lead_import.run(runtime, settings, who, state.registry, import_id, checked, campaign, process,
                                        state.worker.wake))
    return import_id


@get("/api/v1/imports/{importId:str}", operation_id="getImport",
     summary="Get an import's progress", tags=TAGS,
     description=("Where an import stands: its state, its row counts and the first failed rows with their problems;"
                  " 404 NOT_FOUND when it is not the tenant's."),
     sync_to_thread=False,
     opt={"data": lead_import.ImportStatus, "errors": ["NOT_FOUND"]})
def get_import(request: Request, import_id: ImportId) -> Response:
    found = lead_import.get(request.app.state.runtime, principal(request.scope).tenant_id, import_id)
    if found is None:
        raise NotFound()
    return ok(found)


ROUTES = [import_leads, get_import]
