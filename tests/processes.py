"""Helpers for tests that run the service (or a buyer) as a real process on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


def appliance_command() -> list[str]:
    """How tests that run the appliance as a user does start it: `APPLIANCE_TEST_COMMAND` names
    an installed one (a regular `pip install .`'s script, the one-file binary: .ci/smoke-install
    and .ci/smoke-binary set it), else this checkout through the test's own Python."""
    given = os.environ.get("APPLIANCE_TEST_COMMAND")
    return shlex.split(given) if given else [sys.executable, "-m", "appliance"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
    """Send `sig` and wait; SIGKILL what is still running after `timeout` seconds."""
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def wait_healthy(base_url: str, proc: subprocess.Popen, log: Path, timeout: float = 20.0,
                 verify: ssl.SSLContext | bool = True) -> None:
    """Until GET /healthz answers 200; fails with the server's log if it exits or takes too long.
    `verify`: for an https `base_url`, a context trusting the server's certificate."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(f"{base_url}/healthz", timeout=1, verify=verify).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


@contextlib.contextmanager
def serving(config: Path, log: Path, port: int, *, host: str = "127.0.0.1", scheme: str = "http",
            verify: ssl.SSLContext | bool = True) -> Iterator[subprocess.Popen]:
    """`appliance serve` on `host`:`port`, its output in `log`, once GET /healthz answers 200 at
    `scheme`://127.0.0.1:`port`; stopped on exit."""
    with log.open("ab") as out:
        proc = subprocess.Popen([*appliance_command(), "--config", str(config), "serve", "--host", host,
                                 "--port", str(port)], cwd=Path(__file__).resolve().parent.parent,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"{scheme}://127.0.0.1:{port}", proc, log, verify=verify)
        yield proc
    finally:
        stop_process(proc)


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie has ended: its parent may not have reaped it yet)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return re.search(r"^State:\s+Z", status, re.MULTILINE) is None


def doctor(config: Path) -> dict:
    """`appliance doctor --json` in this process, whatever its verdict (a process not running fails it)."""
    from click.testing import CliRunner

    from appliance.cli import main as cli_main

    result = CliRunner().invoke(cli_main, ["--config", str(config), "doctor", "--json"], catch_exceptions=False)
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def processes_detail(config: Path) -> str:
    """What doctor's "processes" check says."""
    return {c["check"]: c for c in doctor(config)["checks"]}["processes"]["detail"]


def appliance_processes(config: Path) -> list[tuple[str, int, bool]]:
    """(role, pid, running) of each process of the appliance doctor lists."""
    return [(role, int(pid), state == "running")
            for role, pid, state in re.findall(r"(\w+) pid (\d+) (running|NOT RUNNING)", processes_detail(config))]


def running_delivery_pid(config: Path, timeout: float = 15.0, *, other_than: int | None = None) -> int:
    """The delivery process doctor lists as running (a new one, when `other_than` is the old pid)."""
    deadline = time.monotonic() + timeout
    while True:
        running = [pid for role, pid, up in appliance_processes(config)
                   if role == "delivery" and up and pid != other_than]
        if running:
            return running[0]
        assert time.monotonic() < deadline, f"no running delivery process listed by doctor within {timeout} s"
        time.sleep(0.1)
