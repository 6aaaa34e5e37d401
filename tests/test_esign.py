"""Campaign documents for e-signature through the HTTP API, with a fake Documenso: a qualified
lead's documents are sent in order, the lead waits at `document_sent`, Documenso's callbacks move
each file reference, every required document signed makes the lead `signed` and delivers it (its
signed PDF kept); declined or run out: `failed`; Documenso down: `pending` and retried; nonsense
from Documenso: the lead held. Callbacks that are not verified, or not the tenant's, change nothing."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from litestar.testing import TestClient

from appliance.runtime import Runtime
from appliance.services import tenancy
from tests.bundles import campaign
from tests.buyer_server import BuyerServer
from tests.conftest import make_tenant
from tests.documenso_fake import FakeDocumenso
from tests.people import sign_in
from tests.submit_support import FakeClock, condition, rule_set
from tests.worker_helpers import endpoint, lead_body, lead_of, live_app, status_is, submit, wait_for

START = datetime(2026, 3, 10, 15, 0, tzinfo=UTC)
API_KEY = "dk_live_documenso_0042"
SECRET = "whsec-documenso-shared-0042"
RETAINER = {"documentId": "retainer", "kind": "esign", "signTemplateId": "tpl-retainer", "name": "Retainer",
            "required": True, "autoSend": True, "expiresInDays": 7, "order": 2,
            "fieldMappingOverrides": [
                {"providerFieldName": "client_name", "sourceType": "field_library", "sourceValue": "firstName"},
                {"providerFieldName": "client_city", "sourceType": "field_library", "sourceValue": "address.city",
                 "fallbackTemplate": "{{address.state}} resident"}]}
NOTICE = {"documentId": "privacy notice", "kind": "esign", "signTemplateId": "tpl-notice", "name": "Privacy notice",
          "required": False, "autoSend": True, "order": 1}
TEXAS_ONLY = {"documentId": "tx-addendum", "kind": "esign", "signTemplateId": "tpl-tx", "name": "Texas addendum",
              "required": True, "autoSend": True, "order": 3,
              "conditions": rule_set(condition("address.state", "equals", ["TX"]))}
BY_HAND = {"documentId": "by-hand", "kind": "esign", "signTemplateId": "tpl-hand", "name": "Sent by hand",
           "required": True, "autoSend": False}
RECIPIENT = [{"id": 7, "email": "", "name": "Signer", "role": "SIGNER"}]


@pytest.fixture
def documenso() -> Iterator[FakeDocumenso]:
    with FakeDocumenso(api_key=API_KEY) as fake:
        for template in ("tpl-retainer", "tpl-notice", "tpl-tx", "tpl-hand"):
            fake.template(template, recipients=RECIPIENT)
        yield fake


@pytest.fixture
def receiver() -> Iterator[BuyerServer]:
    with BuyerServer() as server:
        server.route("/events", status=204)
        yield server


@pytest.fixture
def config_file(config_file: Path, documenso: FakeDocumenso) -> Path:
    with config_file.open("a") as f:  # the fake Documenso is on loopback
        f.write(f'\n[plugins.documenso]\nbase_url = "{documenso.base_url}"\napi_key = "{API_KEY}"\n'
                f'webhook_secret = "{SECRET}"\n\n[delivery]\nallow_private_addresses = true\n')
    return config_file


@pytest.fixture
def clock(runtime: Runtime) -> FakeClock:
    runtime.clock = FakeClock(START)
    return runtime.clock


@pytest.fixture
def live(runtime: Runtime, clock: FakeClock, tmp_path) -> Iterator[TestClient]:
    with live_app(runtime, tmp_path) as client:
        yield client


def tenant_with(runtime, *documents: dict, receiver: BuyerServer | None = None, name: str = "T", **extra):
    bundle = {"deliveryEndpoints": [endpoint()], "campaigns": [campaign(
        "ES1", "Signed retainers", delivery={"deliveryEndpointId": "ep"}, documents=list(documents), **extra)]}
    if receiver is not None:
        bundle["webhooks"] = [{"webhookId": "events", "url": receiver.url("/events"),
                               "events": ["lead.document_sent", "lead.signed", "lead.delivered", "lead.failed"]}]
    return make_tenant(runtime, name, bundle)


def files_of(live, tenant, lead_id: str) -> dict[str, dict]:
    response = live.get(f"/api/v1/files/{lead_id}", headers=tenant.headers)
    assert response.status_code == 200, response.text
    return {f["fileKey"]: f for f in response.json()["data"]["files"]}


def callback(live, tenant, body: bytes, *, secret: str | None = SECRET, adapter: str = "documenso",
             tenant_id: str | None = None):
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers["X-Documenso-Secret"] = secret
    return live.post(f"/hooks/esign/{adapter}/{tenant_id or tenant.tenant_id}", content=body, headers=headers)


def document_id_of(reference: dict) -> int:
    return int(reference["providerDocumentId"])


def events(lead: dict) -> list[str]:
    return [e["type"] for e in lead["submissions"][-1]["journeyEvents"]]


def test_documents_are_sent_in_order_signed_then_the_lead_is_delivered(live, runtime, documenso, receiver):
    tenant = tenant_with(runtime, RETAINER, NOTICE, TEXAS_ONLY, BY_HAND, receiver=receiver)
    data = submit(live, tenant, lead_body("ES1", address={"state": "CA"}))
    assert data["status"] == "qualified"
    lead = wait_for(live, tenant, data["leadId"], status_is("document_sent"))
    assert lead["submissions"][-1]["result"] == "waiting for Retainer to be signed"

    # In `order`: the notice (1), then the retainer (2); the Texas addendum does not apply and the
    # document without autoSend is never sent by itself.
    generated = [r for r in documenso.requests if r.path.endswith("/generate-document")]
    assert [r.path for r in generated] == ["/api/v1/templates/tpl-notice/generate-document",
                                           "/api/v1/templates/tpl-retainer/generate-document"]
    retainer_request = generated[1].json()
    assert retainer_request["formValues"] == {"client_name": "Ann", "client_city": "CA resident"}
    assert retainer_request["recipients"] == [{"id": 7, "email": lead["email"], "name": lead["firstName"] + " "
                                               + lead["lastName"]}]
    assert retainer_request["externalId"] == f"{data['leadId']}/esign_retainer"
    assert all(r.headers["authorization"] == API_KEY for r in documenso.requests)
    assert [d["sent"] for d in documenso.documents.values()] == [True, True]

    files = files_of(live, tenant, data["leadId"])
    assert set(files) == {"esign_privacy_notice", "esign_retainer"}
    retainer = files["esign_retainer"]
    assert retainer["provider"] == "esign_vendor" and retainer["status"] == "pending"
    assert retainer["fileName"] == "Retainer" and retainer["fileType"] == "pdf"
    assert retainer["signingUrl"].startswith(documenso.base_url + "/sign/")
    assert retainer["providerDocumentId"] == "2"
    assert retainer["documentUrl"].endswith(f"/api/v1/files/{data['leadId']}/esign_retainer/content")
    assert retainer["metadata"]["expiresAt"] == "2026-03-17T15:00:00.000Z"
    assert live.get(f"/api/v1/files/{data['leadId']}/esign_retainer/content",
                    headers=tenant.headers).status_code == 404  # nothing kept before it is signed

    answer = callback(live, tenant, documenso.callback("DOCUMENT_OPENED", 2))
    assert answer.status_code == 200, answer.text
    assert answer.json()["data"] == {"received": True, "changed": True, "status": "viewed"}
    assert files_of(live, tenant, data["leadId"])["esign_retainer"]["status"] == "viewed"
    assert lead_of(live, tenant, data["leadId"])["status"] == "document_sent"

    # Only the required document holds the lead: the notice may stay unsigned.
    assert callback(live, tenant, documenso.callback("DOCUMENT_COMPLETED", 2, status="COMPLETED")).status_code == 200
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered"))
    kinds = events(lead)
    for kind in ("documents_scheduled", "document_sent", "waiting_for_signature", "document_viewed",
                 "document_signed", "document_fetched", "delivery_scheduled"):
        assert kind in kinds, kinds
    assert kinds.index("document_signed") < kinds.index("delivery_scheduled") < kinds.index("delivered")
    retainer = files_of(live, tenant, data["leadId"])["esign_retainer"]
    assert retainer["status"] == "signed" and retainer["signedAt"] is not None
    content = live.get(f"/api/v1/files/{data['leadId']}/esign_retainer/content", headers=tenant.headers)
    assert content.status_code == 200
    assert content.content == documenso.signed_pdf
    assert content.headers["content-type"] == "application/pdf"

    # The events, to webhooks (and so to the plugins' on_lead_event hook, the same outbox).
    wait_until(lambda: {"lead.document_sent", "lead.signed", "lead.delivered"} <= {
        json.loads(r.body)["type"] for r in receiver.requests}, live)


def wait_until(predicate, live, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        live.app_state.webhook_sender.wake()
        time.sleep(0.02)


def test_a_declined_document_fails_the_lead_naming_it(live, runtime, documenso):
    tenant = tenant_with(runtime, RETAINER)
    data = submit(live, tenant, lead_body("ES1"))
    wait_for(live, tenant, data["leadId"], status_is("document_sent"))
    assert callback(live, tenant, documenso.callback("DOCUMENT_REJECTED", 1, status="REJECTED")).status_code == 200
    lead = wait_for(live, tenant, data["leadId"], status_is("failed"))
    assert lead["submissions"][-1]["result"] == "document Retainer was declined"
    assert files_of(live, tenant, data["leadId"])["esign_retainer"]["status"] == "declined"
    # A late callback cannot move a final status back.
    late = callback(live, tenant, documenso.callback("DOCUMENT_OPENED", 1))
    assert late.json()["data"] == {"received": True, "changed": False, "status": "declined"}


def test_a_document_unsigned_after_expires_in_days_fails_the_lead(live, runtime, clock, documenso):
    tenant = tenant_with(runtime, RETAINER)
    data = submit(live, tenant, lead_body("ES1"))
    wait_for(live, tenant, data["leadId"], status_is("document_sent"))
    clock.advance(days=6, hours=23)
    live.app_state.worker.wake()
    time.sleep(0.3)  # the worker polls every 50 ms: long enough for a job due too early to run
    assert lead_of(live, tenant, data["leadId"])["status"] == "document_sent"
    clock.advance(hours=1, seconds=1)
    lead = wait_for(live, tenant, data["leadId"], status_is("failed"))
    assert lead["submissions"][-1]["result"] == "document Retainer expired unsigned"
    assert files_of(live, tenant, data["leadId"])["esign_retainer"]["status"] == "expired"
    assert "document_expired" in events(lead)


def test_documenso_down_leaves_the_lead_pending_and_the_document_is_sent_later(live, runtime, clock, documenso):
    documenso.down = True
    tenant = tenant_with(runtime, RETAINER)
    data = submit(live, tenant, lead_body("ES1"))
    lead = wait_for(live, tenant, data["leadId"], lambda lead: "esign_error" in events(lead))
    assert lead["status"] == "pending"
    assert "could not be sent" in lead["submissions"][-1]["result"] and "retry 2" in lead["submissions"][-1]["result"]
    assert files_of(live, tenant, data["leadId"]) == {}
    documenso.down = False
    clock.advance(seconds=11)  # past the first retry (10 s)
    lead = wait_for(live, tenant, data["leadId"], status_is("document_sent"))
    assert len(documenso.documents) == 1


def test_an_answer_documenso_does_not_document_holds_the_lead(live, runtime, documenso):
    documenso.garbage = True
    tenant = tenant_with(runtime, RETAINER)
    data = submit(live, tenant, lead_body("ES1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("pending_action"))
    assert lead["submissions"][-1]["result"].startswith("document Retainer could not be sent: ")
    reference = files_of(live, tenant, data["leadId"])["esign_retainer"]
    assert reference["status"] == "failed" and reference["metadata"]["problem"]
    assert "providerDocumentId" not in reference or reference["providerDocumentId"] is None


def test_documents_wait_for_the_human_review(live, runtime, documenso):
    tenant = tenant_with(runtime, RETAINER, firstIntakeAction={"enabled": True, "action": "human_review",
                                                               "humanReview": {"reason": "check first"}})
    data = submit(live, tenant, lead_body("ES1"))
    assert data["status"] == "pending_action"
    live.app_state.worker.wake()
    time.sleep(0.3)  # the worker polls every 50 ms: long enough for a job that should not exist to run
    assert documenso.requests == []
    decided = live.post(f"/api/v1/leads/{data['leadId']}/approve", json={"status": "approved"},
                        headers=tenant.headers)
    assert decided.status_code == 200, decided.text
    wait_for(live, tenant, data["leadId"], status_is("document_sent"))
    assert len(documenso.documents) == 1


def test_campaigns_without_documents_deliver_as_before(live, runtime, documenso):
    tenant = tenant_with(runtime, BY_HAND, {**RETAINER, "isActive": False})
    data = submit(live, tenant, lead_body("ES1"))
    wait_for(live, tenant, data["leadId"], status_is("delivered"))
    assert documenso.requests == []


def test_callbacks_that_are_not_verified_or_not_the_tenants_change_nothing(live, runtime, documenso, caplog):
    tenant = tenant_with(runtime, RETAINER)
    other = tenant_with(runtime, RETAINER, name="Other")
    data = submit(live, tenant, lead_body("ES1"))
    lead = wait_for(live, tenant, data["leadId"], status_is("document_sent"))
    signed = documenso.callback("DOCUMENT_COMPLETED", 1, status="COMPLETED")
    caplog.set_level(logging.WARNING, logger="appliance.esign")

    assert callback(live, tenant, signed, secret=None).status_code == 401
    assert callback(live, tenant, signed, secret="not-the-secret").status_code == 401
    assert callback(live, tenant, signed, tenant_id=other.tenant_id).status_code == 404  # not the other's document
    assert callback(live, tenant, signed, tenant_id="ten_nobody").status_code == 404
    # Without the secret a tenant that exists and one that does not answer alike.
    assert callback(live, tenant, signed, tenant_id="ten_nobody", secret=None).status_code == 401
    assert callback(live, tenant, signed, adapter="nosuch").status_code == 404
    assert callback(live, tenant, documenso.callback("DOCUMENT_COMPLETED", 99, status="COMPLETED")).status_code == 404
    unreadable = callback(live, tenant, b"{not json")
    assert unreadable.status_code == 400 and unreadable.json()["error"]["code"] == "VALIDATION_ERROR"

    assert files_of(live, tenant, data["leadId"])["esign_retainer"]["status"] == "pending"
    assert lead_of(live, tenant, data["leadId"])["status"] == "document_sent"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "appliance.esign"]
    assert len(warnings) >= 7
    logged = "\n".join(r.getMessage() for r in warnings)
    assert lead["email"] not in logged and SECRET not in logged and "not-the-secret" not in logged


def test_a_document_naming_an_unknown_field_or_provider_is_refused_at_import(cli, runtime, tmp_path):
    tenant_id = cli.json("tenant", "create", "Imports")["tenantId"]
    bad_field = {**RETAINER, "fieldMappingOverrides": [
        {"providerFieldName": "x", "sourceType": "field_library", "sourceValue": "favouriteColour"}]}
    bad_type = {**RETAINER, "type": "paperless"}
    bad_fallback = {**RETAINER, "fieldMappingOverrides": [
        {"providerFieldName": "x", "sourceValue": "firstName", "fallbackTemplate": "{{address.state}} {{shoeSize}}"}]}
    for document, named in ((bad_field, "campaigns[0].documents[0].fieldMappingOverrides[0].sourceValue"),
                            (bad_type, "campaigns[0].documents[0].type"),
                            (bad_fallback, "campaigns[0].documents[0].fieldMappingOverrides[0].fallbackTemplate:"
                                           " unknown field library key 'shoeSize'")):
        path = tmp_path / "bundle.json"
        path.write_text(json.dumps({"campaigns": [campaign("ES1", "Signed", documents=[document])]}))
        result = cli("import", "--tenant", tenant_id, str(path), expect=1)
        assert named in result.output, result.output
    # A field the tenant's library has is fine.
    path.write_text(json.dumps({"fieldLibrary": [{"key": "favouriteColour", "label": "Colour", "category": "custom"}],
                                "campaigns": [campaign("ES1", "Signed", documents=[bad_field])]}))
    cli("import", "--tenant", tenant_id, str(path))


def test_the_console_lead_page_shows_each_document_and_its_status(live, runtime, documenso):
    tenant = tenant_with(runtime, RETAINER, NOTICE)
    data = submit(live, tenant, lead_body("ES1"))
    wait_for(live, tenant, data["leadId"], status_is("document_sent"))
    callback(live, tenant, documenso.callback("DOCUMENT_COMPLETED", 1, status="COMPLETED"))  # the notice
    wait_for(live, tenant, data["leadId"], lambda lead: "document_fetched" in events(lead))
    sign_in(live, tenant, "viewer")
    page = live.get(f"/admin/leads/{data['leadId']}")
    assert page.status_code == 200
    html = page.text
    assert 'data-file-key="esign_retainer"' in html and 'data-file-key="esign_privacy_notice"' in html
    assert "Retainer" in html and "Privacy notice" in html
    assert f'href="/admin/leads/{data["leadId"]}/files/esign_privacy_notice"' in html
    download = live.get(f"/admin/leads/{data['leadId']}/files/esign_privacy_notice")
    assert download.status_code == 200 and download.content == documenso.signed_pdf


LISTENER = '''
import json
from pathlib import Path
from appliance.sdk import hookimpl

@hookimpl
def on_lead_event(tenant_id, event):
    with (Path(__file__).parent / "events.jsonl").open("a") as f:
        f.write(json.dumps([event["type"], event["data"]["leadId"], event["data"]["status"]]) + "\\n")
'''


def test_the_plugins_on_lead_event_hook_gets_document_sent_and_signed(runtime, clock, documenso, tmp_path):
    (tmp_path / "plugins").mkdir(exist_ok=True)
    (tmp_path / "plugins" / "listener.py").write_text(LISTENER)
    tenant = tenant_with(runtime, RETAINER)
    with live_app(runtime, tmp_path) as live:
        data = submit(live, tenant, lead_body("ES1"))
        wait_for(live, tenant, data["leadId"], status_is("document_sent"))
        callback(live, tenant, documenso.callback("DOCUMENT_COMPLETED", 1, status="COMPLETED"))
        wait_for(live, tenant, data["leadId"], status_is("delivered"))
        log = tmp_path / "plugins" / "events.jsonl"

        def seen() -> list:
            return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

        wait_until(lambda: ["lead.delivered", data["leadId"], "delivered"] in seen(), live)
    assert ["lead.document_sent", data["leadId"], "document_sent"] in seen()
    assert ["lead.signed", data["leadId"], "signed"] in seen()


def test_an_optional_document_signed_after_delivery_is_kept_and_sells_nothing_twice(live, runtime, documenso):
    tenant = tenant_with(runtime, NOTICE)
    data = submit(live, tenant, lead_body("ES1"))
    wait_for(live, tenant, data["leadId"], status_is("delivered"))
    assert callback(live, tenant, documenso.callback("DOCUMENT_COMPLETED", 1, status="COMPLETED")).status_code == 200
    lead = wait_for(live, tenant, data["leadId"], lambda lead: "documents_updated" in events(lead))
    assert lead["status"] == "delivered" and events(lead).count("delivered") == 1
    assert live.get(f"/api/v1/files/{data['leadId']}/esign_privacy_notice/content",
                    headers=tenant.headers).content == documenso.signed_pdf


def test_a_signed_file_that_cannot_be_fetched_is_noted_once(live, runtime, documenso):
    documenso.signed_pdf = b"<html>not a pdf</html>"
    tenant = tenant_with(runtime, RETAINER, NOTICE)
    data = submit(live, tenant, lead_body("ES1"))
    wait_for(live, tenant, data["leadId"], status_is("document_sent"))
    callback(live, tenant, documenso.callback("DOCUMENT_COMPLETED", 1, status="COMPLETED"))  # the optional notice
    lead = wait_for(live, tenant, data["leadId"], lambda lead: "document_fetch_failed" in events(lead))
    assert lead["status"] == "document_sent"  # the notice holds nothing
    downloads = len([r for r in documenso.requests if r.path.startswith("/files/")])
    live.app_state.worker.wake()
    time.sleep(0.3)
    assert len([r for r in documenso.requests if r.path.startswith("/files/")]) == downloads  # not fetched again
    assert files_of(live, tenant, data["leadId"])["esign_privacy_notice"]["metadata"]["problem"]
    # The required retainer's file not fetched holds the lead for a person.
    callback(live, tenant, documenso.callback("DOCUMENT_COMPLETED", 2, status="COMPLETED"))
    lead = wait_for(live, tenant, data["leadId"], status_is("pending_action"))
    assert lead["submissions"][-1]["result"].startswith("document Retainer was signed but its file could not be fetched")


def test_a_resubmitted_lead_waits_for_the_same_documents_and_goes_on_when_signed(live, runtime, documenso):
    tenant = tenant_with(runtime, RETAINER)
    first = lead_body("ES1")
    data = submit(live, tenant, first)
    wait_for(live, tenant, data["leadId"], status_is("document_sent"))
    again = submit(live, tenant, {**first, "leadId": data["leadId"], "notes": "again"})
    assert again["leadId"] == data["leadId"]
    lead = wait_for(live, tenant, data["leadId"], lambda lead: len(lead["submissions"]) == 2
                    and lead["status"] == "document_sent")
    assert len(documenso.documents) == 1  # not sent twice
    callback(live, tenant, documenso.callback("DOCUMENT_COMPLETED", 1, status="COMPLETED"))
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered"))
    assert "document_signed" in events(lead)


def test_document_ids_that_make_the_same_file_key_are_refused_at_import(cli, tmp_path):
    tenant_id = cli.json("tenant", "create", "Imports")["tenantId"]
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps({"campaigns": [campaign("ES1", "Signed", documents=[
        RETAINER, {**RETAINER, "documentId": "Retainer"}])]}))
    result = cli("import", "--tenant", tenant_id, str(path), expect=1)
    assert "campaigns[0].documents[1].documentId: 'Retainer' makes the same file key as 'retainer'" in result.output


def test_a_sent_documents_reference_cannot_be_rewritten_and_a_posted_one_is_not_a_signature(live, runtime,
                                                                                              documenso):
    # Another tenant's document is number 1 at the (shared) Documenso account.
    other = tenant_with(runtime, RETAINER, name="Other")
    theirs = submit(live, other, lead_body("ES1"))
    wait_for(live, other, theirs["leadId"], status_is("document_sent"))
    tenant = tenant_with(runtime, RETAINER, firstIntakeAction={"enabled": True, "action": "human_review"})
    data = submit(live, tenant, lead_body("ES1"))
    forged = {"leadId": data["leadId"], "fileKey": "esign_retainer", "fileName": "Retainer", "fileType": "pdf",
              "documentUrl": "https://files.example.com/r.pdf", "provider": "esign_vendor",
              "providerDocumentId": "1", "status": "signed"}
    assert live.post("/api/v1/files", json=forged, headers=tenant.headers).status_code == 201
    live.post(f"/api/v1/leads/{data['leadId']}/approve", json={"status": "approved"}, headers=tenant.headers)
    lead = wait_for(live, tenant, data["leadId"], status_is("document_sent"))  # sent for real, not "signed"
    mine = files_of(live, tenant, data["leadId"])["esign_retainer"]
    assert mine["providerDocumentId"] == "2" and mine["status"] == "pending"
    again = live.post("/api/v1/files", json=forged, headers=tenant.headers)
    assert again.status_code == 409 and again.json()["error"]["code"] == "INVALID_STATE"
    assert files_of(live, tenant, data["leadId"])["esign_retainer"] == mine
    callback(live, other, documenso.callback("DOCUMENT_COMPLETED", 1, status="COMPLETED"))
    wait_for(live, other, theirs["leadId"], status_is("delivered"))
    assert live.get(f"/api/v1/files/{data['leadId']}/esign_retainer/content", headers=tenant.headers).status_code == 404
    assert lead_of(live, tenant, data["leadId"])["status"] == lead["status"] == "document_sent"


def test_a_rejection_while_documents_wait_stops_the_lead_for_good(live, runtime, documenso):
    tenant = tenant_with(runtime, RETAINER, firstIntakeAction={"enabled": True, "action": "human_review"})
    data = submit(live, tenant, lead_body("ES1"))
    path = f"/api/v1/leads/{data['leadId']}/approve"
    assert live.post(path, json={"status": "approved"}, headers=tenant.headers).status_code == 200
    wait_for(live, tenant, data["leadId"], status_is("document_sent"))
    assert live.post(path, json={"status": "pending"}, headers=tenant.headers).status_code == 200
    assert live.post(path, json={"status": "rejected"}, headers=tenant.headers).status_code == 200
    assert lead_of(live, tenant, data["leadId"])["status"] == "rejected"
    callback(live, tenant, documenso.callback("DOCUMENT_COMPLETED", 1, status="COMPLETED"))
    lead = wait_for(live, tenant, data["leadId"], lambda lead: "documents_updated" in events(lead))
    assert lead["status"] == "rejected" and "delivered" not in events(lead)


BAD_PLUGIN = '''
from appliance.sdk import EsignAdapter, EsignSent, hookimpl

class Sloppy(EsignAdapter):
    name = "sloppy"

    async def send(self, request, http):
        return EsignSent(outcome="sent", provider_document_id=123, signing_url=["not", "a", "url"])

@hookimpl
def appliance_esign_adapters(settings):
    return [Sloppy()]
'''


def test_an_adapters_answer_of_the_wrong_shape_fails_the_document_and_holds_the_lead(runtime, clock, tmp_path):
    (tmp_path / "plugins").mkdir(exist_ok=True)
    (tmp_path / "plugins" / "sloppy.py").write_text(BAD_PLUGIN)
    tenant = tenant_with(runtime, {**RETAINER, "type": "sloppy"})
    with live_app(runtime, tmp_path) as live:
        data = submit(live, tenant, lead_body("ES1"))
        lead = wait_for(live, tenant, data["leadId"], status_is("pending_action"))
        assert lead["submissions"][-1]["result"].startswith(
            "document Retainer could not be sent: the sloppy adapter answered a bad result")
        assert files_of(live, tenant, data["leadId"])["esign_retainer"]["status"] == "failed"


def test_a_document_created_whose_sending_failed_is_sent_on_the_retry_not_created_again(live, runtime, clock,
                                                                                         documenso):
    documenso.stall_next(0)  # the template: answered
    documenso.stall_next(0)  # generate-document: answered (the document exists at Documenso)
    documenso.fail_next(503)  # send: fails
    tenant = tenant_with(runtime, RETAINER)
    data = submit(live, tenant, lead_body("ES1"))
    lead = wait_for(live, tenant, data["leadId"], lambda lead: "esign_error" in events(lead))
    assert lead["status"] == "pending"
    assert [d["sent"] for d in documenso.documents.values()] == [False]
    clock.advance(seconds=11)
    wait_for(live, tenant, data["leadId"], status_is("document_sent"))
    assert [d["sent"] for d in documenso.documents.values()] == [True]  # the same one, sent
    reference = files_of(live, tenant, data["leadId"])["esign_retainer"]
    assert reference["providerDocumentId"] == "1" and reference["signingUrl"]
    assert "unsent" not in reference["metadata"]


def test_a_signature_counts_only_for_the_template_signed(live, runtime, documenso):
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint()], "campaigns": [
        campaign("ES1", "Retainers", delivery={"deliveryEndpointId": "ep"}, documents=[RETAINER]),
        campaign("ES2", "Other retainers", delivery={"deliveryEndpointId": "ep"},
                 documents=[{**RETAINER, "signTemplateId": "tpl-notice"}])]})
    first = lead_body("ES1")
    data = submit(live, tenant, first)
    wait_for(live, tenant, data["leadId"], status_is("document_sent"))
    callback(live, tenant, documenso.callback("DOCUMENT_COMPLETED", 1, status="COMPLETED"))
    wait_for(live, tenant, data["leadId"], status_is("delivered"))
    submit(live, tenant, {**first, "campaignId": "ES2", "leadId": data["leadId"]})
    lead = wait_for(live, tenant, data["leadId"], lambda lead: len(lead["submissions"]) == 2
                    and lead["status"] == "document_sent")
    assert [d["templateId"] for d in documenso.documents.values()] == ["tpl-retainer", "tpl-notice"]
    assert documenso.documents[2]["externalId"] == \
        f"{data['leadId']}/esign_retainer/{lead['submissions'][-1]['submissionId']}"
    reference = files_of(live, tenant, data["leadId"])["esign_retainer"]
    assert reference["providerDocumentId"] == "2" and reference["signedAt"] is None
    content = f"/api/v1/files/{data['leadId']}/esign_retainer/content"
    assert live.get(content, headers=tenant.headers).status_code == 404  # the first document's file is gone
    documenso.signed_pdf = b"%PDF-1.7 the second retainer"
    callback(live, tenant, documenso.callback("DOCUMENT_COMPLETED", 2, status="COMPLETED"))
    wait_for(live, tenant, data["leadId"], lambda lead: lead["status"] == "delivered" and len(lead["submissions"]) == 2)
    assert live.get(content, headers=tenant.headers).content == b"%PDF-1.7 the second retainer"


def test_a_callback_for_a_document_whose_sending_was_unconfirmed_counts(live, runtime, clock, documenso):
    documenso.stall_next(0)
    documenso.stall_next(0)
    documenso.fail_next(503)  # the send's answer is lost: the document may have gone out
    tenant = tenant_with(runtime, RETAINER)
    data = submit(live, tenant, lead_body("ES1"))
    wait_for(live, tenant, data["leadId"], lambda lead: "esign_error" in events(lead))
    assert callback(live, tenant, documenso.callback("DOCUMENT_COMPLETED", 1, status="COMPLETED")).json()["data"] \
        == {"received": True, "changed": True, "status": "signed"}
    clock.advance(seconds=11)
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered"))
    assert "document_signed" in events(lead)
    reference = files_of(live, tenant, data["leadId"])["esign_retainer"]
    assert reference["status"] == "signed" and reference["signedAt"] is not None
    assert len(documenso.documents) == 1


def test_a_rejection_while_the_provider_is_down_stops_the_documents(live, runtime, clock, documenso):
    tenant = tenant_with(runtime, RETAINER, firstIntakeAction={"enabled": True, "action": "human_review"})
    data = submit(live, tenant, lead_body("ES1"))
    path = f"/api/v1/leads/{data['leadId']}/approve"
    documenso.down = True
    assert live.post(path, json={"status": "approved"}, headers=tenant.headers).status_code == 200
    wait_for(live, tenant, data["leadId"], lambda lead: "esign_error" in events(lead))
    assert lead_of(live, tenant, data["leadId"])["status"] == "pending"
    assert live.post(path, json={"status": "pending"}, headers=tenant.headers).status_code == 200
    assert live.post(path, json={"status": "rejected"}, headers=tenant.headers).status_code == 200
    documenso.down = False
    clock.advance(seconds=11)
    live.app_state.worker.wake()
    time.sleep(0.3)
    assert lead_of(live, tenant, data["leadId"])["status"] == "rejected"
    assert documenso.documents == {}


def test_a_signed_file_not_fetched_is_fetched_again_for_a_resubmission(live, runtime, documenso):
    documenso.signed_pdf = b"<html>not a pdf</html>"
    tenant = tenant_with(runtime, RETAINER)
    first = lead_body("ES1")
    data = submit(live, tenant, first)
    wait_for(live, tenant, data["leadId"], status_is("document_sent"))
    callback(live, tenant, documenso.callback("DOCUMENT_COMPLETED", 1, status="COMPLETED"))
    wait_for(live, tenant, data["leadId"], status_is("pending_action"))
    documenso.signed_pdf = b"%PDF-1.7 fixed"  # the cause is fixed: a resubmission takes the lead on
    submit(live, tenant, {**first, "leadId": data["leadId"]})
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered"))
    assert len(lead["submissions"]) == 2 and len(documenso.documents) == 1
    assert live.get(f"/api/v1/files/{data['leadId']}/esign_retainer/content",
                    headers=tenant.headers).content == b"%PDF-1.7 fixed"


def test_a_signature_after_the_lead_moved_to_another_campaign_is_kept(live, runtime, documenso):
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint()], "campaigns": [
        campaign("ES1", "Retainers", delivery={"deliveryEndpointId": "ep"}, documents=[RETAINER]),
        campaign("NO1", "No documents", delivery={"deliveryEndpointId": "ep"})]})
    first = lead_body("ES1")
    data = submit(live, tenant, first)
    wait_for(live, tenant, data["leadId"], status_is("document_sent"))
    submit(live, tenant, {**first, "campaignId": "NO1", "leadId": data["leadId"]})
    wait_for(live, tenant, data["leadId"], status_is("delivered"))
    callback(live, tenant, documenso.callback("DOCUMENT_COMPLETED", 1, status="COMPLETED"))
    wait_for(live, tenant, data["leadId"], lambda lead: "document_fetched" in events(lead))
    assert live.get(f"/api/v1/files/{data['leadId']}/esign_retainer/content",
                    headers=tenant.headers).content == documenso.signed_pdf


def test_metadata_a_caller_posted_cannot_break_the_console_lead_page(live, runtime, documenso):
    tenant = tenant_with(runtime, NOTICE)
    data = submit(live, tenant, lead_body("ES1"))
    wait_for(live, tenant, data["leadId"], status_is("delivered"))
    posted = {"leadId": data["leadId"], "fileKey": "id_card", "fileName": "ID", "fileType": "png",
              "documentUrl": "https://files.example.com/id.png", "provider": "esign_vendor",
              "metadata": {"sentAt": 5, "expiresAt": 7, "fetchedAt": ["x"], "required": {"a": 1}}}
    assert live.post("/api/v1/files", json=posted, headers=tenant.headers).status_code == 201
    sign_in(live, tenant, "viewer")
    page = live.get(f"/admin/leads/{data['leadId']}")
    assert page.status_code == 200 and 'data-file-key="id_card"' in page.text
    assert f"/admin/leads/{data['leadId']}/files/id_card" not in page.text


def test_a_lead_queued_by_hand_while_its_documents_wait_goes_on_when_signed(live, runtime, documenso):
    tenant = tenant_with(runtime, RETAINER)
    data = submit(live, tenant, lead_body("ES1"))
    wait_for(live, tenant, data["leadId"], status_is("document_sent"))
    patched = live.patch(f"/api/v1/leads/{data['leadId']}", json={"status": "queued"}, headers=tenant.headers)
    assert patched.status_code == 200, patched.text
    callback(live, tenant, documenso.callback("DOCUMENT_COMPLETED", 1, status="COMPLETED"))
    wait_for(live, tenant, data["leadId"], status_is("delivered"))


def test_a_required_document_deactivated_while_leads_wait_lets_them_go_on(live, runtime, documenso):
    tenant = tenant_with(runtime, RETAINER, NOTICE)
    data = submit(live, tenant, lead_body("ES1"))
    wait_for(live, tenant, data["leadId"], status_is("document_sent"))
    tenancy.import_bundle(runtime, tenant.tenant_id, json.dumps({"campaigns": [campaign(
        "ES1", "Signed retainers", delivery={"deliveryEndpointId": "ep"},
        documents=[{**RETAINER, "isActive": False}, NOTICE])]}).encode(), "json")
    callback(live, tenant, documenso.callback("DOCUMENT_COMPLETED", 1, status="COMPLETED"))  # the notice
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered"))
    kinds = events(lead)
    assert "signed" not in kinds and kinds.index("delivery_scheduled") < kinds.index("delivered")


def test_a_signed_file_that_cannot_be_fetched_for_a_day_and_a_half_holds_the_lead(live, runtime, clock, documenso):
    tenant = tenant_with(runtime, RETAINER)
    data = submit(live, tenant, lead_body("ES1"))
    wait_for(live, tenant, data["leadId"], status_is("document_sent"))
    documenso.down = True
    callback(live, tenant, documenso.callback("DOCUMENT_COMPLETED", 1, status="COMPLETED"))
    lead = wait_for(live, tenant, data["leadId"], lambda lead: "esign_error" in events(lead))
    assert lead["status"] == "document_sent"  # a fetch outage leaves the lead as it is
    clock.advance(hours=37)
    lead = wait_for(live, tenant, data["leadId"], status_is("pending_action"))
    assert "could not be fetched" in lead["submissions"][-1]["result"]
    assert "tried for 37 hours" in files_of(live, tenant, data["leadId"])["esign_retainer"]["metadata"]["problem"]
