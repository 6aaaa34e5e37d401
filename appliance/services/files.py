"""File references of a lead.

POST /api/v1/files upserts by (leadId, fileKey): a new pair is inserted (201) with a new
`file_...` id and status `pending` unless given; an existing pair is updated (200) and keeps its
fileId and createdAt. On update the required fields replace the stored ones and each optional
field replaces its stored value only when given (an update that leaves out `status` keeps the
status). `metadata`, when given, replaces the stored object whole.

Rules: `fileKey` lowercase letters, digits and underscores; `fileType` a file extension (letters
and digits, a leading dot is dropped, stored in lower case); `documentUrl` and `signingUrl`
absolute http or https URLs; `provider` and `status` from the interface's value sets; `signedAt`
ISO 8601 (a date or a timestamp; stored as UTC with milliseconds). The lead must be the caller's
tenant's: an unknown leadId, or another tenant's, is a VALIDATION_ERROR naming `leadId`
. The reads answer NOT_FOUND for a missing file, and
GET /api/v1/files/{leadId} for a lead that is not the caller's tenant's (the path resource),
so another tenant's lead cannot be told from a missing one; a lead without files lists
`{files: [], count: 0}`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

from appliance.clock import iso
from appliance.errors import InvalidState, NotFound, ValidationFailed
from appliance.ids import new_id
from appliance.services.lead_updates import parse_iso
from appliance.model import Model
from appliance.runtime import Runtime
from appliance.storage import Session

FileStatus = Literal["pending", "uploaded", "viewed", "in_progress", "signed", "verified", "expired", "declined",
                     "failed"]
FileProvider = Literal["esign_vendor", "manual_upload", "system_generated", "csv_import"]
FILE_KEY_PATTERN = "^[a-z0-9_]+$"
MAX_URL = 2048
MAX_METADATA_KEYS = 200

_EXTENSION = re.compile(r"^\.?([A-Za-z0-9]{1,16})$")
_URL_FORBIDDEN = re.compile(r"[\s\x00-\x1f\x7f]")


class FileBody(Model):
    """POST /api/v1/files."""

    lead_id: Annotated[str, Meta(min_length=1, max_length=64)]
    file_key: Annotated[str, Meta(min_length=1, max_length=100, pattern=FILE_KEY_PATTERN,
                                  description="lowercase letters, digits and underscores")]
    file_name: Annotated[str, Meta(min_length=1, max_length=255)]
    file_type: Annotated[str, Meta(min_length=1, max_length=17)]
    document_url: Annotated[str, Meta(min_length=1, max_length=MAX_URL)]
    signing_url: Annotated[str, Meta(min_length=1, max_length=MAX_URL)] | None = None
    provider: FileProvider | None = None
    provider_document_id: Annotated[str, Meta(max_length=256)] | None = None
    status: FileStatus | None = None
    signed_at: Annotated[str, Meta(max_length=64)] | None = None
    metadata: Annotated[dict[str, Any], Meta(max_length=MAX_METADATA_KEYS)] | None = None


class FileReference(Model):
    """A file reference as stored and returned, plus what the create request also accepts."""

    file_id: str
    lead_id: str
    file_key: str
    file_name: str
    file_type: str
    document_url: str
    signing_url: str | None = None
    status: FileStatus = "pending"
    provider: FileProvider | None = None
    provider_document_id: str | None = None
    signed_at: str | None = None
    metadata: dict[str, Any] | None = None
    created_at: str
    updated_at: str


class FileList(Model):
    lead_id: str
    files: list[FileReference]
    count: int


_decode = msgspec.json.Decoder(FileReference).decode
_encode = msgspec.json.Encoder().encode


def url_problem(url: str) -> str | None:
    if _URL_FORBIDDEN.search(url):
        return "must be an absolute http or https URL (no spaces or control characters)"
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        return "must be an absolute http or https URL"
    if parts.scheme.lower() not in ("http", "https") or not host:
        return "must be an absolute http or https URL"
    return None


def _checked(body: FileBody) -> tuple[str, str | None]:
    """(fileType as stored, signedAt as stored); raises with every problem found."""
    problems: list[str] = []
    if not body.file_name.strip():
        problems.append("fileName: must not be blank")
    extension = _EXTENSION.match(body.file_type)
    if extension is None:
        problems.append("fileType: must be a file extension (letters and digits, e.g. pdf)")
    for name, value in (("documentUrl", body.document_url), ("signingUrl", body.signing_url)):
        if value is not None and (problem := url_problem(value)):
            problems.append(f"{name}: {problem}")
    signed_at = None
    if body.signed_at is not None:
        parsed = parse_iso(body.signed_at)
        if parsed is None:
            problems.append("signedAt: must be an ISO 8601 date or timestamp")
        else:
            signed_at = iso(parsed[0])
    if problems:
        raise ValidationFailed(problems)
    assert extension is not None
    return extension.group(1).lower(), signed_at


async def upsert(runtime: Runtime, tenant_id: str, body: FileBody) -> tuple[FileReference, bool]:
    """The stored reference and whether it was created."""
    file_type, signed_at = _checked(body)
    now = iso(runtime.clock.now())

    def unit(tx: Session) -> tuple[FileReference, bool]:
        if not tx.leads.lead_exists(tenant_id, body.lead_id):
            raise ValidationFailed(["leadId: unknown lead"])
        stored = tx.files.find(tenant_id, body.lead_id, body.file_key)
        if stored is not None and tx.files.is_esign_managed(tenant_id, body.lead_id, body.file_key):
            # Its status and provider ids are the provider's word (through its callbacks): a
            # reference that could be rewritten here could claim a signature, or another's file.
            raise InvalidState(["fileKey: a document sent for e-signature; only its provider's callbacks change it"])
        given = {"file_name": body.file_name, "file_type": file_type, "document_url": body.document_url}
        optional = {"signing_url": body.signing_url, "status": body.status, "provider": body.provider,
                    "provider_document_id": body.provider_document_id, "signed_at": signed_at,
                    "metadata": body.metadata}
        given.update({k: v for k, v in optional.items() if v is not None})
        if stored is None:
            reference = FileReference(file_id=new_id("file"), lead_id=body.lead_id, file_key=body.file_key,
                                      created_at=now, updated_at=now, **given)
            tx.files.insert(tenant_id, file_id=reference.file_id, lead_id=body.lead_id,
                            file_key=body.file_key, created_at=now, doc=_encode(reference))
            return reference, True
        reference = msgspec.structs.replace(_decode(stored), updated_at=now, **given)
        tx.files.update(tenant_id, file_id=reference.file_id, updated_at=now, doc=_encode(reference))
        return reference, False

    return await runtime.store.write(unit, may_refuse=True)


def get_doc(tx: Session, tenant_id: str, lead_id: str, file_key: str) -> bytes:
    doc = tx.files.find(tenant_id, lead_id, file_key)
    if doc is None:
        raise NotFound()
    return doc


def list_json(tx: Session, tenant_id: str, lead_id: str) -> bytes:
    """`{leadId, files, count}` as JSON; NOT_FOUND when the lead is not the tenant's."""
    with tx:  # one read transaction: the lead check and its files as of the same commit
        if not tx.leads.lead_exists(tenant_id, lead_id):
            raise NotFound()
        docs = tx.files.docs_of(tenant_id, lead_id)
    return (b'{"leadId":' + _encode(lead_id) + b',"files":[' + b",".join(docs) + b'],"count":'
            + str(len(docs)).encode() + b"}")
