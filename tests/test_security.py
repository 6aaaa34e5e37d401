"""Security: tenant isolation on every route, mass assignment, key scope and revocation, how keys
are compared, secrets kept out of responses and logs, and SSRF through the real delivery worker.

Timing-safe key comparison, as built: a presented key is never compared with a stored secret.
The middleware hashes it (SHA-256; keys carry 190 random bits, so a slow hash adds nothing) and
looks the digest up through the unique index on api_keys.key_hash: the time taken depends on the
digest, which an attacker cannot steer toward a stored one. The only byte-by-byte comparison of
key material is the checksum of our own key format (apikeys.well_formed), done with
secrets.compare_digest. The tests below pin each of those facts."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets as pysecrets
import subprocess
import sys

import httpx
import pytest

from appliance import apikeys
from appliance.services import tenancy
from appliance.config import load_config
from appliance.runtime import create_runtime
from appliance.storage.tenants import Tenants
from tests.api_helpers import FILE, fill, routes_of, submission_of, submit
from tests.bundles import campaign, standard_bundle
from tests.buyer_server import BuyerServer, Reply, wait_until
from tests.conftest import make_tenant
from tests.processes import free_port, stop_process
from tests.servers import live_server, person, write_config
from tests.engine import engine, stored_bytes, table_columns

SUBMIT = "/api/v1/leads/submit"
PING = "/api/v1/leads/ping"


# ---- helpers ----------------------------------------------------------------------------------

def snapshot(runtime, tenant_id: str) -> dict[str, list]:
    """Every row of every table that carries the tenant's id (the activity log and key usage
    stamps aside: those record the attempt itself)."""
    conn = engine(runtime.store).reader()
    rows = {}
    for table, columns in table_columns(runtime.store).items():
        if "tenant_id" not in columns or table in ("activity_log", "api_keys"):
            continue
        rows[table] = sorted(map(repr, conn.execute(f"SELECT * FROM {table} WHERE tenant_id = ?", (tenant_id,))))
    assert {"tenants", "leads", "jobs"} <= set(rows), sorted(rows)  # the catalog read found the tables
    return rows


# ---- another tenant's ids ----------------------------------------------------------------------

def test_every_route_with_another_tenants_ids_is_not_found_and_changes_nothing(client, runtime, tenant,
                                                                               other_tenant):
    tenancy.import_bundle(runtime, other_tenant.tenant_id, json.dumps({"fieldLibrary": [
        {"key": "theirfield", "label": "Theirs", "category": "custom"}]}).encode(), "json")
    mine = submit(client, tenant, "AC01", 1)
    theirs = submit(client, other_tenant, "OC01", 2)
    their_submission = submission_of(client, other_tenant, theirs)
    client.post("/api/v1/files", json={"leadId": theirs, **FILE}, headers=other_tenant.headers)
    client.post("/api/v1/webhooks", json={"url": "https://hooks.example.com/theirs", "webhookId": "theirhook"},
                headers=other_tenant.headers)
    their_list = client.post("/api/v1/suppression-lists", json={"name": "Theirs"},
                             headers=other_tenant.headers).json()["data"]["listId"]
    client.post(f"/api/v1/suppression-lists/{their_list}/entries", json={"add": ["jane2@example.com"]},
                headers=other_tenant.headers)
    client.post("/api/v1/endpoints/O-ep/pause", json={"reason": "theirs"}, headers=other_tenant.headers)
    client.post("/api/v1/clients", json={"clientId": "their-client", "name": "Theirs"}, headers=other_tenant.headers)
    their_user = client.post("/api/v1/users", json={"email": "theirs@example.com", "role": "viewer"},
                             headers=other_tenant.headers).json()["data"]["userId"]
    their_import = client.post("/api/v1/leads/import", headers=other_tenant.headers, data={
        "campaignId": "OC01", "process": "false"}, files={"file": ("a.csv", "email\nx@example.com\n")}
        ).json()["data"]["importId"]
    assert wait_until(lambda: client.get(f"/api/v1/imports/{their_import}", headers=other_tenant.headers)
                      .json()["data"]["state"] != "running", 10)
    before = snapshot(runtime, other_tenant.tenant_id)
    h = tenant.headers

    def status(method: str, path: str, body=None) -> int:
        kwargs = {"json": body} if body is not None else {}
        return client.request(method, path, headers=h, **kwargs).status_code

    # Path ids of the other tenant: 404, as for ids that do not exist.
    not_found = {
        ("GET", "/api/v1/leads/{leadId}"): None,
        ("PATCH", "/api/v1/leads/{leadId}"): {"notes": "mine now", "status": "failed", "email": "me@example.com"},
        ("GET", "/api/v1/leads/{leadId}/messages"): None,
        ("GET", "/api/v1/leads/{leadId}/auctions"): None,
        ("GET", "/api/v1/imports/{importId}"): None,
        ("POST", "/api/v1/leads/{leadId}/approve"): {"status": "approved"},
        ("POST", "/api/v1/leads/{leadId}/return"): {"reason": "wrong number"},
        ("POST", "/api/v1/leads/{leadId}/repost"): {},
        ("POST", "/api/v1/leads/{leadId}/deliver"): {"campaignId": "AC01"},
        ("GET", "/api/v1/submissions/{submissionId}"): None,
        ("PATCH", "/api/v1/submissions/{submissionId}"): {"status": "failed", "result": "mine now"},
        ("GET", "/api/v1/files/{leadId}"): None,
        ("GET", "/api/v1/files/{leadId}/{fileKey}"): None,
        ("GET", "/api/v1/files/{leadId}/{fileKey}/content"): None,
        ("GET", "/api/v1/field-library/{key}"): None,
        ("GET", "/api/v1/webhooks/{webhookId}"): None,
        ("PATCH", "/api/v1/webhooks/{webhookId}"): {"url": "https://evil.example.com/x"},
        ("DELETE", "/api/v1/webhooks/{webhookId}"): None,
        ("GET", "/api/v1/webhooks/{webhookId}/deliveries"): None,
        ("GET", "/api/v1/suppression-lists/{listId}"): None,
        ("POST", "/api/v1/suppression-lists/{listId}/entries"): {"remove": ["jane2@example.com"]},
        ("POST", "/api/v1/endpoints/{deliveryEndpointId}/pause"): {"reason": "mine now"},
        ("POST", "/api/v1/endpoints/{deliveryEndpointId}/resume"): {},
        ("GET", "/api/v1/users/{userId}"): None,
        ("PATCH", "/api/v1/users/{userId}"): {"role": "owner", "active": False},
        ("DELETE", "/api/v1/users/{userId}"): None,
        ("GET", "/api/v1/clients/{clientId}"): None,
        ("PATCH", "/api/v1/clients/{clientId}"): {"name": "Mine now"},
        ("POST", "/api/v1/clients/{clientId}/credits"): {"amount": 5},
        ("GET", "/api/v1/clients/{clientId}/statement"): None,
        ("GET", "/api/v1/sources/{sourceId}/spec"): None,
        ("POST", "/api/v1/leads/{leadId}/return-requests"): {"reason": "mine now"},
        ("POST", "/api/v1/return-requests/{requestId}/decision"): {"decision": "approve"},
    }
    for (method, path), body in not_found.items():
        url = fill(path, leadId=theirs, submissionId=their_submission, fileKey="license", key="theirfield",
                   webhookId="theirhook", listId=their_list, deliveryEndpointId="O-ep", importId=their_import,
                   userId=their_user, clientId="their-client", requestId="rtr_theirs",
                   sourceId="O-src")
        assert status(method, url, body) == 404, (method, url)
    # Body references to the other tenant: the subject of sms/send and pixels/fire is NOT_FOUND,
    # other references are a VALIDATION_ERROR naming the field.
    assert status("POST", "/api/v1/sms/send", {"leadId": theirs, "message": "hi"}) == 404
    assert status("POST", "/api/v1/pixels/fire", {"leadId": theirs, "pixelId": "A-px", "platform": "social",
                                                  "eventName": "Lead"}) == 404
    assert status("POST", "/api/v1/pixels/fire", {"leadId": mine, "pixelId": "O-px", "platform": "social",
                                                  "eventName": "Lead"}) == 404
    for method, path, body, field in [
        ("POST", SUBMIT, {"leadId": theirs, "campaignId": "AC01", **person(3)}, "leadId"),
        ("POST", SUBMIT, {"campaignId": "OC01", **person(4)}, "campaignId"),
        ("POST", f"/api/v1/leads/{mine}/deliver", {"campaignId": "OC01"}, "campaignId"),
        ("POST", "/api/v1/files", {"leadId": theirs, **FILE}, "leadId"),
    ]:
        answer = client.request(method, path, json=body, headers=h)
        assert answer.status_code == 400, (path, answer.text)
        assert any(d.startswith(field) for d in answer.json()["error"]["details"]), answer.text
    # Lists: nothing of theirs is visible, their ids find nothing.
    bulk = client.patch("/api/v1/leads/bulk", json={"leadIds": [theirs], "updates": {"notes": "x", "status": "failed"}},
                        headers=h)
    assert bulk.status_code == 200 and bulk.json()["data"]["modifiedCount"] == 0
    for query in (f"search={theirs}", "campaignIds=OC01", "search=jane2@example.com"):
        assert client.get(f"/api/v1/leads?{query}", headers=h).json()["data"]["leads"] == [], query
    assert client.get(f"/api/v1/leads?cursor={theirs}", headers=h).status_code == 400
    listed = json.dumps([client.get(p, headers=h).json() for p in ("/api/v1/campaigns", "/api/v1/questionnaires",
                                                                   "/api/v1/field-library")])
    assert "OC0" not in listed and "O-q1" not in listed
    assert client.get("/api/v1/webhooks", headers=h).json()["data"]["items"] == []
    assert client.get("/api/v1/suppression-lists", headers=h).json()["data"]["items"] == []
    assert client.get("/api/v1/users", headers=h).json()["data"]["items"] == []
    mine_audited = json.dumps(client.get("/api/v1/audit", headers=h).json()["data"]["items"])
    assert their_user not in mine_audited and "theirhook" not in mine_audited and their_list not in mine_audited
    assert [e["deliveryEndpointId"] for e in client.get("/api/v1/endpoints", headers=h).json()["data"]["items"]] \
        == ["A-ep"]

    assert snapshot(runtime, other_tenant.tenant_id) == before
    # Every route with a path parameter was tried above (a new one must be added here).
    tried = set(not_found)
    with_ids = {r for r in routes_of(client.app) if "{" in r[1]}
    assert with_ids <= tried, with_ids - tried


# ---- mass assignment --------------------------------------------------------------------------

MASS_ASSIGNMENT = [
    *[(SUBMIT, {"campaignId": "AC01", **person(10), field: value}, field) for field, value in [
        ("tenantId", "tnt_X"), ("status", "delivered"), ("createdAt", "2020-01-01T00:00:00.000Z"),
        ("updatedAt", "2020-01-01T00:00:00.000Z"), ("submissionCount", 9), ("phoneE164", "+14155550000"),
        ("sourceId", "A-src"), ("approval", {"status": "approved"}), ("clientId", "cli-9"), ("offerId", "o"),
        ("submissions", []), ("id", "x"), ("_id", "x")]],
    *[("/api/v1/leads/{lead}/repost", {"modifiedPayload": {field: "x"}}, f"modifiedPayload.{field}")
      for field in ("tenantId", "leadId", "status", "createdAt", "sourceId")],
    *[("/api/v1/leads/{lead}/deliver", {"campaignId": "AC01", field: "x"}, field)
      for field in ("tenantId", "leadId", "submissionId")],
    *[("/api/v1/leads/{lead}/approve", {"status": "approved", field: "x"}, field)
      for field in ("tenantId", "decidedAt", "decidedBy")],
    *[("/api/v1/submissions/{submission}", {"result": "r", field: "x"}, field)
      for field in ("tenantId", "submissionId", "leadId", "createdAt", "updatedAt", "submissionNumber",
                    "campaignId")],
    *[("/api/v1/leads/bulk", {"leadIds": ["{lead}"], "updates": {"notes": "n", field: "x"}}, f"updates.{field}")
      for field in ("tenantId", "leadId", "createdAt", "updatedAt", "approval", "sourceId", "phoneE164")],
    ("/api/v1/leads/bulk", {"leadIds": ["{lead}"], "updates": {"notes": "n"}, "tenantId": "x"}, "tenantId"),
    *[("/api/v1/files", {"leadId": "{lead}", **FILE, field: "x"}, field)
      for field in ("tenantId", "fileId", "createdAt", "updatedAt")],
    *[("/api/v1/sms/send", {"leadId": "{lead}", "message": "hi", field: "x"}, field)
      for field in ("tenantId", "messageId", "status")],
    *[("/api/v1/pixels/fire", {"leadId": "{lead}", "pixelId": "A-px", "platform": "social", "eventName": "Lead",
                               field: "x"}, field) for field in ("tenantId", "eventId")],
    *[("/api/v1/webhooks", {"url": "https://hooks.example.com/x", field: "x"}, field)
      for field in ("tenantId", "createdAt", "updatedAt")],
]


def test_bodies_carrying_ids_tenant_or_timestamps_are_rejected(client, runtime, tenant):
    lead = submit(client, tenant, "AC01", 11)
    sub = submission_of(client, tenant, lead)
    before = snapshot(runtime, tenant.tenant_id)
    for path, body, field in MASS_ASSIGNMENT:
        path = path.format(lead=lead, submission=sub)
        text = json.dumps(body).replace("{lead}", lead)
        method = "PATCH" if path.startswith("/api/v1/submissions") or path.endswith("/bulk") else "POST"
        answer = client.request(method, path, content=text, headers={**tenant.headers,
                                                                     "Content-Type": "application/json"})
        assert answer.status_code == 400, (path, field, answer.text)
        details = answer.json()["error"]["details"]
        assert any(d.startswith(f"{field}: unknown field") for d in details), (path, field, details)
    assert snapshot(runtime, tenant.tenant_id) == before


# ---- key scope, revocation ----------------------------------------------------------------------

def test_source_key_may_only_submit_to_its_own_campaigns(client, runtime, tenant):
    tenancy.import_bundle(runtime, tenant.tenant_id, json.dumps({"campaigns": [
        campaign("AC07", "Active, no sources")]}).encode(), "json")
    generated = tenancy.create_key(runtime, tenant.tenant_id, source_id="A-src").key
    imported = "imported-source-key-A-0123456789"
    for key in (generated, imported):
        headers = {"X-API-Key": key}
        for method, path in routes_of(client.app):
            if path in (SUBMIT, PING):
                continue
            answer = client.request(method, fill(path), headers=headers, json={})
            assert answer.status_code == 403, (key[:6], method, path, answer.text)
            assert answer.json()["error"]["code"] == "FORBIDDEN"
        # AC07 is active and has no ingestion source A-src
        assert client.post(SUBMIT, json={"campaignId": "AC07", **person(20)}, headers=headers).status_code == 403
        assert client.post(PING, json={"campaignId": "AC07"}, headers=headers).status_code == 403
        assert client.post(PING, json={"campaignId": "AC01"}, headers=headers).status_code == 200
        assert client.post(SUBMIT, json={"campaignId": "AC01", **person(21 if key == imported else 22)},
                           headers=headers).status_code == 201


# The whole body of every 401, byte for byte, and the challenge naming the header to send.
UNAUTHORIZED = b'{"success":false,"error":{"code":"UNAUTHORIZED","message":"Authentication required"}}'
CHALLENGE = 'APIKey realm="appliance", header="X-API-Key"'


def assert_unauthorized(answer: httpx.Response, *context) -> None:
    assert answer.status_code == 401, (*context, answer.text)
    assert answer.content == UNAUTHORIZED, (*context, answer.text)
    assert answer.headers.get_list("www-authenticate") == [CHALLENGE], (*context, answer.headers)


def test_missing_revoked_and_unknown_keys_are_refused_on_every_route(client, runtime, tenant):
    source = tenancy.create_key(runtime, tenant.tenant_id, source_id="A-src")
    for key_id in (tenant.key_id, source.key_id):
        tenancy.revoke_key(runtime, key_id)
    near_miss = tenant.key[:-1] + ("A" if tenant.key[-1] != "A" else "B")
    for key in (None, "", tenant.key, source.key, near_miss, tenant.key.upper(), " " + tenant.key + "x",
                "lsk_" + "0" * 38):
        headers = {} if key is None else {"X-API-Key": key}
        for method, path in routes_of(client.app):
            assert_unauthorized(client.request(method, fill(path), headers=headers, json={}), key, method, path)


def test_a_real_server_refuses_missing_revoked_and_unknown_keys_with_the_challenge(runtime, tenant):
    """Through uvicorn: submit is answered before Litestar (api/submit_edge.py), the rest by it."""
    revoked = tenancy.create_key(runtime, tenant.tenant_id, source_id="A-src")
    tenancy.revoke_key(runtime, revoked.key_id)
    with live_server(runtime, background=False) as base, httpx.Client(base_url=base, timeout=10) as http:
        for headers in ({}, {"X-API-Key": "lsk_" + "0" * 38}, {"X-API-Key": revoked.key}):
            assert_unauthorized(http.post(SUBMIT, json={"campaignId": "AC01", **person(30)}, headers=headers),
                                headers)
            assert_unauthorized(http.get("/api/v1/campaigns", headers=headers), headers)
        assert http.get("/api/v1/campaigns", headers=tenant.headers).status_code == 200


# ---- how keys are compared --------------------------------------------------------------------

def test_keys_are_stored_and_looked_up_by_sha256_only(runtime, tenant):
    assert apikeys.key_hash(tenant.key) == hashlib.sha256(tenant.key.encode()).digest()
    conn = engine(runtime.store).reader()
    (stored,) = conn.execute("SELECT key_hash FROM api_keys WHERE key_id = ?", (tenant.key_id,)).fetchone()
    assert bytes(stored) == hashlib.sha256(tenant.key.encode()).digest()
    assert runtime.store.reader().tenants.find_active_key(bytes(stored)).id == tenant.key_id
    assert runtime.store.reader().tenants.find_active_key(hashlib.sha256(b"other").digest()) is None


@pytest.mark.sqlite_only  # SQLite's query plan
def test_keys_are_looked_up_by_index(runtime, tenant):
    conn = engine(runtime.store).reader()
    (stored,) = conn.execute("SELECT key_hash FROM api_keys WHERE key_id = ?", (tenant.key_id,)).fetchone()
    plan = " ".join(str(row) for row in conn.execute(
        "EXPLAIN QUERY PLAN SELECT key_id FROM api_keys WHERE key_hash = ? AND revoked_at IS NULL", (stored,)))
    assert "USING INDEX" in plan or "USING COVERING INDEX" in plan, plan


def test_a_plaintext_key_is_nowhere_in_the_database(tenant, config):
    assert tenant.key.encode() not in stored_bytes(config)  # SQLite: the files, WAL included


def test_checksum_comparison_uses_compare_digest(monkeypatch):
    calls = []
    real = pysecrets.compare_digest
    monkeypatch.setattr(apikeys.secrets, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    key = apikeys.generate("tenant")
    assert apikeys.well_formed(key)
    assert not apikeys.well_formed(key[:-1] + ("0" if key[-1] != "0" else "1"))
    assert len(calls) == 2


def test_auth_reads_the_key_only_through_its_hash(client, tenant, monkeypatch):
    seen = []
    real = Tenants.find_active_key
    monkeypatch.setattr(Tenants, "find_active_key", lambda tenants, digest: seen.append(digest) or real(tenants, digest))
    assert client.get("/api/v1/campaigns", headers=tenant.headers).status_code == 200
    assert seen == [hashlib.sha256(tenant.key.encode()).digest()]


# ---- secrets never leave: a whole flow at DEBUG against `appliance serve` ---------------------

def test_no_key_token_or_ciphertext_in_responses_or_logs(tmp_path, backend_toml):
    tag = pysecrets.token_hex(6)
    secrets = {
        "endpoint token": f"ep-token-{tag}-secret",
        "echo endpoint token": f"echo-token-{tag}-secret",
        "basic password": f"basic-pass-{tag}",
        "url query secret": f"query-secret-{tag}",
        "imported source key": f"imported-src-key-{tag}-0123456789",
        "sms token": f"sms-token-{tag}-secret",
        "pixel token": f"pixel-token-{tag}-secret",
    }
    # On PostgreSQL the URL carries a password too (the test cluster accepts any).
    if backend_toml:
        secrets["database password"] = f"db-pass-{tag}"
        backend_toml = backend_toml.replace("://postgres@", f"://postgres:{secrets['database password']}@")
        assert secrets["database password"] in backend_toml
    with BuyerServer() as buyer:
        def echo(received):  # a buyer that repeats every credential it was sent
            return Reply(status=400, body={"error": "rejected", "echo": received.headers,
                                           "body": received.body.decode("utf-8", "replace")})

        buyer.route("/ok", status=200, body={"id": "B-1"})
        buyer.route("/echo", echo)
        buyer.route("/2010-04-01/Accounts/AC123/Messages.json", echo)
        buyer.route("/v21.0/A-px/events", echo)
        config = write_config(tmp_path, extra=(
            f'\n[server]\nhost = "127.0.0.1"\nport = {free_port()}\nlog_level = "debug"\n'
            f'\n[delivery]\nallow_private_addresses = true\n'
            f'\n[sms.twilio]\nbase_url = "{buyer.url("").rstrip("/")}"\n'
            f'\n[pixels.social]\nbase_url = "{buyer.url("").rstrip("/")}"\n'), backend=backend_toml)
        bundle = standard_bundle()
        bundle["deliveryEndpoints"] = [
            {"deliveryEndpointId": "A-ep", "url": buyer.url("/ok"),
             "auth": {"type": "bearer", "token": secrets["endpoint token"]},
             "headers": {"X-Static": "public"}},
            {"deliveryEndpointId": "A-echo", "url": buyer.url("/echo"), "retry": {"maxAttempts": 1},
             "auth": {"type": "bearer", "token": secrets["echo endpoint token"]}},
            {"deliveryEndpointId": "A-basic", "url": buyer.url("/echo") + "?api_key=" + secrets["url query secret"],
             "retry": {"maxAttempts": 1},
             "auth": {"type": "basic", "username": "u", "password": secrets["basic password"]}},
        ]
        bundle["sms"]["providers"][0]["authToken"] = secrets["sms token"]
        bundle["pixels"][0]["accessToken"] = secrets["pixel token"]
        bundle["campaigns"][0]["ingestion"]["sources"][0]["apiKey"] = secrets["imported source key"]
        bundle["campaigns"] += [campaign("AC05", "Echo buyer", delivery={"deliveryEndpointId": "A-echo"}),
                                campaign("AC06", "Basic buyer", delivery={"deliveryEndpointId": "A-basic"})]
        (tmp_path / "bundle.json").write_text(json.dumps(bundle))

        env = {**os.environ, "APPLIANCE_CONFIG": str(config)}
        cli_output = []

        def cli(*args: str) -> str:
            done = subprocess.run([sys.executable, "-m", "appliance", *args], capture_output=True, text=True,
                                  env=env, timeout=60)
            assert done.returncode == 0, done.stderr
            cli_output.append(done.stdout + done.stderr)
            return done.stdout

        cli("init")
        tenant_id = json.loads(cli("tenant", "create", "Leaky", "--json"))["tenantId"]
        cli("import", "--tenant", tenant_id, str(tmp_path / "bundle.json"))
        shown_once = [json.loads(cli("key", "create", "--tenant", tenant_id, "--json"))["key"],
                      json.loads(cli("key", "create", "--tenant", tenant_id, "--source", "A-src", "--json"))["key"]]
        cli_output.clear()  # `key create` shows its key once, by design; everything after must not
        secrets["tenant key"], secrets["source key"] = shown_once
        master = load_config(config).master_key_path.read_text().strip()
        secrets["master key"] = master
        secrets["basic credentials"] = base64.b64encode(f"u:{secrets['basic password']}".encode()).decode()
        secrets["sms basic credentials"] = base64.b64encode(f"AC123:{secrets['sms token']}".encode()).decode()

        log_file = tmp_path / "server.log"
        bootstrap = BOOTSTRAP_AT_DEBUG
        with open(log_file, "w") as log:
            server = subprocess.Popen([sys.executable, "-c", bootstrap], stdout=log, stderr=subprocess.STDOUT, env=env)
        base = f"http://127.0.0.1:{load_config(config).server.port}"
        answers: list[httpx.Response] = []
        try:
            assert wait_until(lambda: _up(base), timeout=20), log_file.read_text()
            with httpx.Client(base_url=base, timeout=20, event_hooks={"response": [lambda r: r.read()]}) as http:
                key = {"X-API-Key": secrets["tenant key"]}

                def call(method, path, headers=key, **kw):
                    answers.append(http.request(method, path, headers=headers, **kw))
                    return answers[-1]

                leads = {}
                for n, (code, headers) in enumerate([("AC01", key), ("AC01", {"X-API-Key": secrets["source key"]}),
                                                     ("AC01", {"X-API-Key": secrets["imported source key"]}),
                                                     ("AC05", key), ("AC06", key)]):
                    answer = call("POST", SUBMIT, headers=headers, json={"campaignId": code, **person(700 + n)})
                    assert answer.status_code == 201, answer.text
                    leads.setdefault(code, answer.json()["data"]["leadId"])

                def settled() -> bool:
                    statuses = [http.get(f"/api/v1/leads/{lead}", headers=key).json()["data"]["status"]
                                for lead in leads.values()]
                    return all(s in ("delivered", "failed") for s in statuses)

                assert wait_until(settled, timeout=20), [r.text for r in answers[-3:]]
                assert buyer.requests_to("/ok")[0].headers["authorization"] == f"Bearer {secrets['endpoint token']}"
                assert buyer.requests_to("/echo"), "the echoing buyer was never called"
                for lead in leads.values():
                    detail = call("GET", f"/api/v1/leads/{lead}")
                    for sub in detail.json()["data"]["submissions"]:
                        call("GET", f"/api/v1/submissions/{sub['submissionId']}")
                call("GET", "/api/v1/leads")
                call("GET", "/api/v1/campaigns?includeArchived=true")
                call("GET", "/api/v1/questionnaires")
                call("GET", "/api/v1/field-library")
                call("POST", "/api/v1/sms/send", json={"leadId": leads["AC01"], "message": "hello"})
                call("POST", "/api/v1/pixels/fire", json={"leadId": leads["AC01"], "pixelId": "A-px",
                                                          "platform": "social", "eventName": "Lead"})
                assert buyer.requests_to("/2010-04-01/Accounts/AC123/Messages.json")
                assert buyer.requests_to("/v21.0/A-px/events")
                # errors: bad keys, a source key out of scope, bad bodies, unknown ids, a huge body
                call("GET", "/api/v1/campaigns", headers={"X-API-Key": secrets["tenant key"] + "x"})
                call("GET", "/api/v1/campaigns", headers={"X-API-Key": secrets["source key"]})
                call("POST", SUBMIT, json={"campaignId": "AC01", "email": 5})
                call("POST", SUBMIT, content=b"{not json", headers={**key, "Content-Type": "application/json"})
                call("GET", "/api/v1/leads/lead_nope")
                call("POST", f"/api/v1/leads/{leads['AC05']}/repost")
                call("POST", SUBMIT, content=b'{"notes":"' + b"x" * 2_000_000 + b'"}',
                     headers={**key, "Content-Type": "application/json"})
                call("GET", "/schema/openapi.json", headers={})
        finally:
            stop_process(server)

    log_text = log_file.read_text()
    assert "DEBUG" in log_text  # the capture really was at DEBUG
    texts = {"server log": log_text, "cli": "\n".join(cli_output)}
    for n, answer in enumerate(answers):
        texts[f"response {n} {answer.request.method} {answer.request.url.path} {answer.status_code}"] = (
            "\n".join(f"{k}: {v}" for k, v in answer.headers.items()) + "\n" + answer.text)
    leaks = [(what, where) for what, value in secrets.items() for where, text in texts.items() if value in text]
    leaks += [(word, where) for word in ("ciphertext", "encryptedDataKey", "encrypted_data_key", "authTag")
              for where, text in texts.items() if word in text and "openapi" not in where]
    assert not leaks, leaks


# `appliance serve` with the root logger at DEBUG once the app has configured logging (Litestar
# sets the root to INFO), as an operator turning on debug logging would have it.
BOOTSTRAP_AT_DEBUG = """
import logging, sys
import appliance.app as app_module
real = app_module.create_app
def create_app(*args, **kwargs):
    app = real(*args, **kwargs)
    logging.getLogger().setLevel(logging.DEBUG)
    logging.getLogger("appliance").setLevel(logging.DEBUG)
    logging.getLogger(__name__).debug("root logger at DEBUG")
    return app
