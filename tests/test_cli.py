"""The `appliance` command with a real data folder."""

from __future__ import annotations

import json
import os
import stat
import tomllib

import apsw
import msgspec
import pytest
from litestar.testing import TestClient

from appliance.app import create_app
from appliance.runtime import open_runtime
from tests.bundles import standard_bundle
from tests.conftest import TEST_BACKEND
from tests.engine import engine, seen, stored_bytes


def test_init_is_idempotent_and_creates_a_private_master_key(bare_cli, config):
    cli = bare_cli
    first = cli("init").stdout
    assert "created" in first
    key_mode = stat.S_IMODE(os.stat(config.master_key_path).st_mode)
    assert key_mode == 0o600
    key_before = config.master_key_path.read_bytes()
    second = cli("init").stdout
    assert "up to date" in second and "kept" in second
    assert config.master_key_path.read_bytes() == key_before


def test_tenant_create_and_list_json(cli):
    created = cli.json("tenant", "create", "Acme Leads")
    assert created["tenantId"].startswith("tnt_")
    listed = cli.json("tenant", "list")
    assert [t["tenantId"] for t in listed] == [created["tenantId"]]
    assert listed[0]["name"] == "Acme Leads"


def test_key_create_list_revoke(cli):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    made = cli.json("key", "create", "--tenant", tenant_id, "--name", "web")
    assert made["key"].startswith("lsk_") and made["keyId"].startswith("key_")
    assert made["key"].startswith(made["prefix"]) and len(made["prefix"]) < len(made["key"])
    listed = cli.json("key", "list", "--tenant", tenant_id)
    assert listed[0]["keyId"] == made["keyId"] and listed[0]["revokedAt"] is None
    assert made["key"] not in json.dumps(listed)  # shown once: never listed again
    cli("key", "revoke", made["keyId"])
    assert cli.json("key", "list", "--tenant", tenant_id)[0]["revokedAt"] is not None


def test_key_errors(cli):
    result = cli("key", "create", "--tenant", "tnt_nope", expect=1)
    assert "tnt_nope does not exist" in result.stderr
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    result = cli("key", "create", "--tenant", tenant_id, "--source", "nope", expect=1)
    assert "source nope" in result.stderr
    unknown = "key_01JDN0TAKEYATA000000000000"
    assert cli("key", "revoke", unknown, expect=1).stderr == f"error: key {unknown} does not exist\n"


def test_key_revoke_takes_the_key_itself_and_never_prints_it(cli):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    leaked, kept = (cli.json("key", "create", "--tenant", tenant_id, "--name", name) for name in ("leaked", "kept"))
    text = cli("key", "revoke", leaked["key"])
    assert text.stdout == f"revoked {leaked['keyId']} (tenant {tenant_id})\n"
    assert cli.json("key", "revoke", leaked["key"]) == {"keyId": leaked["keyId"], "tenantId": tenant_id,
                                                        "revoked": True}
    assert [k["revokedAt"] is not None for k in cli.json("key", "list", "--tenant", tenant_id)] == [True, False]
    outputs = [text.output]

    never_made = "lsk_" + kept["key"][4:][::-1]  # a key's shape, but no key of this install
    for args in ([never_made], [never_made, "--json"]):
        refused = cli("key", "revoke", *args, expect=1)
        assert refused.stderr == ("error: no key has that key id, and no key is that key (not shown): "
                                  "`key list --tenant T` lists the key ids\n")
        outputs.append(refused.output)
    assert not any(secret in output for output in outputs for secret in (leaked["key"], never_made))


def test_source_key_needs_an_existing_source(cli, tmp_path):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    bundle = tmp_path / "b.json"
    bundle.write_text(json.dumps(standard_bundle()))
    cli("import", "--tenant", tenant_id, str(bundle))
    made = cli.json("key", "create", "--tenant", tenant_id, "--source", "A-src")
    assert made["key"].startswith("lss_") and made["kind"] == "source" and made["sourceId"] == "A-src"


