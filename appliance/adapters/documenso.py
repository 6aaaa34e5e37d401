"""The built-in e-signature adapter `documenso`: Documenso's public API v1, registered through the
plugin hook like any plugin.

Settings: `[plugins.documenso]` `base_url` (default https://app.documenso.com), `api_key` (sent as
`Authorization: <api_key>`, the bare token Documenso v1 takes; never logged, stored or put in a
reason), `webhook_secret` (what Documenso sends in `X-Documenso-Secret` with each callback),
`timeout_seconds` (default 10: one deadline over a whole send, its three requests included, and
over a whole fetch; the caller's `timeout_seconds` when that is shorter). Unknown keys and wrong
types fail the load. Every URL is checked by the SSRF guard (netguard) unless the caller allows
private addresses; redirects are not followed; answers are read up to 1 MiB (the signed file up to
25 MB).

Sending a document (JSON bodies, `Accept: application/json`):

1. `GET {base_url}/api/v1/templates/{templateId}`: the template's `Recipient` list; the lead takes
   the place of the first `SIGNER` (or of the first recipient).
2. `POST {base_url}/api/v1/templates/{templateId}/generate-document` with `title`, `externalId`,
   `recipients: [{id, email, name}]` and `formValues` (the document's field values): answers
   `documentId` and the recipients, each with its `signingUrl`.
3. `POST {base_url}/api/v1/documents/{documentId}/send` with `{"sendEmail": true}`. When this
   step comes to `retry`, the retry carries `documentId` as its `provider_document_id`: the
   document exists, and the next try must not generate another.

Resuming (the request carries `provider_document_id`, a document an earlier try created): no
template or generate-document request. `GET {base_url}/api/v1/documents/{id}` answers `id`,
`externalId`, `status` (DRAFT, PENDING, COMPLETED, REJECTED) and `recipients` (`id`, `email`,
`token`, `role`, ... and perhaps `signingUrl`). An `externalId` other than the request's fails.
DRAFT: the document is sent (step 3), then `sent`; any other status: it was sent already (the
answer was lost), `sent` without sending again (what became of it comes by callback). The signing
URL is that of the recipient with the lead's email (else the first SIGNER, else the first): its
`signingUrl` when that is an http(s) URL, else `{base_url}/sign/{token}`. Every `retry` while
resuming carries the id again.

Fetching the signed file: `GET {base_url}/api/v1/documents/{id}/download` answers a `downloadUrl`
(often another host, such as S3, which gets no Authorization header); that URL serves the PDF.

What the answers come to, for sending and fetching alike:

- `retry` (tried again later with backoff): a timeout, a connection error, a destination the SSRF
  guard refuses, 5xx, 408, 429, 401/403 (the api key, which the operator can fix), no api key set.
- `failed` (not retried): 404 (the template or document is not at Documenso), any other status
  (with Documenso's `message` when it is short), or a 2xx whose body is not what the API
  documents (the reason says what was wrong); a signed file that is not a PDF or is over 25 MB.

Reasons are in our words; Documenso's own `message` is quoted only when it is one short line, with
the api key, the webhook secret and the lead's email masked.

Callbacks (`POST /hooks/esign/documenso/<tenantId>`) are verified by `X-Documenso-Secret` equal to
`webhook_secret` (none configured: every callback is refused) and read as `{"event", "payload":
{"id", "status", ...}}`: DOCUMENT_OPENED -> viewed; DOCUMENT_SIGNED -> in_progress (signed when
the payload's status is COMPLETED); DOCUMENT_RECIPIENT_COMPLETED -> in_progress; DOCUMENT_COMPLETED
-> signed; DOCUMENT_REJECTED -> declined; DOCUMENT_CANCELLED -> failed; any other event changes
nothing.
"""

from __future__ import annotations

import hmac
import json
import re
import time
from typing import Any, Final, Literal, NamedTuple
from urllib.parse import quote

import httpx
import msgspec

from appliance import sdk
from appliance.adapters import netguard
from appliance.adapters.outbound import (MAX_RESPONSE_BYTES, Answer, Scrubber, get_capped, outage_reason,
                                         post_capped, transient)
from appliance.config import DocumensoSettings
from appliance.model import describe_validation_error

NAME: Final = "Documenso"
TABLE: Final = "[plugins.documenso]"
MAX_PDF_BYTES: Final = 25 * 1024 * 1024
MAX_MESSAGE_CHARS: Final = 200  # Documenso's `message` is quoted only up to this length
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")

# Callback events and what they say of the document; events not listed change nothing.
_EVENTS: Final[dict[str, sdk.EsignStatus]] = {
    "DOCUMENT_OPENED": "viewed",
    "DOCUMENT_SIGNED": "in_progress",
    "DOCUMENT_RECIPIENT_COMPLETED": "in_progress",
    "DOCUMENT_COMPLETED": "signed",
    "DOCUMENT_REJECTED": "declined",
    "DOCUMENT_CANCELLED": "failed",
}


