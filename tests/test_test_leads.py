"""Test mode (CONTRACT 9.4, issue 36 item 5): a lead with `isTest: true` runs the whole pipeline,
is posted only to a buyer that has a `testUrl` (there, never to its real URL) and ends
`delivered`; with no such buyer it stays `qualified` ("test lead"); it books no money, spends no
client's balance and says nothing about the buyer's health."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from tests.buyer_server import BuyerServer
from tests.bundles import campaign
from tests.conftest import make_tenant
from tests.submit_support import FakeClock, clock, source_key  # noqa: F401 (the clock fixture)
from tests.test_auctions import config_file, live  # noqa: F401 (fixtures: buyers on loopback, the app running)
from tests.worker_helpers import lead_body, status_is, submit, wait_for

MONEY = {"revenueMilestones": [{"leadStatus": "delivered", "amount": 10, "currency": "USD"}]}
COST = [{"sourceId": "web", "costMilestones": [{"leadStatus": "lead_ingested", "amount": 2}]}]


@pytest.fixture
def buyer() -> Iterator[BuyerServer]:
    with BuyerServer() as server:
        for path in ("/live", "/test", "/other"):
            server.route(path, status=200, body={"ok": True})
        yield server


def http_endpoint(buyer: BuyerServer, endpoint_id: str, path: str = "/live", test: str | None = "/test",
                  **extra) -> dict:
    return {"deliveryEndpointId": endpoint_id, "url": buyer.url(path),
            **({"testUrl": buyer.url(test)} if test else {}), "headers": {"X-Buyer-Key": "k-123"}, **extra}


def tenant_selling(runtime, buyers: list[dict], delivery: dict, clients: list[dict] | None = None):
    return make_tenant(runtime, "T", {
        "deliveryEndpoints": buyers, "clients": clients or [],
        "campaigns": [campaign("TM1", "Tested", ingestion={"sources": COST}, delivery={**MONEY, **delivery})]})


def ledger_of(live, tenant, lead_id: str) -> list[dict]:
    return live.get("/api/v1/ledger", params={"leadId": lead_id}, headers=tenant.headers).json()["data"]["items"]


def test_a_test_lead_goes_to_the_test_url_with_the_endpoints_auth_and_books_no_money(live, runtime, buyer):
    tenant = tenant_selling(runtime, [http_endpoint(buyer, "ep", clientId="payer")], {"deliveryEndpointId": "ep"},
                            clients=[{"clientId": "payer", "name": "Payer", "billing": {"mode": "prepaid"}}])
    web = SimpleNamespace(headers={"X-API-Key": source_key(runtime, tenant, "web")})
    data = submit(live, web, lead_body("TM1", isTest=True))
    lead = wait_for(live, tenant, data["leadId"], status_is("delivered", "failed", "queued"))
    assert lead["status"] == "delivered"  # a prepaid client without funds: a test lead costs it nothing
    (sent,) = buyer.requests_to("/test")
    assert sent.headers["x-buyer-key"] == "k-123" and sent.json()["email"] == lead["email"]
    assert buyer.requests_to("/live") == []
    assert ledger_of(live, tenant, data["leadId"]) == []
    statement = live.get("/api/v1/clients/payer/statement", headers=tenant.headers).json()["data"]
    assert statement["lines"] == []
    endpoint = live.get("/api/v1/endpoints", headers=tenant.headers).json()["data"]["items"][0]
    assert endpoint["lastSuccessAt"] is None  # the test address's answer is not the buyer's health

    real = submit(live, web, lead_body("TM1"))  # the same buyer, a real lead
    assert wait_for(live, tenant, real["leadId"], status_is("queued", "delivered"))["status"] == "queued"
    assert buyer.requests_to("/live") == []


def test_a_test_lead_without_a_test_url_is_not_posted_and_stays_qualified(live, runtime, buyer):
    tenant = tenant_selling(runtime, [http_endpoint(buyer, "ep", test=None)], {"deliveryEndpointId": "ep"})
    web = SimpleNamespace(headers={"X-API-Key": source_key(runtime, tenant, "web")})
    data = submit(live, web, lead_body("TM1", isTest=True))
    lead = wait_for(live, tenant, data["leadId"], lambda lead: lead["submissions"][-1]["journeyEvents"][-1]["type"]
                    == "test_lead")
    assert (lead["status"], lead["submissions"][-1]["result"]) == ("qualified", "test lead")
    assert buyer.requests_to("/live") == [] and buyer.requests_to("/test") == []
    assert ledger_of(live, tenant, data["leadId"]) == []


def test_a_distribution_sends_a_test_lead_to_its_first_buyer_with_a_test_url(live, runtime, buyer):
    tenant = tenant_selling(runtime, [http_endpoint(buyer, "a", test=None), http_endpoint(buyer, "b", "/other")],
                            {"distribution": {"endpoints": [{"deliveryEndpointId": "a"}, {"deliveryEndpointId": "b"}]}})
    data = submit(live, tenant, lead_body("TM1", isTest=True))
    assert wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))["status"] == "delivered"
    assert len(buyer.requests_to("/test")) == 1
    assert buyer.requests_to("/live") == [] and buyer.requests_to("/other") == []


@pytest.mark.parametrize("test_url, says", [
    ("ftp://buyer.example.com/in", "must be an http or https URL"),
    ("https://user:pw@buyer.example.com/in", "must not carry credentials"),
    ("https://buyer.example.com/in?apiKey=k1", "must not carry credentials")])
def test_a_bad_test_url_is_refused_at_import_naming_it(cli, tmp_path, test_url, says):
    tenant_id = cli.json("tenant", "create", "T")["tenantId"]
    bundle = tmp_path / "b.json"
    bundle.write_text(json.dumps({"deliveryEndpoints": [
        {"deliveryEndpointId": "ep", "url": "https://buyer.example.com/in", "testUrl": test_url}]}))
    result = cli("import", "--tenant", tenant_id, str(bundle), expect=1)
    assert f"deliveryEndpoints[0].testUrl: {says}" in result.stderr
    assert "pw" not in result.stderr and "k1" not in result.stderr
