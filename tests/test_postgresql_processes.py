"""`appliance serve` processes on one PostgreSQL database, end to end: real processes, a loopback
buyer in its own process (bench/buyer.py: it records every Idempotency-Key, i.e. every
submissionId it was sent), load over HTTP. Each process has a data folder of its own holding a
copy of the master key, as two machines would.

- Two servers share a submit load; one is SIGKILLed while it holds deliveries it claimed but had
  not finished. Every acknowledged lead exists and is delivered; the dead server's claimed jobs
  are finished by the survivor once their leases end (`[storage] job_lease_seconds`, short
  here); a disqualified lead is never sent; the campaign's delivery-limit count equals the leads
  delivered (the dead server's slots were given back, none counted twice).
- One server SIGKILLed under load and started again (the SQLite crash test's counterpart): the
  same checks, the new process taking the dead one's jobs.
- One burst split over two servers: a source cap, dedupe, a delivery limit and the round robin
  come out exactly as with one process.

A repeated delivery (sent by the dead process, its answer lost) is allowed: at least once."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.conftest import Cli
from tests.processes import free_port, stop_process, wait_healthy

pytestmark = pytest.mark.postgresql_own

ROOT = Path(__file__).resolve().parent.parent
LEASE_SECONDS = 3  # a dead process's jobs are taken over within 3.75 s
WORKERS_PER_SERVER = 8
CAMPAIGN = "PGK1"
SLOT_LIMIT = 100_000  # a campaign delivery limit never reached: its count is what the test checks


@dataclass(frozen=True)
class Acked:
    lead_id: str
    submission_id: str
    status: str
    server: int


class Server:
    """`python -m appliance --config CFG serve` on a fresh port, until it answers /healthz."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config, self.log = config, log
        self.port = free_port()
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "appliance", "--config", str(config), "serve", "--port", str(self.port)],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        wait_healthy(self.url, self.proc, log)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def owns(self, claimed_by: str | None) -> bool:
        """Whether a job's claim (`host:pid:random`, storage/postgres/leases.py) is this process's."""
        return claimed_by is not None and claimed_by.rsplit(":", 2)[-2] == str(self.proc.pid)


class Install:
    """An install on `url` made with the CLI, and the config of each of its servers."""

    def __init__(self, tmp_path: Path, url: str, bundle: dict, servers: int) -> None:
        self.tmp_path, self.url = tmp_path, url
        self.configs = [self._config(n) for n in range(servers)]
        cli = Cli(self.configs[0])
        cli("init")
        for n in range(1, servers):  # the other machines: their own folder, a copy of the key
            (tmp_path / f"data{n}").mkdir(mode=0o700)
            shutil.copy2(tmp_path / "data0" / "master.key", tmp_path / f"data{n}" / "master.key")
        self.tenant_id = cli.json("tenant", "create", "Many Processes")["tenantId"]
        self.key = cli.json("key", "create", "--tenant", self.tenant_id, "--name", "load")["key"]
        (tmp_path / "bundle.json").write_text(json.dumps(bundle))
        cli("import", "--tenant", self.tenant_id, str(tmp_path / "bundle.json"))
        self.cli = cli

    def _config(self, n: int) -> Path:
        path = self.tmp_path / f"server{n}.toml"
        path.write_text(
            f'[server]\nlog_level = "warning"\n\n'
            f'[storage]\npath = "{self.tmp_path / f"data{n}"}"\nbackend = "postgresql"\nurl = "{self.url}"\n'
            f'job_lease_seconds = {LEASE_SECONDS}\n\n'
            f'[security]\nrate_limit_per_minute = 0\n\n'
            # One process a server: the claims a SIGKILLed server held are the ones it made itself
            # (a server's own delivery process is killed in test_processes.py and the crash test).
            f'[delivery]\nallow_private_addresses = true\nconcurrency = 32\nprocess = "shared"\n\n'
            f'[plugins]\ndirs = []\n')
        return path

    def start(self, n: int) -> Server:
        return Server(self.configs[n], self.tmp_path / f"server{n}.log")

    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()


