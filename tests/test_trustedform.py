"""TrustedForm certificate claims through the HTTP API: a campaign with
`qualification.tcpaPolicy.ingestionPolicy.verifyCertificate` answers `pending`, the job loop
claims the certificate (a local server plays TrustedForm), stores `compliance.trustedForm` and
qualifies; 404 / outcome failure / a missing URL disqualify; 5xx waits at `pending` and retries."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from litestar.testing import TestClient

from appliance.runtime import Runtime
from tests.buyer_server import BuyerServer, Received, Reply
from tests.bundles import campaign
from tests.conftest import make_tenant
from tests.submit_support import FakeClock, condition, rule_set
from tests.worker_helpers import endpoint, lead_body, lead_of, live_app, status_is, submit, wait_for

START = datetime(2026, 3, 10, 15, 0, tzinfo=UTC)
API_KEY = "tf-secret-key-0042"
CERT = "https://cert.trustedform.com/0123abcd"
VERIFY = {"tcpaPolicy": {"ingestionPolicy": {"verifyCertificate": True}}}


@pytest.fixture
def tf() -> Iterator[BuyerServer]:
    with BuyerServer() as server:
        server.route("/0123abcd", status=200, body={"outcome": "success", "expires_at": "2026-06-08T15:00:00Z"})
        yield server


@pytest.fixture
def config_file(config_file: Path, tf: BuyerServer) -> Path:
    with config_file.open("a") as f:  # the fake TrustedForm is on loopback
        f.write(f'\n[plugins.trustedform]\nbase_url = "{tf.url("")}"\napi_key = "{API_KEY}"\n'
                "\n[delivery]\nallow_private_addresses = true\n")
    return config_file


@pytest.fixture
def clock(runtime: Runtime) -> FakeClock:
    runtime.clock = FakeClock(START)
    return runtime.clock


@pytest.fixture
def live(runtime: Runtime, clock: FakeClock, tmp_path) -> Iterator[TestClient]:
    with live_app(runtime, tmp_path) as client:
        yield client


def tenant_with(runtime, *, verify: bool = True, rules: list | None = None):
    qualification = dict(VERIFY) if verify else {}
    if rules is not None:
        qualification["rules"] = rules
    return make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint()], "campaigns": [campaign(
        "TF1", "Verified", qualification=qualification, delivery={"deliveryEndpointId": "ep"})]})


def body(cert: str | None = CERT) -> dict:
    return lead_body("TF1", compliance={"trustedFormCertUrl": cert} if cert else {"tcpaConsent": True})


def test_a_verified_certificate_qualifies_and_is_stored_on_the_lead(live, runtime, tf):
    tenant = tenant_with(runtime)
    data = submit(live, tenant, body())
    assert data["status"] == "pending"
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered"))
    assert lead["compliance"]["trustedForm"] == {"verified": True, "expiresAt": "2026-06-08T15:00:00Z",
                                                 "outcome": "success"}
    [claim] = tf.requests_to("/0123abcd")
    assert claim.method == "POST"
    assert claim.headers["authorization"] == "Basic " + base64.b64encode(f"API:{API_KEY}".encode()).decode()
    assert claim.json() == {"reference": data["leadId"]}
    assert API_KEY not in str(lead) and base64.b64encode(f"API:{API_KEY}".encode()).decode() not in str(lead)


def test_rules_can_read_the_claims_outcome(live, runtime, tf):
    # A rule set disqualifies when its conditions hold: one that holds only for a verified
    # certificate shows the rule engine reads the stored claim.
    tenant = tenant_with(runtime, rules=[rule_set(condition("compliance.trustedForm.verified", "equals", [True]),
                                                  name="verified cert")])
    data = submit(live, tenant, body())
    lead = wait_for(live, tenant, data["leadId"], status_is("disqualified"))
    assert lead["submissions"][-1]["result"] == \
        'Disqualified by rule set "verified cert": compliance.trustedForm.verified equals [true]'
    # The usual form: disqualify whatever is not verified; a verified lead goes through.
    other = make_tenant(runtime, "U", {"deliveryEndpoints": [endpoint()], "campaigns": [campaign(
        "TF1", "Verified", delivery={"deliveryEndpointId": "ep"}, qualification={**VERIFY, "rules": [rule_set(
            condition("compliance.trustedForm.verified", "not_equals", [True]), name="unverified")]})]})
    data = submit(live, other, body())
    wait_for(live, other, data["leadId"], status_is("delivered"))


def test_an_outcome_of_failure_disqualifies(live, runtime, tf):
    tf.route("/0123abcd", status=200, body={"outcome": "failure"})
    tenant = tenant_with(runtime)
    data = submit(live, tenant, body())
    lead = wait_for(live, tenant, data["leadId"], status_is("disqualified"))
    assert "could not be verified" in lead["submissions"][-1]["result"]
    assert lead["compliance"]["trustedForm"] == {"verified": False, "expiresAt": None, "outcome": "failure"}


def test_an_unknown_certificate_disqualifies(live, runtime, tf):
    tenant = tenant_with(runtime)
    data = submit(live, tenant, body("https://cert.trustedform.com/ffff0000"))
    lead = wait_for(live, tenant, data["leadId"], status_is("disqualified"))
    assert "TrustedForm certificate could not be verified" in lead["submissions"][-1]["result"]
    assert "404" in lead["submissions"][-1]["result"]
    assert lead["compliance"]["trustedForm"] == {"verified": False, "expiresAt": None, "outcome": "failure"}
    assert [r.path for r in tf.requests] == ["/ffff0000"]


def test_an_outage_holds_the_lead_at_pending_and_the_claim_is_retried(live, runtime, clock, tf):
    answers = iter([Reply(status=503, body={"error": "down"})])

    def script(request: Received) -> Reply:
        return next(answers, Reply(status=200, body={"outcome": "success", "expires_at": "2026-06-08T15:00:00Z"}))

    tf.route("/0123abcd", script)
    tenant = tenant_with(runtime)
    data = submit(live, tenant, body())
    lead = wait_for(live, tenant, data["leadId"],
                    lambda lead: lead["submissions"][-1]["journeyEvents"][-1]["type"] == "trustedform_error")
    assert lead["status"] == "pending"
    assert "TrustedForm answered 503" in lead["submissions"][-1]["journeyEvents"][-1]["reason"]
    assert len(tf.requests_to("/0123abcd")) == 1
    clock.advance(seconds=11)  # past the first retry (10 s)
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered"))
    assert lead["compliance"]["trustedForm"]["verified"] is True
    assert len(tf.requests_to("/0123abcd")) == 2


def test_a_service_down_for_good_ends_the_lead_at_error_after_a_day_and_a_half(live, runtime, clock, tf):
    tf.route("/0123abcd", Reply(status=503, body={"error": "down"}))
    tenant = tenant_with(runtime)
    data = submit(live, tenant, body())
    for attempt in range(1, 24):
        lead = wait_for(live, tenant, data["leadId"], lambda lead: len(tf.requests_to("/0123abcd")) == attempt
                        and (lead["submissions"][-1]["journeyEvents"][-1]["details"] or {}).get("attempt") == attempt)
        if attempt < 23:
            assert lead["status"] == "pending"
            clock.advance(hours=2, seconds=1)  # past every retry's wait (at most 2 h)
    lead = wait_for(live, tenant, data["leadId"], status_is("error"))
    assert lead["submissions"][-1]["result"].endswith("TrustedForm did not answer after 23 attempts")
    clock.advance(hours=3)
    live.app_state.worker.wake()
    assert len(tf.requests_to("/0123abcd")) == 23  # nothing more


def test_a_missing_certificate_url_disqualifies_at_intake(live, runtime, tf):
    tenant = tenant_with(runtime)
    data = submit(live, tenant, body(cert=None))
    assert data["status"] == "disqualified"
    lead = lead_of(live, tenant, data["leadId"])
    assert "could not be verified" in lead["submissions"][-1]["result"]
    assert tf.requests == []


def test_campaigns_without_verification_never_call_the_service(live, runtime, tf):
    tenant = tenant_with(runtime, verify=False)
    data = submit(live, tenant, body())
    assert data["status"] == "qualified"
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered"))
    assert "trustedForm" not in lead["compliance"]
    assert tf.requests == []


def test_a_submitter_cannot_set_the_claims_outcome(live, runtime, tf):
    tenant = tenant_with(runtime, verify=False)
    response = live.post("/api/v1/leads/submit", headers=tenant.headers, json=lead_body(
        "TF1", compliance={"trustedForm": {"verified": True}}))
    assert response.status_code == 400, response.text
    assert "compliance.trustedForm" in response.text
