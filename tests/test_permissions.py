"""Roles on every route: the OpenAPI document's every operation, called with a key of each staff
role, is refused 403 naming the role needed exactly when domain/permissions.py's table says the
role is short of it; and the table names every operation of the document (none falls through to
its owner-only default unnoticed)."""

from __future__ import annotations

import pytest

from appliance.domain.permissions import NEEDED, STAFF_ROLES, allows
from appliance.services import tenancy
from tests.conftest import Tenant

# Values for the path's parameters: any id, since a refusal for the role comes before any lookup.
_PATH_VALUES = {"leadId": "lead_01ZZZZZZZZZZZZZZZZZZZZZZZZ", "submissionId": "sub_01ZZZZZZZZZZZZZZZZZZZZZZZZ",
                "webhookId": "wh_x", "listId": "sl_x", "deliveryEndpointId": "A-ep", "importId": "imp_x",
                "userId": "usr_x", "clientId": "cl_x", "requestId": "rtr_x", "fileKey": "f", "key": "k",
                "sourceId": "A-src"}


@pytest.fixture
def operations(client) -> list[tuple[str, str, str]]:
    """(method, path with values, operationId) of every operation that takes a key."""
    document = client.get("/schema/openapi.json").json()
    found = []
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            if not operation.get("security"):
                continue
            filled = path
            for name, value in _PATH_VALUES.items():
                filled = filled.replace("{" + name + "}", value)
            assert "{" not in filled, f"no test value for a parameter of {path}"
            found.append((method.upper(), filled, operation["operationId"]))
    return found


def test_the_table_names_every_operation_of_the_document(operations):
    documented = {operation for _, _, operation in operations}
    assert documented <= set(NEEDED), f"missing from domain/permissions.NEEDED: {sorted(documented - set(NEEDED))}"
    api_entries = {name for name in NEEDED if not name.startswith("console:") and name != "options"}
    assert api_entries <= documented, f"in the table, not in the API: {sorted(api_entries - documented)}"


def test_each_role_is_refused_exactly_what_the_table_keeps_from_it(client, runtime, tenant, operations):
    keys = {role: tenancy.create_key(runtime, tenant.tenant_id, name=role, role=role).key for role in STAFF_ROLES}
    for role, key in keys.items():
        for method, path, operation in operations:
            answer = client.request(method, path, headers={"X-API-Key": key, "Content-Type": "application/json"},
                                    content=b"{}")
            needed = NEEDED[operation]
            if allows(role, needed):
                assert answer.status_code != 403, (role, method, path, answer.text)
            else:
                assert answer.status_code == 403, (role, method, path, answer.status_code, answer.text)
                error = answer.json()["error"]
                assert error["code"] == "FORBIDDEN" and needed in error["message"] and role in error["message"]


def test_a_source_key_may_submit_and_ping_only(client, runtime, tenant, operations):
    source = tenancy.create_key(runtime, tenant.tenant_id, source_id="A-src").key
    for method, path, operation in operations:
        answer = client.request(method, path, headers={"X-API-Key": source, "Content-Type": "application/json"},
                                content=b"{}")
        assert (answer.status_code == 403) == (operation not in ("submitLead", "pingLead")), (method, path)


def test_a_key_made_without_a_role_is_an_admin_as_before(client, runtime, tenant: Tenant, cli):
    listed = cli.json("key", "list", "--tenant", tenant.tenant_id)
    assert {k["role"] for k in listed if k["kind"] == "tenant"} == {"admin"}
    assert client.get("/api/v1/users", headers=tenant.headers).status_code == 200  # admin's
    made = cli.json("key", "create", "--tenant", tenant.tenant_id, "--role", "viewer")
    assert made["role"] == "viewer"
    viewer = {"X-API-Key": made["key"]}
    assert client.get("/api/v1/leads", headers=viewer).status_code == 200
    refused = client.post("/api/v1/leads/lead_01ZZZZZZZZZZZZZZZZZZZZZZZZ/approve", json={"status": "approved"},
                          headers=viewer)
    assert refused.status_code == 403 and "reviewer" in refused.json()["error"]["message"]
    assert cli("key", "create", "--tenant", tenant.tenant_id, "--role", "buyer", expect=2).exit_code == 2
