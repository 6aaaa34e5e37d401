"""A fake of Documenso's public API v1 (what appliance/adapters/documenso.py speaks): a real local
HTTP server in a thread, the BuyerServer of tests/buyer_server.py with one handler for every path.

    with FakeDocumenso(api_key="dk_test") as fake:
        fake.template("tpl-1", recipients=[{"id": 7, "email": "", "name": "Signer", "role": "SIGNER"}])
        ... send with base_url = fake.base_url ...
        fake.requests        # every request (tests.buyer_server.Received), recorded before the reply
        fake.documents[1]    # {"templateId", "title", "externalId", "recipients", "formValues", "sent",
                             #  "status"}: status DRAFT until /send, then PENDING (a test may set it)
        fake.down = True     # every request answers 503 until set back to False
        fake.garbage = True  # 200 answers carry {"ok": true} instead of the documented fields
        fake.fail_next(400, {"message": "Invalid"})  # the next request answers this (queued, in order)
        fake.stall_next(2.0)  # the next request is answered (normally) only after 2 s
        fake.signed_pdf = b"%PDF-1.7 ..."            # what the download URL serves
        fake.callback("DOCUMENT_COMPLETED", 1, status="COMPLETED")  # a webhook body as Documenso sends it

Like Documenso it answers 401 `{"message": "Unauthorized"}` without the right `Authorization`
header (the bare api key), 404 for an unknown template or document, and 400 `{"message": ...}`
for a generate-document body its schema refuses. Documents are numbered from 1; each recipient
gets a token and `signingUrl` `{base_url}/sign/<token>`; `/api/v1/documents/{id}/download` answers
`{"downloadUrl": "{download_base_url}/files/{id}.pdf"}` (`download_base_url` is `base_url` unless
a test points it at another server), served there without authorization as a pre-signed URL is.
`GET /api/v1/documents/{id}` answers the document as Documenso's getDocument does: `id`,
`externalId`, `title`, `status` and `recipients` (`id`, `documentId`, `email`, `name`, `token`,
`role`, `signingOrder`, `signingStatus`, `readStatus`, `sendStatus`, `signingUrl`).
"""

from __future__ import annotations

import json
import re
import secrets
from collections import deque
from datetime import UTC, datetime
from typing import Any

from tests.buyer_server import BuyerServer, Received, Reply

_TEMPLATE = re.compile(r"^/api/v1/templates/([^/]+)$")
_GENERATE = re.compile(r"^/api/v1/templates/([^/]+)/generate-document$")
_SEND = re.compile(r"^/api/v1/documents/(\d+)/send$")
_DOWNLOAD = re.compile(r"^/api/v1/documents/(\d+)/download$")
_DOCUMENT = re.compile(r"^/api/v1/documents/(\d+)$")
_FILE = re.compile(r"^/files/(\d+)\.pdf$")


def _message(status: int, message: str) -> Reply:
    return Reply(status=status, body={"message": message})


class _EveryPath(dict):
    """BuyerServer looks a reply up by exact path; Documenso's paths carry ids, so every path
    gets the fake's one handler."""

    def __init__(self, handler: Any) -> None:
        super().__init__()
        self.handler = handler

    def get(self, path: str, default: Any = None) -> Any:
        return self.handler


