"""Suppression lists through the HTTP API and the CLI: lists and their entries (normalized as a
lead's email and phone are, stored as SHA-256 digests only), a lead matching a campaign's list
ends `suppressed` at intake and at delivery, another tenant's list is not found, and every bad
input is reported field by field or row by row."""

from __future__ import annotations

import json

import msgspec
import pytest
from litestar.testing import TestClient

from appliance.app import create_app
from appliance.services import tenancy
from tests.api_helpers import validation_error
from tests.bundles import campaign
from tests.conftest import make_tenant
from tests.worker_helpers import endpoint, lead_body, live_app, status_is, submit, wait_for
from tests.engine import engine, stored_bytes

LISTS = "/api/v1/suppression-lists"


def new_list(client, tenant, name: str = "Do not call") -> dict:
    response = client.post(LISTS, json={"name": name}, headers=tenant.headers)
    assert response.status_code == 201, response.text
    return response.json()["data"]


def change(client, tenant, list_id: str, status: int = 200, **body) -> dict:
    response = client.post(f"{LISTS}/{list_id}/entries", json=body, headers=tenant.headers)
    assert response.status_code == status, response.text
    return response.json()["data"] if status == 200 else response.json()["error"]


def bundle_with_lists(*list_ids: str) -> dict:
    return {"deliveryEndpoints": [endpoint()],
            "campaigns": [campaign("SUP1", "Suppressed", delivery={"deliveryEndpointId": "ep"},
                                   qualification={"suppressionListIds": list(list_ids)})]}


def with_lists(runtime, client, name: str = "T"):
    tenant = make_tenant(runtime, name)
    made = new_list(client, tenant)
    tenancy.import_bundle(runtime, tenant.tenant_id, msgspec.json.encode(bundle_with_lists(made["listId"])), "json")
    return tenant, made


def jobs_of(runtime, lead_id: str) -> list:
    return list(engine(runtime.store).reader().execute("SELECT kind, state FROM jobs WHERE lead_id = ?", (lead_id,)))


# ---- lists and entries --------------------------------------------------------------------------

def test_a_list_is_created_listed_and_its_entries_added_and_removed(client, tenant):
    made = new_list(client, tenant, "Opt-outs")
    assert made["listId"].startswith("sup_") and made["name"] == "Opt-outs" and made["count"] == 0
    assert set(made) == {"listId", "name", "count", "createdAt"}
    assert change(client, tenant, made["listId"], add=["Ann@Example.com", "(415) 555-0100", "ann@example.com "]) == \
        {"added": 2, "removed": 0, "count": 2}  # the same email twice, normalized
    assert change(client, tenant, made["listId"], add=["+14155550100", "bob@example.com"]) == \
        {"added": 1, "removed": 0, "count": 3}
    assert change(client, tenant, made["listId"], remove=["ANN@example.com", "nobody@example.com"]) == \
        {"added": 0, "removed": 1, "count": 2}
    got = client.get(f"{LISTS}/{made['listId']}", headers=tenant.headers).json()["data"]
    assert got == {**made, "count": 2}
    second = new_list(client, tenant, "Second")
    page = client.get(f"{LISTS}?limit=1", headers=tenant.headers).json()["data"]
    assert page["hasMore"] is True and page["items"][0]["listId"] == made["listId"]
    rest = client.get(f"{LISTS}?cursor={page['nextCursor']}", headers=tenant.headers).json()["data"]
    assert [i["listId"] for i in rest["items"]] == [second["listId"]] and rest["hasMore"] is False


def test_an_empty_list_of_entries_changes_nothing(client, tenant):
    made = new_list(client, tenant)
    change(client, tenant, made["listId"], add=["ann@example.com", "bob@example.com"])
    assert change(client, tenant, made["listId"], add=["carl@example.com"], remove=[]) == \
        {"added": 1, "removed": 0, "count": 3}
    assert change(client, tenant, made["listId"], add=[], remove=["bob@example.com"]) == \
        {"added": 0, "removed": 1, "count": 2}
    for body in ({"add": [], "remove": []}, {"add": []}, {"remove": []}):
        assert change(client, tenant, made["listId"], **body) == {"added": 0, "removed": 0, "count": 2}, body
    assert client.get(f"{LISTS}/{made['listId']}", headers=tenant.headers).json()["data"]["count"] == 2
    # Nothing to change still needs the list to be the tenant's.
    assert client.post(f"{LISTS}/sup_unknown/entries", json={"add": [], "remove": []},
                       headers=tenant.headers).status_code == 404


def test_values_are_stored_as_digests_only(client, runtime, tenant):
    made = new_list(client, tenant)
    change(client, tenant, made["listId"], add=["secret.person@example.com", "+1 415 555 0199"])
    hashes = [h for (h,) in engine(runtime.store).reader().execute("SELECT hash FROM suppression_entries")]
    assert len(hashes) == 2 and all(isinstance(h, bytes) and len(h) == 32 for h in hashes)


