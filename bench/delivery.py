"""Delivery benchmarks: submit-to-delivered latency under an open-loop offered load, and the
delivery worker's throughput draining a pre-loaded queue, against a fast loopback buyer.

(a) latency: a fresh appliance (delivery worker on) and bench/buyer.py. An open-loop client sends
    `--rate` submits/s for `--duration` s on a schedule that does not wait for answers (request i
    is due at start + i/rate; a pool of keep-alive connections sends it when due, from a backlog
    when every connection is busy, so a slow server shows as latency, not as a lower rate).
    Latencies count from the scheduled moment. The buyer records the arrival time of every
    `Idempotency-Key` (= submissionId) on the same monotonic clock, so per lead:
    submit-to-delivered = first arrival at the buyer - scheduled send. Every second the open job
    count (`state IN ('ready','running')`, read-only connection) is sampled; its trend over the
    load window says whether the queue grows.
(b) throughput: a fresh appliance with `[delivery] concurrency = 0` is loaded with `--preload`
    qualified leads (closed loop, bench.loadgen), stopped, and restarted with the worker on
    (`--worker-concurrency`); deliveries/s = leads / (last arrival - first arrival) at the buyer,
    plus the steady rate between the 10th and the 90th percentile arrival.

Targets: (a) median < 20 ms, p99 < 200 ms, queue does not grow at 1,000 leads/s for
30 s; (b) >= 2,000 deliveries/s. The server is pinned to CPU 0, the buyer and the client share
CPU 1 (2-core machine). `--profile` also runs `py-spy record` on the server during each measured
window and prints where its time goes. Results: bench/results/delivery.json.

    python -m bench.delivery [--phase both|latency|throughput] [--rate 1000] [--duration 30]
                             [--preload 30000] [--worker-concurrency 64] [--buyers 1]
                             [--billing off|none|prepaid|credit] [--profile] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw
import msgspec

from bench.bare_app import sample_lead
from bench.campaigns_list import _pin, _version, appliance_cli, cpu_seconds, machine_cpu_seconds
from bench.loadgen import Request, encode_request, free_port, run_load, wait_for_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
CAMPAIGN = "DLV1"
TARGET_MEDIAN_MS, TARGET_P99_MS, TARGET_DPS = 20.0, 200.0, 2000.0
_KEY = os.environ.get("BENCH_DELIVERY_KEY", "")  # for the spawned-safe preload factory


# ---- setup ------------------------------------------------------------------------------------------

def bundle(buyer_port: int, buyers: int = 1, billing: str = "off") -> dict[str, Any]:
    """One endpoint at the buyer (a realistic JSON field mapping) and one campaign: adults only,
    a daily delivery limit that is never reached (so the counter path runs), no schedule.
    `buyers` > 1: that many endpoints (all at the same buyer) in a round-robin distribution.
    `billing` other than off: the campaign's client is a record with that billing and each sale
    earns 1 USD, debited from its balance; `prepaid` and `credit` also check and hold the client's
    money before each post (`fund` credits it)."""
    endpoint = {
        "deliveryEndpointId": "fast-buyer", "url": f"http://127.0.0.1:{buyer_port}/leads",
        "fieldMapping": [
            {"clientKey": "first_name", "leadField": "firstName", "required": True},
            {"clientKey": "last_name", "leadField": "lastName", "required": True},
            {"clientKey": "email", "leadField": "email", "required": True},
            {"clientKey": "phone", "leadField": "phoneE164", "required": True},
            {"clientKey": "state", "leadField": "address.state"},
            {"clientKey": "zip", "leadField": "address.zip"},
            {"clientKey": "dob", "leadField": "dateOfBirth"},
            {"clientKey": "injured", "leadField": "questionnaire.injured"},
            {"clientKey": "trusted_form", "leadField": "compliance.trusted_form_cert_url"},
            {"clientKey": "vendor", "value": "bench"},
        ],
        "responseRules": {"success": {"statusCodes": [200, 201]}, "clientLeadIdPath": "id"},
        "timeoutSeconds": 10,
    }
    endpoints = [endpoint] if buyers == 1 else [{**endpoint, "deliveryEndpointId": f"fast-buyer-{i}"}
                                                 for i in range(buyers)]
    delivery: dict[str, Any] = {"deliveryEndpointId": "fast-buyer"} if buyers == 1 else {"distribution": {
        "method": "round_robin", "endpoints": [{"deliveryEndpointId": e["deliveryEndpointId"]} for e in endpoints]}}
    billed = billing != "off"
    if billed:
        delivery["revenueMilestones"] = [{"leadStatus": "delivered", "amount": 1, "currency": "USD"}]
    return {
        "deliveryEndpoints": endpoints,
        "clients": [{"clientId": "cli-bench", "name": "Bench Buyer", "billing": {"mode": billing}}] if billed else [],
        "campaigns": [{
            "campaignId": CAMPAIGN, "name": "Delivery benchmark",
            "client": {"clientId": "cli-bench", "clientName": "Bench Buyer"},
            "offer": {"offerId": "off-bench", "offerName": "Bench"},
            "qualification": {"rules": [{"name": "Adults", "logicalOperator": "AND", "subRules": [
                {"logicalOperator": "AND", "conditions": [
                    {"field": "age", "operator": "less_than", "value": [18], "maxSeverity": "disqualify"}]}]}]},
            "delivery": {**delivery, "deliveryLimits": [{"cap": 10_000_000, "type": "daily", "action": "queue"}]},
        }],
    }


def write_config(work: Path, concurrency: int) -> Path:
    config = work / "appliance.toml"
    config.write_text(
        f'[server]\nhost = "127.0.0.1"\nlog_level = "warning"\n\n'
        f'[storage]\npath = "{work / "data"}"\nsynchronous = "FULL"\n\n'
        f'[security]\nrate_limit_per_minute = 0\n\n'
        f'[delivery]\nallow_private_addresses = true\nconcurrency = {concurrency}\n\n'
        f'[plugins]\ndirs = []\n')
    return config


def fund(port: int, key: str) -> None:
    """More money than any run spends, credited to the bench's client over the API."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/clients/cli-bench/credits", method="POST",
                                     data=json.dumps({"amount": 100_000_000}).encode(),
                                     headers={"X-API-Key": key, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 201


def prepare(work: Path, buyer_port: int, concurrency: int, buyers: int = 1,
            billing: str = "off") -> tuple[Path, str]:
    work.mkdir(parents=True, exist_ok=True)
    config = write_config(work, concurrency)
    appliance_cli(config, "init")
    tenant = json.loads(appliance_cli(config, "tenant", "create", "Delivery Bench", "--json"))["tenantId"]
    key = json.loads(appliance_cli(config, "key", "create", "--tenant", tenant, "--name", "bench", "--json"))["key"]
    (work / "bundle.json").write_text(json.dumps(bundle(buyer_port, buyers, billing)))
    appliance_cli(config, "import", "--tenant", tenant, str(work / "bundle.json"))
    return config, key


class Procs:
    """Subprocesses of a run: started pinned, logged under the work dir, always stopped."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.all: list[subprocess.Popen] = []
        self.logs: list[Any] = []

    def start(self, name: str, cmd: list[str], port: int, cpu: int | None) -> subprocess.Popen:
        log = open(self.work / f"{name}.log", "ab")
        self.logs.append(log)
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_pin(cpu))
        self.all.append(proc)
        try:
            wait_for_port(port, proc=proc)
        except Exception:
            log.flush()
            sys.stderr.write((self.work / f"{name}.log").read_text(errors="replace")[-3000:])
            raise
        return proc

    def appliance(self, config: Path, port: int, cpu: int | None, name: str = "appliance") -> subprocess.Popen:
        return self.start(name, [sys.executable, "-m", "appliance", "--config", str(config), "serve", "--port",
                                 str(port)], port, cpu)

    @staticmethod
    def stop(proc: subprocess.Popen, timeout: float = 15.0) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        for proc in self.all:
            self.stop(proc, 10)
        for log in self.logs:
            log.close()


def buyer_get(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_buyer/{path}", timeout=30) as resp:
        return json.loads(resp.read())


def buyer_reset(port: int) -> None:
    urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/_buyer/reset", method="POST"),
                           timeout=10).read()


class JobCounter:
    """Open jobs, from a read-only connection of our own (WAL: never blocks the writer)."""

    def __init__(self, db_file: Path) -> None:
        self.conn = apsw.Connection(str(db_file), flags=apsw.SQLITE_OPEN_READONLY)
        self.conn.setbusytimeout(5000)

    def open_jobs(self) -> int:
        return self.conn.execute("SELECT count(*) FROM jobs WHERE state IN ('ready', 'running')").fetchone()[0]

    def states(self) -> dict[str, int]:
        return dict(self.conn.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall())

    def lead_statuses(self) -> dict[str, int]:
        return dict(self.conn.execute("SELECT status, count(*) FROM leads GROUP BY status").fetchall())

    def close(self) -> None:
        self.conn.close()


# ---- profiling -----------------------------------------------------------------------------------

class Profiler:
    """py-spy record (raw collapsed stacks) on a pid for a fixed time; a summary by function."""

    def __init__(self, pid: int, seconds: float, out: Path, gil: bool = True) -> None:
        self.out = out
        self.gil = gil
        exe = Path(sys.executable).with_name("py-spy")
        cmd = [str(exe if exe.exists() else "py-spy"), "record", "-p", str(pid), "-d", str(max(1, int(seconds))),
               "-r", "200", "-f", "raw", "-o", str(out), "--nonblocking"]
        if gil:
            cmd.append("--gil")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def finish(self, top: int = 25) -> dict[str, Any]:
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        if not self.out.exists():
            return {"error": (err or b"").decode(errors="replace")[-500:]}
        return summarize_stacks(self.out.read_text(), top) | {"mode": "py-spy --gil" if self.gil else "py-spy, all threads"}


def _frame_name(frame: str) -> str:
    # "func (path/to/module.py:123)" -> "func (module.py)"
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = path.split("/")
    short = "/".join(parts[-2:]) if len(parts) > 1 else path
    return f"{name} ({short})"


_CATEGORIES = (  # (path prefix of a frame's file, category); the leaf-most matching frame decides
    (("httpcore/", "httpx/", "h11/", "anyio/", "sniffio/"), "http client (httpx, httpcore, h11, anyio)"),
    (("logging/",), "logging"),
    (("msgspec/",), "msgspec"),
    (("uvicorn/", "litestar/", "httptools/", "starlette/"), "HTTP server (uvicorn, litestar)"),
    (("appliance/storage/",), "appliance storage (SQL, apsw)"),
    (("appliance/",), "appliance (other)"),
    (("asyncio/", "uvloop/", "selectors.py", "threading.py", "queue.py"), "event loop, threads"),
)


def _category(frames: list[str]) -> str:
    for frame in reversed(frames):
        where = frame.partition(" (")[2]
        for prefixes, name in _CATEGORIES:
            if where.startswith(prefixes):
                if name == "appliance (other)":
                    module = where.rsplit(":", 1)[0]
                    return f"appliance {module.removeprefix('appliance/')}"
                return name
    return "other"


def summarize_stacks(text: str, top: int) -> dict[str, Any]:
    """Self time by package (the leaf-most frame of a known package decides), self and inclusive
    time by function, in % of the samples (py-spy --gil: samples where a thread held the GIL)."""
    inclusive: Counter = Counter()
    own: Counter = Counter()
    packages: Counter = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        packages[_category(frames)] += n
        names = [_frame_name(f) for f in frames]
        own[names[-1]] += n
        for name in set(names):
            inclusive[name] += n
    pct = lambda n: round(100 * n / total, 1) if total else 0.0  # noqa: E731
    skip = ("<module>", "_run_module_as_main", "_run_code", "Command.", "Group.", "Context.", "pass_context",
            "serve (", "_serve (", "run (uvicorn", "Server.run", "asyncio_run", "Runner.run", "Thread.")
    return {"samples": total,
            "by_package_pct": [(k, pct(v)) for k, v in packages.most_common()],
            "self_pct": [(k, pct(v)) for k, v in own.most_common(top)],
            "inclusive_pct": [(k, pct(v)) for k, v in inclusive.most_common(top * 4) if not k.startswith(skip)][:top]}


def print_profile(label: str, prof: dict[str, Any]) -> None:
    if "error" in prof:
        print(f"  profile {label}: py-spy failed: {prof['error']}")
        return
    print(f"\n  server profile during {label}: {prof['samples']} samples ({prof.get('mode', 'py-spy')}, 200 Hz)")
    print("   self %  by package")
    for name, p in prof["by_package_pct"]:
        print(f"   {p:6.1f}  {name}")
    print("   self %  by function")
    for name, p in prof["self_pct"][:12]:
        print(f"   {p:6.1f}  {name}")
    print("   incl %  by function")
    for name, p in prof["inclusive_pct"][:20]:
        print(f"   {p:6.1f}  {name}")


# ---- stats -----------------------------------------------------------------------------------------

def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-p * len(ordered) // 100))))
    return ordered[rank - 1]


def ms_summary(seconds: list[float]) -> dict[str, float]:
    return {"n": len(seconds), "p50": round(pct(seconds, 50) * 1000, 2), "p90": round(pct(seconds, 90) * 1000, 2),
            "p99": round(pct(seconds, 99) * 1000, 2), "max": round(max(seconds) * 1000, 2) if seconds else float("nan"),
            "mean": round(statistics.fmean(seconds) * 1000, 2) if seconds else float("nan")}


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope (units per second)."""
    if len(points) < 2:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else 0.0


# ---- (a) the open-loop client --------------------------------------------------------------------------

@dataclass
class OpenLoopResult:
    scheduled: list[float] = field(default_factory=list)   # monotonic moment each request was due
    sent: list[float] = field(default_factory=list)
    answered: list[float] = field(default_factory=list)    # 0.0: no answer
    statuses: list[int] = field(default_factory=list)
    submission: list[str | None] = field(default_factory=list)
    lead_status: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    queue: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, open jobs)
    max_backlog: int = 0
    start: float = 0.0
    end_of_sends: float = 0.0
    client_cpu: float = 0.0


