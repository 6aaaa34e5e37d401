"""CSV lead import through HTTP (POST /api/v1/leads/import, GET /api/v1/imports/{importId}) and
the CLI (`appliance import-leads`): column mapping, process true and false, bad rows counted by
data row number, every refusal of a bad request with nothing imported, other tenants, the size
limit (a huge upload refused unread by the real server), and an import a stop interrupted."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from litestar.testing import TestClient

from appliance.app import create_app
from appliance.clock import iso
from appliance.services import tenancy
from tests.api_helpers import data, validation_error
from tests.servers import live_server

URL = "/api/v1/leads/import"
HEADER = "First Name,last_name,E-mail,Phone Number,State,zip,questionnaire.injured,Ignored"


def rows(*lines: str) -> str:
    return "\n".join([HEADER, *lines]) + "\n"


def person(n: int, **change: str) -> str:
    cells = {"first": "jan", "last": f"doe{n}", "email": f"jan{n}@example.com", "phone": f"(415) 555-{n:04d}",
             "state": "CA", "zip": "94110", "injured": "yes", "ignored": "x", **change}
    return ",".join(cells.values())


def start(client, tenant, text: str | bytes, status: int = 202, **form: str):
    answer = client.post(URL, headers=tenant.headers, files={"file": ("leads.csv", text, "text/csv")},
                         data={"campaignId": "AC01", **form})
    assert answer.status_code == status, answer.text
    return answer.json()["data"]["importId"] if status == 202 else answer


def finished(client, tenant, import_id: str) -> dict:
    deadline = time.monotonic() + 20
    while True:
        found = data(client.get(f"/api/v1/imports/{import_id}", headers=tenant.headers))
        if found["state"] != "running":
            return found
        assert time.monotonic() < deadline, found
        time.sleep(0.02)


def leads(client, tenant, query: str = "") -> list[dict]:
    return data(client.get(f"/api/v1/leads?limit=100{query}", headers=tenant.headers))["leads"]


def test_rows_stored_as_new_without_processing(client, tenant):
    import_id = start(client, tenant, rows(person(1), person(2, email="not-an-email"), "", person(3),
                                           person(4, phone="call me", first="")), process="false")
    assert import_id.startswith("imp_")
    done = finished(client, tenant, import_id)
    assert (done["state"], done["total"], done["processed"], done["created"], done["failed"]) == ("done", 4, 4, 2, 2)
    assert done["errors"] == [
        {"row": 2, "details": ["email: must be a valid email address"]},
        {"row": 4, "details": ["firstName: required for a new lead",
                               "phone: must be a valid phone number (digits, +, dashes, spaces, parentheses)"]}]
    assert done["columns"] == {"First Name": "firstName", "last_name": "lastName", "E-mail": "email",
                               "Phone Number": "phone", "State": "address.state", "zip": "address.zip",
                               "questionnaire.injured": "questionnaire.injured"}
    assert (done["process"], done["campaignId"], done["fileName"], done["reason"]) == (False, "AC01", "leads.csv", None)
    stored = leads(client, tenant)
    assert sorted(x["lastName"] for x in stored) == ["Doe1", "Doe3"]
    lead = data(client.get(f"/api/v1/leads/{stored[0]['leadId']}", headers=tenant.headers))
    assert (lead["status"], lead["firstName"], lead["phoneE164"], lead["address"]["state"]) == (
        "new", "Jan", "+14155550003", "CA")
    assert (lead["campaignId"], lead["clientId"], lead["offerId"]) == ("AC01", "cli-1", "off-1")
    (submission,) = lead["submissions"]
    assert submission["status"] == "new" and submission["journeyEvents"][0]["type"] == "imported"
    assert submission["journeyEvents"][0]["details"] == {"importId": import_id}
    # the report rollups count them as leads were counted by one submit each
    summary = data(client.get("/api/v1/reports/summary?groupBy=campaign", headers=tenant.headers))
    assert summary["totals"]["leads"] == 2


def test_rows_through_the_submit_pipeline(client, tenant):
    import_id = start(client, tenant, rows(person(11), person(11), person(12, email="x")))
    done = finished(client, tenant, import_id)
    assert (done["state"], done["created"], done["failed"]) == ("done", 2, 1)
    assert done["errors"] == [{"row": 3, "details": ["email: must be a valid email address"]}]
    statuses = sorted(x["status"] for x in leads(client, tenant))
    assert statuses == ["duplicate", "qualified"]  # dedupe as for two submits
    lead = next(x for x in leads(client, tenant) if x["status"] == "qualified")
    detail = data(client.get(f"/api/v1/leads/{lead['leadId']}", headers=tenant.headers))
    assert detail["questionnaire"] == [{"key": "injured", "question": "Were you injured?", "answer": "yes"}]
    assert [e["type"] for e in detail["submissions"][0]["journeyEvents"]][0] == "received"


def test_mapping_overrides_names_and_takes_dotted_paths(client, tenant):
    text = "Given,Family,Mail,Cell,Region,First Name,Loss\nann,lee,ann@example.com,4155550020,TX,ignored,500\n"
    mapping = {"Given": "firstName", "Family": "lastName", "Mail": "email", "Cell": "phone",
               "Region": "address.state", "First Name": None, "Loss": "customFields.loss"}
    done = finished(client, tenant, start(client, tenant, text, mapping=json.dumps(mapping), process="false"))
    assert done["created"] == 1 and done["columns"] == {k: v for k, v in mapping.items() if v}
    (lead,) = leads(client, tenant)
    lead = data(client.get(f"/api/v1/leads/{lead['leadId']}", headers=tenant.headers))
    assert (lead["firstName"], lead["address"]["state"], lead["customFields"]) == ("Ann", "TX", {"loss": "500"})


@pytest.mark.parametrize("written, meant", [("true", True), ("FALSE", False), ("Yes", True), ("no", False),
                                             ("1", True), ("0", False), (" YES ", True)])
def test_boolean_columns_read_as_a_person_writes_them(client, tenant, written, meant):
    text = f"firstName,lastName,email,phone,isTest,TCPA Consent\nA,B,ab@example.com,4155550030,{written},{written}\n"
    done = finished(client, tenant, start(client, tenant, text, process="false",
                                          mapping='{"TCPA Consent": "compliance.tcpaConsent"}'))
    assert (done["created"], done["errors"]) == (1, []), done
    (stored,) = leads(client, tenant)
    lead = data(client.get(f"/api/v1/leads/{stored['leadId']}", headers=tenant.headers))
    assert lead["isTest"] is meant and lead["compliance"]["tcpaConsent"] is meant


def test_a_boolean_cell_in_neither_form_is_a_row_error_naming_its_column(client, tenant):
    text = ("firstName,lastName,email,phone,isTest,TCPA Consent\n"
            "A,B,ab@example.com,4155550030,true,y\nC,D,cd@example.com,4155550031,maybe,no\n")
    done = finished(client, tenant, start(client, tenant, text, process="false",
                                          mapping='{"TCPA Consent": "compliance.tcpaConsent"}'))
    assert done["created"] == 0 and done["failed"] == 2
    assert done["errors"] == [
        {"row": 1, "details": ["compliance.tcpaConsent: column 'TCPA Consent' must read true/false, yes/no or 1/0,"
                               " not 'y'"]},
        {"row": 2, "details": ["isTest: column 'isTest' must read true/false, yes/no or 1/0, not 'maybe'"]}]


@pytest.mark.parametrize("content, form, field", [
    (b"\xff\xfeF\x00i\x00", {}, "file"),                                      # UTF-16, not UTF-8
    (b"firstName,email\nJan,j\xe9@example.com\n", {}, "file"),               # Latin-1 inside
    (b"\x89PNG\r\n\x1a\n\x00\x00", {}, "file"),                               # not text at all
    (b'firstName,email\n"Jan,a@example.com\n', {}, "file"),                 # a quote never closed: not CSV
    (b"", {}, "file"),                                                        # empty
    (b"\n\n", {}, "file"),                                                    # no header row
    (b"firstName,lastName,email,phone\n", {}, "file"),                       # no data rows
    (b"color,size\nred,9\n", {}, "file"),                                     # nothing maps
    (rows(person(1)).encode(), {"campaignId": "NOPE"}, "campaignId"),        # unknown campaign
    (rows(person(1)).encode(), {"campaignId": "AC02"}, "campaignId"),        # inactive
    (rows(person(1)).encode(), {"mapping": "{not json"}, "mapping"),
    (rows(person(1)).encode(), {"mapping": "[1]"}, "mapping"),
    (rows(person(1)).encode(), {"mapping": '{"Ignored": "shoeSize"}'}, "mapping.Ignored"),
    (rows(person(1)).encode(), {"mapping": '{"Ignored": "address.planet"}'}, "mapping.Ignored"),
    (rows(person(1)).encode(), {"mapping": '{"Nope": "email"}'}, "mapping.Nope"),
    (rows(person(1)).encode(), {"mapping": '{"Ignored": "email"}'}, "mapping"),  # two columns fill email
    (rows(person(1)).encode(), {"process": "maybe"}, "process"),
    (rows(person(1)).encode(), {"color": "red"}, "color"),
])
def test_a_bad_request_is_a_validation_error_and_imports_nothing(client, tenant, content, form, field):
    validation_error(start(client, tenant, content, 400, **form), field)
    assert leads(client, tenant) == []


def test_missing_parts_and_wrong_media_type(client, tenant):
    validation_error(client.post(URL, headers=tenant.headers, data={"campaignId": "AC01"},
                                 files={"other": ("x.csv", b"a", "text/csv")}), "other")
    answer = client.post(URL, headers=tenant.headers, files={"file": ("x.csv", rows(person(1)), "text/csv")})
    validation_error(answer, "campaignId")
    validation_error(client.post(URL, headers=tenant.headers, data={"campaignId": "AC01", "process": "true"},
                                 files={"unused": ("", b"", "text/plain")}), "unused")
    answer = client.post(URL, headers=tenant.headers, data={"campaignId": "AC01"}, files={"x": ("", b"")})
    assert answer.status_code == 400
    answer = client.post(URL, headers=tenant.headers, json={"campaignId": "AC01"})
    assert answer.status_code == 415 and answer.json()["error"]["code"] == "UNSUPPORTED_MEDIA_TYPE"
    answer = client.post(URL, headers={**tenant.headers, "Content-Type": "multipart/form-data; boundary=xyz"},
                         content=b"--xyz\r\nContent-Disposition: form-data; name=\"campaignId\"\r\n\r\nAC01")
    validation_error(answer, "body")  # ends inside the form
    assert leads(client, tenant) == []


def test_another_tenants_import_is_not_found(client, tenant, other_tenant):
    import_id = start(client, tenant, rows(person(1)), process="false")
    for who, found in ((other_tenant, import_id), (tenant, "imp_NOPE")):
        answer = client.get(f"/api/v1/imports/{found}", headers=who.headers)
        assert answer.status_code == 404 and answer.json()["error"]["message"] == "Resource not found"


@pytest.fixture
def small_limit(config_file: Path) -> Path:
    with config_file.open("a") as f:
        f.write("\n[imports]\nmax_file_mb = 1\n")
    return config_file


def test_a_file_over_the_limit_is_refused(small_limit, client, tenant):
    big = rows(*(person(n % 9000) for n in range(20_000))).encode()
    assert len(big) > 1024 * 1024
    validation_error(start(client, tenant, big, 400), "file")

    def chunks():  # no Content-Length: the limit is found while streaming
        for start_at in range(0, len(big), 65536):
            yield big[start_at:start_at + 65536]

    boundary = "b0undary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"campaignId\"\r\n\r\nAC01\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.csv\"\r\n\r\n").encode()
    answer = client.post(URL, headers={**tenant.headers, "Content-Type": f"multipart/form-data; boundary={boundary}"},
                         content=iter([head, *chunks(), f"\r\n--{boundary}--\r\n".encode()]))
    validation_error(answer, "file")
    assert leads(client, tenant) == []


def test_the_real_server_refuses_a_200_mb_upload_without_reading_it(runtime, tenant):
    with live_server(runtime, background=False) as base:
        address = urlsplit(base)
        with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
            sock.sendall((f"POST {URL} HTTP/1.1\r\nHost: x\r\nX-API-Key: {tenant.key}\r\n"
                          "Content-Type: multipart/form-data; boundary=b\r\n"
                          f"Content-Length: {200 * 1024 * 1024}\r\n\r\n").encode() + b"--b\r\n")
            answer = sock.recv(65536).decode()  # answered with 199.99 MB still unsent
    assert answer.startswith("HTTP/1.1 400"), answer
    assert '"file: larger than the 50 MB limit of an import"' in answer


def test_an_import_a_stop_interrupts_ends_failed_with_honest_counts(runtime, tenant):
    text = rows(*(person(n % 9000, last=f"stop{n}") for n in range(30_000)))
    with TestClient(create_app(runtime, background=False), raise_server_exceptions=False) as client:
        import_id = start(client, tenant, text, process="false")
    # the client's exit stopped the app while the import ran; a new start finds it ended
    with TestClient(create_app(runtime, background=False), raise_server_exceptions=False) as client:
        ended = data(client.get(f"/api/v1/imports/{import_id}", headers=tenant.headers))
        summary = data(client.get("/api/v1/reports/summary?groupBy=campaign", headers=tenant.headers))
    assert ended["state"] == "failed" and ended["reason"].startswith("interrupted")
    assert ended["created"] == summary["totals"]["leads"] < 30_000
    assert ended["processed"] == ended["created"] + ended["failed"]


def test_an_import_left_running_by_a_crash_ends_failed_at_the_next_start(runtime, tenant):
    now = iso(runtime.clock.now())
    runtime.store.write_sync(lambda tx: tx.imports.create(tenant.tenant_id, "imp_CRASHED", "AC01", "a.csv", True,
                                                          {"email": "email"}, 10, now))
    with TestClient(create_app(runtime, background=False), raise_server_exceptions=False) as client:
        ended = data(client.get("/api/v1/imports/imp_CRASHED", headers=tenant.headers))
    assert (ended["state"], ended["processed"], ended["finishedAt"] is not None) == ("failed", 0, True)
    assert ended["reason"] == "interrupted: the appliance stopped before the import finished"


# ---- the CLI ----------------------------------------------------------------------------------

@pytest.fixture
def cli_tenant(cli) -> str:
    tenant_id = cli.json("tenant", "create", "Importer")["tenantId"]
    bundle = Path(cli.config_file).parent / "bundle.json"
    from tests.bundles import standard_bundle
    bundle.write_text(json.dumps(standard_bundle()))
    cli("import", "--tenant", tenant_id, str(bundle))
    return tenant_id


def test_cli_imports_with_a_mapping_and_reports_bad_rows(cli, cli_tenant, tmp_path):
    file = tmp_path / "leads.csv"
    file.write_text("Given,last_name,email,phone,Cell\n" "jan,doe,jan@example.com,4155550040,x\n"
                    "ann,lee,nope,4155550041,x\n" "bo,kim,bo@example.com,,4155550042\n")
    report = cli.json("import-leads", "--tenant", cli_tenant, "--campaign", "AC01", str(file), "--no-process",
                      "--map", "Given=firstName", "--map", "Cell=")
    assert (report["total"], report["created"], report["failed"]) == (3, 1, 2)
    assert [e["row"] for e in report["errors"]] == [2, 3]
    assert report["errors"][1]["details"] == ["phone: required for a new lead"]
    text = cli("import-leads", "--tenant", cli_tenant, "--campaign", "AC01", str(file),
               "--map", "Given=firstName", "--map", "Cell=").stdout
    assert "imported 1 of 3 rows into AC01 (processed); 2 failed" in text and "row 2: email:" in text


def test_cli_exit_codes(cli, cli_tenant, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"firstName,email\nJ,j\xe9@example.com\n")
    result = cli("import-leads", "--tenant", cli_tenant, "--campaign", "AC01", str(bad), expect=1)
    assert f"error: {bad}: not UTF-8 text" in result.stderr
    good = tmp_path / "good.csv"
    good.write_text("firstName,lastName,email,phone\nJ,K,jk@example.com,4155550050\n")
    assert "unknown campaign" in cli("import-leads", "--tenant", cli_tenant, "--campaign", "NOPE", str(good),
                                     expect=1).stderr
    assert "does not exist" in cli("import-leads", "--tenant", "tnt_NOPE", "--campaign", "AC01", str(good),
                                   expect=1).stderr
    assert "mapping.email" in cli("import-leads", "--tenant", cli_tenant, "--campaign", "AC01", str(good),
                                  "--map", "email=shoeSize", expect=1).stderr
    assert "cannot read" in cli("import-leads", "--tenant", cli_tenant, "--campaign", "AC01",
                                str(tmp_path / "missing.csv"), expect=1).stderr
    cli("import-leads", "--tenant", cli_tenant, "--campaign", "AC01", str(good), "--map", "email", expect=2)
    cli("import-leads", "--tenant", cli_tenant, str(good), expect=2)
    every_row_bad = tmp_path / "rows.csv"
    every_row_bad.write_text("firstName,lastName,email,phone\nJ,K,nope,4155550051\n")
    assert "0 of 1 rows" in cli("import-leads", "--tenant", cli_tenant, "--campaign", "AC01", str(every_row_bad),
                                expect=1).stdout


def test_cli_import_is_visible_through_the_api(cli, cli_tenant, tmp_path, config):
    file = tmp_path / "leads.csv"
    file.write_text("firstName,lastName,email,phone\n" + "".join(
        f"P,Q{n},p{n}@example.com,41555501{n:02d}\n" for n in range(5)))
    cli("import-leads", "--tenant", cli_tenant, "--campaign", "AC01", str(file), "--no-process")
    from appliance.runtime import open_runtime
    runtime = open_runtime(config)
    try:
        key = tenancy.create_key(runtime, cli_tenant, name="t").key
        with TestClient(create_app(runtime, background=False)) as client:
            found = data(client.get("/api/v1/leads?status=new", headers={"X-API-Key": key}))["leads"]
    finally:
        runtime.close()
    assert len(found) == 5


def test_a_tenant_runs_a_few_imports_at_once(client, runtime, tenant, other_tenant):
    def running(who, n: int) -> None:  # imports still at work (big files in another request)
        runtime.store.write_sync(lambda tx: [tx.imports.create(
            who.tenant_id, f"imp_BUSY{who.tenant_id[-4:]}{i}", "AC01", "big.csv", False, {}, 1_000_000,
            "2026-01-01T00:00:00.000Z") for i in range(n)])

    running(tenant, 4)
    refused = start(client, tenant, rows(person(1)), status=409, process="false").json()["error"]
    assert refused["code"] == "INVALID_STATE" and refused["details"][0].startswith("file: 4 imports")
    running(other_tenant, 1)
    assert start(client, other_tenant, rows(person(2)), process="false", campaignId="OC01")  # theirs: their own count
    runtime.store.write_sync(lambda tx: tx.imports.finish(f"imp_BUSY{tenant.tenant_id[-4:]}0", "done", None,
                                                          "2026-01-01T00:00:01.000Z"))
    assert finished(client, tenant, start(client, tenant, rows(person(3)), process="false"))["created"] == 1
