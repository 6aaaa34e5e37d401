"""The envelope, request ids, authentication, key scope, rate limit and Litestar's own refusals."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import time
from urllib.parse import urlsplit

import msgspec
import pytest
from litestar.testing import TestClient

from appliance.services import tenancy
from appliance.app import create_app
from appliance.config import load_config
from appliance.runtime import create_runtime
from tests.buyer_server import wait_until
from tests.engine import engine, seen

UNAUTHORIZED = {"success": False, "error": {"code": "UNAUTHORIZED", "message": "Authentication required"}}


def test_healthz_needs_no_key_and_has_request_id(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["data"]["status"] == "ok"
    assert re.fullmatch(r"req_[0-9a-f]{16}", response.headers["x-request-id"])


@pytest.mark.parametrize("headers", [{}, {"X-API-Key": ""}, {"X-API-Key": "lsk_short"},
                                     {"X-API-Key": "lsk_" + "x" * 38}, {"X-API-Key": "y" * 300}])
def test_missing_or_unknown_key_is_401(client, tenant, headers):
    response = client.get("/api/v1/campaigns", headers=headers)
    assert response.status_code == 401
    assert response.json() == UNAUTHORIZED
    assert "x-request-id" in response.headers


def test_revoked_key_is_refused_at_once(client, runtime, tenant):
    assert client.get("/api/v1/campaigns", headers=tenant.headers).status_code == 200
    tenancy.revoke_key(runtime, tenant.key_id)
    assert client.get("/api/v1/campaigns", headers=tenant.headers).status_code == 401


def test_key_revoked_by_the_cli_in_another_process_is_refused_at_once(client, runtime, config_file, tenant):
    # The server caches keys it has seen; the CLI is another process with its own connection.
    for _ in range(3):
        assert client.get("/api/v1/campaigns", headers=tenant.headers).status_code == 200
    done = subprocess.run([sys.executable, "-m", "appliance", "--config", str(config_file), "key", "revoke",
                           tenant.key_id], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert seen(runtime.store, lambda: client.get("/api/v1/campaigns", headers=tenant.headers).status_code == 401)
    response = client.get("/api/v1/campaigns", headers=tenant.headers)
    assert response.status_code == 401 and response.json() == UNAUTHORIZED


def test_source_key_created_by_the_cli_shows_at_once(client, runtime, cli, tenant):
    def prefix() -> str:
        campaigns = client.get("/api/v1/campaigns", headers=tenant.headers).json()["data"]["campaigns"]
        return campaigns[0]["ingestion"]["sources"][0]["keyPrefix"]

    assert prefix() == "import"
    made = cli.json("key", "create", "--tenant", tenant.tenant_id, "--source", "A-src")
    assert seen(runtime.store, lambda: prefix() == made["prefix"])


def test_key_change_that_could_not_be_signalled_is_seen_within_a_second(client, runtime, tenant):
    assert client.get("/api/v1/campaigns", headers=tenant.headers).status_code == 200
    # As a command that could not open the signal file would leave it: committed, not announced.
    engine(runtime.store).write_sync(lambda conn: conn.execute("UPDATE api_keys SET revoked_at = '2026-01-01T00:00:00.000Z'"
                                                              " WHERE key_id = ?", (tenant.key_id,)))
    time.sleep(1.1)
    assert client.get("/api/v1/campaigns", headers=tenant.headers).status_code == 401


@pytest.mark.sqlite_only  # SQLite's change-signal file; PostgreSQL signals with LISTEN/NOTIFY
def test_without_a_signal_file_keys_are_read_every_time(tmp_path):
    config_file = tmp_path / "nosignal.toml"
    config_file.write_text(f'[storage]\npath = "{tmp_path / "data"}"\n[security]\nrate_limit_per_minute = 0\n'
                           f'[plugins]\ndirs = []\n')
    config = load_config(config_file)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / (config.database_file.name + "-changes")).mkdir()  # cannot be opened as a file
    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("appliance.storage").addHandler(handler)
    runtime = create_runtime(config)
    try:
        assert runtime.store.changes is None
        tenant_id = tenancy.create_tenant(runtime, "No signal")
        made = tenancy.create_key(runtime, tenant_id)
        with TestClient(create_app(runtime, background=False)) as plain:
            assert plain.get("/api/v1/campaigns", headers={"X-API-Key": made.key}).status_code == 200
            tenancy.revoke_key(runtime, made.key_id)
            assert plain.get("/api/v1/campaigns", headers={"X-API-Key": made.key}).status_code == 401
        assert any("could not signal the change" in w for w in warnings)
    finally:
        logging.getLogger("appliance.storage").removeHandler(handler)
        runtime.close()


def test_while_the_change_listener_is_cut_off_keys_are_read_every_time(client, runtime, tenant, request):
    """PostgreSQL's counterpart of the test above: no LISTEN connection, no cached key."""
    if not hasattr(runtime.store, "postgres"):
        pytest.skip("PostgreSQL's change listener (SQLite: the signal-file test above)")
    cluster = request.getfixturevalue("postgres_cluster")
    database = urlsplit(runtime.config.database_url).path.lstrip("/")
    assert client.get("/api/v1/campaigns", headers=tenant.headers).status_code == 200
    # Connections already open stay; the listener's is ended and may not come back.
    cluster.admin(f"ALTER DATABASE {database} ALLOW_CONNECTIONS false")
    cluster.admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{database}' "
                  "AND query LIKE 'LISTEN%'")
    changes = runtime.store.changes
    assert wait_until(lambda: changes.value() != changes.value(), 10)  # moves on every read: cut off
    assert client.get("/api/v1/campaigns", headers=tenant.headers).status_code == 200
    engine(runtime.store).write_sync(lambda conn: conn.execute("UPDATE api_keys SET revoked_at = '2026-01-01T00:00:00.000Z'"
                                                              " WHERE key_id = ?", (tenant.key_id,)))
    assert client.get("/api/v1/campaigns", headers=tenant.headers).status_code == 401  # not announced, seen