def test_no_plain_value_reaches_the_database(client, runtime, tenant):
    made = new_list(client, tenant)
    change(client, tenant, made["listId"], add=["secret.person@example.com", "+1 415 555 0199"])
    stored = stored_bytes(runtime.config)  # SQLite: the files, WAL included
    for plain in (b"secret.person", b"4155550199", b"415 555 0199"):
        assert plain not in stored and plain.decode().encode("utf-16-le") not in stored


def test_bad_entry_changes_are_reported_field_by_field(client, tenant):
    list_id = new_list(client, tenant)["listId"]
    assert validation_error(client.post(f"{LISTS}/{list_id}/entries", json={}, headers=tenant.headers), "add") == \
        ["add: give values to add, remove or both"]
    details = validation_error(client.post(f"{LISTS}/{list_id}/entries", json={
        "add": ["ok@example.com", "not-an-email", "12"], "remove": ["@"]}, headers=tenant.headers), "add[1]")
    assert details == ["add[1]: must be an email address or a phone number",
                       "add[2]: must be an email address or a phone number",
                       "remove[0]: must be an email address or a phone number"]
    assert "not-an-email" not in json.dumps(details)
    validation_error(client.post(f"{LISTS}/{list_id}/entries", json={"add": [5]}, headers=tenant.headers), "add[0]")
    validation_error(client.post(f"{LISTS}/{list_id}/entries", json={"add": ["a@example.com"], "tenantId": "x"},
                                 headers=tenant.headers), "tenantId")
    validation_error(client.post(LISTS, json={"name": ""}, headers=tenant.headers), "name")
    validation_error(client.post(LISTS, json={"name": "   "}, headers=tenant.headers), "name")
    validation_error(client.post(LISTS, json={}, headers=tenant.headers), "name")
    validation_error(client.post(LISTS, json={"name": "x", "listId": "sup_mine"}, headers=tenant.headers), "listId")
    assert client.get(f"{LISTS}/{list_id}", headers=tenant.headers).json()["data"]["count"] == 0
    assert client.post(f"{LISTS}/sup_unknown/entries", json={"add": ["a@example.com"]},
                       headers=tenant.headers).status_code == 404


def test_another_tenants_list_is_not_found(client, runtime, tenant, other_tenant):
    theirs = new_list(client, other_tenant, "Theirs")
    change(client, other_tenant, theirs["listId"], add=["x@example.com"])
    h = tenant.headers
    assert client.get(f"{LISTS}/{theirs['listId']}", headers=h).status_code == 404
    assert client.post(f"{LISTS}/{theirs['listId']}/entries", json={"remove": ["x@example.com"]},
                       headers=h).status_code == 404
    assert client.get(LISTS, headers=h).json()["data"]["items"] == []
    assert client.get(f"{LISTS}/{theirs['listId']}", headers=other_tenant.headers).json()["data"]["count"] == 1
    # Nor may a campaign of this tenant name it.
    with pytest.raises(tenancy.BundleError) as refused:
        tenancy.import_bundle(runtime, tenant.tenant_id, msgspec.json.encode(bundle_with_lists(theirs["listId"])),
                              "json")
    assert refused.value.problems == ["campaigns[0].qualification.suppressionListIds[0]: unknown suppression list"]


def test_an_unknown_list_in_a_bundle_is_refused_naming_the_field(cli, runtime, tmp_path):
    tenant = make_tenant(runtime, "T")
    bundle = tmp_path / "b.json"
    bundle.write_text(json.dumps(bundle_with_lists("sup_nope")))
    result = cli("import", "--tenant", tenant.tenant_id, str(bundle), expect=1)
    assert result.stderr.strip() == \
        "error: campaigns[0].qualification.suppressionListIds[0]: unknown suppression list"


# ---- intake and delivery ------------------------------------------------------------------------

def test_a_lead_on_a_list_is_suppressed_at_intake_without_a_job(client, runtime):
    tenant, made = with_lists(runtime, client)
    change(client, tenant, made["listId"], add=["blocked@example.com", "+14155550123"])
    for body in (lead_body("SUP1", email="Blocked@Example.com"), lead_body("SUP1", phone="415-555-0123")):
        lead = submit(client, tenant, body)
        assert lead["status"] == "suppressed"
        stored = client.get(f"/api/v1/leads/{lead['leadId']}", headers=tenant.headers).json()["data"]
        assert stored["status"] == "suppressed"
        submission = stored["submissions"][-1]
        assert submission["result"] == "suppressed by list Do not call"
        assert "blocked" not in json.dumps(submission["journeyEvents"]).lower()
        assert jobs_of(runtime, lead["leadId"]) == []
    free = submit(client, tenant, lead_body("SUP1"))
    assert free["status"] == "qualified" and jobs_of(runtime, free["leadId"]) == [("deliver", "ready")]
    listed = client.get("/api/v1/leads?status=suppressed", headers=tenant.headers).json()["data"]["leads"]
    assert len(listed) == 2


