"""The operator's commands on a PostgreSQL install: `appliance doctor` shows the server, its
version, the round trip, the migrations and the other appliance processes sharing the database,
with the URL's password hidden."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import Cli
from tests.processes import free_port, stop_process, wait_healthy

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
