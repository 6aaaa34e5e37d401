"""The appliance's processes, through real `appliance serve` processes, the CLI and HTTP: with
`[delivery] process = "own"` serve runs a delivery process beside the server (appliance/processes.py);
doctor and the logs show both; a delivery process that is killed is started again and loses no
acknowledged lead; one that keeps ending stops the appliance cleanly (exit 1, one line); a killed
server takes its delivery process with it and frees the data folder; SIGTERM stops both; with
`process = "shared"` there is only the server. A full disk (a small tmpfs) answers 503s, never a
500 or a hang; both processes say so and live on, and once there is room every acknowledged lead
is delivered and recorded. Delivery goes to bench/buyer.py, which records every Idempotency-Key
(the submission id)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import Cli
from tests.processes import (alive, appliance_processes, free_port, processes_detail, running_delivery_pid,
                             stop_process, wait_healthy)

# The delivery process shares the SQLite file (and inherits its folder's lock); PostgreSQL's
# processes are tested in test_postgresql_processes.py.
pytestmark = pytest.mark.sqlite_only

ROOT = Path(__file__).resolve().parent.parent
CAMPAIGN = "PROC1"
# Loaded by the server and by each delivery process: only the latter ends, at once, every start.
ENDING_PLUGIN = "import os, sys\nif '_deliver' in sys.argv:\n    os._exit(3)\n"


# ---- processes as the operating system sees them ---------------------------------------------------

def parent_of(pid: int) -> int:
    return int(re.search(r"^PPid:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE).group(1))


def wait_until(condition, timeout: float, what: str, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log is not None else ""
            raise AssertionError(f"{what}: not within {timeout} s\n{tail}")
        time.sleep(0.1)


# ---- an install, a buyer, a server ------------------------------------------------------------------

@dataclass
class Install:
    config: Path
    key: str
    data: Path

    def processes(self) -> list[tuple[str, int, bool]]:
        return appliance_processes(self.config)


@contextlib.contextmanager
def running_buyer(log: Path, delay_ms: int = 0) -> Iterator[int]:
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "bench.buyer", "--port", str(port), "--delay-ms", str(delay_ms)],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _answers(f"http://127.0.0.1:{port}/_buyer/stats"), 15, "the buyer listens")
        yield port
    finally:
        stop_process(proc, timeout=5)


@pytest.fixture
def buyer(tmp_path: Path) -> Iterator[int]:
    with running_buyer(tmp_path / "buyer.log") as port:
        yield port


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def buyer_keys(port: int) -> set[str]:
    response = httpx.get(f"http://127.0.0.1:{port}/_buyer/keys", timeout=10)
    response.raise_for_status()
    return set(response.json()["keys"])


def install(tmp_path: Path, buyer_port: int, *, process: str = "own", data: Path | None = None,
            log_level: str = "info") -> Install:
    data = data or tmp_path / "data"
    config = tmp_path / "appliance.toml"
    config.write_text(
        f'[storage]\npath = "{data}"\n\n[logging]\nformat = "json"\nlevel = "{log_level}"\n\n'
        f'[security]\nrate_limit_per_minute = 0\n\n'
        f'[delivery]\nallow_private_addresses = true\nprocess = "{process}"\n\n'
        f'[plugins]\ndirs = ["{tmp_path / "plugins"}"]\n')
    (tmp_path / "plugins").mkdir(exist_ok=True)
    cli = Cli(config)
    cli("init")
    tenant_id = cli.json("tenant", "create", "Process Agency")["tenantId"]
    key = cli.json("key", "create", "--tenant", tenant_id, "--name", "processes")["key"]
    bundle = tmp_path / "bundle.json"
    bundle.write_text(json.dumps({
        "deliveryEndpoints": [{
            "deliveryEndpointId": "buyer", "url": f"http://127.0.0.1:{buyer_port}/leads",
            "fieldMapping": [{"clientKey": "email", "leadField": "email", "required": True}],
            "responseRules": {"success": {"statusCodes": [200]}},
            "timeoutSeconds": 5, "retry": {"maxAttempts": 5, "backoffSeconds": [0.2, 0.5, 1]},
        }],
        "campaigns": [{"campaignId": CAMPAIGN, "name": "Processes",
                       "client": {"clientId": "cli-proc", "clientName": "Buyer"},
                       "offer": {"offerId": "off-proc", "offerName": "Offer"},
                       "delivery": {"deliveryEndpointId": "buyer"}}],
    }))
    cli("import", "--tenant", tenant_id, str(bundle))
    return Install(config, key, data)


class Serve:
    """`python -m appliance --config CFG serve --port P`, its output (both processes') in a file."""

    def __init__(self, inst: Install, log: Path) -> None:
        self.port = free_port()
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "appliance", "--config", str(inst.config), "serve", "--port", str(self.port)],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_healthy(self.url, self.proc, log)
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_process(self.proc, timeout=20)

    def lines(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]


