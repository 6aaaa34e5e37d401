"""The built-in `documenso` e-signature adapter, loaded through the plugin registry as the app
loads it, against a fake Documenso API on a real local HTTP server (tests/documenso_fake.py):
what it sends, what each answer comes to, callbacks, the signed file, and a bad settings table."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from appliance.adapters.outbound import http_client
from appliance.config import Config, ConfigError, PluginsConfig, load_config
from appliance.plugins import Registry, load_plugins
from appliance.sdk import EsignAdapter, EsignFetched, EsignRequest, EsignSent
from tests.buyer_server import BuyerServer, free_port
from tests.documenso_fake import FakeDocumenso

API_KEY = "dk_test_0123456789abcdef"
SECRET = "whsec_documenso_0042"
LEAD_EMAIL = "jane.lead@example.com"
SIGNER = {"id": 7, "email": "", "name": "Signer", "role": "SIGNER", "signingOrder": 1}
VIEWER = {"id": 3, "email": "office@example.com", "name": "Office", "role": "VIEWER", "signingOrder": 2}


def registry_with(table: dict[str, Any] | None) -> Registry:
    tables = {} if table is None else {"documenso": table}
    return load_plugins(Config(plugins=PluginsConfig(dirs=[], tables=tables)))


@pytest.fixture
def fake() -> Iterator[FakeDocumenso]:
    with FakeDocumenso(api_key=API_KEY) as server:
        server.template("tpl-1", recipients=[VIEWER, SIGNER])
        yield server


def table_for(fake: FakeDocumenso, **changes: Any) -> dict[str, Any]:
    return {"base_url": fake.base_url, "api_key": API_KEY, "webhook_secret": SECRET, **changes}


@pytest.fixture
def adapter(fake: FakeDocumenso) -> EsignAdapter:
    registry = registry_with(table_for(fake))
    assert registry.errors == []
    found = registry.esign_adapter("documenso")
    assert found is not None
    return found


def esign_request(fake: FakeDocumenso, **changes: Any) -> EsignRequest:
    values: dict[str, Any] = {
        "template_id": "tpl-1", "title": "Service agreement", "external_id": "L-1/agreement",
        "recipient_email": LEAD_EMAIL, "recipient_name": "Jane Lead",
        "fields": {"plan": "Gold", "start_date": "2026-04-01"}, "settings": table_for(fake),
        "allow_private_addresses": True}
    return EsignRequest(**{**values, **changes})


def no_secret_in(reason: str | None) -> None:
    assert API_KEY not in (reason or "")
    assert SECRET not in (reason or "")
    assert LEAD_EMAIL not in (reason or "")


def send(adapter: EsignAdapter, request: EsignRequest) -> EsignSent:
    async def run() -> EsignSent:
        async with http_client() as http:
            return await adapter.send(request, http)
    sent = asyncio.run(run())
    no_secret_in(sent.reason)
    return sent


def fetch(adapter: EsignAdapter, document_id: str, settings: dict[str, Any], *, timeout: float = 10.0,
          allow_private: bool = True) -> EsignFetched:
    async def run() -> EsignFetched:
        async with http_client() as http:
            return await adapter.fetch_signed(document_id, settings, http, timeout_seconds=timeout,
                                              allow_private_addresses=allow_private)
    fetched = asyncio.run(run())
    no_secret_in(fetched.reason)
    return fetched


# ---- loading --------------------------------------------------------------------------------------

def test_the_adapter_is_built_in_and_loads_without_a_table():
    registry = registry_with(None)
    (report,) = [r for r in registry.load_report if r.name == "documenso"]
    assert report.builtin and report.error is None and report.provides == [("esign", "documenso")]
    assert registry.esign_adapter("documenso").name == "documenso"


@pytest.mark.parametrize("table, problem", [
    ('api_key = "%s"\napikey = "typo"' % API_KEY, "plugins.documenso.apikey: unknown field"),
    ('api_key = "%s"\ntimeout_seconds = "ten"' % API_KEY, "plugins.documenso.timeout_seconds: expected float, got str"),
    ('api_key = "%s"\ntimeout_seconds = 0' % API_KEY, "plugins.documenso.timeout_seconds: must be more than 0"),
    ("api_key = 42", "plugins.documenso.api_key: expected str"),
    ('base_url = "ftp://documenso.example"', "plugins.documenso.base_url: must be an http or https URL"),
])
def test_a_bad_table_stops_the_config_from_loading(tmp_path, table, problem):
    # Checked with the config, like every built-in adapter's table: a typo is found at start.
    path = tmp_path / "appliance.toml"
    path.write_text(f"[plugins.documenso]\n{table}\n")
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert problem in str(refused.value)
    assert API_KEY not in str(refused.value)


# ---- send -------------------------------------------------------------------------------------------

def test_send_generates_the_document_from_the_template_and_sends_it(fake, adapter):
    sent = send(adapter, esign_request(fake))

    assert sent.outcome == "sent" and sent.reason is None
    assert sent.provider_document_id == "1"
    template, generate, send_request = fake.requests
    assert (template.method, template.path) == ("GET", "/api/v1/templates/tpl-1")
    assert (generate.method, generate.path) == ("POST", "/api/v1/templates/tpl-1/generate-document")
    assert (send_request.method, send_request.path) == ("POST", "/api/v1/documents/1/send")
    for received in fake.requests:
        assert received.headers["authorization"] == API_KEY  # the bare token, as Documenso v1 takes it
        assert received.headers["accept"] == "application/json"
    for received in (generate, send_request):
        assert received.headers["content-type"] == "application/json"
    assert generate.json() == {
        "title": "Service agreement", "externalId": "L-1/agreement",
        "recipients": [{"id": 7, "email": LEAD_EMAIL, "name": "Jane Lead"}],  # the SIGNER, not the first
        "formValues": {"plan": "Gold", "start_date": "2026-04-01"}}
    assert send_request.json() == {"sendEmail": True}

    document = fake.documents[1]
    assert document["templateId"] == "tpl-1" and document["externalId"] == "L-1/agreement"
    assert document["formValues"] == {"plan": "Gold", "start_date": "2026-04-01"}
    assert document["sent"] is True
    (ours,) = [r for r in document["recipients"] if r["recipientId"] == 7]
    assert ours["email"] == LEAD_EMAIL
    assert sent.signing_url == ours["signingUrl"]
    assert sent.signing_url.startswith(f"{fake.base_url}/sign/")


def test_documents_are_numbered_and_each_send_has_its_own(fake, adapter):
    first = send(adapter, esign_request(fake))
    second = send(adapter, esign_request(fake, external_id="L-2/agreement", recipient_name=None))
    assert (first.provider_document_id, second.provider_document_id) == ("1", "2")
    assert first.signing_url != second.signing_url
    assert fake.documents[2]["externalId"] == "L-2/agreement"
    assert fake.requests_to("/api/v1/templates/tpl-1/generate-document")[1].json()["recipients"][0]["name"] == ""


def test_without_a_signer_the_lead_takes_the_first_recipient(fake, adapter):
    fake.template("viewers", recipients=[{**VIEWER, "id": 11}, {**VIEWER, "id": 12}])
    sent = send(adapter, esign_request(fake, template_id="viewers"))
    assert sent.outcome == "sent"
    assert fake.requests[1].json()["recipients"][0]["id"] == 11


def test_a_template_without_recipients_fails(fake, adapter):
    fake.template("empty", recipients=[])
    sent = send(adapter, esign_request(fake, template_id="empty"))
    assert (sent.outcome, sent.reason) == ("failed", "template empty has no recipient")
    assert len(fake.requests) == 1


def test_an_unknown_template_fails(fake, adapter):
    sent = send(adapter, esign_request(fake, template_id="tpl-missing"))
    assert (sent.outcome, sent.reason) == ("failed", "template tpl-missing not found at Documenso")
    assert fake.documents == {}


def test_a_recipient_documenso_refuses_fails_with_its_message(fake, adapter):
    sent = send(adapter, esign_request(fake, recipient_email="not-an-email"))
    assert sent.outcome == "failed"
    assert sent.reason == ("Documenso answered 400 to the generate-document request: "
                           "recipients.0.email: Invalid email")
    assert fake.documents == {}


def test_documenso_down_is_retried_and_the_next_send_goes_through(fake, adapter):
    fake.down = True
    sent = send(adapter, esign_request(fake))
    assert (sent.outcome, sent.reason) == ("retry", "Documenso answered 503 to the template request")
    fake.down = False
    assert send(adapter, esign_request(fake)).outcome == "sent"


@pytest.mark.parametrize("status", [500, 502, 408, 429, 401, 403])
def test_outages_and_refused_credentials_are_retried(fake, adapter, status):
    fake.fail_next(status)
    sent = send(adapter, esign_request(fake))
    assert sent.outcome == "retry"
    assert sent.reason.startswith(f"Documenso answered {status} to the template request")
    if status in (401, 403):
        assert "api_key in [plugins.documenso] was not accepted" in sent.reason
    assert fake.documents == {}


def test_a_wrong_api_key_is_retried(fake):
    registry = registry_with(table_for(fake, api_key="dk_wrong_key"))
    sent = send(registry.esign_adapter("documenso"), esign_request(fake, settings=table_for(fake, api_key="dk_wrong_key")))
    assert sent.outcome == "retry" and "401" in sent.reason and "dk_wrong_key" not in sent.reason


def test_no_api_key_is_retried_without_a_request(fake, adapter):
    settings = table_for(fake)
    del settings["api_key"]
    sent = send(adapter, esign_request(fake, settings=settings))
    assert (sent.outcome, sent.reason) == ("retry", "no api_key is configured in [plugins.documenso]")
    assert fake.requests == []


def test_a_refusal_at_a_later_step_names_the_step(fake, adapter):
    fake.fail_next(200, {"Recipient": [SIGNER]})
    fake.fail_next(200, {"documentId": 41, "recipients": [{"recipientId": 7, "signingUrl": "https://s.example/x"}]})
    fake.fail_next(404)
    sent = send(adapter, esign_request(fake))
    assert (sent.outcome, sent.reason) == ("failed", "document 41 not found at Documenso")


@pytest.mark.parametrize("body, problem", [
    ({"message": "Template is \x1b[31mnot\n ready"}, ": Template is [31mnot ready"),
    ({"message": "x" * 500}, ""),  # too long to quote
    ({"message": f"bad key {API_KEY} for {LEAD_EMAIL}"}, ": bad key *** for ***"),
    ({"error": "no message"}, ""),
    ("<html>Bad Request</html>", ""),
])
def test_other_refusals_fail_naming_the_status_and_a_short_message(fake, adapter, body, problem):
    fake.fail_next(400, body)
    sent = send(adapter, esign_request(fake))
    assert (sent.outcome, sent.reason) == ("failed", f"Documenso answered 400 to the template request{problem}")


def test_garbage_answers_fail_saying_what_is_missing(fake, adapter):
    fake.garbage = True
    sent = send(adapter, esign_request(fake))
    assert (sent.outcome, sent.reason) == ("failed", "Documenso's answer to the template request has no Recipient list")


@pytest.mark.parametrize("template", [{"Recipient": [{"name": "no id", "role": "SIGNER"}]},
                                      {"Recipient": [{"id": "7", "role": "SIGNER"}]}])
def test_a_template_recipient_without_an_integer_id_fails(fake, adapter, template):
    fake.fail_next(200, template)
    sent = send(adapter, esign_request(fake))
    assert sent.outcome == "failed" and "recipient without an integer id" in sent.reason


@pytest.mark.parametrize("answer, problem", [
    ("not json", "is not a JSON object"),
    ({"ok": True}, "has no integer documentId"),
    ({"documentId": "12", "recipients": []}, "has no integer documentId"),
    ({"documentId": True, "recipients": []}, "has no integer documentId"),
    ({"documentId": 12}, "has no recipients"),
    ({"documentId": 12, "recipients": []}, "has no recipients"),
    ({"documentId": 12, "recipients": [{"recipientId": 7}]}, "has no http(s) signingUrl"),
    ({"documentId": 12, "recipients": [{"recipientId": 7, "signingUrl": "javascript:alert(1)"}]},
     "has no http(s) signingUrl"),
])
def test_a_generate_answer_that_is_not_as_documented_fails_and_nothing_is_sent(fake, adapter, answer, problem):
    fake.fail_next(200, {"Recipient": [SIGNER]})
    fake.fail_next(200, answer)
    sent = send(adapter, esign_request(fake))
    assert (sent.outcome, sent.reason) == ("failed", f"Documenso's answer to the generate-document request {problem}")
    assert len(fake.requests) == 2  # no /send for a document we could not read


def test_the_signing_url_is_found_by_email_or_else_the_first(fake, adapter):
    fake.fail_next(200, {"Recipient": [SIGNER]})
    fake.fail_next(200, {"documentId": 5, "recipients": [
        {"recipientId": 1, "email": "other@example.com", "signingUrl": "https://sign.example/other"},
        {"recipientId": 2, "email": LEAD_EMAIL, "signingUrl": "https://sign.example/ours"}]})
    fake.fail_next(200, {})
    assert send(adapter, esign_request(fake)).signing_url == "https://sign.example/ours"
    fake.fail_next(200, {"Recipient": [SIGNER]})
    fake.fail_next(200, {"documentId": 6, "recipients": [
        {"recipientId": 1, "email": "other@example.com", "signingUrl": "https://sign.example/first"}]})
    fake.fail_next(200, {})
    assert send(adapter, esign_request(fake)).signing_url == "https://sign.example/first"


def test_a_stalled_answer_is_retried_after_the_table_timeout(fake):
    settings = table_for(fake, timeout_seconds=0.3)
    adapter = registry_with(settings).esign_adapter("documenso")
    fake.stall_next(3)
    started = time.monotonic()
    sent = send(adapter, esign_request(fake, settings=settings))
    assert (sent.outcome, sent.reason) == ("retry", "Documenso (template request) did not answer within 0.3 s")
    assert time.monotonic() - started < 2


def test_a_shorter_timeout_from_the_caller_wins(fake, adapter):
    fake.stall_next(0)
    fake.stall_next(3)  # the generate-document request
    sent = send(adapter, esign_request(fake, timeout_seconds=0.3))
    assert (sent.outcome, sent.reason) == ("retry", "Documenso (generate-document request) did not answer within 0.3 s")


def test_the_timeout_covers_the_whole_send(fake):
    settings = table_for(fake, timeout_seconds=0.6)
    adapter = registry_with(settings).esign_adapter("documenso")
    fake.stall_next(0.4)
    fake.stall_next(0.4)  # each answer in time, the two together not
    sent = send(adapter, esign_request(fake, settings=settings))
    assert (sent.outcome, sent.reason) == ("retry", "Documenso (generate-document request) did not answer within 0.6 s")


def test_an_unreachable_documenso_is_retried(fake, adapter):
    settings = table_for(fake, base_url=f"http://127.0.0.1:{free_port()}")
    sent = send(adapter, esign_request(fake, settings=settings))
    assert (sent.outcome, sent.reason) == ("retry", "Documenso (template request) could not be reached (connection failed)")


def test_the_ssrf_guard_refuses_a_private_base_url_without_a_request(fake, adapter):
    sent = send(adapter, esign_request(fake, allow_private_addresses=False))
    assert sent.outcome == "retry"
    assert sent.reason == "Documenso template request not sent: destination refused: 127.0.0.1 is a loopback address"
    assert fake.requests == []


def test_a_bad_table_on_the_request_fails_without_a_request(fake, adapter):
    sent = send(adapter, esign_request(fake, settings=table_for(fake, extra=1)))
    assert (sent.outcome, sent.reason) == ("failed", "[plugins.documenso] extra: unknown field")
    assert fake.requests == []


# ---- resuming a document an earlier try created -----------------------------------------------------

def test_a_send_step_outage_after_generate_is_retried_with_the_document_id(fake, adapter):
    fake.stall_next(0)  # the template request
    fake.stall_next(0)  # generate-document
    fake.fail_next(503)  # /send
    sent = send(adapter, esign_request(fake))
    assert (sent.outcome, sent.provider_document_id) == ("retry", "1")
    assert sent.reason == "Documenso answered 503 to the send request"
    assert list(fake.documents) == [1] and fake.documents[1]["status"] == "DRAFT"

    again = send(adapter, esign_request(fake, provider_document_id=sent.provider_document_id))
    assert (again.outcome, again.provider_document_id) == ("sent", "1")
    assert list(fake.documents) == [1]  # one document, whatever the tries
    assert len(fake.requests_to("/api/v1/templates/tpl-1/generate-document")) == 1


def test_a_refused_send_step_fails_without_an_id(fake, adapter):
    fake.stall_next(0)
    fake.stall_next(0)
    fake.fail_next(400, {"message": "Document is not valid"})
    sent = send(adapter, esign_request(fake))
    assert (sent.outcome, sent.provider_document_id) == ("failed", None)


def created(fake: FakeDocumenso, adapter: EsignAdapter, *, sent_already: bool = False) -> str:
    """A document generated at the fake by an earlier try, never sent (or sent, its answer lost)."""
    fake.stall_next(0)
    fake.stall_next(0)
    if sent_already:
        fake.stall_next(3)  # the /send goes through; its answer comes too late
        sent = send(adapter, esign_request(fake, timeout_seconds=0.5))
        deadline = time.monotonic() + 5
        while fake.documents[1]["status"] != "PENDING" and time.monotonic() < deadline:
            time.sleep(0.01)
    else:
        fake.fail_next(503)
        sent = send(adapter, esign_request(fake))
    assert (sent.outcome, sent.provider_document_id) == ("retry", "1")
    fake.requests.clear()
    return sent.provider_document_id


def test_resuming_a_draft_sends_it_without_generating_another(fake, adapter):
    document_id = created(fake, adapter)
    sent = send(adapter, esign_request(fake, provider_document_id=document_id))

    assert (sent.outcome, sent.provider_document_id, sent.reason) == ("sent", "1", None)
    get, send_request = fake.requests
    assert (get.method, get.path) == ("GET", "/api/v1/documents/1")
    assert get.headers["authorization"] == API_KEY
    assert (send_request.method, send_request.path) == ("POST", "/api/v1/documents/1/send")
    assert send_request.json() == {"sendEmail": True}
    assert list(fake.documents) == [1] and fake.documents[1]["status"] == "PENDING"
    (ours,) = [r for r in fake.documents[1]["recipients"] if r["email"] == LEAD_EMAIL]
    assert sent.signing_url == ours["signingUrl"]


@pytest.mark.parametrize("status", ["PENDING", "COMPLETED", "REJECTED"])
def test_resuming_a_document_sent_already_does_not_send_it_again(fake, adapter, status):
    document_id = created(fake, adapter, sent_already=True)
    fake.documents[1]["status"] = status
    sent = send(adapter, esign_request(fake, provider_document_id=document_id))

    assert (sent.outcome, sent.provider_document_id) == ("sent", "1")
    (get,) = fake.requests  # no second /send
    assert (get.method, get.path) == ("GET", "/api/v1/documents/1")
    (ours,) = [r for r in fake.documents[1]["recipients"] if r["email"] == LEAD_EMAIL]
    assert sent.signing_url == ours["signingUrl"]


def test_resuming_another_leads_document_fails(fake, adapter):
    document_id = created(fake, adapter)
    sent = send(adapter, esign_request(fake, external_id="L-2/agreement", provider_document_id=document_id))
    assert (sent.outcome, sent.reason) == ("failed", "document 1 at Documenso is not this lead's")
    assert [r.path for r in fake.requests] == ["/api/v1/documents/1"]
    assert fake.documents[1]["status"] == "DRAFT"


def test_resuming_an_unknown_document_fails(fake, adapter):
    sent = send(adapter, esign_request(fake, provider_document_id="99"))
    assert (sent.outcome, sent.reason) == ("failed", "document 99 not found at Documenso")
    assert [r.path for r in fake.requests] == ["/api/v1/documents/99"]
    assert fake.documents == {}


@pytest.mark.parametrize("status", [503, 429])
def test_an_outage_while_resuming_is_retried_with_the_same_id(fake, adapter, status):
    document_id = created(fake, adapter)
    fake.fail_next(status)
    sent = send(adapter, esign_request(fake, provider_document_id=document_id))
    assert (sent.outcome, sent.provider_document_id) == ("retry", "1")
    assert sent.reason == f"Documenso answered {status} to the document request"
    fake.stall_next(0)  # the document request
    fake.fail_next(503)  # its /send
    sent = send(adapter, esign_request(fake, provider_document_id=document_id))
    assert (sent.outcome, sent.provider_document_id) == ("retry", "1")
    assert sent.reason == "Documenso answered 503 to the send request"
    assert list(fake.documents) == [1] and fake.documents[1]["status"] == "DRAFT"


def test_resuming_without_an_api_key_keeps_the_id(fake, adapter):
    settings = table_for(fake)
    del settings["api_key"]
    sent = send(adapter, esign_request(fake, settings=settings, provider_document_id="1"))
    assert (sent.outcome, sent.provider_document_id) == ("retry", "1")
    assert fake.requests == []


def test_resuming_builds_the_signing_url_from_the_token_when_there_is_no_signing_url(fake, adapter):
    answer = {"id": 4, "externalId": "L-1/agreement", "status": "PENDING", "recipients": [
        {"id": 1, "email": "office@example.com", "token": "tok-office", "role": "VIEWER"},
        {"id": 2, "email": "someone@example.com", "token": "tok-signer", "role": "SIGNER"},
        {"id": 3, "email": LEAD_EMAIL.upper(), "token": "tok-lead", "role": "SIGNER"}]}
    fake.fail_next(200, answer)
    sent = send(adapter, esign_request(fake, provider_document_id="4"))
    assert (sent.outcome, sent.signing_url) == ("sent", f"{fake.base_url}/sign/tok-lead")
    fake.fail_next(200, {**answer, "recipients": answer["recipients"][:2]})
    assert send(adapter, esign_request(fake, provider_document_id="4")).signing_url == f"{fake.base_url}/sign/tok-signer"
    fake.fail_next(200, {**answer, "recipients": answer["recipients"][:1]})
    assert send(adapter, esign_request(fake, provider_document_id="4")).signing_url == f"{fake.base_url}/sign/tok-office"


@pytest.mark.parametrize("answer, problem", [
    ("not json", "Documenso's answer to the document request is not a JSON object"),
    ({"ok": True}, "Documenso's answer to the document request has no externalId"),
    ({"externalId": "L-1/agreement", "status": "SENT", "recipients": []},
     "Documenso's answer to the document request has no known status"),
    ({"externalId": "L-1/agreement", "status": "DRAFT"}, "Documenso's answer to the document request has no recipients"),
    ({"externalId": "L-1/agreement", "status": "DRAFT", "recipients": [{"email": LEAD_EMAIL}]},
     "Documenso's answer to the document request has no http(s) signingUrl or token for the lead"),
    ({"externalId": "L-1/agreement", "status": "DRAFT",
      "recipients": [{"email": LEAD_EMAIL, "signingUrl": "javascript:alert(1)", "token": ""}]},
     "Documenso's answer to the document request has no http(s) signingUrl or token for the lead"),
])
def test_a_document_answer_that_is_not_as_documented_fails_and_nothing_is_sent(fake, adapter, answer, problem):
    fake.fail_next(200, answer)
    sent = send(adapter, esign_request(fake, provider_document_id="5"))
    assert (sent.outcome, sent.reason) == ("failed", problem)
    assert len(fake.requests) == 1


# ---- callbacks --------------------------------------------------------------------------------------

def test_a_callback_is_verified_by_the_shared_secret(fake, adapter):
    body = fake.callback("DOCUMENT_COMPLETED", 1, status="COMPLETED")
    assert adapter.verify_callback({"x-documenso-secret": SECRET}, body, table_for(fake))
    assert not adapter.verify_callback({"x-documenso-secret": SECRET + "x"}, body, table_for(fake))
    assert not adapter.verify_callback({"x-documenso-secret": ""}, body, table_for(fake))
    assert not adapter.verify_callback({}, body, table_for(fake))
    no_secret = table_for(fake)
    del no_secret["webhook_secret"]
    assert not adapter.verify_callback({"x-documenso-secret": SECRET}, body, no_secret)
    assert not adapter.verify_callback({"x-documenso-secret": ""}, body, table_for(fake, webhook_secret=""))
    assert not adapter.verify_callback({"x-documenso-secret": SECRET}, body, table_for(fake, bogus=True))


@pytest.mark.parametrize("event, status, expected", [
    ("DOCUMENT_OPENED", "PENDING", "viewed"),
    ("DOCUMENT_SIGNED", "PENDING", "in_progress"),
    ("DOCUMENT_SIGNED", "COMPLETED", "signed"),
    ("DOCUMENT_RECIPIENT_COMPLETED", "PENDING", "in_progress"),
    ("DOCUMENT_COMPLETED", "COMPLETED", "signed"),
    ("DOCUMENT_REJECTED", "REJECTED", "declined"),
    ("DOCUMENT_CANCELLED", "PENDING", "failed"),
    ("DOCUMENT_CREATED", "DRAFT", None),
    ("DOCUMENT_SENT", "PENDING", None),
    ("DOCUMENT_REMINDER_SENT", "PENDING", None),
])
def test_callback_events_map_to_statuses(fake, adapter, event, status, expected):
    assert send(adapter, esign_request(fake)).outcome == "sent"
    callback = adapter.read_callback(fake.callback(event, 1, status=status))
    assert callback is not None
    assert (callback.provider_document_id, callback.status) == ("1", expected)
    assert callback.reason == ("cancelled at Documenso" if expected == "failed" else None)


def test_a_string_document_id_is_read_too(adapter):
    callback = adapter.read_callback(b'{"event": "DOCUMENT_OPENED", "payload": {"id": "doc_9"}}')
    assert (callback.provider_document_id, callback.status) == ("doc_9", "viewed")


@pytest.mark.parametrize("body", [
    b"", b"not json", b"\xff\xfe", b"[]", b'"DOCUMENT_SIGNED"', b"[" * 100_000 + b"]" * 100_000,
    b'{"payload": {"id": 1}}',
    b'{"event": 7, "payload": {"id": 1}}',
    b'{"event": "DOCUMENT_SIGNED"}',
    b'{"event": "DOCUMENT_SIGNED", "payload": [1]}',
    b'{"event": "DOCUMENT_SIGNED", "payload": {}}',
    b'{"event": "DOCUMENT_SIGNED", "payload": {"id": null}}',
    b'{"event": "DOCUMENT_SIGNED", "payload": {"id": 1.5}}',
    b'{"event": "DOCUMENT_SIGNED", "payload": {"id": true}}',
    b'{"event": "DOCUMENT_SIGNED", "payload": {"id": ""}}',
])
def test_unreadable_callbacks_are_none(adapter, body):
    assert adapter.read_callback(body) is None


# ---- the signed file --------------------------------------------------------------------------------

def test_the_signed_file_is_fetched(fake, adapter):
    send(adapter, esign_request(fake))
    fake.signed_pdf = b"%PDF-1.7\n" + bytes(range(256)) * 100
    before = len(fake.requests)

    fetched = fetch(adapter, "1", table_for(fake))

    assert (fetched.outcome, fetched.content, fetched.content_type) == ("fetched", fake.signed_pdf, "application/pdf")
    download, file = fake.requests[before:]
    assert (download.method, download.path) == ("GET", "/api/v1/documents/1/download")
    assert download.headers["authorization"] == API_KEY
    assert (file.method, file.path) == ("GET", "/files/1.pdf")


def test_a_download_url_on_another_host_gets_no_api_key(fake, adapter):
    send(adapter, esign_request(fake))
    with BuyerServer() as storage:
        storage.route("/files/1.pdf", body=b"%PDF-1.4 from storage", headers={"Content-Type": "application/pdf"})
        fake.download_base_url = storage.url("")
        fetched = fetch(adapter, "1", table_for(fake))
        assert (fetched.outcome, fetched.content) == ("fetched", b"%PDF-1.4 from storage")
        (received,) = storage.requests
        assert "authorization" not in received.headers

        storage.route("/files/1.pdf", status=403, body="<Error>Request has expired</Error>")
        fetched = fetch(adapter, "1", table_for(fake))  # an expired pre-signed URL: a new one next time
        assert (fetched.outcome, fetched.reason) == ("retry", "Documenso answered 403 to the signed file download")
        storage.route("/files/1.pdf", status=404)
        fetched = fetch(adapter, "1", table_for(fake))
        assert (fetched.outcome, fetched.reason) == ("failed", "the signed file of document 1 is not at its downloadUrl")


def test_a_file_that_is_not_a_pdf_fails(fake, adapter):
    send(adapter, esign_request(fake))
    fake.signed_pdf = b"<html>Access denied</html>"
    fetched = fetch(adapter, "1", table_for(fake))
    assert (fetched.outcome, fetched.reason) == ("failed", "the signed file from Documenso is not a PDF")


def test_a_file_over_25_mb_fails(fake, adapter):
    send(adapter, esign_request(fake))
    fake.signed_pdf = b"%PDF-1.7\n" + b"0" * (25 * 1024 * 1024)
    fetched = fetch(adapter, "1", table_for(fake))
    assert (fetched.outcome, fetched.reason) == ("failed", "the signed file from Documenso is larger than 25 MB")


def test_fetching_an_unknown_document_fails(fake, adapter):
    fetched = fetch(adapter, "99", table_for(fake))
    assert (fetched.outcome, fetched.reason) == ("failed", "document 99 not found at Documenso")


def test_fetching_while_documenso_is_down_is_retried(fake, adapter):
    send(adapter, esign_request(fake))
    fake.down = True
    fetched = fetch(adapter, "1", table_for(fake))
    assert (fetched.outcome, fetched.reason) == ("retry", "Documenso answered 503 to the download request")
    fake.down = False
    fake.fail_next(200, {"downloadUrl": f"{fake.base_url}/files/1.pdf"})
    fake.fail_next(429)
    fetched = fetch(adapter, "1", table_for(fake))
    assert (fetched.outcome, fetched.reason) == ("retry", "Documenso answered 429 to the signed file download")


def test_a_garbage_download_answer_fails(fake, adapter):
    send(adapter, esign_request(fake))
    fake.garbage = True
    fetched = fetch(adapter, "1", table_for(fake))
    assert (fetched.outcome, fetched.reason) == ("failed", "Documenso's answer to the download request has no http(s) downloadUrl")


def test_a_stalled_download_is_retried(fake, adapter):
    send(adapter, esign_request(fake))
    fake.stall_next(0)
    fake.stall_next(3)  # the file itself
    fetched = fetch(adapter, "1", table_for(fake), timeout=0.3)
    assert (fetched.outcome, fetched.reason) == ("retry", "Documenso (signed file download) did not answer within 0.3 s")


def test_fetching_from_a_private_address_is_refused_without_a_request(fake, adapter):
    fetched = fetch(adapter, "1", table_for(fake), allow_private=False)
    assert fetched.outcome == "retry" and "loopback" in fetched.reason
    assert fake.requests == []