def test_a_value_added_after_the_submit_suppresses_the_lead_at_delivery(runtime, tmp_path):
    with TestClient(create_app(runtime, background=False), raise_server_exceptions=False) as quiet:
        tenant, made = with_lists(runtime, quiet)
        lead = submit(quiet, tenant, lead_body("SUP1", email="late@example.com"))
        assert lead["status"] == "qualified"
        change(quiet, tenant, made["listId"], add=["LATE@example.com"])
    with live_app(runtime, tmp_path) as live:
        done = wait_for(live, tenant, lead["leadId"], status_is("suppressed", "delivered", "disqualified"))
    assert done["status"] == "suppressed"
    assert done["submissions"][-1]["result"] == "suppressed by list Do not call"
    assert jobs_of(runtime, lead["leadId"]) == [("deliver", "done")]


# ---- the CLI ----------------------------------------------------------------------------------------

def test_cli_loads_a_csv_and_reports_bad_rows(cli, client, runtime, tmp_path):
    tenant = make_tenant(runtime, "T")
    list_id = new_list(client, tenant)["listId"]
    csv_file = tmp_path / "optouts.csv"
    csv_file.write_text("email,phone\nann@example.com,+14155550100\nnot-an-email,\n,\nbob@example.com,\n"
                        "ann@example.com,\n,415 555 0101\ncarl@example.com,12\n")
    report = cli.json("suppress", "--tenant", tenant.tenant_id, "--list", list_id, str(csv_file))
    assert report == {"listId": list_id, "rows": 6, "loaded": 4, "skipped": 1, "badRows": 2,
                      "badRowExamples": ["row 3: not an email or a phone number",
                                         "row 8: not an email or a phone number"], "count": 4}
    single = tmp_path / "single.csv"
    single.write_text("dave@example.com\nnope\n+1 415 555 0102\n")
    text = cli("suppress", "--tenant", tenant.tenant_id, "--list", list_id, str(single)).stdout
    assert "loaded 2 values from 3 rows" in text and "row 2: not an email or a phone number" in text
    assert client.get(f"{LISTS}/{list_id}", headers=tenant.headers).json()["data"]["count"] == 6
    removed = cli.json("suppress", "--tenant", tenant.tenant_id, "--list", list_id, "--remove", str(single))
    assert removed["removed"] == 2 and removed["count"] == 4
    loads = client.get("/api/v1/audit", params={"actor": "cli", "action": "suppression.entries_change"},
                       headers=tenant.headers).json()["data"]["items"]
    assert [(e["target"], e["after"]) for e in loads] == [
        (list_id, {"removed": 2, "from": "csv"}), (list_id, {"added": 2, "from": "csv"}),
        (list_id, {"added": 4, "from": "csv"})]
    assert "dave@example.com" not in json.dumps(loads)


@pytest.mark.parametrize("case, says, code", [
    ("unknown list", "error: no suppression list sup_nope in tenant", 1),
    ("unknown tenant", "error: tenant tnt_nope does not exist", 1),
    ("missing file", "error: cannot read", 1),
    ("no column", "error: ", 1),
    ("not utf-8", "error: ", 1),
    ("no list option", "Missing option '--list'", 2),
])
def test_cli_refusals_are_one_line(cli, client, runtime, tmp_path, case, says, code):
    tenant = make_tenant(runtime, "T")
    list_id = new_list(client, tenant)["listId"]
    good = tmp_path / "good.csv"
    good.write_text("email\na@example.com\n")
    args = {"unknown list": ["--tenant", tenant.tenant_id, "--list", "sup_nope", str(good)],
            "unknown tenant": ["--tenant", "tnt_nope", "--list", list_id, str(good)],
            "missing file": ["--tenant", tenant.tenant_id, "--list", list_id, str(tmp_path / "none.csv")],
            "no column": ["--tenant", tenant.tenant_id, "--list", list_id, str(good)],
            "not utf-8": ["--tenant", tenant.tenant_id, "--list", list_id, str(good)],
            "no list option": ["--tenant", tenant.tenant_id, str(good)]}[case]
    if case == "no column":
        good.write_text("name,city\nAnn,Paris\n")
    if case == "not utf-8":
        good.write_bytes(b"email\n\xff\xfe@example.com\n")
    result = cli("suppress", *args, expect=code)
    lines = result.stderr.strip().splitlines()
    assert says in lines[-1] and "Traceback" not in result.output + result.stderr
    if code == 1:
        assert len(lines) == 1