def test_import_json_and_toml_and_export_round_trip(cli, tmp_path):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    bundle = tmp_path / "b.json"
    bundle.write_text(json.dumps(standard_bundle()))
    out = cli("import", "--tenant", tenant_id, str(bundle)).stdout
    assert "3 campaigns" in out
    exported = tmp_path / "export.toml"
    cli("export", "--tenant", tenant_id, str(exported))
    as_toml = tomllib.loads(exported.read_text())
    assert {c["campaignId"] for c in as_toml["campaigns"]} == {"AC01", "AC02", "AC03"}
    # a TOML bundle imports into another tenant
    other = cli.json("tenant", "create", "Other")["tenantId"]
    cli("import", "--tenant", other, str(exported))
    as_json = json.loads(cli("export", "--tenant", other).stdout)
    assert [c["name"] for c in as_json["campaigns"]] == ["Auto Accident West", "Solar Homes", "Old Mass Tort"]
    # upsert: importing the same bundle twice keeps one of each
    cli("import", "--tenant", tenant_id, str(bundle))
    assert len(json.loads(cli("export", "--tenant", tenant_id).stdout)["campaigns"]) == 3


def test_export_never_contains_secrets(cli, tmp_path):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    bundle = tmp_path / "b.json"
    bundle.write_text(json.dumps(standard_bundle()))
    cli("import", "--tenant", tenant_id, str(bundle))
    text = cli("export", "--tenant", tenant_id).stdout
    for secret in ("endpoint-secret-token-123", "sms-secret-token-456", "pixel-secret-token-789",
                   "imported-source-key-A", "ciphertext"):
        assert secret not in text


def test_import_error_names_the_path_and_changes_nothing(cli, tmp_path):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    bad = standard_bundle()
    bad["campaigns"].append({"campaignId": "BAD1", "name": "Bad",
                             "delivery": {"deliverySchedule": {"timezone": "Mars/Olympus"}}})
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    result = cli("import", "--tenant", tenant_id, str(path), expect=1)
    assert "campaigns[3].delivery.deliverySchedule.timezone: unknown time zone" in result.stderr
    assert json.loads(cli("export", "--tenant", tenant_id).stdout)["campaigns"] == []


def test_import_toml_error_path(cli, tmp_path):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    path = tmp_path / "bad.toml"
    path.write_text('[[campaigns]]\ncampaignId = "OK1"\nname = "Fine"\n\n[[campaigns]]\ncampaignId = "X"\nname = "Short code"\n')
    result = cli("import", "--tenant", tenant_id, str(path), expect=1)
    assert "campaigns[1].campaignId:" in result.stderr


def test_secrets_are_sealed_in_the_database(cli, tmp_path, config):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    bundle = tmp_path / "b.json"
    bundle.write_text(json.dumps(standard_bundle()))
    cli("import", "--tenant", tenant_id, str(bundle))
    raw = stored_bytes(config)
    for secret in (b"endpoint-secret-token-123", b"sms-secret-token-456", b"pixel-secret-token-789",
                   b"imported-source-key-A-0123456789"):
        assert secret not in raw


def test_secrets_are_sealed_at_rest(cli, tmp_path, config):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    bundle = tmp_path / "b.json"
    bundle.write_text(json.dumps(standard_bundle()))
    cli("import", "--tenant", tenant_id, str(bundle))
    runtime = open_runtime(config)
    try:
        reader = engine(runtime.store).reader()
        refs = {r for (r,) in reader.execute("SELECT ref FROM secrets")}
        sealed = [bytes(s) for (s,) in reader.execute("SELECT sealed FROM secrets")]
    finally:
        runtime.close()
    assert refs == {"source:AC01:A-src:apiKey", "endpoint:A-ep:auth.token", "sms:tw:authToken",
                    "pixel:A-px:accessToken"}
    for blob in sealed:
        assert set(msgspec.json.decode(blob)) == {"ciphertext", "encryptedDataKey", "iv", "authTag", "kmsKeyId"}
        assert b"secret-token" not in blob and b"source-key" not in blob


