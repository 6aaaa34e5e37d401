"""Every failure the API can answer with, and the one place that turns exceptions into the
envelope `{success: false, error: {code, message, details?}}`."""

from __future__ import annotations

import logging

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, NotFoundException

from appliance.storage import StorageUnavailable, UnstorableText

log = logging.getLogger("appliance.api")

JSON = "application/json"


class ApiError(Exception):
    status = 500
    code = "INTERNAL_ERROR"
    message = "Internal server error"

    def __init__(self, details: list[str] | None = None, *, message: str | None = None) -> None:
        super().__init__(self.code)
        self.details = details
        if message is not None:
            self.message = message

    def headers(self) -> dict[str, str]:
        return {}


class ValidationFailed(ApiError):
    status, code, message = 400, "VALIDATION_ERROR", "Invalid input data"


class Unauthorized(ApiError):
    status, code, message = 401, "UNAUTHORIZED", "Authentication required"
    # RFC 9110 §11.6.1: a 401 carries a challenge saying how to authenticate. No registered scheme
    # sends a key in a header of its own, so the scheme is ours and its `header` names that header.
    API_KEY_CHALLENGE = 'APIKey realm="appliance", header="X-API-Key"'

    def __init__(self, challenge: str = API_KEY_CHALLENGE) -> None:
        super().__init__()
        self.challenge = challenge

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": self.challenge}


class Forbidden(ApiError):
    status, code, message = 403, "FORBIDDEN", "This key is not allowed to do that"


class NotFound(ApiError):
    status, code, message = 404, "NOT_FOUND", "Resource not found"


class MethodNotAllowed(ApiError):
    status, code, message = 405, "METHOD_NOT_ALLOWED", "Method not allowed on this route"


class InvalidState(ApiError):
    status, code, message = 409, "INVALID_STATE", "The resource's state does not allow this"


class PayloadTooLarge(ApiError):
    status, code, message = 413, "PAYLOAD_TOO_LARGE", "Request body is larger than 1 MiB"


class UnsupportedMediaType(ApiError):
    status, code, message = 415, "UNSUPPORTED_MEDIA_TYPE", "Request body must be application/json"


class RateLimited(ApiError):
    status, code, message = 429, "RATE_LIMITED", "Too many requests for this API key"

    def __init__(self, retry_after: int, *, message: str | None = None) -> None:
        super().__init__(message=message)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class ProviderError(ApiError):
    status, code, message = 502, "PROVIDER_ERROR", "The provider refused or could not be reached"


class ServiceUnavailable(ApiError):
    """The database cannot answer now (unreachable, disk full): nothing was stored; ask again later."""

    status, code, message = 503, "SERVICE_UNAVAILABLE", "The service cannot reach its database; retry later"
    RETRY_AFTER = 5

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.RETRY_AFTER)}


ERRORS_BY_STATUS: dict[int, type[ApiError]] = {
    cls.status: cls
    for cls in (ValidationFailed, Unauthorized, Forbidden, NotFound, MethodNotAllowed, InvalidState,
                PayloadTooLarge, UnsupportedMediaType, RateLimited, ProviderError, ServiceUnavailable)
}


def error_body(code: str, message: str, details: list[str] | None = None) -> bytes:
    error: dict = {"code": code, "message": message}
    if details is not None:
        error["details"] = details
    return msgspec.json.encode({"success": False, "error": error})


def _respond(error: ApiError, headers: dict[str, str] | None = None) -> Response:
    return Response(
        error_body(error.code, error.message, error.details),
        status_code=error.status,
        media_type=JSON,
        headers={**error.headers(), **(headers or {})},
    )


def handle_api_error(_: Request, exc: ApiError) -> Response:
    return _respond(exc)


def handle_http_exception(request: Request, exc: HTTPException) -> Response:
    """Litestar's own refusals (unknown route, wrong method, body too large, bad JSON)."""
    if isinstance(exc, NotFoundException):
        return _respond(NotFound())
    kind = ERRORS_BY_STATUS.get(exc.status_code)
    if kind is None or kind is RateLimited:
        if exc.status_code >= 500:
            return handle_unexpected(request, exc)
        return _respond(ValidationFailed([f"request: {exc.detail}"]))
    if kind is ValidationFailed:
        return _respond(ValidationFailed([f"body: {exc.detail}"]))
    if kind is MethodNotAllowed:  # RFC 9110: a 405 names the methods the route has
        allow = {k.lower(): v for k, v in (exc.headers or {}).items()}.get("allow")
        return _respond(kind(), {"Allow": allow} if allow else None)
    return _respond(kind())


def service_unavailable(exc: StorageUnavailable) -> ServiceUnavailable:
    # Not logged: an outage answers every request that needs the database, and a line each would
    # drown the log; the job loops say it once (appliance/jobs/outage.py).
    return ServiceUnavailable(message=f"Service unavailable: {exc.reason}; retry later")


def handle_storage_unavailable(_: Request, exc: StorageUnavailable) -> Response:
    return _respond(service_unavailable(exc))


def handle_unstorable_text(_: Request, exc: UnstorableText) -> Response:
    return _respond(ValidationFailed([f"request: {exc}"]))


def handle_unexpected(request: Request, exc: Exception) -> Response:
    body = unexpected_error_body(exc, request.method, request.scope.get("path_template", "?"),
                                 request.scope.get("state", {}).get("request_id", "-"))
    return Response(body, status_code=500, media_type=JSON)


def unexpected_error_body(exc: BaseException, method: str, path_template: str, request_id: str) -> bytes:
    """Logs a bug and returns the 500 body that names the request id."""
    # Type and place only: an exception's text or a traceback's locals can carry request data or
    # secrets, and logs must never hold those.
    log.error("internal error %s at %s on %s %s (request %s)", type(exc).__name__, _where(exc),
              method, path_template, request_id)
    return error_body("INTERNAL_ERROR", f"Internal server error (request {request_id})")


def _where(exc: BaseException) -> str:
    tb = exc.__traceback__
    if tb is None:
        return "?"
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}"


EXCEPTION_HANDLERS = {
    ApiError: handle_api_error,
    StorageUnavailable: handle_storage_unavailable,
    UnstorableText: handle_unstorable_text,
    HTTPException: handle_http_exception,
    Exception: handle_unexpected,
}
