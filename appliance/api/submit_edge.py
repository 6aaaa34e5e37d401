"""POST /api/v1/leads/submit answered at the ASGI edge, before Litestar.

Submit is the hot path, and Litestar's per-request machinery (router, middleware stack, request
and response objects) costs about as much CPU as the whole submit pipeline: on this machine a
bare Litestar endpoint that decodes a lead serves ~10,800 requests/s, the same decode as a plain
ASGI app on the same uvicorn ~40,000/s (bench/HISTORY.md). So the edge answers exactly
`POST /api/v1/leads/submit` itself, through the same functions as every route (authenticate,
require_json, submit_json, the error envelope); anything else on that path (other methods,
OPTIONS, a trailing slash) still goes through Litestar, where the route is declared for the
OpenAPI document too."""

from __future__ import annotations

from typing import Any

from litestar.types import Receive, Scope

from appliance.api.auth import SUBMIT_PATH, authenticate, header
from appliance.api.io import MAX_BODY, require_json
from appliance.api.leads import submit_json
from appliance.errors import (
    ApiError,
    PayloadTooLarge,
    ValidationFailed,
    error_body,
    service_unavailable,
    unexpected_error_body,
)
from appliance.storage import StorageUnavailable, UnstorableText

_JSON_HEADER = (b"content-type", b"application/json")


async def _read_body(scope: Scope, receive: Receive) -> bytes | None:
    """The whole body (413 past MAX_BODY), or None when the client went away."""
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise PayloadTooLarge()
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise PayloadTooLarge()
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def answer_submit(app_state: Any, scope: Scope,
                        receive: Receive) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
    """The answer's status, headers and body, or None when the client went away before its body
    was read. The caller sends it (with its request id header)."""
    scope["path_template"] = SUBMIT_PATH  # for the activity log, as Litestar would set it
    extra: list[tuple[bytes, bytes]] = []
    try:
        who = authenticate(scope, app_state, SUBMIT_PATH, "submitLead")
        # Before reading: a large body of another type is a 415, not a 413.
        require_json((header(scope, b"content-type") or b"").decode("latin-1"))
        body = await _read_body(scope, receive)
        if body is None:
            return None
        status, content = 201, await submit_json(app_state, who, body)
    except (ApiError, StorageUnavailable, UnstorableText) as exc:
        error = service_unavailable(exc) if isinstance(exc, StorageUnavailable) \
            else ValidationFailed([f"request: {exc}"]) if isinstance(exc, UnstorableText) else exc
        status, content = error.status, error_body(error.code, error.message, error.details)
        extra = [(name.lower().encode(), value.encode()) for name, value in error.headers().items()]
    except Exception as exc:  # the same 500 as every route: logged by type and place, no details
        status, content = 500, unexpected_error_body(exc, "POST", SUBMIT_PATH, scope["state"]["request_id"])
    return status, [*extra, _JSON_HEADER, (b"content-length", str(len(content)).encode())], content