class Buyer:
    """bench/buyer.py in its own process, answering each delivery after `delay_ms`."""

    def __init__(self, tmp_path: Path, delay_ms: int) -> None:
        self.port = free_port()
        log = tmp_path / "buyer.log"
        with log.open("wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "bench.buyer", "--port", str(self.port),
                                          "--delay-ms", str(delay_ms)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            assert self.proc.poll() is None, log.read_text()
            try:
                httpx.get(f"{self.url}/_buyer/stats", timeout=1).raise_for_status()
                return
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the buyer did not start"
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def keys(self) -> dict[str, list[float]]:
        response = httpx.get(f"{self.url}/_buyer/keys", timeout=10)
        response.raise_for_status()
        return response.json()["keys"]


@pytest.fixture
def procs() -> Iterator[list]:
    """Every process a test starts (Server or Buyer), killed at the end whatever happened."""
    started: list = []
    yield started
    for each in started:
        if each.proc.poll() is None:
            each.proc.kill()
        try:
            each.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


def endpoint(endpoint_id: str, buyer: Buyer) -> dict:
    return {"deliveryEndpointId": endpoint_id, "url": f"{buyer.url}/{endpoint_id}",
            "fieldMapping": [{"clientKey": "email", "leadField": "email", "required": True},
                             {"clientKey": "state", "leadField": "address.state"}],
            "responseRules": {"success": {"statusCodes": [200]}, "clientLeadIdPath": "id"},
            "timeoutSeconds": 5, "retry": {"maxAttempts": 5, "backoffSeconds": [0.2, 0.5, 1]}}


def campaign(campaign_id: str, **extra) -> dict:
    return {"campaignId": campaign_id, "name": f"Campaign {campaign_id}",
            "client": {"clientId": f"cli-{campaign_id}", "clientName": "Buyer Co"},
            "offer": {"offerId": f"off-{campaign_id}", "offerName": "Offer"}, **extra}


_serial = itertools.count(1)


def lead(campaign_id: str, n: int | None = None, **fields) -> dict:
    n = next(_serial) if n is None else n
    return {"campaignId": campaign_id, "firstName": "Grace", "lastName": "Hopper", "email": f"pg.{n}@example.com",
            "phone": f"+1415{3_000_000 + n % 1_000_000:07d}", **fields}


# ---- SIGKILL under load -------------------------------------------------------------------------

def kill_bundle(buyer: Buyer) -> dict:
    return {"deliveryEndpoints": [endpoint("buyer", buyer)],
            "campaigns": [campaign(CAMPAIGN, qualification={"rules": [{
                "name": "Not in NY", "logicalOperator": "AND",
                "subRules": [{"logicalOperator": "AND", "conditions": [
                    {"field": "address.state", "operator": "equals", "value": ["NY"], "maxSeverity": "disqualify"}]}]}]},
                delivery={"deliveryEndpointId": "buyer",
                          "deliveryLimits": [{"cap": SLOT_LIMIT, "type": "daily"}]})]}


async def load_and_kill(install: Install, servers: list[Server], victim: Server,
                        after_kill: float) -> tuple[list[Acked], list[int], Counter]:
    """WORKERS_PER_SERVER submitters per server. Once 40 submits are acknowledged and the victim
    holds at least 3 running jobs, it is SIGKILLed; the jobs it held then are returned, and the
    load goes on `after_kill` s against the other servers. A request the victim had in flight
    fails: not acknowledged."""
    acked: list[Acked] = []
    errors: Counter = Counter()
    killed, done = asyncio.Event(), asyncio.Event()
    held: list[int] = []

    async def submitter(client: httpx.AsyncClient, index: int) -> None:
        while not done.is_set():
            n = next(_serial)
            body = lead(CAMPAIGN, n, address={"state": "NY" if n % 4 == 0 else "CA"})
            try:
                response = await client.post("/api/v1/leads/submit", json=body)
            except httpx.HTTPError as exc:
                if servers[index] is victim and killed.is_set():
                    return  # in flight at the kill
                errors[f"{type(exc).__name__} from server {index}"] += 1
                continue
            if response.status_code == 201:
                data = response.json()["data"]
                acked.append(Acked(data["leadId"], data["submissionId"], data["status"], index))
            else:
                errors[f"HTTP {response.status_code} from server {index}"] += 1

    def victims_running_jobs() -> list[int]:
        rows = install.rows("SELECT job_id, claimed_by FROM jobs WHERE state = 'running'")
        return [job_id for job_id, claimed_by in rows if victim.owns(claimed_by)]

    async def killer() -> None:
        deadline = time.monotonic() + 30
        while len(acked) < 40 or len(await asyncio.to_thread(victims_running_jobs)) < 3:
            assert time.monotonic() < deadline, f"the victim never held 3 running jobs ({len(acked)} acknowledged)"
            await asyncio.sleep(0.02)
        os.kill(victim.proc.pid, signal.SIGKILL)
        killed.set()
        held.extend(await asyncio.to_thread(victims_running_jobs))  # nothing of it moves until its leases end
        await asyncio.sleep(after_kill)
        done.set()

    timeout = httpx.Timeout(10.0, connect=5.0)
    clients = [httpx.AsyncClient(base_url=s.url, timeout=timeout, headers={"X-API-Key": install.key}) for s in servers]
    try:
        await asyncio.wait_for(asyncio.gather(killer(), *(
            submitter(client, index) for index, client in enumerate(clients) for _ in range(WORKERS_PER_SERVER))),
            timeout=90)
    finally:
        for client in clients:
            await client.aclose()
    return acked, held, errors


def wait_drained(install: Install, buyer: Buyer, wanted: set[str], timeout: float = 40.0) -> set[str]:
    """Until no job waits or runs and the buyer has every wanted submission; what it lacks."""
    deadline = time.monotonic() + timeout
    while True:
        open_jobs = install.rows("SELECT count(*) FROM jobs WHERE state IN ('ready', 'running')")[0][0]
        missing = wanted - buyer.keys().keys()
        if (open_jobs == 0 and not missing) or time.monotonic() > deadline:
            assert open_jobs == 0, f"{open_jobs} jobs still ready or running after {timeout} s"
            return missing
        time.sleep(0.1)


async def fetch_leads(base_url: str, key: str, lead_ids: list[str]) -> dict[str, dict | None]:
    found: dict[str, dict | None] = {}
    queue = list(lead_ids)
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(10.0), headers={"X-API-Key": key}) as client:
        async def reader() -> None:
            while queue:
                lead_id = queue.pop()
                response = await client.get(f"/api/v1/leads/{lead_id}")
                found[lead_id] = response.json()["data"] if response.status_code == 200 else None

        await asyncio.wait_for(asyncio.gather(*(reader() for _ in range(8))), timeout=60)
    return found