@pytest.fixture
def serves() -> Iterator[list[Serve]]:
    """Every server a test starts is stopped after it, whatever happened."""
    started: list[Serve] = []
    yield started
    for serve in started:
        serve.stop()


def submit(base_url: str, key: str, n: int) -> httpx.Response:
    return httpx.post(f"{base_url}/api/v1/leads/submit", headers={"X-API-Key": key}, timeout=10,
                      json={"campaignId": CAMPAIGN, "firstName": "Ada", "lastName": "Lovelace",
                            "email": f"proc.{n}@example.com", "phone": f"+1415{3_000_000 + n:07d}"})


def ok(response: httpx.Response) -> httpx.Response:
    assert response.status_code == 201, response.text
    return response


def acknowledged(response: httpx.Response) -> str:
    return ok(response).json()["data"]["submissionId"]


# ---- the tests ---------------------------------------------------------------------------------------

def test_own_process_doctor_lists_both_and_logs_name_them_and_sigterm_stops_both(tmp_path, buyer, serves):
    inst = install(tmp_path, buyer, log_level="debug")  # a delivery's own line is at debug
    serve = Serve(inst, tmp_path / "serve.log")
    serves.append(serve)
    pid = running_delivery_pid(inst.config)
    listed = inst.processes()
    assert listed == [("server", serve.proc.pid, True), ("delivery", pid, True)], listed
    assert parent_of(pid) == serve.proc.pid  # the server's own child, as /proc sees it

    wanted = {acknowledged(submit(serve.url, inst.key, n)) for n in range(5)}
    wait_until(lambda: wanted <= buyer_keys(buyer), 15, "the leads reach the buyer", serve.log)

    def delivered_lines() -> list[dict]:
        return [line for line in serve.lines() if line["message"].startswith("delivered to")]
    # The buyer records a key on arrival; the delivery process logs a delivery once it has committed the answer.
    wait_until(lambda: len(delivered_lines()) >= 5, 15, "the delivery process logs the 5 deliveries", serve.log)
    delivered = delivered_lines()
    by_process = {(line["process"], line["pid"]) for line in serve.lines()}
    assert by_process == {("server", serve.proc.pid), ("delivery", pid)}, by_process
    assert len(delivered) == 5 and {(line["process"], line["pid"]) for line in delivered} == {("delivery", pid)}

    def delivered_metric() -> float:  # the delivery process's counts, as the server's /metrics shows them
        text = httpx.get(f"{serve.url}/metrics", timeout=10).text
        found = re.search(r'^appliance_deliveries_total\{endpoint="buyer",outcome="success"\} (\S+)$', text, re.M)
        return float(found.group(1)) if found else 0.0
    wait_until(lambda: delivered_metric() == 5, 10, "/metrics counts the 5 deliveries", serve.log)

    serve.proc.send_signal(signal.SIGTERM)
    serve.proc.wait(20)
    # uvicorn re-raises the SIGTERM it handled after its clean shutdown (as tests/test_crash_safety.py
    # accepts): either way the stop was clean, not a kill.
    assert serve.proc.returncode in (0, -signal.SIGTERM), serve.log.read_text()[-3000:]
    assert not alive(pid)
    assert inst.processes() == []  # doctor: no server running


