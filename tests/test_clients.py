"""Clients (buyers) as records (CONTRACT 9.4, issue 36 item 1): the bundle's `clients` and a
delivery endpoint's `clientId`, exported and imported again, and /api/v1/clients with its
validation, roles, tenancy and audit entries."""

from __future__ import annotations

import json

import pytest

from appliance.services import tenancy
from appliance.services.bundle import BundleError
from tests.worker_helpers import endpoint

CLIENTS = "/api/v1/clients"
SMITH = {"clientId": "smith-law", "name": "Smith Law",
         "billing": {"mode": "prepaid", "lowBalance": 250, "currency": "USD"},
         "returnPolicy": {"maxPercent": 15, "maxAgeDays": 10, "autoApprove": True}}


def _import(runtime, tenant, bundle: dict) -> dict:
    return tenancy.import_bundle(runtime, tenant.tenant_id, json.dumps(bundle).encode(), "json")


def test_a_bundle_carries_clients_and_endpoints_name_them(runtime, client, tenant):
    done = _import(runtime, tenant, {"clients": [SMITH], "deliveryEndpoints": [
        {**endpoint("smith-ep"), "clientId": "smith-law"}]})
    assert done["clients"] == 1
    listed = client.get(CLIENTS, headers=tenant.headers).json()["data"]
    assert [c["clientId"] for c in listed["items"]] == ["smith-law"] and listed["hasMore"] is False
    shown = client.get(f"{CLIENTS}/smith-law", headers=tenant.headers).json()["data"]
    assert shown["billing"] == {"mode": "prepaid", "creditLimit": 0, "lowBalance": 250, "currency": "USD"}
    assert shown["returnPolicy"] == {"maxPercent": 15, "maxAgeDays": 10, "autoApprove": True}
    assert shown["active"] is True and shown["createdAt"].endswith("Z")
    exported = tenancy.export_bundle(runtime, tenant.tenant_id)
    assert [c.client_id for c in exported.clients] == ["smith-law"]
    assert next(e for e in exported.delivery_endpoints if e.delivery_endpoint_id == "smith-ep").client_id == "smith-law"
    again = tenancy.encode_bundle(exported, "json")
    tenancy.import_bundle(runtime, tenant.tenant_id, again, "json")  # an export imports back unchanged
    assert client.get(f"{CLIENTS}/smith-law", headers=tenant.headers).json()["data"]["createdAt"] == shown["createdAt"]


@pytest.mark.parametrize("bundle, problem", [
    ({"deliveryEndpoints": [{**endpoint("x-ep"), "clientId": "nobody"}]}, "deliveryEndpoints[0].clientId: unknown client"),
    ({"clients": [SMITH, SMITH]}, "clients[1].clientId"),
    ({"clients": [{**SMITH, "billing": {"mode": "credit", "creditLimit": -5}}]}, "clients[0].billing.creditLimit"),
    ({"clients": [{**SMITH, "billing": {"mode": "prepaid", "creditLimit": 100}}]}, "clients[0].billing.creditLimit"),
    ({"clients": [{**SMITH, "returnPolicy": {"maxPercent": 101}}]}, "clients[0].returnPolicy.maxPercent"),
    ({"clients": [{**SMITH, "clientId": "has space"}]}, "clients[0].clientId"),
])
def test_bad_clients_in_a_bundle_are_refused_naming_the_field(runtime, tenant, bundle, problem):
    with pytest.raises(BundleError) as refused:
        _import(runtime, tenant, bundle)
    assert any(p.startswith(problem) for p in refused.value.problems), refused.value.problems
    assert tenancy.export_bundle(runtime, tenant.tenant_id).clients == []  # nothing imported