def test_config_imported_by_the_cli_is_served_at_once(client, runtime, cli, tmp_path, tenant):
    before = client.get("/api/v1/campaigns", headers=tenant.headers).json()["data"]
    assert "NEW1" not in [c["campaignId"] for c in before["campaigns"]]
    bundle = tmp_path / "more.json"
    bundle.write_text(json.dumps({"campaigns": [{"campaignId": "NEW1", "name": "Imported while serving"}]}))
    cli("import", "--tenant", tenant.tenant_id, str(bundle))

    def served() -> bool:
        after = client.get("/api/v1/campaigns", headers=tenant.headers).json()["data"]
        return "NEW1" in [c["campaignId"] for c in after["campaigns"]]

    assert seen(runtime.store, served)


@pytest.mark.parametrize("path", ["/api/v1/campaigns", "/api/v1/questionnaires", "/api/v1/field-library",
                                  "/api/v1/field-library/email"])
def test_source_key_is_forbidden_outside_submit(client, runtime, tenant, path):
    source_key = tenancy.create_key(runtime, tenant.tenant_id, source_id="A-src").key
    response = client.get(path, headers={"X-API-Key": source_key})
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "FORBIDDEN"


def test_imported_source_key_authenticates_but_is_scoped(client, tenant):
    response = client.get("/api/v1/campaigns", headers={"X-API-Key": "imported-source-key-A-0123456789"})
    assert response.status_code == 403


def test_unknown_route_is_404_envelope(client, tenant):
    for headers in ({}, tenant.headers):
        response = client.get("/api/v1/nothing-here", headers=headers)
        assert response.status_code == 404
        assert response.json() == {"success": False, "error": {"code": "NOT_FOUND", "message": "Resource not found"}}
        assert "x-request-id" in response.headers


def test_wrong_method_is_405_envelope(client, tenant):
    response = client.delete("/api/v1/campaigns", headers=tenant.headers)
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "METHOD_NOT_ALLOWED"
    assert "x-request-id" in response.headers


def test_every_request_gets_a_distinct_request_id(client, tenant):
    ids = {client.get("/api/v1/campaigns", headers=tenant.headers).headers["x-request-id"] for _ in range(5)}
    assert len(ids) == 5


def test_rate_limit_per_key_answers_429_with_retry_after(tmp_path, backend_toml):
    config_file = tmp_path / "c.toml"
    config_file.write_text(f'[storage]\npath = "{tmp_path}/d"\n{backend_toml}[security]\nrate_limit_per_minute = 3\n')
    runtime = create_runtime(load_config(config_file))
    try:
        tenant_id = tenancy.create_tenant(runtime, "Limited")
        first = tenancy.create_key(runtime, tenant_id).key
        second = tenancy.create_key(runtime, tenant_id).key
        with TestClient(create_app(runtime)) as client:
            statuses = [client.get("/api/v1/campaigns", headers={"X-API-Key": first}).status_code for _ in range(4)]
            assert statuses == [200, 200, 200, 429]
            limited = client.get("/api/v1/campaigns", headers={"X-API-Key": first})
            assert limited.json()["error"]["code"] == "RATE_LIMITED"
            assert 1 <= int(limited.headers["retry-after"]) <= 61
            # the limit is per key: another key of the same tenant still passes
            assert client.get("/api/v1/campaigns", headers={"X-API-Key": second}).status_code == 200
    finally:
        runtime.close()


