"""What deploy/ ships: the systemd unit passes `systemd-analyze verify` (where systemd is installed;
CI installs it) and keeps its promises (a user of its own, ProtectSystem=strict with the data
folder its only writable path, a restart on failure, reload by SIGHUP); the container recipe runs
a non-root user with the data folder of its config as a VOLUME, exposes the config's port, and its
HEALTHCHECK command, run here as the container runs it, passes against a running server (plain
and HTTPS) and fails once the server stopped."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.config import load_config
from tests.conftest import Cli
from tests.http_helpers import write_certificate
from tests.processes import free_port, serving
from tests.servers import write_config

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
UNIT = DEPLOY / "appliance.service"
CONTAINERFILE = DEPLOY / "Containerfile"
CONTAINER_CONFIG = DEPLOY / "container.toml"


# ---- the systemd unit ---------------------------------------------------------------------------------

def unit_settings() -> dict[str, dict[str, list[str]]]:
    """Each section's settings, every value of a repeated key in order."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
        else:
            key, value = line.split("=", 1)
            current.setdefault(key, []).append(value)
    return sections


def test_the_unit_runs_a_user_of_its_own_that_may_write_only_the_data_folder():
    service = unit_settings()["Service"]
    assert service["User"] == ["appliance"] and service["Group"] == ["appliance"]
    assert service["ProtectSystem"] == ["strict"]
    assert service["ReadWritePaths"] == ["/var/lib/appliance/data"]
    assert service["Restart"] == ["on-failure"]
    assert service["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert service["ExecStart"][0].endswith("appliance serve")
    assert service["NoNewPrivileges"] == ["yes"] and service["CapabilityBoundingSet"] == [""]
    assert unit_settings()["Install"]["WantedBy"] == ["multi-user.target"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed (CI installs it)")
def test_the_unit_passes_systemd_analyze_verify(tmp_path):
    unit = tmp_path / "appliance.service"
    # verify checks that ExecStart's program exists: this checkout's, where the unit names the installed one
    unit.write_text(UNIT.read_text().replace("ExecStart=/usr/local/bin/appliance ",
                                             f"ExecStart={sys.executable} -m appliance "))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60,
                            check=False)
    said = [line for line in (result.stdout + result.stderr).splitlines() if unit.name in line]
    assert result.returncode == 0 and said == [], result.stdout + result.stderr


# ---- the container recipe -----------------------------------------------------------------------------

def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, its arguments) of the Containerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, arguments = line.partition(" ")
            found.append((word.upper(), arguments.strip()))
    return found


def arguments_of(instruction: str) -> list[str]:
    return [arguments for word, arguments in instructions() if word == instruction]


def healthcheck_command() -> list[str]:
    (healthcheck,) = arguments_of("HEALTHCHECK")
    _options, _, command = healthcheck.partition("CMD ")
    return json.loads(command)


def test_the_container_runs_a_user_of_its_own_with_the_data_folder_as_a_volume():
    config = load_config(CONTAINER_CONFIG)
    (base,) = arguments_of("FROM")
    assert base.startswith("python:3.11-slim")
    assert any(re.search(r"pip install .*-c constraints\.txt '?\.", run) for run in arguments_of("RUN"))
    (user,) = arguments_of("USER")
    assert user.split(":")[0] not in ("root", "0")
    volumes = [volume for arguments in arguments_of("VOLUME") for volume in json.loads(arguments)]
    assert str(config.data_dir) in volumes
    assert arguments_of("EXPOSE") == [str(config.server.port)]
    assert "APPLIANCE_CONFIG=/etc/appliance/appliance.toml" in arguments_of("ENV")
    assert any(copy.split() == ["deploy/container.toml", "/etc/appliance/appliance.toml"]
               for copy in arguments_of("COPY"))
    assert config.server.host == "0.0.0.0"  # reachable through the published port
    assert healthcheck_command()[0] == "python"


def run_healthcheck(config: Path) -> subprocess.CompletedProcess:
    """The HEALTHCHECK command as the container runs it, with this Python and `config` as
    $APPLIANCE_CONFIG (the image sets it); at most its --timeout."""
    command = [sys.executable, *healthcheck_command()[1:]]
    return subprocess.run(command, env={**os.environ, "APPLIANCE_CONFIG": str(config)}, capture_output=True,
                          text=True, timeout=5, check=False)


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_the_healthcheck_passes_while_the_server_answers_and_fails_once_it_stopped(tmp_path, backend_toml, tls):
    port = free_port()
    server_lines = f"port = {port}\n"
    verify = True
    if tls:
        cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
        write_certificate(cert, key, "appliance.example.com")  # not 127.0.0.1: the healthcheck need not trust it
        server_lines += f'tls_cert_file = "{cert}"\ntls_key_file = "{key}"\n'
        verify = False
    config = write_config(tmp_path, backend=backend_toml, extra=f"\n[server]\n{server_lines}")
    Cli(config)("init")
    with serving(config, tmp_path / "serve.log", port, scheme="https" if tls else "http", verify=verify):
        up = run_healthcheck(config)
        assert up.returncode == 0, up.stderr
    down = run_healthcheck(config)
    assert down.returncode != 0 and "Connection refused" in down.stderr