def settings_of(table: dict[str, Any]) -> DocumensoSettings:
    """The table decoded; raises ValueError naming the key that is wrong."""
    try:
        return msgspec.convert(table, DocumensoSettings)
    except msgspec.ValidationError as exc:
        raise ValueError(f"{TABLE} {describe_validation_error(exc)}") from None


class _Stop(NamedTuple):
    """A call that did not get a usable 2xx: what the send or fetch comes to."""

    outcome: Literal["retry", "failed"]
    reason: str


class _Call(NamedTuple):
    """What one call needs besides its URL."""

    http: httpx.AsyncClient
    settings: DocumensoSettings
    timeout: float  # the whole send's or fetch's, as reasons name it
    deadline: float  # time.monotonic() by which the whole send or fetch is done
    allow_private: bool
    scrub: Scrubber

    def left(self) -> float:
        return self.deadline - time.monotonic()


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _web_url(value: Any) -> bool:
    if not isinstance(value, str) or len(value) > 4096 or _CONTROL.search(value) or " " in value:
        return False
    return netguard.unsendable_reason(value) is None


def _same_origin(a: str, b: str) -> bool:
    first, second = httpx.URL(a), httpx.URL(b)
    return (first.scheme, first.host, first.port) == (second.scheme, second.host, second.port)


def _message(body: bytes, scrub: Scrubber) -> str:
    """`: <Documenso's message>` when it is one short line, else nothing."""
    data = _json(body)
    message = data.get("message") if isinstance(data, dict) else None
    if not isinstance(message, str):
        return ""
    text = scrub(" ".join(_CONTROL.sub(" ", message).split())) or ""
    return f": {text}" if 0 < len(text) <= MAX_MESSAGE_CHARS else ""


async def _call(call: _Call, method: str, url: str, what: str, *, not_found: str, body: Any = None,
                accept: str = "application/json", authorized: bool = True,
                max_bytes: int = MAX_RESPONSE_BYTES) -> Answer | _Stop:
    """One request, in what is left of the deadline; its 2xx answer, or what the send or fetch
    comes to. `what` names the request in reasons; `not_found` is the reason for a 404."""
    who = f"{NAME} ({what})"
    if call.left() <= 0:
        return _Stop("retry", outage_reason(who, TimeoutError(), call.timeout))
    destination = await netguard.resolve_destination(
        url, call.allow_private, timeout=min(call.left(), netguard.RESOLVE_TIMEOUT_SECONDS))
    if destination.reason:
        return _Stop("retry", f"{NAME} {what} not sent: {destination.reason}")
    headers = {"Accept": accept}
    if authorized:
        headers["Authorization"] = call.settings.api_key or ""
    try:
        left = call.left()
        if left <= 0:
            raise TimeoutError
        if method == "POST":
            headers["Content-Type"] = "application/json"
            answer = await post_capped(call.http, url, headers=headers, content=json.dumps(body).encode(),
                                       timeout=left)
        else:
            answer = await get_capped(call.http, url, headers=headers, timeout=left, max_bytes=max_bytes)
    except (TimeoutError, httpx.HTTPError) as exc:
        return _Stop("retry", outage_reason(who, exc, call.timeout))
    status = answer.status
    if 200 <= status < 300:
        return answer
    if transient(status):
        return _Stop("retry", f"{NAME} answered {status} to the {what}")
    if status in (401, 403):  # the api key, or an expired pre-signed download URL: both can come right
        blame = f": the api_key in {TABLE} was not accepted" if authorized else ""
        return _Stop("retry", f"{NAME} answered {status} to the {what}{blame}")
    if status == 404:
        return _Stop("failed", not_found)
    return _Stop("failed", f"{NAME} answered {status} to the {what}{_message(answer.body, call.scrub)}")


def _prepare(table: dict[str, Any], http: httpx.AsyncClient, timeout: float, allow_private: bool,
             extra_secrets: tuple[str, ...] = ()) -> _Call | _Stop:
    try:
        settings = settings_of(table)
    except ValueError as exc:
        return _Stop("failed", str(exc))
    if not settings.api_key:
        return _Stop("retry", f"no api_key is configured in {TABLE}")
    budget = min(settings.timeout_seconds, timeout) if timeout > 0 else settings.timeout_seconds
    scrub = Scrubber([settings.api_key, settings.webhook_secret, *extra_secrets])
    return _Call(http, settings, budget, time.monotonic() + budget, allow_private, scrub)