def fetch_leads_sync(server: Server, key: str, lead_ids: list[str]) -> dict[str, dict | None]:
    return asyncio.run(fetch_leads(server.url, key, lead_ids))


def check_every_acknowledged_lead(install: Install, survivor: Server, buyer: Buyer, acked: list[Acked],
                                  held: list[int]) -> None:
    qualified = {a.submission_id for a in acked if a.status == "qualified"}
    missing = wait_drained(install, buyer, qualified)
    assert not missing, f"{len(missing)} acknowledged qualified leads never reached the buyer"
    found = fetch_leads_sync(survivor, install.key, [a.lead_id for a in acked])
    sent = buyer.keys()
    problems = []
    for a in acked:
        stored = found[a.lead_id]
        subs = {s["submissionId"]: s for s in stored["submissions"]} if stored else {}
        if a.submission_id not in subs:
            problems.append(f"{a.lead_id}: missing ({'no lead' if stored is None else 'no submission'})")
            continue
        want = "delivered" if a.status == "qualified" else a.status
        if stored["status"] != want or subs[a.submission_id]["status"] != want:
            problems.append(f"{a.lead_id}: acknowledged {a.status}, now {stored['status']} (want {want})")
        if a.status != "qualified" and a.submission_id in sent:
            problems.append(f"{a.lead_id}: {a.status} but sent to the buyer")
    assert not problems, f"{len(problems)} problems, first: {problems[:5]}"
    assert {a.status for a in acked} == {"qualified", "disqualified"}

    # The jobs the dead process held were finished by the survivor, each delivered.
    rows = install.rows("SELECT state, claimed_by, submission_id FROM jobs WHERE job_id = ANY(%s)", (held,))
    assert len(rows) == len(held) >= 3
    assert all(state == "done" and survivor.owns(claimed_by) for state, claimed_by, _ in rows), rows
    assert all(submission_id in sent for _, _, submission_id in rows)
    # Every delivery kept its slot of the campaign's limit, and only those: the dead process's
    # slots went back with its jobs. (Submits the victim committed but could not answer are
    # delivered too.)
    delivered = install.rows("SELECT count(*) FROM leads WHERE status = 'delivered'")[0][0]
    slots = install.rows("SELECT coalesce(sum(count), 0) FROM cap_counters WHERE scope LIKE %s",
                         (f"delivery:{CAMPAIGN}:%",))[0][0]
    assert slots == delivered >= len(qualified)