def test_activity_log_and_last_used_are_written_off_the_request_path(client, runtime, tenant):
    client.get("/api/v1/campaigns", headers=tenant.headers)
    client.get("/api/v1/nothing", headers=tenant.headers)
    client.get("/api/v1/campaigns", headers={"X-API-Key": "z" * 40})
    # The ticker flushes every second; leaving the client's context flushes the rest.
    client.__exit__(None, None, None)
    conn = engine(runtime.store).reader()
    rows = conn.execute("SELECT key_id, method, route, status, duration_ms FROM activity_log ORDER BY id").fetchall()
    assert (tenant.key_id, "GET", "/api/v1/campaigns", 200) in [r[:4] for r in rows]
    assert (None, "GET", "(unmatched)", 404) in [r[:4] for r in rows]
    assert (None, "GET", "/api/v1/campaigns", 401) in [r[:4] for r in rows]
    assert all(r[4] >= 0 for r in rows)
    (last_used,) = conn.execute("SELECT last_used_at FROM api_keys WHERE key_id = ?", (tenant.key_id,)).fetchone()
    assert last_used is not None and last_used.endswith("Z")


def test_openapi_document_describes_envelope_and_errors(client):
    doc = client.get("/schema/openapi.json").json()
    operation = doc["paths"]["/api/v1/campaigns"]["get"]
    assert operation["operationId"] == "listCampaigns"
    assert set(operation["responses"]) >= {"200", "401", "429", "500"}
    success = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert success["properties"]["data"]["$ref"] == "#/components/schemas/CampaignPage"
    assert operation["responses"]["401"]["content"]["application/json"]["schema"]["$ref"] == "#/components/schemas/Error"
    assert "Retry-After" in operation["responses"]["429"]["headers"]
    assert {p["name"] for p in operation["parameters"]} >= {"page", "limit", "active", "clientId", "offerId",
                                                             "includeArchived", "search"}
    field = doc["paths"]["/api/v1/field-library/{key}"]["get"]
    assert "404" in field["responses"]
    assert doc["components"]["securitySchemes"]["apiKey"]["name"] == "X-API-Key"
    msgspec.json.encode(doc)