class Documenso(sdk.EsignAdapter):
    name = "documenso"

    async def send(self, request: sdk.EsignRequest, http: httpx.AsyncClient) -> sdk.EsignSent:
        call = _prepare(request.settings, http, request.timeout_seconds, request.allow_private_addresses,
                        (request.recipient_email,))
        if isinstance(call, _Stop):
            done: sdk.EsignSent | _Stop = call
        elif request.provider_document_id:
            done = await _resume(call, request, request.provider_document_id)
        else:
            done = await _send(call, request)
        if isinstance(done, _Stop):
            # A retry of a document that exists keeps its id, so the next try resumes it again.
            keep = request.provider_document_id if done.outcome == "retry" else None
            return sdk.EsignSent(outcome=done.outcome, provider_document_id=keep or None, reason=done.reason)
        return done

    def verify_callback(self, headers: dict[str, str], body: bytes, settings: dict[str, Any]) -> bool:
        try:
            secret = settings_of(settings).webhook_secret
        except ValueError:
            return False
        given = headers.get("x-documenso-secret")
        if not secret or given is None:
            return False
        return hmac.compare_digest(given.encode(), secret.encode())

    def read_callback(self, body: bytes) -> sdk.EsignCallback | None:
        data = _json(body)
        if not isinstance(data, dict):
            return None
        event, payload = data.get("event"), data.get("payload")
        if not isinstance(event, str) or not isinstance(payload, dict):
            return None
        document_id = payload.get("id")
        if _is_int(document_id):
            document_id = str(document_id)
        elif not isinstance(document_id, str) or not 0 < len(document_id) <= 128:
            return None
        status = _EVENTS.get(event)
        if event == "DOCUMENT_SIGNED" and payload.get("status") == "COMPLETED":
            status = "signed"  # the last signature: Documenso may send this before DOCUMENT_COMPLETED
        reason = "cancelled at Documenso" if status == "failed" else None
        return sdk.EsignCallback(provider_document_id=document_id, status=status, reason=reason)

    async def fetch_signed(self, provider_document_id: str, settings: dict[str, Any], http: httpx.AsyncClient, *,
                           timeout_seconds: float = 10.0, allow_private_addresses: bool = False) -> sdk.EsignFetched:
        call = _prepare(settings, http, timeout_seconds, allow_private_addresses)
        fetched = call if isinstance(call, _Stop) else await _fetch(call, provider_document_id)
        if isinstance(fetched, _Stop):
            return sdk.EsignFetched(outcome=fetched.outcome, reason=fetched.reason)
        return sdk.EsignFetched(outcome="fetched", content=fetched, content_type="application/pdf")


async def _send(call: _Call, request: sdk.EsignRequest) -> sdk.EsignSent | _Stop:
    base = call.settings.base_url.rstrip("/")
    template = quote(request.template_id, safe="")
    shown = request.template_id[:100]
    not_found = f"template {shown} not found at {NAME}"

    answer = await _call(call, "GET", f"{base}/api/v1/templates/{template}", "template request",
                         not_found=not_found)
    if isinstance(answer, _Stop):
        return answer
    data = _json(answer.body)
    recipients = data.get("Recipient") if isinstance(data, dict) else None
    if not isinstance(recipients, list) or not all(isinstance(r, dict) for r in recipients):
        return _Stop("failed", f"{NAME}'s answer to the template request has no Recipient list")
    if not recipients:
        return _Stop("failed", f"template {shown} has no recipient")
    ours = next((r for r in recipients if r.get("role") == "SIGNER"), recipients[0])
    if not _is_int(ours.get("id")):
        return _Stop("failed", f"{NAME}'s answer to the template request has a recipient without an integer id")

    generate = {"title": request.title, "externalId": request.external_id,
                "recipients": [{"id": ours["id"], "email": request.recipient_email,
                                "name": request.recipient_name or ""}],
                "formValues": request.fields}
    answer = await _call(call, "POST", f"{base}/api/v1/templates/{template}/generate-document",
                         "generate-document request", not_found=not_found, body=generate)
    if isinstance(answer, _Stop):
        return answer
    data = _json(answer.body)
    if not isinstance(data, dict):
        return _Stop("failed", f"{NAME}'s answer to the generate-document request is not a JSON object")
    document_id = data.get("documentId")
    if not _is_int(document_id):
        return _Stop("failed", f"{NAME}'s answer to the generate-document request has no integer documentId")
    signers = data.get("recipients")
    if not isinstance(signers, list) or not signers or not all(isinstance(r, dict) for r in signers):
        return _Stop("failed", f"{NAME}'s answer to the generate-document request has no recipients")
    signer = next((r for r in signers if r.get("recipientId") == ours["id"]),
                  next((r for r in signers if r.get("email") == request.recipient_email), signers[0]))
    signing_url = signer.get("signingUrl")
    if not _web_url(signing_url):
        return _Stop("failed", f"{NAME}'s answer to the generate-document request has no http(s) signingUrl")

    answer = await _send_document(call, str(document_id))
    if isinstance(answer, _Stop):
        if answer.outcome == "retry":  # the document exists: the next try resumes it, never another
            return sdk.EsignSent(outcome="retry", provider_document_id=str(document_id), reason=answer.reason)
        return answer
    return sdk.EsignSent(outcome="sent", provider_document_id=str(document_id), signing_url=signing_url)