def report(acked: list[Acked], held: list[int], errors: Counter, buyer: Buyer) -> None:
    sent = buyer.keys()
    repeats = sum(len(times) - 1 for times in sent.values())
    print(f"\n  acknowledged {len(acked)} by server {dict(Counter(a.server for a in acked))}, "
          f"{dict(Counter(a.status for a in acked))}; the dead server held {len(held)} running jobs; "
          f"other failures {dict(errors)}; buyer: {len(sent)} submissions, {repeats} repeated sends")


def test_two_servers_one_sigkilled_under_load_every_acknowledged_lead_is_delivered_by_the_survivor(
        tmp_path, postgres_url, procs):
    buyer = Buyer(tmp_path, delay_ms=300)  # deliveries stay in flight: the victim holds some at the kill
    procs.append(buyer)
    install = Install(tmp_path, postgres_url, kill_bundle(buyer), servers=2)
    servers = [install.start(0), install.start(1)]
    procs.extend(servers)
    victim, survivor = servers
    acked, held, errors = asyncio.run(load_and_kill(install, servers, victim, after_kill=1.0))
    assert victim.proc.wait(10) == -signal.SIGKILL
    assert not errors, errors  # the survivor answered every submit, before the kill and after
    assert {a.server for a in acked} == {0, 1}
    check_every_acknowledged_lead(install, survivor, buyer, acked, held)
    report(acked, held, errors, buyer)
    stop_process(survivor.proc)
    assert survivor.proc.returncode in (0, -signal.SIGTERM), survivor.log.read_text()[-2000:]


def test_a_server_sigkilled_under_load_and_started_again_loses_no_acknowledged_lead(tmp_path, postgres_url, procs):
    buyer = Buyer(tmp_path, delay_ms=300)
    procs.append(buyer)
    install = Install(tmp_path, postgres_url, kill_bundle(buyer), servers=1)
    first = install.start(0)
    procs.append(first)
    acked, held, errors = asyncio.run(load_and_kill(install, [first], first, after_kill=0))
    assert first.proc.wait(10) == -signal.SIGKILL
    assert not errors, errors
    again = install.start(0)  # the same folder and database: the kill released the folder's lock
    procs.append(again)
    check_every_acknowledged_lead(install, again, buyer, acked, held)
    report(acked, held, errors, buyer)
    stop_process(again.proc)
    assert again.proc.returncode in (0, -signal.SIGTERM), again.log.read_text()[-2000:]


# ---- one burst, two servers ---------------------------------------------------------------------