def test_body_over_one_mebibyte_is_413_envelope(client, tenant):
    body = b'{"campaignId":"AC01","notes":"' + b"x" * (1024 * 1024) + b'"}'
    response = client.post("/api/v1/leads/submit", content=body,
                           headers={**tenant.headers, "Content-Type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert "x-request-id" in response.headers


@pytest.mark.parametrize(("body", "content_type", "status", "code"), [
    (b'{"campaignId": "AC01",', "application/json", 400, "VALIDATION_ERROR"),
    (b"", "application/json", 400, "VALIDATION_ERROR"),
    (b'{"campaignId": "AC01"}', "text/plain", 415, "UNSUPPORTED_MEDIA_TYPE"),
    (b"campaignId=AC01", "application/x-www-form-urlencoded", 415, "UNSUPPORTED_MEDIA_TYPE"),
])
def test_malformed_or_mistyped_bodies(client, tenant, body, content_type, status, code):
    response = client.post("/api/v1/leads/submit", content=body,
                           headers={**tenant.headers, "Content-Type": content_type})
    assert response.status_code == status
    assert response.json()["error"]["code"] == code


def test_unexpected_exception_is_a_generic_500_with_the_request_id(client, runtime, tenant, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("token=super-secret-value at /internal/path")

    # the catalog class of the backend in use (PostgreSQL's subclasses SQLite's)
    monkeypatch.setattr(type(runtime.store.reader().catalog), "list_campaigns", broken)
    # another page than any cached one, so the broken storage call is reached
    response = client.get("/api/v1/campaigns?page=7", headers=tenant.headers)
    assert response.status_code == 500
    error = response.json()["error"]
    request_id = response.headers["x-request-id"]
    assert error == {"code": "INTERNAL_ERROR", "message": f"Internal server error (request {request_id})"}
    assert "super-secret-value" not in response.text and "Traceback" not in response.text
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert request_id in logged and "RuntimeError" in logged
    assert "super-secret-value" not in logged


def test_unexpected_exception_in_submit_is_the_same_generic_500(client, tenant, monkeypatch, caplog):
    from appliance.services import intake

    async def broken(*args, **kwargs):
        raise RuntimeError("token=super-secret-value at /internal/path")

    monkeypatch.setattr(intake, "submit", broken)
    response = client.post("/api/v1/leads/submit", json={"campaignId": "AC01", "email": "a@example.com"},
                           headers=tenant.headers)
    assert response.status_code == 500
    request_id = response.headers["x-request-id"]
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"success": False, "error": {
        "code": "INTERNAL_ERROR", "message": f"Internal server error (request {request_id})"}}
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert request_id in logged and "RuntimeError" in logged and "/api/v1/leads/submit" in logged
    assert "super-secret-value" not in logged and "super-secret-value" not in response.text


def test_submit_is_in_the_activity_log_under_its_route(client, runtime, tenant):
    for body in ({"campaignId": "AC01", "firstName": "Bo", "email": "b@example.com", "phone": "+14155550123"},
                 {"campaignId": "AC01", "nope": 1}):
        response = client.post("/api/v1/leads/submit", json=body, headers=tenant.headers)
        (row,) = [r for r in runtime.activity if r[7] == response.headers["x-request-id"]]
        assert row[1:6] == (tenant.tenant_id, tenant.key_id, "POST", "/api/v1/leads/submit", response.status_code)
    assert response.status_code == 400


def test_activity_log_keeps_the_configured_days(runtime, tenant):
    import asyncio
    from datetime import datetime, timezone

    from appliance.jobs.ticker import purge_old_activity

    rows = [("2020-01-01T00:00:00.000Z", tenant.tenant_id, tenant.key_id, "GET", "/x", 200, 1.0, "req_old"),
            (datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z"), tenant.tenant_id, tenant.key_id,
             "GET", "/x", 200, 1.0, "req_new")]
    runtime.store.write_sync(lambda tx: tx.activity.append(rows))
    assert asyncio.run(purge_old_activity(runtime)) == 1
    kept = engine(runtime.store).reader().execute("SELECT request_id FROM activity_log").fetchall()
    assert kept == [("req_new",)]


def test_country_with_a_trailing_newline_is_refused(client, tenant):
    body = {"campaignId": "AC01", "firstName": "A", "lastName": "B", "email": "a@b.co", "phone": "+14155552671",
            "country": "US\n"}
    response = client.post("/api/v1/leads/submit", json=body, headers=tenant.headers)
    assert response.status_code == 400
    assert response.json()["error"]["details"][0].startswith("country: ")


def test_pre_1970_date_range_is_accepted(client, tenant):
    response = client.get("/api/v1/leads?startDate=1960-01-01&endDate=1965-01-01", headers=tenant.headers)
    assert response.status_code == 200
    assert response.json()["data"]["leads"] == []


def test_a_nul_character_is_a_validation_error_naming_the_field_never_a_500(client, tenant):
    """PostgreSQL's text cannot hold U+0000 and no field needs it: a JSON body, a path or a query
    value holding one is refused on both backends, naming the field, never a 500."""
    body = {"campaignId": "AC01", "firstName": "Ada\u0000", "lastName": "Lovelace", "email": "nul@example.com",
            "phone": "+14155550100"}
    answer = client.post("/api/v1/leads/submit", json=body, headers=tenant.headers)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["details"] == ["firstName: must not contain the NUL character (\\u0000)"]
    patched = client.patch("/api/v1/leads/lead_nope", json={"address": {"city": "x\u0000"}}, headers=tenant.headers)
    assert patched.status_code == 400 and patched.json()["error"]["details"] == [
        "address.city: must not contain the NUL character (\\u0000)"], patched.text
    for path, field in (("/api/v1/leads/lead_x%00y", "path"), ("/api/v1/leads?limit=5&email=a%00b%40example.com", "email"),
                        ("/api/v1/leads?search=ada%00", "search"), ("/admin/leads?search=%00", "search")):
        answer = client.get(path, headers=tenant.headers)
        assert answer.status_code == 400, (path, answer.status_code, answer.text)
        assert answer.json()["error"]["details"] == [f"{field}: must not contain the NUL character (%00)"]
