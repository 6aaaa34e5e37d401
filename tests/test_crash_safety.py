"""Crash safety: a real `appliance serve` process under concurrent
submit load is killed with SIGKILL at a random moment, then restarted on the same data folder; or
its delivery process (`[delivery] process = "own"`, appliance/processes.py) is, and the server
starts a new one by itself.

Each cycle: submit load (CONCURRENCY requests in flight) against the running server; SIGKILL, at
a random moment of the load window, of the server or of its delivery process: the first two
cycles kill one of each (in an order the seed picks), later ones either, so every run kills both.
The server killed: the load stops (the requests in flight fail); its delivery process must end by
itself (it holds the folder's lock); `PRAGMA integrity_check` on the files the dead processes
left; restart. The delivery process killed: the load goes on, every submit must still
be acknowledged, until the server has started a new delivery process (doctor lists it) and a
little after; nothing is restarted by the test. Then wait (bounded) until the job queue is empty
and the buyer has every qualified lead;
then check, for every submit that got a 201 in any cycle so far, through the API:
- the lead exists with that submission;
- a lead acknowledged `qualified` is `delivered` and the buyer received its submission at least
  once (by `Idempotency-Key: <submissionId>`); a `disqualified` one was never sent;
- duplicates (a key the buyer saw more than once) are allowed (at-least-once) and printed.
The server that runs then is the one the next cycle loads. At the end the server is
stopped and the database checked again.

The buyer is bench/buyer.py (raw asyncio, keep-alive, records every Idempotency-Key) in its own
process. The kill moments and victims come from an RNG seeded with SEED, so every run kills at the
same moments; CRASH_SEED=<seed> tries others. The seed is printed (`-s` shows it). Every wait is
bounded and the whole test stays within about 60 s: a cycle after the first two is started only
while the time budget allows.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import apsw
import httpx
import pytest

from tests.conftest import Cli
from tests.processes import alive, free_port, processes_detail, running_delivery_pid, stop_process

# SQLite's crash test: PostgreSQL's, with one and two servers, is in test_postgresql_processes.py.
pytestmark = pytest.mark.sqlite_only

ROOT = Path(__file__).resolve().parent.parent
CONCURRENCY = 24
CYCLES = 3
SEED = 20261121                # CRASH_SEED overrides it
KILL_WINDOW = (0.3, 3.0)       # seconds after the first acknowledged submit
BUDGET_SECONDS = 50.0          # no new cycle starts after this much of the test has passed
CYCLE_RESERVE_SECONDS = 15.0   # what one more cycle may need
START_TIMEOUT = 20.0
DRAIN_TIMEOUT = 25.0
AFTER_RESTART = 0.5            # seconds of load after a new delivery process is listed
CAMPAIGN = "CRSH1"


@dataclass(frozen=True)
class Acked:
    lead_id: str
    submission_id: str
    status: str
    cycle: int


# ---- processes ---------------------------------------------------------------------------------

def _wait_for_port(port: int, proc: subprocess.Popen, log: Path | None = None, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log is not None and log.exists() else ""
            raise AssertionError(f"process exited with {proc.returncode} before listening on {port}\n{tail}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listening on port {port} after {timeout} s")


class Server:
    """`python -m appliance --config CFG serve` as a subprocess; a fresh port per start."""

    def __init__(self, config: Path, log: Path, procs: list[subprocess.Popen]) -> None:
        self.port = free_port()
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "appliance", "--config", str(config), "serve", "--port", str(self.port)],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        procs.append(self.proc)
        _wait_for_port(self.port, self.proc, log)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _buyer_keys(port: int) -> dict[str, list[float]]:
    response = httpx.get(f"http://127.0.0.1:{port}/_buyer/keys", timeout=10)
    response.raise_for_status()
    return response.json()["keys"]


def _db_check(db_file: Path) -> dict[str, int]:
    """integrity_check and foreign_key_check on a read-only connection; job counts by state."""
    conn = apsw.Connection(str(db_file), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        conn.setbusytimeout(5000)
        integrity = [row[0] for row in conn.execute("PRAGMA integrity_check")]
        assert integrity == ["ok"], integrity
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        return dict(conn.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall())
    finally:
        conn.close()


def _open_jobs(db_file: Path) -> int:
    conn = apsw.Connection(str(db_file), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        conn.setbusytimeout(5000)
        return conn.execute("SELECT count(*) FROM jobs WHERE state IN ('ready', 'running')").fetchone()[0]
    finally:
        conn.close()


# ---- the load ----------------------------------------------------------------------------------

_serial = itertools.count(1)


def _body(n: int) -> dict:
    # Every 4th lead is in NY, which the campaign disqualifies: those must never reach the buyer.
    return {"campaignId": CAMPAIGN, "firstName": "grace", "lastName": "hopper", "email": f"crash.{n}@example.com",
            "phone": f"+1415{2_000_000 + n:07d}", "address": {"state": "NY" if n % 4 == 0 else "CA"},
            "customFields": {"n": n}}


async def _load_and_kill(base_url: str, key: str, pids: list[int], kill_after: float, cycle: int,
                         config: Path | None = None, *, body: Callable[[int], dict] = _body,
                         tasks: int = CONCURRENCY, pause: float = 0.0) -> tuple[list[Acked], Counter, int]:
    """Submit `body(n)` with `tasks` tasks (`pause` s between one task's submits); `kill_after` s
    after the first 201, SIGKILL each of `pids` at once. The server among them (no `config`): the
    requests in flight fail and the load ends. The delivery process (`config` given, its pid
    first): the load goes on until doctor lists the new delivery process the server started, and
    AFTER_RESTART s more. Returns (acknowledged, errors by kind, requests sent)."""
    acked: list[Acked] = []
    errors: Counter = Counter()
    server_killed = config is None
    killed = asyncio.Event()
    stopped = asyncio.Event()
    first_ack = asyncio.Event()
    sent = 0
    limits = httpx.Limits(max_connections=tasks, max_keepalive_connections=tasks)
    timeout = httpx.Timeout(10.0, connect=5.0)

    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout,
                                 headers={"X-API-Key": key}) as client:
        async def worker() -> None:
            nonlocal sent
            while not stopped.is_set():
                sent += 1
                try:
                    response = await client.post("/api/v1/leads/submit", json=body(next(_serial)))
                except httpx.HTTPError as exc:
                    if server_killed and killed.is_set():
                        errors[type(exc).__name__] += 1  # in flight at the kill: not acknowledged
                        return
                    errors[f"server up: {type(exc).__name__}"] += 1
                    continue
                if response.status_code == 201:
                    data = response.json()["data"]
                    acked.append(Acked(data["leadId"], data["submissionId"], data["status"], cycle))
                    first_ack.set()
                else:
                    errors[f"server up: HTTP {response.status_code}"] += 1
                if pause:
                    await asyncio.sleep(pause)

        async def killer() -> None:
            await asyncio.wait_for(first_ack.wait(), timeout=15)  # the window opens with the first 201
            await asyncio.sleep(kill_after)
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            killed.set()
            if config is not None:  # submits go on while the server starts a new delivery process
                await asyncio.to_thread(running_delivery_pid, config, other_than=pids[0])
                await asyncio.sleep(AFTER_RESTART)
            stopped.set()

        await asyncio.wait_for(asyncio.gather(killer(), *(worker() for _ in range(tasks))),
                               timeout=kill_after + 45)
    return acked, errors, sent


def kill_under_load(server: Server, config: Path, key: str, victim: str, kill_after: float, cycle: int, *,
                    body: Callable[[int], dict], tasks: int, pause: float) -> tuple[list[Acked], Counter]:
    """One cycle's SIGKILL under submit load: of the server, of its delivery process, or of both
    at once (`victim`: "server", "delivery", "both"). The server killed: waits until its delivery
    process has ended too (it holds the folder's lock) before the caller restarts it. Returns
    (acknowledged, errors by kind)."""
    delivery = running_delivery_pid(config)
    if victim in ("server", "both"):
        pids = [server.proc.pid, delivery] if victim == "both" else [server.proc.pid]
        acked, errors, _ = asyncio.run(_load_and_kill(server.url, key, pids, kill_after, cycle, body=body,
                                                      tasks=tasks, pause=pause))
        server.proc.wait(10)
        assert server.proc.returncode == -signal.SIGKILL
        deadline = time.monotonic() + 15
        while alive(delivery):
            assert time.monotonic() < deadline, f"cycle {cycle}: the delivery process outlived its server"
            time.sleep(0.05)
    else:
        acked, errors, _ = asyncio.run(_load_and_kill(server.url, key, [delivery], kill_after, cycle, config,
                                                      body=body, tasks=tasks, pause=pause))
        assert server.proc.poll() is None, f"cycle {cycle}: the server ended with its delivery process"
        assert not alive(delivery)
    assert not [e for e in errors if e.startswith("server up")], errors
    return acked, errors


async def _fetch_leads(base_url: str, key: str, lead_ids: list[str]) -> dict[str, tuple[int, dict | None]]:
    found: dict[str, tuple[int, dict | None]] = {}
    queue = list(lead_ids)
    limits = httpx.Limits(max_connections=16, max_keepalive_connections=16)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=httpx.Timeout(10.0),
                                 headers={"X-API-Key": key}) as client:
        async def worker() -> None:
            while queue:
                lead_id = queue.pop()
                response = await client.get(f"/api/v1/leads/{lead_id}")
                found[lead_id] = (response.status_code,
                                  response.json()["data"] if response.status_code == 200 else None)

        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(16))), timeout=60)
    return found


# ---- the test ----------------------------------------------------------------------------------

def _wait_drained(db_file: Path, buyer_port: int, wanted: set[str], deadline: float) -> tuple[int, set[str]]:
    """Until no job is ready or running and the buyer has every wanted key (or the deadline)."""
    while True:
        open_jobs = _open_jobs(db_file)
        missing = wanted - _buyer_keys(buyer_port).keys() if open_jobs == 0 else wanted
        if open_jobs == 0 and not missing:
            return open_jobs, missing
        if time.monotonic() > deadline:
            return open_jobs, wanted - _buyer_keys(buyer_port).keys()
        time.sleep(0.1)


def test_sigkill_under_submit_load_loses_nothing_and_delivers_every_qualified_lead(tmp_path: Path) -> None:
    started = time.monotonic()
    seed = int(os.environ.get("CRASH_SEED") or SEED)
    rng = random.Random(seed)
    print(f"\ncrash safety: seed {seed} (replay with CRASH_SEED={seed})")
    # One kill of each kind first, whatever the seed and the time budget; then either.
    victims = rng.sample(("server", "delivery"), 2) + [rng.choice(("server", "delivery")) for _ in range(CYCLES - 2)]
    killed: list[str] = []

    data = tmp_path / "data"
    db_file = data / "appliance.db"
    config = tmp_path / "appliance.toml"
    procs: list[subprocess.Popen] = []
    buyer_port = free_port()
    buyer_log = tmp_path / "buyer.log"
    try:
        with buyer_log.open("wb") as out:
            buyer = subprocess.Popen([sys.executable, "-m", "bench.buyer", "--port", str(buyer_port)],
                                     cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        procs.append(buyer)
        _wait_for_port(buyer_port, buyer, buyer_log)

        config.write_text(
            f'[server]\nlog_level = "warning"\n\n[storage]\npath = "{data}"\nsynchronous = "FULL"\n\n'
            f'[security]\nrate_limit_per_minute = 0\n\n'
            # "own" whatever the machine's cores ("auto" is "shared" on one): the kill may pick it.
            f'[delivery]\nallow_private_addresses = true\nconcurrency = 32\nprocess = "own"\n\n'
            f'[plugins]\ndirs = []\n')
        cli = Cli(config)
        cli("init")
        tenant_id = cli.json("tenant", "create", "Crash Test Agency")["tenantId"]
        key = cli.json("key", "create", "--tenant", tenant_id, "--name", "crash")["key"]
        bundle = tmp_path / "bundle.json"
        bundle.write_text(json.dumps({
            "deliveryEndpoints": [{
                "deliveryEndpointId": "local-buyer", "url": f"http://127.0.0.1:{buyer_port}/leads",
                "fieldMapping": [
                    {"clientKey": "first_name", "leadField": "firstName", "required": True},
                    {"clientKey": "last_name", "leadField": "lastName", "required": True},
                    {"clientKey": "email", "leadField": "email", "required": True},
                    {"clientKey": "phone", "leadField": "phoneE164", "required": True},
                    {"clientKey": "state", "leadField": "address.state"},
                    {"clientKey": "vendor", "value": "crash-test"},
                ],
                "responseRules": {"success": {"statusCodes": [200, 201]}, "clientLeadIdPath": "id"},
                "timeoutSeconds": 5,
                # A buyer answer lost to the kill is retried by the restart, not by backoff; keep
                # any other retry short so the bounded wait covers it.
                "retry": {"maxAttempts": 5, "backoffSeconds": [0.2, 0.5, 1]},
            }],
            "campaigns": [{
                "campaignId": CAMPAIGN, "name": "Crash safety",
                "client": {"clientId": "cli-crash", "clientName": "Crash Buyer"},
                "offer": {"offerId": "off-crash", "offerName": "Crash"},
                "qualification": {"rules": [{
                    "name": "Not in NY", "logicalOperator": "AND",
                    "subRules": [{"logicalOperator": "AND", "conditions": [
                        {"field": "address.state", "operator": "equals", "value": ["NY"],
                         "maxSeverity": "disqualify"}]}]}]},
                "delivery": {"deliveryEndpointId": "local-buyer"},
            }],
        }))
        cli("import", "--tenant", tenant_id, str(bundle))

        server_log = tmp_path / "server.log"
        server = Server(config, server_log, procs)
        all_acked: list[Acked] = []
        cycle = 0
        while cycle < CYCLES:
            if cycle >= 2 and time.monotonic() - started > BUDGET_SECONDS - CYCLE_RESERVE_SECONDS:
                print(f"  time budget: stopping after {cycle} cycles")
                break
            victim = victims[cycle]
            cycle += 1
            kill_after = round(rng.uniform(*KILL_WINDOW), 3)
            delivery = running_delivery_pid(config)
            if victim == "server":
                acked, errors, sent = asyncio.run(_load_and_kill(server.url, key, [server.proc.pid], kill_after, cycle))
                server.proc.wait(10)
                assert server.proc.returncode == -signal.SIGKILL
                # It holds the folder's lock: no restart before it has ended by itself.
                deadline = time.monotonic() + 15
                while alive(delivery):
                    assert time.monotonic() < deadline, f"cycle {cycle}: the delivery process outlived its server"
                    time.sleep(0.05)
            else:
                acked, errors, sent = asyncio.run(_load_and_kill(server.url, key, [delivery], kill_after, cycle, config))
                assert server.proc.poll() is None, f"cycle {cycle}: the server ended with its delivery process"
                assert not alive(delivery)
            killed.append(victim)
            assert not [e for e in errors if e.startswith("server up")], errors
            assert acked, f"cycle {cycle}: no submit was acknowledged before the kill at {kill_after} s"
            all_acked += acked
            delivered_at_kill = len(_buyer_keys(buyer_port))
            jobs_after_kill = _db_check(db_file)  # the files exactly as the killed process left them

            if victim == "server":
                server = Server(config, server_log, procs)
            qualified = {a.submission_id for a in all_acked if a.status == "qualified"}
            open_jobs, missing = _wait_drained(db_file, buyer_port, qualified, time.monotonic() + DRAIN_TIMEOUT)
            assert not missing, f"cycle {cycle}: {len(missing)} acknowledged qualified leads never reached the buyer"
            assert open_jobs == 0, f"cycle {cycle}: {open_jobs} jobs still ready/running after {DRAIN_TIMEOUT} s"

            found = asyncio.run(_fetch_leads(server.url, key, [a.lead_id for a in all_acked]))
            keys = _buyer_keys(buyer_port)
            problems = []
            for a in all_acked:
                status_code, lead = found[a.lead_id]
                if status_code != 200 or lead is None:
                    problems.append(f"{a.lead_id}: GET answered {status_code}")
                    continue
                subs = {s["submissionId"]: s for s in lead["submissions"]}
                if a.submission_id not in subs:
                    problems.append(f"{a.lead_id}: submission {a.submission_id} missing")
                    continue
                want = "delivered" if a.status == "qualified" else a.status
                if lead["status"] != want or subs[a.submission_id]["status"] != want:
                    problems.append(f"{a.lead_id}: acknowledged {a.status}, now lead {lead['status']} / "
                                    f"submission {subs[a.submission_id]['status']} (want {want})")
                if a.status != "qualified" and a.submission_id in keys:
                    problems.append(f"{a.lead_id}: {a.status} lead was delivered")
            assert not problems, f"cycle {cycle}: {len(problems)} problems, first: {problems[:5]}"

            statuses = Counter(a.status for a in acked)
            duplicates = {k: len(v) for k, v in keys.items() if len(v) > 1}
            acked_keys = {a.submission_id for a in all_acked}
            print(f"  cycle {cycle}: SIGKILL of the {victim} process at {kill_after} s; sent {sent}, acknowledged {len(acked)} "
                  f"{dict(statuses)}; lost in flight {dict(errors)}; buyer had {delivered_at_kill} keys at the kill, "
                  f"jobs at the kill {jobs_after_kill}; afterwards all delivered "
                  f"(buyer: {len(keys)} keys, {len(keys.keys() - acked_keys)} from unacknowledged submits), "
                  f"duplicates so far {len(duplicates)} ({sum(duplicates.values()) - len(duplicates)} extra sends)")

        assert {"server", "delivery"} <= set(killed), f"killed only: {killed}"
        assert all(a.status in ("qualified", "disqualified") for a in all_acked), Counter(a.status for a in all_acked)
        delivery = running_delivery_pid(config)
        listed = processes_detail(config)
        stop_process(server.proc, timeout=10.0)  # graceful: uvicorn re-raises SIGTERM after its shutdown, hence -15
        assert server.proc.returncode in (0, -signal.SIGTERM), server_log.read_text(errors="replace")[-2000:]
        assert not alive(delivery)  # stopped with its server
        final = _db_check(db_file)
        assert set(final) <= {"done"}, final
        print(f"  {cycle} cycles, {len(all_acked)} acknowledged leads, final jobs {final}, "
              f"processes at the end: {listed}, {time.monotonic() - started:.1f} s")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