def test_a_killed_delivery_process_is_started_again_and_every_acknowledged_lead_is_delivered(
        tmp_path, buyer, serves):
    inst = install(tmp_path, buyer)
    serve = Serve(inst, tmp_path / "serve.log")
    serves.append(serve)
    first = running_delivery_pid(inst.config)

    async def load() -> tuple[set[str], list[str]]:
        acked: set[str] = set()
        refused: list[str] = []
        counter = iter(range(1_000_000))
        stop = asyncio.Event()
        async with httpx.AsyncClient(base_url=serve.url, headers={"X-API-Key": inst.key}, timeout=10) as client:
            async def worker() -> None:
                while not stop.is_set():
                    n = next(counter)
                    response = await client.post("/api/v1/leads/submit", json={
                        "campaignId": CAMPAIGN, "firstName": "Ada", "lastName": "Lovelace",
                        "email": f"kill.{n}@example.com", "phone": f"+1415{4_000_000 + n:07d}"})
                    if response.status_code == 201:
                        acked.add(response.json()["data"]["submissionId"])
                    else:
                        refused.append(f"{response.status_code} {response.text[:200]}")

            async def killer() -> None:
                while len(acked) < 20:  # submits acknowledged before the kill
                    await asyncio.sleep(0.01)
                os.kill(first, signal.SIGKILL)
                # ... during the restart pause, and after the new process is up
                await asyncio.sleep(0.5)
                before = len(acked)
                await asyncio.to_thread(running_delivery_pid, inst.config, other_than=first)
                while len(acked) < before + 20:
                    await asyncio.sleep(0.01)
                stop.set()

            await asyncio.wait_for(asyncio.gather(killer(), *(worker() for _ in range(8))), 60)
        return acked, refused

    acked, refused = asyncio.run(load())
    assert not refused, refused[:5]  # the server answered every submit while delivery restarted
    wait_until(lambda: acked <= buyer_keys(buyer), 20, "every acknowledged lead reaches the buyer", serve.log)

    second = running_delivery_pid(inst.config, other_than=first)
    assert not alive(first) and parent_of(second) == serve.proc.pid
    assert "(started 2 times)" in processes_detail(inst.config)
    ended = [line for line in serve.lines() if line["process"] == "server"
             and "the delivery process ended (signal SIGKILL)" in line["message"]]
    assert len(ended) == 1 and ended[0]["level"] == "ERROR", ended
    assert serve.proc.poll() is None