@pytest.mark.parametrize("count", [2, 4])
def test_one_burst_over_several_servers_keeps_caps_dedupe_limits_and_the_rotation_exact(
        tmp_path, postgres_url, procs, count):
    """40 submits from one capped source (10 a day), 40 of one person under dedupe, 20 to a
    campaign delivering 7 a day, 30 to a round robin of three buyers: every burst spread over
    the servers at once. Exactly 10 qualified, exactly one original, 7 delivered and 13 queued,
    10 per buyer: as one process would have done."""
    buyer = Buyer(tmp_path, delay_ms=0)
    procs.append(buyer)
    bundle = {
        "deliveryEndpoints": [endpoint(e, buyer) for e in ("a", "b", "c")],
        "campaigns": [
            campaign("CAP1", ingestion={"sources": [{"sourceId": "web", "caps": [{"cap": 10, "type": "daily"}]}]},
                     delivery={"deliveryEndpointId": "a"}),
            campaign("DUP1", qualification={"dedupeOverride": {
                "enabled": True, "window": 30, "matchFields": {"email": True, "phone": False, "matchLogic": "OR"}}},
                delivery={"deliveryEndpointId": "a"}),
            campaign("LIM1", delivery={"deliveryEndpointId": "b", "deliveryLimits": [{"cap": 7, "type": "daily"}]}),
            campaign("RR1", delivery={"distribution": {
                "method": "round_robin", "endpoints": [{"deliveryEndpointId": e} for e in ("a", "b", "c")]}}),
        ]}
    install = Install(tmp_path, postgres_url, bundle, servers=count)
    source_key = install.cli.json("key", "create", "--tenant", install.tenant_id, "--source", "web")["key"]
    servers = [install.start(n) for n in range(count)]
    procs.extend(servers)
    same = lead("DUP1")
    bursts = [(source_key, [lead("CAP1") for _ in range(40)]),
              (install.key, [{**lead("DUP1"), "email": same["email"]} for _ in range(40)]),
              (install.key, [lead("LIM1") for _ in range(20)]),
              (install.key, [lead("RR1") for _ in range(30)])]

    async def burst() -> list[list[httpx.Response]]:
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
        clients = [httpx.AsyncClient(base_url=s.url, timeout=httpx.Timeout(30.0), limits=limits) for s in servers]
        try:
            return await asyncio.wait_for(asyncio.gather(*(asyncio.gather(*(
                clients[n % count].post("/api/v1/leads/submit", json=body, headers={"X-API-Key": key})
                for n, body in enumerate(bodies))) for key, bodies in bursts)), timeout=60)
        finally:
            for client in clients:
                await client.aclose()

    answers = asyncio.run(burst())
    for responses in answers:
        assert [r.status_code for r in responses] == [201] * len(responses), [r.text for r in responses if r.status_code != 201]
    capped, deduped, limited, rotated = ([r.json()["data"] for r in responses] for responses in answers)
    assert Counter(d["status"] for d in capped) == {"qualified": 10, "disqualified": 30}
    assert Counter(d["status"] for d in deduped) == {"qualified": 1, "duplicate": 39}

    def settled() -> dict[str, dict]:
        found = fetch_leads_sync(servers[0], install.key, [d["leadId"] for d in limited + rotated])
        return {lead_id: data for lead_id, data in found.items() if data and data["status"] in ("delivered", "queued")}

    deadline = time.monotonic() + 30
    while len(done := settled()) < len(limited) + len(rotated):
        assert time.monotonic() < deadline, f"{len(limited) + len(rotated) - len(done)} leads still on their way"
        time.sleep(0.3)
    assert Counter(done[d["leadId"]]["status"] for d in limited) == {"delivered": 7, "queued": 13}

    def buyer_of(data: dict) -> str:
        (taken,) = [e["details"]["deliveryEndpointId"] for e in data["submissions"][-1]["journeyEvents"]
                    if e["type"] == "delivered"]
        return taken

    assert Counter(buyer_of(done[d["leadId"]]) for d in rotated) == {"a": 10, "b": 10, "c": 10}
    for server in servers:
        stop_process(server.proc)


# ---- imports: each server ends only its own ---------------------------------------------------

def _import_csv(rows: int) -> bytes:
    lines = ["first_name,last_name,email,phone,state,zip"]
    lines += [f"Ada,Lovelace{n},imp.{n}@example.com,(415) 555-{n % 10_000:04d},CA,94110" for n in range(rows)]
    return ("\n".join(lines) + "\n").encode()


