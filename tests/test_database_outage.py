"""A database that cannot be reached, refuses the login, or cannot take a write: real `appliance
serve` processes and CLI commands. An outage is served with 503 SERVICE_UNAVAILABLE (never a 500,
never a 2xx for a lead that was not stored) until the database answers again, with no restart; a
refusal that waiting cannot mend (credentials, database name, a database `appliance init` never
set up) is one line and exit code 1. A password in the URL never shows."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.bundles import standard_bundle
from tests.conftest import Cli
from tests.engine import engine
from tests.postgres_cluster import Relay
from tests.processes import free_port, stop_process
from tests.servers import person

pytestmark = pytest.mark.postgresql_own

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "s3cret-Pa55word"
BUNDLE = {"campaigns": [{"campaignId": "OUT1", "name": "Outage"}]}


def write_config(tmp_path: Path, url: str) -> Path:
    config = tmp_path / "appliance.toml"
    config.write_text(f'[storage]\npath = "{tmp_path / "data"}"\nbackend = "postgresql"\nurl = "{url}"\n\n'
                      '[security]\nrate_limit_per_minute = 0\n\n[plugins]\ndirs = []\n')
    return config


def start_serving(config: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """`appliance serve`, once it answers HTTP (whatever the status)."""
    port = free_port()
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "appliance", "--config", str(config), "serve", "--port",
                                 str(port)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            return proc, url
        except httpx.HTTPError:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)


def unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "SERVICE_UNAVAILABLE"
    assert int(response.headers["Retry-After"]) > 0


def until(check, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}\n{log.read_text()}"
        time.sleep(0.2)


def test_a_server_rides_out_an_unreachable_database_with_503s_and_serves_once_it_answers(
        tmp_path, postgres_cluster, postgres_url):
    relay = Relay(postgres_cluster, free_port())
    config = write_config(tmp_path, relay.url(postgres_url.rsplit("/", 1)[1], PASSWORD))
    relay.start()
    cli = Cli(config)
    cli("init")
    tenant_id = cli.json("tenant", "create", "Outage")["tenantId"]
    key = cli.json("key", "create", "--tenant", tenant_id)["key"]
    (tmp_path / "bundle.json").write_text(json.dumps(BUNDLE))
    cli("import", "--tenant", tenant_id, str(tmp_path / "bundle.json"))
    relay.stop()

    log = tmp_path / "server.log"
    proc, url = start_serving(config, log)
    acked: list[str] = []
    try:
        with httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=15) as client:
            def submit(n: int) -> httpx.Response:
                response = client.post("/api/v1/leads/submit", json={"campaignId": "OUT1", **person(n)})
                assert response.status_code in (201, 503), response.text
                if response.status_code == 201:
                    acked.append(response.json()["data"]["leadId"])
                else:
                    unavailable(response)
                return response

            # Unreachable at start: serving, one line naming where, 503 for what needs the database.
            unavailable(client.get("/healthz"))
            unavailable(submit(0))
            unavailable(client.get("/api/v1/leads"))
            # The server's line: a delivery process of its own (`process = "auto"` on two cores or more)
            # says so too once it has started, a moment later.
            said = [line for line in log.read_text().splitlines()
                    if "cannot open database" in line and f"server[{proc.pid}]" in line]
            assert len(said) == 1 and f"127.0.0.1:{relay.port}" in said[0] and "postgres:***@" in said[0], said

            relay.start()  # reached: no restart needed
            until(lambda: client.get("/healthz").status_code == 200, 45, "never reached", log)
            assert submit(1).status_code == 201

            relay.stop()  # gone while serving: the open connections are cut
            for n in range(2, 6):
                unavailable(submit(n))
            unavailable(client.get("/healthz"))
            # The delivery loop meets the outage at its next claim (it polls every half second):
            # the database stays away until it has, however quickly the 503s above came back.
            until(lambda: "delivery paused" in log.read_text(), 15, "the delivery loop never met the outage", log)

            relay.start()
            until(lambda: submit(100).status_code == 201, 45, "never served again", log)
            for lead_id in acked:  # every acknowledged lead was stored
                assert client.get(f"/api/v1/leads/{lead_id}").status_code == 200
    finally:
        stop_process(proc)
        relay.stop()
    text = log.read_text()
    assert PASSWORD not in text and "Traceback" not in text
    # An outage is said as one (connections pooled before it are replaced once it answers).
    assert "internal error" not in text, text
    # The job loops say so once per outage they meet (two here), not once per attempt.
    for loop in ("delivery", "webhooks", "housekeeping"):
        assert text.count(f"{loop} paused") <= 2, text
    assert len(acked) == 2


def test_a_database_reached_late_with_secrets_of_another_master_key_is_never_served(
        tmp_path, postgres_cluster, postgres_url):
    relay = Relay(postgres_cluster, free_port())
    config = write_config(tmp_path, relay.url(postgres_url.rsplit("/", 1)[1]))
    relay.start()
    cli = Cli(config)
    cli("init")
    tenant_id = cli.json("tenant", "create", "Sealed")["tenantId"]
    key = cli.json("key", "create", "--tenant", tenant_id)["key"]
    (tmp_path / "bundle.json").write_text(json.dumps(standard_bundle()))  # secrets sealed with this key
    cli("import", "--tenant", tenant_id, str(tmp_path / "bundle.json"))
    relay.stop()
    master = tmp_path / "data" / "master.key"
    master.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")  # another install's key

    log = tmp_path / "server.log"
    proc, url = start_serving(config, log)
    try:
        relay.start()
        until(lambda: "cannot be served" in log.read_text(), 45, "never reached", log)
        assert "sealed with" in log.read_text()
        with httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=15) as client:
            unavailable(client.get("/healthz"))
            unavailable(client.post("/api/v1/leads/submit", json={"campaignId": "AC01", **person(1)}))
    finally:
        stop_process(proc)
        relay.stop()


def run(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "appliance", "--config", str(config), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def one_line_error(result: subprocess.CompletedProcess, *expected: str) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    assert PASSWORD not in result.stdout + result.stderr
    return lines[0]


def test_a_login_refused_for_good_stops_serve_with_one_line(tmp_path, postgres_cluster, postgres_url):
    config = write_config(tmp_path, postgres_url)
    Cli(config)("init")  # the data folder and master key
    host = f"127.0.0.1:{postgres_cluster.port}"
    for url, reason in ((f"postgresql://postgres:{PASSWORD}@{host}/no_such_db", "does not exist"),
                        (f"postgresql://nobody:{PASSWORD}@{host}/postgres", "does not exist")):
        write_config(tmp_path, url)
        one_line_error(run(config, "serve", "--port", str(free_port())), "cannot open database", reason, ":***@")
        one_line_error(run(config, "tenant", "list"), "cannot open database", reason)


def test_cli_commands_on_an_unreachable_database_say_so_in_one_line(tmp_path, postgres_url):
    config = write_config(tmp_path, postgres_url)
    Cli(config)("init")
    port = free_port()  # nothing listens there
    write_config(tmp_path, f"postgresql://postgres:{PASSWORD}@127.0.0.1:{port}/appliance")
    for args in (("tenant", "list"), ("doctor",), ("init",)):
        result = run(config, *args)
        if args == ("doctor",):
            assert result.returncode == 1 and PASSWORD not in result.stdout + result.stderr
            assert f"127.0.0.1:{port}" in result.stdout, result.stdout
        else:
            one_line_error(result, f"127.0.0.1:{port}", "postgres:***@")


def test_a_database_without_the_appliances_tables_is_refused_until_init(tmp_path, postgres_cluster, postgres_url):
    config = write_config(tmp_path, postgres_url)
    Cli(config)("init")
    postgres_cluster.admin("CREATE DATABASE empty_one TEMPLATE template0 LOCALE 'C' ENCODING 'UTF8'")
    try:
        write_config(tmp_path, postgres_cluster.url("empty_one"))
        for args in (("serve", "--port", str(free_port())), ("tenant", "list")):
            one_line_error(run(config, *args), "no appliance database at", "run `appliance init` first")
        assert "(created)" in run(config, "init").stdout
        assert run(config, "tenant", "list").returncode == 0
        assert "(up to date)" in run(config, "init").stdout
    finally:
        postgres_cluster.admin("DROP DATABASE empty_one WITH (FORCE)")


@pytest.mark.sqlite_only
def test_a_full_disk_answers_503_and_the_submit_works_once_there_is_room(runtime, client, tenant):
    db = engine(runtime.store)
    db.write_sync(lambda c: c.execute("PRAGMA max_page_count=1"))  # the file may grow no more (its free pages aside)
    for n in range(1000):
        response = client.post("/api/v1/leads/submit", json={"campaignId": "AC01", **person(n)}, headers=tenant.headers)
        if response.status_code != 201:
            break
    unavailable(response)
    assert "disk is full" in response.json()["error"]["message"]
    db.write_sync(lambda c: c.execute("PRAGMA max_page_count=1073741823"))
    assert client.post("/api/v1/leads/submit", json={"campaignId": "AC01", **person(n)},
                       headers=tenant.headers).status_code == 201