class FakeDocumenso(BuyerServer):
    """See the module docstring."""

    def __init__(self, *, api_key: str = "dk_test") -> None:
        super().__init__()
        self.api_key = api_key
        self.routes = _EveryPath(self._answer)
        self.templates: dict[str, list[dict[str, Any]]] = {}
        self.documents: dict[int, dict[str, Any]] = {}
        self.down = False
        self.garbage = False
        self.signed_pdf = b"%PDF-1.7\n% a signed document\n%%EOF\n"
        self.download_base_url: str | None = None
        self._next: deque[Reply | float] = deque()  # scripted replies, and stalls (seconds)

    @property
    def base_url(self) -> str:
        return self.url("")

    def template(self, template_id: str, *, recipients: list[dict[str, Any]]) -> None:
        """A template with these recipients (`{id, email, name, role, signingOrder}`)."""
        with self.lock:
            self.templates[template_id] = [{"signingOrder": None, **r} for r in recipients]

    def fail_next(self, status: int, body: Any = None) -> None:
        with self.lock:
            self._next.append(Reply(status=status, body=body if body is not None else {"message": f"HTTP {status}"}))

    def stall_next(self, seconds: float) -> None:
        with self.lock:
            self._next.append(seconds)

    def callback(self, event: str, document_id: int, status: str = "PENDING") -> bytes:
        """A webhook body as Documenso posts it for `document_id`."""
        with self.lock:
            document = self.documents.get(document_id, {})
        payload = {"id": document_id, "externalId": document.get("externalId"), "status": status,
                   "title": document.get("title", ""), "recipients": document.get("recipients", [])}
        return json.dumps({"event": event, "payload": payload,
                           "createdAt": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
                           "webhookEndpoint": "https://appliance.example/hooks/esign/documenso/T"}).encode()

    # ---- the API ----------------------------------------------------------------------------------

    def _answer(self, received: Received) -> Reply:
        with self.lock:
            if self.down:
                return _message(503, "Service Unavailable")
            scripted = self._next.popleft() if self._next else None
        if isinstance(scripted, Reply):
            return scripted
        reply = self._route(received)
        reply.delay = scripted or 0.0
        if self.garbage and reply.status == 200 and isinstance(reply.body, dict):
            reply.body = {"ok": True}
        return reply

    def _route(self, received: Received) -> Reply:
        method, path = received.method, received.path
        if method == "GET" and (match := _FILE.match(path)):
            with self.lock:
                known = int(match[1]) in self.documents
            if not known:
                return _message(404, "Not found")
            return Reply(body=self.signed_pdf, headers={"Content-Type": "application/pdf"})
        if received.headers.get("authorization") != self.api_key:
            return _message(401, "Unauthorized")
        if method == "GET" and (match := _TEMPLATE.match(path)):
            return self._get_template(match[1])
        if method == "POST" and (match := _GENERATE.match(path)):
            return self._generate(match[1], received)
        if method == "POST" and (match := _SEND.match(path)):
            return self._send(int(match[1]))
        if method == "GET" and (match := _DOWNLOAD.match(path)):
            return self._download(int(match[1]))
        if method == "GET" and (match := _DOCUMENT.match(path)):
            return self._get_document(int(match[1]))
        return _message(404, "Not found")

    def _get_template(self, template_id: str) -> Reply:
        with self.lock:
            recipients = self.templates.get(template_id)
        if recipients is None:
            return _message(404, "Template not found")
        return Reply(body={"id": template_id, "title": f"Template {template_id}", "type": "PRIVATE",
                           "Recipient": [dict(r) for r in recipients], "Field": []})

    def _generate(self, template_id: str, received: Received) -> Reply:
        with self.lock:
            recipients = self.templates.get(template_id)
        if recipients is None:
            return _message(404, "Template not found")
        try:
            body = received.json()
        except ValueError:
            return _message(400, "Invalid JSON body")
        problem = _generate_problem(body, {r["id"] for r in recipients})
        if problem:
            return _message(400, problem)
        given = {r["id"]: r for r in body["recipients"]}
        with self.lock:
            document_id = len(self.documents) + 1
            signers = []
            for r in recipients:
                token = secrets.token_urlsafe(12)
                override = given.get(r["id"], {})
                signers.append({"recipientId": r["id"], "name": override.get("name", r.get("name", "")),
                                "email": override.get("email", r.get("email", "")), "token": token,
                                "role": r.get("role", "SIGNER"), "signingOrder": r.get("signingOrder"),
                                "signingUrl": f"{self.base_url}/sign/{token}"})
            self.documents[document_id] = {
                "templateId": template_id, "title": body.get("title"), "externalId": body.get("externalId"),
                "recipients": signers, "formValues": body.get("formValues"), "sent": False,
                "status": "DRAFT"}
        return Reply(body={"documentId": document_id, "externalId": body.get("externalId"),
                           "recipients": [dict(s) for s in signers]})

    def _send(self, document_id: int) -> Reply:
        with self.lock:
            document = self.documents.get(document_id)
            if document is None:
                return _message(404, "Document not found")
            document["sent"] = True
            if document.get("status", "DRAFT") == "DRAFT":
                document["status"] = "PENDING"
        return Reply(body={"message": "Document sent for signing successfully", "id": document_id,
                           "status": "PENDING"})

    def _get_document(self, document_id: int) -> Reply:
        with self.lock:
            document = self.documents.get(document_id)
            if document is None:
                return _message(404, "Document not found")
            status = document.get("status", "DRAFT")
            recipients = [{"id": r["recipientId"], "documentId": document_id, "templateId": None,
                           "email": r["email"], "name": r["name"], "token": r["token"], "role": r["role"],
                           "signingOrder": r.get("signingOrder"),
                           "signingStatus": "SIGNED" if status == "COMPLETED" else "NOT_SIGNED",
                           "readStatus": "NOT_OPENED", "sendStatus": "NOT_SENT" if status == "DRAFT" else "SENT",
                           "signingUrl": r["signingUrl"]}
                          for r in document["recipients"]]
            return Reply(body={"id": document_id, "externalId": document.get("externalId"),
                               "title": document.get("title"), "status": status, "recipients": recipients})

    def _download(self, document_id: int) -> Reply:
        with self.lock:
            known = document_id in self.documents
        if not known:
            return _message(404, "Document not found")
        base = self.download_base_url or self.base_url
        return Reply(body={"downloadUrl": f"{base}/files/{document_id}.pdf"})


def _generate_problem(body: Any, template_recipients: set[int]) -> str | None:
    """What Documenso's generate-document schema says of `body`, or None when it takes it."""
    if not isinstance(body, dict):
        return "Expected object, received " + type(body).__name__
    for key in ("title", "externalId"):
        if body.get(key) is not None and not isinstance(body[key], str):
            return f"{key}: Expected string"
    recipients = body.get("recipients")
    if not isinstance(recipients, list):
        return "recipients: Required"
    for n, r in enumerate(recipients):
        if not isinstance(r, dict):
            return f"recipients.{n}: Expected object"
        if not isinstance(r.get("id"), int) or isinstance(r.get("id"), bool):
            return f"recipients.{n}.id: Expected number"
        if r["id"] not in template_recipients:
            return f"Recipient with id {r['id']} not found in template"
        if not isinstance(r.get("email"), str) or not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", r["email"]):
            return f"recipients.{n}.email: Invalid email"
        if r.get("name") is not None and not isinstance(r["name"], str):
            return f"recipients.{n}.name: Expected string"
    values = body.get("formValues")
    if values is not None and (not isinstance(values, dict) or not all(
            isinstance(v, (str, int, float, bool)) for v in values.values())):
        return "formValues: Expected record of string, number or boolean"
    return None