def test_imported_secrets_open_with_the_master_key(cli, tmp_path, config):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    bundle = tmp_path / "b.json"
    bundle.write_text(json.dumps(standard_bundle()))
    cli("import", "--tenant", tenant_id, str(bundle))
    runtime = open_runtime(config)
    try:
        blob = runtime.store.reader().secrets.get(tenant_id, "endpoint:A-ep:auth.token")
        assert runtime.box.open_bytes(blob, f"{tenant_id}/endpoint:A-ep:auth.token") == "endpoint-secret-token-123"
    finally:
        runtime.close()


@pytest.mark.sqlite_only  # an SQLite file copy; PostgreSQL is backed up with pg_dump (backup refuses with that pointer)
def test_backup_is_a_consistent_copy(cli, tmp_path, config):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    dest = tmp_path / "backups"
    dest.mkdir()
    out = cli("backup", str(dest)).stdout
    (copy,) = list(dest.iterdir())
    assert str(copy) in out
    conn = apsw.Connection(str(copy))
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("SELECT tenant_id FROM tenants").fetchall() == [(tenant_id,)]
    assert "exists" in cli("backup", str(copy), expect=1).stderr


def test_doctor_reports_ok_and_failures(cli, config):
    cli("init")
    out = cli("doctor").stdout
    assert "ok    database" in out and ("connection ok" if TEST_BACKEND == "postgresql" else "integrity ok") in out
    os.chmod(config.master_key_path, 0o644)
    failed = cli("doctor", expect=1).stdout
    assert "FAIL  master key" in failed


def test_unknown_config_key_stops_with_its_name(tmp_path, cli):
    bad = tmp_path / "bad.toml"
    bad.write_text("[storage]\npaht = './x'\n")
    cli.config_file = bad
    result = cli("init", expect=1)
    assert "storage.paht: unknown field" in result.stderr


def test_mistyped_config_value_names_the_key(tmp_path, cli):
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nport = 'eighty'\n")
    cli.config_file = bad
    assert "server.port: expected int, got str" in cli("init", expect=1).stderr


def test_config_from_environment_variable(tmp_path, monkeypatch, backend_toml):
    from click.testing import CliRunner

    from appliance.cli import main

    config_file = tmp_path / "env.toml"
    config_file.write_text(f'[storage]\npath = "{tmp_path / "envdata"}"\n{backend_toml}')
    monkeypatch.setenv("APPLIANCE_CONFIG", str(config_file))
    result = CliRunner().invoke(main, ["init"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "envdata" / "master.key").exists()  # the install the variable's config names
    if not backend_toml:
        assert (tmp_path / "envdata" / "appliance.db").exists()


def test_served_campaigns_after_cli_import(cli, tmp_path, config):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    key = cli.json("key", "create", "--tenant", tenant_id)["key"]
    bundle = tmp_path / "b.json"
    bundle.write_text(json.dumps(standard_bundle()))
    runtime = open_runtime(config)
    try:
        with TestClient(create_app(runtime)) as client:
            assert client.get("/api/v1/campaigns", headers={"X-API-Key": key}).json()["data"]["campaigns"] == []
            # an import by another process (the CLI) is visible to the running service at once
            cli("import", "--tenant", tenant_id, str(bundle))
            assert seen(runtime.store, lambda: len(client.get(
                "/api/v1/campaigns", headers={"X-API-Key": key}).json()["data"]["campaigns"]) == 2)
    finally:
        runtime.close()


@pytest.mark.parametrize("command", [["tenant", "list"], ["doctor"], ["--help"]])
def test_commands_run(cli, command):
    cli("init")
    cli(*command)