def test_a_delivery_process_that_keeps_ending_stops_serve_with_one_line_and_frees_the_folder(
        tmp_path, buyer, serves):
    inst = install(tmp_path, buyer)
    (tmp_path / "plugins" / "ending.py").write_text(ENDING_PLUGIN)
    port = free_port()
    done = subprocess.run(
        [sys.executable, "-m", "appliance", "--config", str(inst.config), "serve", "--port", str(port)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)  # it stops by itself
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors == [lines[-1]], lines[-5:]  # one reason, the last word
    assert "the delivery process ended 5 times" in errors[0], errors
    started = [int(m) for m in re.findall(r"delivery process started \(pid (\d+)\)", done.stderr)]
    assert len(started) == 5, done.stderr[-3000:]
    assert done.stderr.count("the delivery process ended (exit code 3)") == 4
    assert not any(alive(pid) for pid in started)

    (tmp_path / "plugins" / "ending.py").unlink()
    serve = Serve(inst, tmp_path / "again.log")  # the folder is free again
    serves.append(serve)
    running_delivery_pid(inst.config)


def test_a_killed_server_takes_its_delivery_process_with_it_and_frees_the_folder(tmp_path, buyer, serves):
    inst = install(tmp_path, buyer)
    serve = Serve(inst, tmp_path / "serve.log")
    serves.append(serve)
    pid = running_delivery_pid(inst.config)
    serve.proc.kill()
    serve.proc.wait(10)
    wait_until(lambda: not alive(pid), 10, "the delivery process ends after its server", serve.log)
    assert any(line["process"] == "delivery" and "the server closed the channel" in line["message"]
               for line in serve.lines())

    again = Serve(inst, tmp_path / "again.log")
    serves.append(again)
    running_delivery_pid(inst.config)


def test_shared_runs_delivery_in_the_server_process(tmp_path, buyer, serves):
    inst = install(tmp_path, buyer, process="shared")
    serve = Serve(inst, tmp_path / "serve.log")
    serves.append(serve)
    assert inst.processes() == [("server", serve.proc.pid, True)]
    wanted = {acknowledged(submit(serve.url, inst.key, n)) for n in range(5)}
    wait_until(lambda: wanted <= buyer_keys(buyer), 15, "the leads reach the buyer", serve.log)
    assert {line["process"] for line in serve.lines()} == {"server"}


def test_a_full_disk_answers_503_at_once_and_both_processes_carry_on_once_space_is_freed(tmp_path):
    """The data folder on a tmpfs of 8 MiB, filled to the last byte, then emptied again.

    A real full disk (ENOSPC) is what SQLite reports as SQLITE_FULL, the one error the appliance
    answers as "the database's disk is full". Filling one without a mount was weighed and refused:
    RLIMIT_FSIZE (SIGXFSZ ignored) fails a write with EFBIG, which SQLite reports as a disk I/O
    error (SQLITE_IOERR, tried: apsw raises IOError on a WAL database), not SQLITE_FULL, and it
    limits each file of one process rather than a disk both processes share. Mounting needs root,
    which CI has (.ci/run runs as root, as the developers do): with CI=true a refused mount fails
    the test; elsewhere it skips."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        reason = f"cannot mount a small tmpfs for the data folder (needs root): {mounted.stderr.strip()}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    serve = None
    try:
        # The buyer answers after 1 s: deliveries are in flight when the disk fills, and their
        # outcomes must be recorded once it has room again.
        with running_buyer(tmp_path / "buyer.log", delay_ms=1000) as buyer:
            inst = install(tmp_path, buyer, data=disk / "data")
            serve = Serve(inst, tmp_path / "serve.log")
            delivery = running_delivery_pid(inst.config)
            acked: dict[str, str] = {}  # submission id: lead id

            def take(response: httpx.Response) -> None:
                data = response.json()["data"]
                acked[data["submissionId"]] = data["leadId"]

            for n in range(5):
                take(ok(submit(serve.url, inst.key, n)))
            wait_until(lambda: acked.keys() <= buyer_keys(buyer), 10, "the buyer has the leads", serve.log)
            filler = disk / "filler"
            with filler.open("wb") as out:  # every byte the tmpfs has left
                with contextlib.suppress(OSError):
                    while True:
                        out.write(b"\0" * 65536)
                        out.flush()
            answers: list[int] = []
            with httpx.Client(base_url=serve.url, headers={"X-API-Key": inst.key}, timeout=10) as client:
                for n in range(100, 3100):  # the WAL's room already taken goes first; then the disk is full
                    response = client.post("/api/v1/leads/submit", json={
                        "campaignId": CAMPAIGN, "firstName": "Ada", "lastName": "Lovelace",
                        "email": f"full.{n}@example.com", "phone": f"+1415{5_000_000 + n:07d}"})
                    answers.append(response.status_code)
                    assert response.status_code in (201, 503), response.text  # never a 500
                    if response.status_code == 201:
                        take(response)
                    elif answers[-3:] == [503] * 3:
                        break
                assert answers[-1] == 503, f"no 503 after {len(answers)} submits on a full disk"
            error = response.json()["error"]
            assert error["code"] == "SERVICE_UNAVAILABLE" and "disk is full" in error["message"], error

            full = wait_until(lambda: [line for line in serve.lines() if line["process"] == "delivery"
                                       and line["level"] == "ERROR" and "is full" in line["message"]],
                              15, "the delivery process logs the full disk", serve.log)
            print(f"\n{len(answers)} submits on the full disk: {answers.count(201)} acknowledged, "
                  f"{answers.count(503)} answered 503; the delivery process: {[line['message'] for line in full]}")
            assert serve.proc.poll() is None
            assert inst.processes() == [("server", serve.proc.pid, True), ("delivery", delivery, True)]

            filler.unlink()
            take(ok(submit(serve.url, inst.key, 4000)))  # the 503s were not for good
            wait_until(lambda: acked.keys() <= buyer_keys(buyer), 20, "every acknowledged lead reaches the buyer",
                       serve.log)

            def undelivered() -> list[str]:
                with httpx.Client(base_url=serve.url, headers={"X-API-Key": inst.key}, timeout=10) as client:
                    return [lead for lead in acked.values()
                            if client.get(f"/api/v1/leads/{lead}").json()["data"]["status"] != "delivered"]
            wait_until(lambda: not undelivered(), 20, "every acknowledged lead is recorded delivered", serve.log)
            assert inst.processes() == [("server", serve.proc.pid, True), ("delivery", delivery, True)]
    finally:
        if serve is not None:
            serve.stop()
        subprocess.run(["umount", "--lazy", str(disk)], check=True)  # gone once its last file closes


def test_a_restarted_delivery_process_keeps_the_configuration_its_server_started_with(tmp_path, buyer, serves):
    inst = install(tmp_path, buyer)
    serve = Serve(inst, tmp_path / "serve.log")
    serves.append(serve)
    pid = running_delivery_pid(inst.config)
    # An edit made while the appliance runs, pointing at another install: it takes effect at the
    # next start of the whole appliance, never in half of it (the delivery process would deliver
    # from a database the server does not write).
    other = tmp_path / "other.toml"
    other.write_text(f'[storage]\npath = "{tmp_path / "other"}"\n')
    Cli(other)("init")
    inst.config.write_text(other.read_text())
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: len(re.findall(r"delivery process started \(pid \d+\)", serve.log.read_text())) == 2, 15,
               "the server starts a new delivery process", serve.log)
    wanted = {acknowledged(submit(serve.url, inst.key, n)) for n in range(3)}
    wait_until(lambda: wanted <= buyer_keys(buyer), 20, "the leads reach the buyer", serve.log)


def test_a_delivery_process_refuses_a_server_of_another_version_or_an_unreadable_start(tmp_path):
    def deliver(start: bytes) -> subprocess.CompletedProcess:
        ours, theirs = socket.socketpair()
        with ours, theirs:
            ours.sendall(start)
            return subprocess.run([sys.executable, "-m", "appliance", "_deliver", "--channel-fd", str(theirs.fileno())],
                                  pass_fds=(theirs.fileno(),), cwd=ROOT, capture_output=True, text=True, timeout=60)

    config = {"storage": {"path": str(tmp_path / "data")}}
    other = deliver(json.dumps({"version": "0.0.0-other", "config": config}).encode() + b"\n")
    assert other.returncode == 78 and "the program was replaced while the server ran" in other.stderr, other.stderr
    garbled = deliver(b"{not json\n")
    assert garbled.returncode == 1 and "start message is not understood" in garbled.stderr, garbled.stderr


def test_a_hung_delivery_process_is_killed_and_started_again(tmp_path, buyer, serves):
    inst = install(tmp_path, buyer)
    serve = Serve(inst, tmp_path / "serve.log")
    serves.append(serve)
    pid = running_delivery_pid(inst.config)
    os.kill(pid, signal.SIGSTOP)  # alive to the operating system, silent to its server
    running_delivery_pid(inst.config, timeout=40, other_than=pid)
    assert not alive(pid)
    assert any("said nothing for" in line["message"] for line in serve.lines() if line["process"] == "server")
    wanted = {acknowledged(submit(serve.url, inst.key, n)) for n in range(3)}
    wait_until(lambda: wanted <= buyer_keys(buyer), 20, "the leads reach the buyer", serve.log)


def test_a_server_started_while_a_killed_servers_delivery_process_finishes_waits_for_it(tmp_path, serves):
    with running_buyer(tmp_path / "slow-buyer.log", delay_ms=3000) as slow:
        inst = install(tmp_path, slow)
        serve = Serve(inst, tmp_path / "serve.log")
        serves.append(serve)
        pid = running_delivery_pid(inst.config)
        key = acknowledged(submit(serve.url, inst.key, 1))
        wait_until(lambda: key in buyer_keys(slow), 15, "the delivery reaches the slow buyer", serve.log)
        serve.proc.kill()  # while the buyer holds that delivery for 3 s
        serve.proc.wait(10)
        assert alive(pid)  # finishing the delivery in flight, the data folder still taken
        again = Serve(inst, tmp_path / "again.log")  # a service manager's restart: it waits, not refuses
        serves.append(again)
        assert not alive(pid)
        assert any(line["process"] == "delivery" and "stops" in line["message"] for line in serve.lines())