async def _send_document(call: _Call, document_id: str) -> Answer | _Stop:
    base = call.settings.base_url.rstrip("/")
    return await _call(call, "POST", f"{base}/api/v1/documents/{quote(document_id, safe='')}/send",
                       "send request", not_found=f"document {document_id[:100]} not found at {NAME}",
                       body={"sendEmail": True})


_STATUSES: Final = ("DRAFT", "PENDING", "COMPLETED", "REJECTED")


async def _resume(call: _Call, request: sdk.EsignRequest, document_id: str) -> sdk.EsignSent | _Stop:
    """Finish a send an earlier try began: the document `document_id` exists at Documenso."""
    base = call.settings.base_url.rstrip("/")
    shown = f"document {document_id[:100]}"
    answer = await _call(call, "GET", f"{base}/api/v1/documents/{quote(document_id, safe='')}",
                         "document request", not_found=f"{shown} not found at {NAME}")
    if isinstance(answer, _Stop):
        return answer
    data = _json(answer.body)
    what = f"{NAME}'s answer to the document request"
    if not isinstance(data, dict):
        return _Stop("failed", f"{what} is not a JSON object")
    if "externalId" not in data:
        return _Stop("failed", f"{what} has no externalId")
    if data["externalId"] != request.external_id:
        return _Stop("failed", f"{shown} at {NAME} is not this lead's")
    status = data.get("status")
    if status not in _STATUSES:
        return _Stop("failed", f"{what} has no known status")
    recipients = data.get("recipients")
    if not isinstance(recipients, list) or not recipients or not all(isinstance(r, dict) for r in recipients):
        return _Stop("failed", f"{what} has no recipients")
    email = request.recipient_email.casefold()
    ours = next((r for r in recipients if isinstance(r.get("email"), str) and r["email"].casefold() == email),
                next((r for r in recipients if r.get("role") == "SIGNER"), recipients[0]))
    signing_url = ours.get("signingUrl")
    if not _web_url(signing_url):
        token = ours.get("token")
        signing_url = f"{base}/sign/{quote(token, safe='')}" if isinstance(token, str) and token else None
        if not _web_url(signing_url):
            return _Stop("failed", f"{what} has no http(s) signingUrl or token for the lead")

    if status == "DRAFT":  # created, never sent
        sent = await _send_document(call, document_id)
        if isinstance(sent, _Stop):
            return sent
    # PENDING, COMPLETED, REJECTED: sent already (the answer was lost); callbacks tell the rest.
    return sdk.EsignSent(outcome="sent", provider_document_id=document_id, signing_url=signing_url)


async def _fetch(call: _Call, provider_document_id: str) -> bytes | _Stop:
    base = call.settings.base_url.rstrip("/")
    document = quote(provider_document_id, safe="")
    shown = f"document {provider_document_id[:100]}"
    not_found = f"{shown} not found at {NAME}"
    answer = await _call(call, "GET", f"{base}/api/v1/documents/{document}/download", "download request",
                         not_found=not_found)
    if isinstance(answer, _Stop):
        return answer
    data = _json(answer.body)
    download_url = data.get("downloadUrl") if isinstance(data, dict) else None
    if not _web_url(download_url):
        return _Stop("failed", f"{NAME}'s answer to the download request has no http(s) downloadUrl")
    # A pre-signed URL elsewhere (S3 ...) must not get the api key.
    answer = await _call(call, "GET", download_url, "signed file download", not_found=f"the signed file of {shown} is not at its downloadUrl",
                         accept="application/pdf", authorized=_same_origin(download_url, base),
                         max_bytes=MAX_PDF_BYTES + 1)  # one byte more tells a file over the limit
    if isinstance(answer, _Stop):
        return answer
    if len(answer.body) > MAX_PDF_BYTES:
        return _Stop("failed", f"the signed file from {NAME} is larger than {MAX_PDF_BYTES // (1024 * 1024)} MB")
    if not answer.body.startswith(b"%PDF"):
        return _Stop("failed", f"the signed file from {NAME} is not a PDF")
    return answer.body


@sdk.hookimpl
def appliance_esign_adapters(settings: dict[str, Any]) -> list[sdk.EsignAdapter]:
    """The built-in Documenso adapter; a bad `[plugins.documenso]` table fails the load (reported)."""
    settings_of(settings)
    return [Documenso()]