def test_a_server_stopping_or_starting_leaves_another_servers_import_running(tmp_path, postgres_url, procs):
    """A server ends the imports it ran when it stops, and at its start those of processes that
    are gone: never an import another live server is running. One killed while it imports has
    its import ended by the next server to start."""
    install = Install(tmp_path, postgres_url, {"campaigns": [campaign("IMP1")]}, servers=2)
    headers = {"X-API-Key": install.key}
    a = install.start(0)
    procs.append(a)

    def upload(server: Server, rows: int) -> str:
        answer = httpx.post(f"{server.url}/api/v1/leads/import", headers=headers, timeout=60,
                            files={"file": ("leads.csv", _import_csv(rows), "text/csv")},
                            data={"campaignId": "IMP1", "process": "false"})
        assert answer.status_code == 202, answer.text
        return answer.json()["data"]["importId"]

    def state(server: Server, import_id: str) -> dict:
        return httpx.get(f"{server.url}/api/v1/imports/{import_id}", headers=headers, timeout=10).json()["data"]

    running = upload(a, 150_000)
    b = install.start(1)  # its start ends the imports of gone processes: not A's
    procs.append(b)
    stop_process(b.proc)  # its stop ends its own imports: none
    assert state(a, running)["state"] == "running", state(a, running)
    deadline = time.monotonic() + 120
    while (found := state(a, running))["state"] == "running":
        assert time.monotonic() < deadline, found
        time.sleep(0.2)
    assert (found["state"], found["created"]) == ("done", 150_000), (found["created"], found["errors"][:3])

    orphan = upload(a, 150_000)
    a.proc.kill()
    a.proc.wait(10)
    deadline = time.monotonic() + 10  # the server ends a killed client's sessions a moment later
    while install.rows("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
                       (f"%:{a.proc.pid}",))[0][0]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    again = install.start(1)
    procs.append(again)
    ended = state(again, orphan)
    assert ended["state"] == "failed" and ended["reason"].startswith("interrupted"), ended


# ---- webhooks: one sender per database ------------------------------------------------------------

def test_two_servers_send_each_webhook_event_once(tmp_path, postgres_url, procs):
    """Both servers read the one outbox; only the process holding the timed-work lock sends, so
    each event reaches the receiver once (a slow receiver: each send outlasts the other server's
    polls). When that server stops, the other takes over the sending."""
    from tests.buyer_server import BuyerServer

    receiver = BuyerServer().start()
    try:
        receiver.route("/hooks", status=200, delay=0.3)
        install = Install(tmp_path, postgres_url, {"campaigns": [campaign("WHK1")]}, servers=2)
        headers = {"X-API-Key": install.key}
        first, second = install.start(0), install.start(1)
        procs.extend([first, second])
        created = httpx.post(f"{first.url}/api/v1/webhooks", headers=headers, timeout=10,
                             json={"url": receiver.url("/hooks"), "events": ["lead.processed"]})
        assert created.status_code == 201, created.text

        def submit(server: Server, n: int) -> None:
            answer = httpx.post(f"{server.url}/api/v1/leads/submit", headers=headers, timeout=10,
                                json=lead("WHK1", n + 500_000))
            assert answer.status_code == 201, answer.text

        def ids_received(count: int) -> Counter:
            deadline = time.monotonic() + 60
            while len(received := Counter(r.headers["webhook-id"] for r in receiver.requests_to("/hooks"))) < count:
                assert time.monotonic() < deadline, f"{len(received)} of {count} events arrived"
                time.sleep(0.1)
            # Until every answer is recorded (the outbox is empty): a server sending without the
            # lock reads an event while it is queued, and the receiver's delay keeps it queued
            # past that server's next poll, so its copy is sent before this.
            while install.rows("SELECT count(*) FROM webhook_outbox")[0][0]:
                assert time.monotonic() < deadline, "events still in the outbox"
                time.sleep(0.1)
            return Counter(r.headers["webhook-id"] for r in receiver.requests_to("/hooks"))

        for n in range(10):
            submit(first if n % 2 else second, n)
        received = ids_received(10)
        assert len(received) == 10 and set(received.values()) == {1}, received

        stop_process(first.proc)  # whichever sent, the one left sends from now on
        for n in range(10, 14):
            submit(second, n)
        received = ids_received(14)
        assert len(received) == 14 and set(received.values()) == {1}, received
    finally:
        receiver.stop()