class _Conn(asyncio.Protocol):
    def __init__(self, client: "OpenLoop") -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.need = -1
        self.status = 0
        self.index = -1
        self.last_used = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, index: int, data: bytes) -> None:
        self.index = index
        self.client.result.sent[index] = time.monotonic()
        self.transport.write(data)  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            if self.need < 0:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = self.buf[:end].lower()
                self.status = int(head[9:12])
                at = head.find(b"\r\ncontent-length:")
                if at < 0:
                    self.client.fail(self, "no content-length")
                    return
                stop = head.find(b"\r\n", at + 2)
                self.need = int(head[at + 17:stop if stop >= 0 else None])
                self.buf = self.buf[end + 4:]
            if len(self.buf) < self.need:
                return
            body, self.buf, self.need = self.buf[:self.need], self.buf[self.need:], -1
            self.client.done(self, self.status, body)
            if not self.buf:
                return

    def connection_lost(self, exc: Exception | None) -> None:
        # The server closes keep-alive connections idle for more than its timeout (uvicorn: 5 s);
        # one closed in flight counts as an error. Either way the pool gets a fresh connection.
        self.transport = None
        if self.index >= 0:
            self.client.fail(self, "connection lost")
        self.client.replace(self)


STALE_SECONDS = 4.0  # uvicorn closes a keep-alive connection idle for 5 s