def test_the_api_creates_lists_and_changes_clients(client, tenant):
    made = client.post(CLIENTS, json={"clientId": "acme", "name": "Acme Buyers"}, headers=tenant.headers)
    assert made.status_code == 201, made.text
    assert made.json()["data"]["billing"] == {"mode": "none", "creditLimit": 0, "lowBalance": None, "currency": "USD"}
    assert made.json()["data"]["returnPolicy"] == {"maxPercent": 10, "maxAgeDays": 7, "autoApprove": False}
    changed = client.patch(f"{CLIENTS}/acme", json={"billing": {"mode": "credit", "creditLimit": 5000},
                                                    "active": False}, headers=tenant.headers)
    assert changed.status_code == 200, changed.text
    data = changed.json()["data"]
    assert data["billing"]["creditLimit"] == 5000 and data["active"] is False and data["name"] == "Acme Buyers"
    assert client.get(f"{CLIENTS}/acme", headers=tenant.headers).json()["data"] == data
    audited = client.get("/api/v1/audit", params={"action": "client.update"}, headers=tenant.headers).json()
    entry = audited["data"]["items"][0]
    assert entry["target"] == "acme" and entry["before"]["active"] is True and entry["after"]["active"] is False


@pytest.mark.parametrize("body, field", [
    ({"clientId": "a", "name": ""}, "name"),
    ({"clientId": "a/b", "name": "A"}, "clientId"),
    ({"clientId": "a", "name": "A", "billing": {"mode": "credit", "creditLimit": "lots"}}, "billing.creditLimit"),
    ({"clientId": "a", "name": "A", "billing": {"mode": "credit", "creditLimit": -1}}, "billing.creditLimit"),
    ({"clientId": "a", "name": "A", "billing": {"mode": "monthly"}}, "billing.mode"),
    ({"clientId": "a", "name": "A", "billing": {"currency": "usd"}}, "billing.currency"),
    ({"clientId": "a", "name": "A", "returnPolicy": {"maxAgeDays": -1}}, "returnPolicy.maxAgeDays"),
    ({"clientId": "a", "name": "A", "balance": 100}, "balance"),
])
def test_bad_client_bodies_are_validation_errors_naming_the_field(client, tenant, body, field):
    answer = client.post(CLIENTS, json=body, headers=tenant.headers)
    assert answer.status_code == 400, answer.text
    assert any(d.startswith(field) for d in answer.json()["error"]["details"]), answer.text


def test_a_client_id_in_use_and_a_change_that_breaks_the_record_are_refused(client, tenant):
    client.post(CLIENTS, json={"clientId": "acme", "name": "Acme"}, headers=tenant.headers)
    again = client.post(CLIENTS, json={"clientId": "acme", "name": "Other"}, headers=tenant.headers)
    assert again.status_code == 400 and "clientId: a client of this tenant already has this id" in again.text
    for body, field in (({"name": ""}, "name"), ({"billing": {"mode": "prepaid", "creditLimit": 10}}, "billing")):
        refused = client.patch(f"{CLIENTS}/acme", json=body, headers=tenant.headers)
        assert refused.status_code == 400 and refused.json()["error"]["details"][0].startswith(field), refused.text
    assert client.get(f"{CLIENTS}/acme", headers=tenant.headers).json()["data"]["name"] == "Acme"
    assert client.patch(f"{CLIENTS}/nobody", json={"name": "x"}, headers=tenant.headers).status_code == 404


def test_clients_are_the_tenants_own_and_admins_change_them(client, runtime, tenant, other_tenant):
    client.post(CLIENTS, json={"clientId": "acme", "name": "Acme"}, headers=tenant.headers)
    assert client.get(f"{CLIENTS}/acme", headers=other_tenant.headers).status_code == 404
    assert client.get(CLIENTS, headers=other_tenant.headers).json()["data"]["items"] == []
    assert client.patch(f"{CLIENTS}/acme", json={"name": "Mine"}, headers=other_tenant.headers).status_code == 404
    manager = {"X-API-Key": tenancy.create_key(runtime, tenant.tenant_id, role="manager").key}
    assert client.get(CLIENTS, headers=manager).status_code == 200
    refused = client.post(CLIENTS, json={"clientId": "b", "name": "B"}, headers=manager)
    assert refused.status_code == 403 and "admin" in refused.json()["error"]["message"]