app_module.create_app = create_app
if not logging.getLogger().handlers:
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
from appliance.cli import main
sys.argv = ["appliance", "serve"]
main()
"""


def _up(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# ---- SSRF through the real worker -------------------------------------------------------------

def test_private_destinations_are_refused_end_to_end(tmp_path, backend_toml):
    runtime = create_runtime(load_config(write_config(tmp_path, backend=backend_toml)))
    try:
        with BuyerServer() as buyer:
            buyer.route("/in", status=200, body={"id": "B-1"})
            port = buyer.port
            urls = {
                "LOOP": f"http://127.0.0.1:{port}/in",
                "IPV6": f"http://[::1]:{port}/in",
                "META": "http://169.254.169.254/latest/meta-data/",
                "DECI": f"http://2130706433:{port}/in",
                "HEX": f"http://0x7f000001:{port}/in",
                "NAME": f"http://localhost:{port}/in",
                "MAPD": f"http://[::ffff:127.0.0.1]:{port}/in",
                "PRIV": "http://10.0.0.1/in",
            }
            bundle = {"deliveryEndpoints": [{"deliveryEndpointId": f"ep-{code}", "url": url,
                                             "retry": {"maxAttempts": 1}} for code, url in urls.items()],
                      "campaigns": [campaign(code, f"To {code}", delivery={"deliveryEndpointId": f"ep-{code}"})
                                    for code in urls]}
            tenant = make_tenant(runtime, "SSRF", bundle)
            with live_server(runtime) as base, httpx.Client(base_url=base, headers=tenant.headers, timeout=20) as http:
                leads = {}
                for n, code in enumerate(urls):
                    answer = http.post(SUBMIT, json={"campaignId": code, **person(800 + n)})
                    assert answer.status_code == 201, answer.text
                    leads[code] = answer.json()["data"]["leadId"]

                def lead(code):
                    return http.get(f"/api/v1/leads/{leads[code]}").json()["data"]

                assert wait_until(lambda: all(lead(c)["status"] == "failed" for c in urls), timeout=20), \
                    {c: lead(c)["status"] for c in urls}
                for code in urls:
                    submission = lead(code)["submissions"][-1]
                    text = json.dumps(submission).lower()
                    assert "refused" in text or "resolves to" in text, (code, submission.get("result"))
            assert buyer.requests == []
    finally:
        runtime.close()


def test_redirects_are_not_followed_end_to_end(tmp_path, backend_toml):
    runtime = create_runtime(load_config(write_config(tmp_path, extra="\n[delivery]\nallow_private_addresses = true\n", backend=backend_toml)))
    try:
        with BuyerServer() as buyer:
            buyer.route("/moved", status=302, headers={"Location": buyer.url("/internal")})
            buyer.route("/meta", status=307, headers={"Location": "http://169.254.169.254/latest/meta-data/"})
            buyer.route("/internal", status=200, body={"id": "nope"})
            bundle = {"deliveryEndpoints": [
                {"deliveryEndpointId": "ep-r1", "url": buyer.url("/moved"), "retry": {"maxAttempts": 1}},
                {"deliveryEndpointId": "ep-r2", "url": buyer.url("/meta"), "retry": {"maxAttempts": 1}}],
                "campaigns": [campaign("RD1", "Redirect", delivery={"deliveryEndpointId": "ep-r1"}),
                              campaign("RD2", "Redirect meta", delivery={"deliveryEndpointId": "ep-r2"})]}
            tenant = make_tenant(runtime, "Redirects", bundle)
            with live_server(runtime) as base, httpx.Client(base_url=base, headers=tenant.headers, timeout=20) as http:
                ids = [http.post(SUBMIT, json={"campaignId": code, **person(900 + n)}).json()["data"]["leadId"]
                       for n, code in enumerate(["RD1", "RD2"])]

                def leads():
                    return [http.get(f"/api/v1/leads/{i}").json()["data"] for i in ids]

                assert wait_until(lambda: all(d["status"] == "failed" for d in leads()), timeout=20), \
                    [d["status"] for d in leads()]
                for detail in leads():
                    assert "redirect not followed" in json.dumps(detail["submissions"][-1])
            assert sorted(r.path for r in buyer.requests) == ["/meta", "/moved"]
    finally:
        runtime.close()