class _Answer(msgspec.Struct):
    data: dict[str, Any] | None = None


class OpenLoop:
    def __init__(self, port: int, key: str, rate: float, duration: float, connections: int, first_n: int,
                 jobs: JobCounter | None) -> None:
        self.port, self.key, self.rate = port, key, rate
        self.total = int(rate * duration)
        self.connections = connections
        self.first_n = first_n
        self.jobs = jobs
        self.result = OpenLoopResult()
        r = self.result
        r.scheduled = [0.0] * self.total
        r.sent = [0.0] * self.total
        r.answered = [0.0] * self.total
        r.statuses = [0] * self.total
        r.submission = [None] * self.total
        self.idle: list[_Conn] = []
        self.backlog: list[int] = []
        self.backlog_head = 0
        self.outstanding = 0
        self.all_done: asyncio.Future | None = None
        self.hostname = f"127.0.0.1:{port}"
        self.decoder = msgspec.json.Decoder(_Answer)
        self.tasks: set[asyncio.Task] = set()
        self.closing = False
        self.requests: list[bytes] = []  # built before the clock starts: the client's CPU competes with the server's

    def request(self, index: int) -> bytes:
        body = msgspec.json.encode({"campaignId": CAMPAIGN, **sample_lead(self.first_n + index)})
        return encode_request(Request("POST", "/api/v1/leads/submit", {"X-API-Key": self.key,
                                      "Content-Type": "application/json"}, body), self.hostname)

    def replace(self, conn: _Conn) -> None:
        if conn in self.idle:
            self.idle.remove(conn)
        if self.closing:
            return

        async def reconnect() -> None:
            fresh = _Conn(self)
            try:
                await asyncio.get_running_loop().create_connection(lambda: fresh, "127.0.0.1", self.port)
            except OSError:
                self.result.errors["reconnect failed"] += 1
                return
            self._next(fresh)

        task = asyncio.get_running_loop().create_task(reconnect())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def dispatch(self, index: int) -> None:
        self.outstanding += 1
        now = time.monotonic()
        while self.idle and (self.idle[-1].transport is None or now - self.idle[-1].last_used > STALE_SECONDS):
            stale = self.idle.pop()  # never race the server's keep-alive timeout: replace, don't reuse
            if stale.transport is not None:
                stale.transport.close()  # connection_lost -> replace()
        if self.idle:
            self.idle.pop().send(index, self.requests[index])
        else:
            self.backlog.append(index)
            waiting = len(self.backlog) - self.backlog_head
            if waiting > self.result.max_backlog:
                self.result.max_backlog = waiting

    def _next(self, conn: _Conn) -> None:
        conn.index = -1
        conn.last_used = time.monotonic()
        if self.backlog_head < len(self.backlog):
            index = self.backlog[self.backlog_head]
            self.backlog_head += 1
            conn.send(index, self.requests[index])
        else:
            self.idle.append(conn)

    def done(self, conn: _Conn, status: int, body: bytes) -> None:
        r, i = self.result, conn.index
        r.answered[i] = time.monotonic()
        r.statuses[i] = status
        if status == 201:
            data = self.decoder.decode(body).data or {}
            r.submission[i] = data.get("submissionId")
            r.lead_status[data.get("status")] += 1
        self._finish_one()
        self._next(conn)

    def fail(self, conn: _Conn, kind: str) -> None:
        self.result.errors[kind] += 1
        if conn.index >= 0:
            conn.index = -1
            self._finish_one()
        if conn.transport is not None:
            conn.transport.abort()

    def _finish_one(self) -> None:
        self.outstanding -= 1
        if self.outstanding == 0 and self.all_sent and self.all_done is not None and not self.all_done.done():
            self.all_done.set_result(None)

    async def sample_queue(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self.jobs is not None:
                self.result.queue.append((round(time.monotonic() - self.result.start, 2), self.jobs.open_jobs()))
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except asyncio.TimeoutError:
                pass

    async def run(self, answer_timeout: float = 60.0) -> OpenLoopResult:
        loop = asyncio.get_running_loop()
        self.all_done = loop.create_future()
        self.all_sent = False
        self.requests = [self.request(index) for index in range(self.total)]
        for _ in range(self.connections):
            conn = _Conn(self)
            await loop.create_connection(lambda c=conn: c, "127.0.0.1", self.port)
            self.idle.append(conn)
        r = self.result
        cpu0 = time.process_time()
        r.start = start = time.monotonic() + 0.05
        stop_sampling = asyncio.Event()
        sampler = asyncio.create_task(self.sample_queue(stop_sampling)) if self.jobs is not None else None
        interval = 1.0 / self.rate
        i = 0
        while i < self.total:
            now = time.monotonic()
            while i < self.total and start + i * interval <= now:
                r.scheduled[i] = start + i * interval
                self.dispatch(i)
                i += 1
            if i < self.total:
                await asyncio.sleep(max(0.0, start + i * interval - time.monotonic()))
        r.end_of_sends = time.monotonic()
        self.all_sent = True
        if self.outstanding == 0 and not self.all_done.done():
            self.all_done.set_result(None)
        try:
            await asyncio.wait_for(asyncio.shield(self.all_done), answer_timeout)
        except asyncio.TimeoutError:
            r.errors["no answer in time"] += self.outstanding
        r.client_cpu = time.process_time() - cpu0
        stop_sampling.set()
        if sampler is not None:
            await sampler
        self.closing = True
        for task in list(self.tasks):
            task.cancel()
        for conn in self.idle:
            if conn.transport is not None:
                conn.transport.close()
        await asyncio.sleep(0)
        return r


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


def open_loop(port: int, key: str, rate: float, duration: float, connections: int, first_n: int,
              jobs: JobCounter | None) -> OpenLoopResult:
    loop = _new_loop()
    try:
        return loop.run_until_complete(OpenLoop(port, key, rate, duration, connections, first_n, jobs).run())
    finally:
        loop.close()


def wait_drained(jobs: JobCounter, buyer_port: int, wanted: int, timeout: float,
                 samples: list[tuple[float, int]] | None = None, t0: float = 0.0) -> bool:
    """Until the queue is empty and the buyer has `wanted` keys (True), or the timeout (False)."""
    deadline = time.monotonic() + timeout
    next_sample = time.monotonic()
    while time.monotonic() < deadline:
        open_jobs = jobs.open_jobs()
        if samples is not None and time.monotonic() >= next_sample:
            samples.append((round(time.monotonic() - t0, 2), open_jobs))
            next_sample += 1.0
        if open_jobs == 0 and buyer_get(buyer_port, "stats")["keys"] >= wanted:
            return True
        time.sleep(0.1)
    return False


def latency_phase(args: argparse.Namespace, work: Path, procs: Procs, server_cpu: int | None,
                  client_cpu: int | None) -> dict[str, Any]:
    buyer_port, port = free_port(), free_port()
    buyer = procs.start("buyer-a", [sys.executable, "-m", "bench.buyer", "--port", str(buyer_port)], buyer_port,
                        client_cpu)
    config, key = prepare(work, buyer_port, args.worker_concurrency, args.buyers, args.billing)
    app = procs.appliance(config, port, server_cpu, "appliance-a")
    if args.billing not in ("off", "none"):
        fund(port, key)
    jobs = JobCounter(work / "data" / "appliance.db")
    # sample_lead(n) repeats its phone number every 10,000,000 n: keep the two runs apart within that.
    try:
        # Warm-up: a few hundred leads at a gentle rate, fully delivered, then forget them.
        warm = open_loop(port, key, min(200.0, args.rate), args.warmup, 16, 0, None)
        warm_ok = warm.lead_status["qualified"]
        if not wait_drained(jobs, buyer_port, warm_ok, 60):
            print("  warning: the warm-up did not drain within 60 s")
        buyer_reset(buyer_port)

        print(f"  (a) offering {args.rate:.0f} submits/s for {args.duration:.0f} s "
              f"({int(args.rate * args.duration)} leads, up to {args.connections} connections)...")
        profiler = Profiler(app.pid, args.duration, work / "profile-latency.txt", not args.profile_threads) \
            if args.profile else None
        cpu0, (busy0, irq0), t0 = cpu_seconds(app.pid), machine_cpu_seconds(), time.perf_counter()
        buyer_cpu0 = cpu_seconds(buyer.pid)
        result = open_loop(port, key, args.rate, args.duration, args.connections, 5_000_000, jobs)
        cpu1, (busy1, irq1), t1 = cpu_seconds(app.pid), machine_cpu_seconds(), time.perf_counter()
        buyer_cpu1 = cpu_seconds(buyer.pid)
        profile = profiler.finish() if profiler else None
        acked = [s for s in result.submission if s]
        drained_in = time.monotonic()
        drained = wait_drained(jobs, buyer_port, result.lead_status["qualified"], args.drain_timeout, result.queue,
                               result.start)
        drained_in = time.monotonic() - drained_in
        arrivals = buyer_get(buyer_port, "keys")["keys"]
        lead_statuses = jobs.lead_statuses()
    finally:
        jobs.close()
        procs.stop(app)

    wall = t1 - t0
    n = len(result.scheduled)
    submit_lat = [result.answered[i] - result.scheduled[i] for i in range(n) if result.answered[i]]
    lag = [result.sent[i] - result.scheduled[i] for i in range(n) if result.sent[i]]
    delivered, ack_to_delivered, missing = [], [], 0
    for i in range(n):
        sid = result.submission[i]
        if not sid:
            continue
        times = arrivals.get(sid)
        if not times:
            missing += 1
            continue
        delivered.append(times[0] - result.scheduled[i])
        ack_to_delivered.append(times[0] - result.answered[i])
    duplicates = sum(len(v) - 1 for v in arrivals.values() if len(v) > 1)
    in_load = [(t, q) for t, q in result.queue if t <= args.duration]
    trend = slope(in_load)
    after = [q for t, q in result.queue if t > args.duration]
    grows = trend > max(5.0, 0.005 * args.rate)
    send_span = result.end_of_sends - result.start
    out = {
        "offered_rate": args.rate, "duration_s": args.duration, "requests": n,
        "achieved_send_rate": round(n / send_span, 1) if send_span > 0 else None,
        "client_lag_ms": ms_summary(lag), "max_backlog": result.max_backlog,
        "statuses": dict(Counter(result.statuses)), "errors": dict(result.errors),
        "lead_status_at_submit": dict(result.lead_status), "lead_status_at_end": lead_statuses,
        "submit_latency_ms": ms_summary(submit_lat),
        "submit_to_delivered_ms": ms_summary(delivered),
        "ack_to_delivered_ms": ms_summary(ack_to_delivered),
        "delivered": len(delivered), "acknowledged": len(acked), "not_delivered": missing,
        "duplicate_deliveries": duplicates,
        "queue_samples": result.queue, "queue_slope_per_s": round(trend, 2),
        "queue_max_in_load": max((q for _, q in in_load), default=0),
        "queue_last_in_load": in_load[-1][1] if in_load else None,
        "queue_grows": grows, "drained": drained, "drain_after_load_s": round(drained_in, 2),
        "queue_after_load": after[:10],
        "server_cpu_pct": round(100 * (cpu1 - cpu0) / wall, 1),
        "buyer_cpu_pct": round(100 * (buyer_cpu1 - buyer_cpu0) / wall, 1),
        "client_cpu_pct": round(100 * result.client_cpu / wall, 1),
        "other_cpu_pct": round(100 * ((busy1 - busy0) + (irq1 - irq0) - (cpu1 - cpu0) - (buyer_cpu1 - buyer_cpu0)
                                      - result.client_cpu) / wall, 1),
        "targets": {"median_ms": TARGET_MEDIAN_MS, "p99_ms": TARGET_P99_MS},
    }
    d = out["submit_to_delivered_ms"]
    out["meets"] = {"median": d["p50"] < TARGET_MEDIAN_MS, "p99": d["p99"] < TARGET_P99_MS, "queue_stable": not grows}
    if profile is not None:
        out["profile"] = profile
    return out


# ---- (b) throughput ------------------------------------------------------------------------------------

_PRELOAD_BASE = 20_000_000  # phone numbers repeat every 10,000,000 n: one fixed base, computed once


def preload_request(n: int) -> Request:
    n += _PRELOAD_BASE
    return Request(method="POST", path="/api/v1/leads/submit",
                   headers={"X-API-Key": _KEY, "Content-Type": "application/json"},
                   body=msgspec.json.encode({"campaignId": CAMPAIGN, **sample_lead(n)}))


def throughput_phase(args: argparse.Namespace, work: Path, procs: Procs, server_cpu: int | None,
                     client_cpu: int | None) -> dict[str, Any]:
    global _KEY
    buyer_port, port = free_port(), free_port()
    buyer = procs.start("buyer-b", [sys.executable, "-m", "bench.buyer", "--port", str(buyer_port)], buyer_port,
                        client_cpu)
    config, key = prepare(work, buyer_port, 0, args.buyers, args.billing)
    _KEY = os.environ["BENCH_DELIVERY_KEY"] = key
    app = procs.appliance(config, port, server_cpu, "appliance-b-load")
    if args.billing not in ("off", "none"):
        fund(port, key)
    print(f"  (b) pre-loading {args.preload} leads with the delivery worker off...")
    t = time.perf_counter()
    load = run_load(f"http://127.0.0.1:{port}/api/v1/leads/submit", connections=64, requests=args.preload, duration=None,
                    factory=preload_request, timeout=30)
    print(f"      {load.ok} submits acknowledged in {time.perf_counter() - t:.1f} s, statuses {load.statuses}, "
          f"errors {load.errors or 0}")
    procs.stop(app)
    jobs = JobCounter(work / "data" / "appliance.db")
    try:
        queued = jobs.open_jobs()
        print(f"      queue: {queued} open jobs; restarting with [delivery] concurrency = {args.worker_concurrency}")
        write_config(work, args.worker_concurrency)
        buyer_cpu0 = cpu_seconds(buyer.pid)
        started = time.monotonic()
        port = free_port()
        app = procs.appliance(config, port, server_cpu, "appliance-b-drain")
        listening = time.monotonic()
        profiler = Profiler(app.pid, args.profile_seconds, work / "profile-throughput.txt",
                            not args.profile_threads) if args.profile else None
        cpu0, (busy0, irq0), t0 = cpu_seconds(app.pid), machine_cpu_seconds(), time.perf_counter()
        samples: list[tuple[float, int]] = []
        drained = wait_drained(jobs, buyer_port, queued, args.drain_timeout, samples, started)
        cpu1, (busy1, irq1), t1 = cpu_seconds(app.pid), machine_cpu_seconds(), time.perf_counter()
        buyer_cpu1 = cpu_seconds(buyer.pid)
        profile = profiler.finish() if profiler else None
        arrivals = buyer_get(buyer_port, "keys")["keys"]
        states = jobs.states()
        lead_statuses = jobs.lead_statuses()
    finally:
        jobs.close()
        procs.stop(app)

    firsts = sorted(v[0] for v in arrivals.values())
    total_sends = sum(len(v) for v in arrivals.values())
    span = firsts[-1] - firsts[0] if len(firsts) > 1 else float("nan")
    lo, hi = pct(firsts, 10), pct(firsts, 90)
    steady = (0.8 * len(firsts)) / (hi - lo) if hi > lo else float("nan")
    per_second: dict[int, int] = defaultdict(int)
    for a in firsts:
        per_second[int(a - firsts[0])] += 1
    wall = t1 - t0
    out = {
        "preloaded": args.preload, "preload_statuses": {str(k): v for k, v in load.statuses.items()},
        "preload_rps": round(load.rps, 1), "queued": queued, "worker_concurrency": args.worker_concurrency,
        "delivered_keys": len(firsts), "sends": total_sends, "duplicates": total_sends - len(firsts),
        "drained": drained, "job_states": states, "lead_statuses": lead_statuses,
        "server_start_s": round(listening - started, 2),
        "first_delivery_after_start_s": round(firsts[0] - started, 2) if firsts else None,
        "delivery_span_s": round(span, 2),
        "deliveries_per_s": round(len(firsts) / span, 1) if span and span > 0 else None,
        "steady_deliveries_per_s": round(steady, 1),
        "per_second": [per_second[k] for k in sorted(per_second)],
        "queue_samples": samples,
        "server_cpu_pct": round(100 * (cpu1 - cpu0) / wall, 1),
        "buyer_cpu_pct": round(100 * (buyer_cpu1 - buyer_cpu0) / wall, 1),
        "other_cpu_pct": round(100 * ((busy1 - busy0) + (irq1 - irq0) - (cpu1 - cpu0) - (buyer_cpu1 - buyer_cpu0))
                               / wall, 1),
        "target_per_s": TARGET_DPS,
    }
    out["meets"] = bool(out["deliveries_per_s"] and out["deliveries_per_s"] >= TARGET_DPS)
    if profile is not None:
        out["profile"] = profile
    return out


# ---- main ----------------------------------------------------------------------------------------------

def report_latency(a: dict[str, Any]) -> None:
    print(f"\n(a) offered {a['offered_rate']:.0f} leads/s for {a['duration_s']:.0f} s: {a['requests']} submits, "
          f"sent at {a['achieved_send_rate']}/s (client lag p99 {a['client_lag_ms']['p99']} ms, max backlog "
          f"{a['max_backlog']}); statuses {a['statuses']} errors {a['errors'] or 0}")
    print(f"    {'':24} {'n':>6} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for label, key in (("submit (from schedule)", "submit_latency_ms"), ("submit -> delivered", "submit_to_delivered_ms"),
                       ("201 answer -> delivered", "ack_to_delivered_ms")):
        s = a[key]
        print(f"    {label:24} {s['n']:>6} {s['p50']:>8.2f} {s['p90']:>8.2f} {s['p99']:>8.2f} {s['max']:>8.2f}")
    print(f"    delivered {a['delivered']}/{a['acknowledged']} acknowledged (not delivered: {a['not_delivered']}, "
          f"duplicate sends {a['duplicate_deliveries']}); lead statuses at the end {a['lead_status_at_end']}")
    samples = " ".join(str(q) for _, q in a["queue_samples"])
    print(f"    open jobs, one sample per second: {samples}")
    print(f"    queue trend during the load: {a['queue_slope_per_s']:+.1f} jobs/s (max {a['queue_max_in_load']}, "
          f"last {a['queue_last_in_load']}); {'GROWS' if a['queue_grows'] else 'stable'}; drained "
          f"{'in ' + str(a['drain_after_load_s']) + ' s after the load' if a['drained'] else 'NOT within the timeout'}")
    print(f"    CPU (% of one core): server {a['server_cpu_pct']}, buyer {a['buyer_cpu_pct']}, client "
          f"{a['client_cpu_pct']}, other {a['other_cpu_pct']}")
    m = a["meets"]
    print(f"    targets: median < {TARGET_MEDIAN_MS:.0f} ms {'met' if m['median'] else 'MISSED'}, p99 < "
          f"{TARGET_P99_MS:.0f} ms {'met' if m['p99'] else 'MISSED'}, queue does not grow "
          f"{'met' if m['queue_stable'] else 'MISSED'}")
    if "profile" in a:
        print_profile("(a)", a["profile"])


def report_throughput(b: dict[str, Any]) -> None:
    print(f"\n(b) {b['queued']} queued deliveries, worker concurrency {b['worker_concurrency']}: "
          f"{b['delivered_keys']} delivered in {b['delivery_span_s']} s = {b['deliveries_per_s']}/s "
          f"(steady p10-p90: {b['steady_deliveries_per_s']}/s); duplicates {b['duplicates']}; "
          f"{'drained' if b['drained'] else 'NOT drained'}; jobs {b['job_states']}")
    print(f"    server up in {b['server_start_s']} s, first delivery {b['first_delivery_after_start_s']} s after "
          f"start; deliveries per second: {' '.join(map(str, b['per_second']))}")
    print(f"    CPU (% of one core): server {b['server_cpu_pct']}, buyer {b['buyer_cpu_pct']}, other "
          f"{b['other_cpu_pct']}; pre-load ran at {b['preload_rps']} submits/s")
    print(f"    target >= {TARGET_DPS:.0f} deliveries/s: {'met' if b['meets'] else 'MISSED'}")
    if "profile" in b:
        print_profile("(b)", b["profile"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.delivery", description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase", choices=("both", "latency", "throughput"), default="both")
    parser.add_argument("--rate", type=float, default=1000.0, help="(a) offered submits per second")
    parser.add_argument("--duration", type=float, default=30.0, help="(a) seconds of offered load")
    parser.add_argument("--warmup", type=float, default=2.0, help="(a) seconds of warm-up at up to 200/s")
    parser.add_argument("--connections", type=int, default=128, help="(a) client connections (open-loop pool)")
    parser.add_argument("--preload", type=int, default=30_000, help="(b) leads queued before the worker starts")
    parser.add_argument("--worker-concurrency", type=int, default=64, help="[delivery] concurrency when on")
    parser.add_argument("--drain-timeout", type=float, default=180.0)
    parser.add_argument("--buyers", type=int, default=1,
                        help="endpoints of the campaign: more than 1 delivers through a round-robin distribution")
    parser.add_argument("--billing", choices=("off", "none", "prepaid", "credit"), default="off",
                        help="the campaign's client as a record with this billing, each sale earning 1 USD off its "
                             "balance (prepaid, credit: each delivery checks and holds its money first)")
    parser.add_argument("--profile", action="store_true", help="py-spy record the server during each measurement")
    parser.add_argument("--profile-seconds", type=float, default=10.0, help="(b) seconds profiled")
    parser.add_argument("--profile-threads", action="store_true",
                        help="sample every non-idle thread (SQLite work done outside the GIL shows too), not only "
                             "the one holding the GIL")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the temp dirs, logs and raw profiles")
    parser.add_argument("--out", type=Path, default=RESULTS / "delivery.json")
    args = parser.parse_args(argv)

    cpus = sorted(os.sched_getaffinity(0))
    pin = args.pin if args.pin is not None else len(cpus) >= 2
    server_cpu, client_cpu = (cpus[0], cpus[1]) if pin else (None, None)
    root = Path(tempfile.mkdtemp(prefix="bench-delivery-"))
    old_affinity = os.sched_getaffinity(0)
    results: dict[str, Any] = {}
    procs = Procs(root)
    try:
        if client_cpu is not None:
            os.sched_setaffinity(0, {client_cpu})
        if args.phase in ("both", "latency"):
            results["latency"] = latency_phase(args, root / "a", procs, server_cpu, client_cpu)
            report_latency(results["latency"])
        if args.phase in ("both", "throughput"):
            results["throughput"] = throughput_phase(args, root / "b", procs, server_cpu, client_cpu)
            report_throughput(results["throughput"])
    finally:
        os.sched_setaffinity(0, old_affinity)
        procs.close()
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "delivery", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "pinned": pin, "server_cpu": server_cpu, "client_and_buyer_cpu": client_cpu},
        "versions": {n: _version(n) for n in ("litestar", "msgspec", "uvicorn", "uvloop", "httptools", "httpx",
                                               "httpcore", "apsw")},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        **results}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
