"""The operator's commands on a PostgreSQL install: `appliance doctor` shows the server, its
version, the round trip, the migrations and the other appliance processes sharing the database;
`appliance backup` is a pg_dump archive and `appliance restore` puts it into an empty database.
The URL's password never shows."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import Cli
from tests.processes import free_port, stop_process, wait_healthy
from tests.servers import person

pytestmark = pytest.mark.postgresql_own

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "s3cret-Pa55word"  # the test cluster trusts every login: the password is only carried


def write_config(tmp_path: Path, url: str) -> Path:
    config = tmp_path / "appliance.toml"
    config.write_text(f'[storage]\npath = "{tmp_path / "data"}"\nbackend = "postgresql"\nurl = "{url}"\n\n'
                      '[security]\nrate_limit_per_minute = 0\n\n[plugins]\ndirs = []\n')
    return config


def with_password(url: str) -> str:
    return url.replace("postgres@", f"postgres:{PASSWORD}@", 1)


def database_line(cli: Cli) -> str:
    out = cli("doctor").stdout
    assert PASSWORD not in out
    return next(line for line in out.splitlines() if "database:" in line)


def test_doctor_shows_the_server_and_the_processes_sharing_it(tmp_path, postgres_url):
    config = write_config(tmp_path, with_password(postgres_url))
    cli = Cli(config)
    cli("init")
    line = database_line(cli)
    shown = with_password(postgres_url).replace(PASSWORD, "***")
    assert line.startswith(f"ok    database: {shown}: PostgreSQL "), line
    assert "connection ok (" in line and "ms a round trip" in line
    assert "shared with 0 other appliance processes" in line and "secrets open with local:" in line
    applied, known = line.split(" migrations")[0].rsplit(" ", 1)[1].split("/")
    assert applied == known

    # One process whatever the machine's cores: with "auto" a delivery process of its own starts beside
    # the server and connects a moment after the server answers, racing the count below.
    config.write_text(config.read_text() + '\n[delivery]\nprocess = "shared"\n')
    log = tmp_path / "server.log"
    port = free_port()
    with log.open("ab") as out:
        server = subprocess.Popen([sys.executable, "-m", "appliance", "--config", str(config), "serve", "--port",
                                   str(port)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", server, log)
        assert "shared with 1 other appliance process," in database_line(cli)
    finally:
        stop_process(server)


def serve(config: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    with log.open("ab") as out:
        server = subprocess.Popen([sys.executable, "-m", "appliance", "--config", str(config), "serve", "--port",
                                   str(port)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, server, log)
    return server, url


def lead_ids(url: str, key: str) -> set[str]:
    answer = httpx.get(f"{url}/api/v1/leads", headers={"X-API-Key": key}, timeout=10)
    assert answer.status_code == 200, answer.text
    return {lead["leadId"] for lead in answer.json()["data"]["leads"]}


def test_backup_is_a_pg_dump_that_restores_into_an_empty_database(tmp_path, postgres_cluster, postgres_url):
    config = write_config(tmp_path, with_password(postgres_url))
    cli = Cli(config)
    cli("init")
    tenant_id = cli.json("tenant", "create", "Dumped")["tenantId"]
    key = cli.json("key", "create", "--tenant", tenant_id)["key"]
    (tmp_path / "bundle.json").write_text(json.dumps({"campaigns": [{"campaignId": "DMP1", "name": "Dump"}]}))
    cli("import", "--tenant", tenant_id, str(tmp_path / "bundle.json"))
    backups = tmp_path / "backups"
    backups.mkdir()
    server, url = serve(config, tmp_path / "server.log")
    try:
        for n in range(3):
            answer = httpx.post(f"{url}/api/v1/leads/submit", headers={"X-API-Key": key}, timeout=10,
                                json={"campaignId": "DMP1", **person(n)})
            assert answer.status_code == 201, answer.text
        stored = lead_ids(url, key)
        made = json.loads(cli("backup", str(backups), "--json").stdout)  # while the server runs
    finally:
        stop_process(server)
    archive = Path(made["file"])
    assert archive.suffix == ".dump" and archive.stat().st_size == made["bytes"] > 0
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600 and list(backups.iterdir()) == [archive]
    assert "exists" in cli("backup", str(archive), expect=1).stderr

    postgres_cluster.admin("CREATE DATABASE restored_here TEMPLATE template0 LOCALE 'C' ENCODING 'UTF8'")
    try:
        restored = write_config(tmp_path, with_password(postgres_cluster.url("restored_here")))
        result = Cli(restored)("restore", str(archive))
        assert "restored" in result.stdout and PASSWORD not in result.stdout
        again = Cli(restored)("restore", str(archive), expect=1)
        assert "already holds an appliance database" in again.stderr and PASSWORD not in again.stderr
        server, url = serve(restored, tmp_path / "restored.log")
        try:
            assert lead_ids(url, key) == stored and len(stored) == 3
        finally:
            stop_process(server)
    finally:
        postgres_cluster.admin("DROP DATABASE restored_here WITH (FORCE)")


def test_restore_refuses_what_is_not_an_appliance_dump_and_backup_needs_pg_dump(tmp_path, postgres_url):
    config = write_config(tmp_path, with_password(postgres_url))
    cli = Cli(config)
    cli("init")
    junk = tmp_path / "junk.dump"
    junk.write_text("not an archive\n")
    line = cli("restore", str(junk), expect=1).stderr.strip()
    assert line.startswith("error: ") and "not a pg_dump custom-format archive" in line and "\n" not in line
    without = subprocess.run([sys.executable, "-m", "appliance", "--config", str(config), "backup", str(tmp_path)],
                             cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PATH": "/nonexistent"})
    assert without.returncode == 1 and without.stderr.startswith("error: pg_dump not found on PATH"), without.stderr
    assert not list(tmp_path.glob("appliance-*"))
