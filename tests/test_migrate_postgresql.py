"""`appliance migrate --to postgresql://...`: an SQLite install copied into an empty PostgreSQL
database of the throwaway cluster (tests/postgres_cluster.py), then served from it."""

from __future__ import annotations

import json
from urllib.parse import urlsplit, urlunsplit

import apsw
import psycopg
import pytest
from litestar.testing import TestClient

from appliance.app import create_app
from appliance.config import load_config
from appliance.runtime import open_runtime
from tests.api_helpers import submit
from tests.bundles import standard_bundle
from tests.conftest import make_tenant

pytestmark = pytest.mark.sqlite_only  # what is copied is an SQLite install

COPIED = ("tenants", "api_keys", "campaigns", "secrets", "leads", "submissions", "jobs", "ledger_entries",
          "report_leads", "leads_names")


def _with_password(url: str) -> str:
    """The cluster trusts local connections: the password is carried, never checked."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.username}:s3cret-pw@{parts.hostname}:{parts.port}"))


def test_migrate_copies_the_install_and_it_serves_from_postgresql(cli, config, config_file, postgres_url):
    runtime = open_runtime(config)
    try:
        tenant = make_tenant(runtime, "Acme Leads", standard_bundle())
        with TestClient(create_app(runtime, background=False)) as client:
            lead_ids = [submit(client, tenant, "AC01", n) for n in range(3)]
    finally:
        runtime.close()
    source = apsw.Connection(str(config.database_file))
    expected = {t: source.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in COPIED if t != "leads_names"}
    source.close()

    result = cli("migrate", "--to", _with_password(postgres_url), "--json")
    assert "s3cret-pw" not in result.output
    rows = json.loads(result.stdout)["rows"]
    assert expected["leads"] == 3 and expected["jobs"] >= 3 and expected["secrets"] >= 1
    with psycopg.connect(postgres_url) as pg:
        for table, count in expected.items():
            assert rows[table] == count == pg.execute(f"SELECT count(*) FROM {table}").fetchone()[0], table
        assert rows["leads_names"] == 3

    sqlite_config = config_file.read_text()
    config_file.write_text(sqlite_config.replace(
        "[storage]\n", f'[storage]\nbackend = "postgresql"\nurl = "{postgres_url}"\n', 1))
    moved = open_runtime(load_config(config_file))  # the master key in the data folder opens the copied secrets
    try:
        with TestClient(create_app(moved, background=False)) as client:
            listed = client.get("/api/v1/leads", headers=tenant.headers)  # the copied key works
            assert listed.status_code == 200, listed.text
            assert sorted(item["leadId"] for item in listed.json()["data"]["leads"]) == sorted(lead_ids)
            found = client.get("/api/v1/leads", params={"search": "jane doe1"}, headers=tenant.headers)
            assert [item["leadId"] for item in found.json()["data"]["leads"]] == [lead_ids[1]]  # names rebuilt
            assert submit(client, tenant, "AC01", 9).startswith("lead_")  # ids continue after the copied ones
    finally:
        moved.close()

    assert "already postgresql" in cli("migrate", "--to", postgres_url, expect=1).stderr
    config_file.write_text(sqlite_config)
    again = cli("migrate", "--to", _with_password(postgres_url), expect=1)
    assert "is not empty" in again.stderr and "s3cret-pw" not in again.output


def test_migrate_refuses_what_it_cannot_copy_to(cli, config):
    assert "postgresql:// URL" in cli("migrate", "--to", "mysql://x/y", expect=1).stderr
    refused = cli("migrate", "--to", "postgresql://someone:s3cret-pw@127.0.0.1:9/none", expect=1)
    assert "cannot open database postgresql://someone:***@127.0.0.1:9/none" in refused.stderr
    assert "s3cret-pw" not in refused.output
