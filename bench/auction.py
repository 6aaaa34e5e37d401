"""Supplier pings sold at auction (issue 34 item 6): one `appliance serve` as shipped answering
POST /api/v1/leads/ping for an exclusive auction campaign over 10 loopback buyers, beside the bare
decode endpoint (bench/bare_app.py) in the same run, with the CPU of every process.

Setup: a fresh data folder (as shipped but for the rate limit off, quiet logs, no plugins and
`[delivery] allow_private_addresses = true`), a tenant key, and bench/bidders.py: 10 buyers in one
process, each on its own port, answering every ping after `--delay-ms` (5) with a random bid
`{"bid": x, "token": "b<i>-<n>"}` and every post with 200. Each buyer is an endpoint of the
built-in `http` adapter with a `ping` (bidPath "bid", pingTokenPath "token"); its post carries the
token back (`auction.pingToken`). Campaigns (age rule, the tenant's dedupe, exclusive, floor 1,
margin 20 %):

  main   AUC1: the 10 buyers, the round's deadline the buyers' ping timeout (1,000 ms)
  never  AUCN: 9 of them and an 11th buyer that reads its pings and never answers; auction
         timeoutMs `--never-timeout-ms` (300)
  one    AUC0: buyer 0 alone (`--scenario one`, not run by default): against main, what the nine
         other outbound pings of a round cost the server

Per scenario: a warm-up (`--warmup` s at the same rate, delivered, then forgotten), then an open
loop (bench/delivery.py's client: request i due at start + i/rate whatever the answers, latency
from the due moment) offers `--rate` (200) pings/s for `--duration` (20) s: 10 outbound pings
each, 2,000/s. Each accepted ping (all, or `--post-fraction`) is posted at once with its pingId
and the full lead (POST /api/v1/leads/submit, inside the bid TTL); the queue must then drain with
every posted lead at a buyer.

Reported: ping answer p50/p99; the appliance's own share of each round = answer time less the
slowest in-time buyer's `responseMs` (the appliance's own clock from the round's start to the
answer read), per round from GET /api/v1/leads/{leadId}/auctions of every posted lead (fetched
after the load), also the time outside the round (answer - `durationMs`) and the estimate answer -
5 ms over every accepted ping (an upper bound: everything but the buyers' think time). CPU of each
process over the load (appliance server, its delivery process, the bidders, the load client: an
open loop in a process of its own) in seconds, % of a core, microseconds a ping and the kernel's
share; resident memory of every process sampled each second (per process max; the target's sum is
the appliance's processes, the bidders and the load client: the bare app and this script, which
only orchestrates, are shown apart). Every posted lead must be sold exactly once (one post at one
buyer, the round's winner, carrying that buyer's token). Then the bare decode endpoint closed
loop (64 connections, as bench.product measures it): its req/s and CPU per request, so a ping's
server CPU reads in bare requests. Before each measurement it waits (`--quiet-wait`, 30 s at most)
for the machine to be quiet, and flags a run that shared it. `--profile` runs the server under
cProfile and prints where its event loop's time goes (it slows the server: its latencies are then
not the product's). Results: bench/results/auction.json.

Targets (issue 34): at 200 pings/s, answer p50 < 15 ms, p99 < 40 ms, own share p99 < 10 ms; with a
buyer that never answers and a 300 ms round, p99 < 320 ms; every posted ping sold exactly once;
resident memory of all processes < 300 MB.

    python -m bench.auction [--duration 20] [--rate 200] [--scenario both|main|never|one ...] [--post-fraction 1]
                            [--warmup 2] [--connections 256] [--bare-duration 10] [--quiet-wait 30]
                            [--profile [--top 30]] [--keep] [--out FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import platform
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
import msgspec

from bench.bare_app import sample_lead
from bench.campaigns_list import (
    ROOT,
    _version,
    appliance_cli,
    cpu_seconds,
    machine_cpu_seconds,
    stop_all,
    tree_cpu_seconds,
)
from bench.delivery import JobCounter, OpenLoop, OpenLoopResult, _Conn, _new_loop, pct
from bench.loadgen import Request, encode_request, free_port, wait_for_port
from bench.submit import bare_request, measure

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_P50_MS, TARGET_P99_MS, TARGET_OWN_P99_MS, TARGET_NEVER_P99_MS, TARGET_RSS_MB = 15.0, 40.0, 10.0, 320.0, 300.0
IN_TIME = ("bid", "no_bid", "below_floor", "error")  # answered before the round closed (not timeout, skipped)


# ---- setup ------------------------------------------------------------------------------------------

def endpoint(index: int, port: int) -> dict[str, Any]:
    return {
        "deliveryEndpointId": f"bidder-{index}", "adapter": "http",
        "url": f"http://127.0.0.1:{port}/post", "method": "POST", "bodyFormat": "json", "timeoutSeconds": 10,
        "fieldMapping": [
            {"clientKey": "first_name", "leadField": "firstName", "required": True},
            {"clientKey": "last_name", "leadField": "lastName", "required": True},
            {"clientKey": "email", "leadField": "email", "required": True},
            {"clientKey": "phone", "leadField": "phoneE164", "required": True},
            {"clientKey": "state", "leadField": "address.state"},
            {"clientKey": "zip", "leadField": "address.zip"},
            {"clientKey": "token", "leadField": "auction.pingToken", "required": True},
            {"clientKey": "price", "leadField": "auction.bid", "type": "number"},
        ],
        "responseRules": {"success": {"statusCodes": [200]}, "clientLeadIdPath": "id"},
        "ping": {
            "url": f"http://127.0.0.1:{port}/ping", "method": "POST", "bodyFormat": "json",
            "fieldMapping": [
                {"clientKey": "state", "leadField": "address.state", "required": True},
                {"clientKey": "zip", "leadField": "address.zip"},
                {"clientKey": "age", "leadField": "age", "type": "integer"},
            ],
            "responseRules": {"bidPath": "bid", "pingTokenPath": "token"},
        },
    }


def campaign(campaign_id: str, name: str, bidders: list[int], timeout_ms: int | None) -> dict[str, Any]:
    auction: dict[str, Any] = {"mode": "exclusive", "floor": 1, "currency": "USD", "bidTtlSeconds": 60,
                               "noBid": "fail", "margin": {"percent": 20}}
    if timeout_ms is not None:
        auction["timeoutMs"] = timeout_ms
    return {
        "campaignId": campaign_id, "name": name,
        "client": {"clientId": "cli-bench", "clientName": "Bench Buyers"},
        "offer": {"offerId": "off-bench", "offerName": "Bench"},
        "qualification": {"rules": [{"name": "Adults", "logicalOperator": "AND", "subRules": [
            {"logicalOperator": "AND", "conditions": [
                {"field": "age", "operator": "less_than", "value": [18], "maxSeverity": "disqualify"}]}]}]},
        "delivery": {"distribution": {"method": "auction", "auction": auction,
                                      "endpoints": [{"deliveryEndpointId": f"bidder-{i}"} for i in bidders]}},
    }


SCENARIOS = {"main": "AUC1", "never": "AUCN", "one": "AUC0"}


def bundle(ports: list[int], buyers: int, never_timeout_ms: int) -> dict[str, Any]:
    """`buyers` answering buyers and one more (the last port) that never answers."""
    return {
        "deliveryEndpoints": [endpoint(i, port) for i, port in enumerate(ports)],
        "campaigns": [
            campaign("AUC1", "Auction, 10 buyers", list(range(buyers)), None),
            campaign("AUCN", "Auction, one buyer never answers", [*range(buyers - 1), buyers], never_timeout_ms),
            campaign("AUC0", "Auction, one buyer", [0], None),
        ],
    }


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# ---- processes: CPU and memory ---------------------------------------------------------------------

def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return 0.0


class Processes:
    """The run's processes by role; the appliance's children (its delivery process) found live.
    `client` is the load client's process while one runs; `orchestrator` is this script."""

    def __init__(self, app: subprocess.Popen, bidders: subprocess.Popen, bare: subprocess.Popen) -> None:
        self.app, self.bidders, self.bare = app, bidders, bare
        self.client: int | None = None

    def roles(self) -> dict[str, int]:
        out = {"server": self.app.pid}
        for pid in tree_cpu_seconds(self.app.pid):
            if pid != self.app.pid:
                out["delivery" if "delivery" not in out else f"child {pid}"] = pid
        out["bidders"] = self.bidders.pid
        if self.client is not None:
            out["client"] = self.client
        out.update({"bare": self.bare.pid, "orchestrator": os.getpid()})
        return out

    def cpu(self) -> dict[str, float]:
        return {role: cpu_seconds(pid) if role != "orchestrator" else sum(os.times()[:2])
                for role, pid in self.roles().items()}

    def kernel(self) -> dict[str, float]:
        return {role: kernel_seconds(pid) for role, pid in self.roles().items() if role not in OUTSIDE}


def kernel_seconds(pid: int) -> float:
    """stime of a process (all its threads): its CPU spent in the kernel (syscalls: sockets, disk)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[12]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


OUTSIDE = ("bare", "orchestrator")  # running beside the system measured, not part of it


class RssSampler:
    """Resident memory of every process, each second."""

    def __init__(self, procs: Processes) -> None:
        self.procs, self.samples, self._stop = procs, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self.samples.append({role: rss_mb(pid) for role, pid in self.procs.roles().items()})
            if self._stop.wait(1.0):
                return

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        system = [sum(v for k, v in s.items() if k not in OUTSIDE) for s in self.samples]
        every = [sum(s.values()) for s in self.samples]
        roles = sorted({k for s in self.samples for k in s})
        return {"by_process_max_mb": {r: round(max(s.get(r, 0.0) for s in self.samples), 1) for r in roles},
                "sum_max_mb": round(max(system), 1), "sum_with_bare_and_orchestrator_max_mb": round(max(every), 1),
                "largest_process_mb": round(max(max(v for k, v in s.items() if k not in OUTSIDE)
                                                for s in self.samples), 1),
                "samples": len(self.samples)}


# ---- the client: pings at a fixed rate, each accepted one posted with its pingId --------------------

class PingLoop(OpenLoop):
    """bench/delivery.py's open-loop client offering pings; each accepted ping chosen by
    `post_fraction` is posted at once, on the same connection pool, with its pingId and the
    full lead. Requests 0..total-1 are the pings; posts are appended after them as they come."""

    def __init__(self, port: int, key: str, rate: float, duration: float, connections: int, first_n: int,
                 jobs: JobCounter | None, campaign_id: str, post_fraction: float) -> None:
        super().__init__(port, key, rate, duration, connections, first_n, jobs)
        self.campaign_id, self.post_fraction = campaign_id, post_fraction
        self.post_bodies: list[bytes] = [b""] * self.total  # the post's body less its pingId and closing brace
        self.pings: list[dict[str, Any] | None] = [None] * self.total
        self.post_of: dict[int, int] = {}  # request index of a post -> index of its ping
        self.lead_ids: dict[int, str] = {}  # ping index -> leadId of its post (201)
        self.post_statuses: Counter = Counter()
        self.problems: list[str] = []  # the first few non-2xx answers, for the report
        self.prebuilt = [self._build(i) for i in range(self.total)]  # before the clock starts

    def request(self, index: int) -> bytes:
        return self.prebuilt[index]

    def _build(self, index: int) -> bytes:
        lead = sample_lead(self.first_n + index)
        ping = {k: v for k, v in lead.items() if k not in ("firstName", "lastName", "email", "phone")}
        body = msgspec.json.encode({"campaignId": self.campaign_id, **ping, "emailHash": digest(lead["email"]),
                                    "phoneHash": digest(lead["phone"])})
        self.post_bodies[index] = msgspec.json.encode({"campaignId": self.campaign_id, **lead})[:-1]
        return encode_request(Request("POST", "/api/v1/leads/ping", {"X-API-Key": self.key,
                                      "Content-Type": "application/json"}, body), self.hostname)

    def chosen(self, index: int) -> bool:
        f = self.post_fraction
        return f >= 1.0 or int((index + 1) * f) > int(index * f)

    def post(self, ping_index: int, ping_id: str) -> None:
        body = self.post_bodies[ping_index] + b',"pingId":"' + ping_id.encode() + b'"}'
        data = encode_request(Request("POST", "/api/v1/leads/submit", {"X-API-Key": self.key,
                                      "Content-Type": "application/json"}, body), self.hostname)
        r = self.result
        index = len(self.requests)
        self.requests.append(data)
        r.scheduled.append(time.monotonic())
        r.sent.append(0.0)
        r.answered.append(0.0)
        r.statuses.append(0)
        r.submission.append(None)
        self.post_of[index] = ping_index
        self.dispatch(index)

    def done(self, conn: _Conn, status: int, body: bytes) -> None:
        r, i = self.result, conn.index
        r.answered[i] = time.monotonic()
        r.statuses[i] = status
        if i < self.total:
            if status == 200:
                data = self.decoder.decode(body).data or {}
                self.pings[i] = data
                if data.get("accepted") and self.chosen(i):
                    self.post(i, data["pingId"])  # before _finish_one: the run is not over yet
            elif len(self.problems) < 5:
                self.problems.append(f"ping {status}: {body[:300]!r}")
        else:
            self.post_statuses[status] += 1
            if status == 201:
                data = self.decoder.decode(body).data or {}
                r.submission[i] = data.get("submissionId")
                self.lead_ids[self.post_of[i]] = data.get("leadId")
                r.lead_status[data.get("status")] += 1
            elif len(self.problems) < 5:
                self.problems.append(f"post {status}: {body[:300]!r}")
        self._finish_one()
        self._next(conn)


@dataclass
class PingRun:
    """What a client process hands back: PingLoop's records."""
    total: int
    result: OpenLoopResult
    pings: list[dict[str, Any] | None]
    post_of: dict[int, int]
    lead_ids: dict[int, str]
    post_statuses: Counter
    problems: list[str]


def _client_main(params: dict[str, Any], conn: Any) -> None:
    """The load client's process: build every request, say ready, run on "go", send the records
    back, and stay alive (its CPU still readable) until "bye"."""
    client = PingLoop(**params)
    conn.send("ready")
    conn.recv()
    loop = _new_loop()
    try:
        loop.run_until_complete(client.run())
    finally:
        loop.close()
    conn.send(PingRun(client.total, client.result, client.pings, client.post_of, client.lead_ids,
                      client.post_statuses, client.problems))
    conn.recv()


class ClientProcess:
    """The open-loop client in a process of its own, so its CPU and memory are the load
    generator's alone (not this script's bookkeeping)."""

    def __init__(self, **params: Any) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        self.duration = params["duration"]
        self.proc = ctx.Process(target=_client_main, args=(params, theirs), daemon=True)
        self.proc.start()
        if not self.conn.poll(120) or self.conn.recv() != "ready":
            raise RuntimeError("the load client process did not start")

    @property
    def pid(self) -> int:
        return self.proc.pid  # type: ignore[return-value]

    def run(self) -> PingRun:
        self.conn.send("go")
        if not self.conn.poll(self.duration + 180):
            raise RuntimeError("the load client process did not finish")
        return self.conn.recv()

    def close(self) -> None:
        try:
            self.conn.send("bye")
        except OSError:
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def run_pings(procs: Processes, **params: Any) -> PingRun:
    client = ClientProcess(**params)
    try:
        procs.client = client.pid
        return client.run()
    finally:
        client.close()
        procs.client = None


# ---- the bidders' control port and the API --------------------------------------------------------

def bidders_get(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_bidders/{path}", timeout=30) as resp:
        return json.loads(resp.read())


def bidders_reset(port: int) -> None:
    urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/_bidders/reset", method="POST"),
                           timeout=10).read()


def wait_drained(jobs: JobCounter, control_port: int, wanted: int, timeout: float) -> bool:
    """Until no deliver job is open and the buyers hold `wanted` posted leads, or the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if jobs.open_jobs() == 0 and sum(b["keys"] for b in bidders_get(control_port, "stats")["buyers"]) >= wanted:
            return True
        time.sleep(0.1)
    return False


def lead_rounds(port: int, key: str, lead_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """GET /api/v1/leads/{leadId}/auctions of each lead, a few at a time (after the load)."""

    def one(lead_id: str) -> tuple[str, list[dict[str, Any]]]:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/leads/{lead_id}/auctions",
                                     headers={"X-API-Key": key})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return lead_id, json.loads(resp.read())["data"]["items"]

    with ThreadPoolExecutor(8) as pool:
        return dict(pool.map(one, lead_ids))


def lead_statuses(db: Path, lead_ids: list[str]) -> Counter:
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    conn.setbusytimeout(5000)
    try:
        found: Counter = Counter()
        for start in range(0, len(lead_ids), 500):
            chunk = lead_ids[start:start + 500]
            found.update(status for (status,) in conn.execute(
                f"SELECT status FROM leads WHERE lead_id IN ({','.join('?' * len(chunk))})", chunk))
        return found
    finally:
        conn.close()


# ---- one scenario ---------------------------------------------------------------------------------

def summary_ms(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": round(pct(values, 50), 2), "p90": round(pct(values, 90), 2),
            "p99": round(pct(values, 99), 2), "max": round(max(values), 2) if values else float("nan")}


def wait_quiet(procs: Processes, threshold_pct: float, limit_s: float) -> float:
    """Until the CPU used outside this benchmark's processes over one second is under
    `threshold_pct` of a core (a test suite running beside would skew every figure), at most
    `limit_s`; returns the last reading."""
    deadline, other = time.monotonic() + limit_s, float("nan")
    while True:
        cpu0, (busy0, irq0), t0 = procs.cpu(), machine_cpu_seconds(), time.monotonic()
        time.sleep(1.0)
        cpu1, (busy1, irq1), t1 = procs.cpu(), machine_cpu_seconds(), time.monotonic()
        ours = sum(cpu1[r] - cpu0.get(r, cpu1[r]) for r in cpu1)
        other = 100 * ((busy1 - busy0) + (irq1 - irq0) - ours) / (t1 - t0)
        if other < threshold_pct or time.monotonic() >= deadline:
            return round(other, 1)
        print(f"  the machine is busy outside the benchmark ({other:.0f}% of a core): waiting", flush=True)


def scenario(name: str, args: argparse.Namespace, port: int, key: str, control_port: int, procs: Processes,
             jobs: JobCounter, db: Path, first_n: int) -> dict[str, Any]:
    campaign_id = SCENARIOS[name]
    print(f"[{name}] warm-up {args.warmup:g} s at {args.rate:g} pings/s ...", flush=True)
    common = {"port": port, "key": key, "rate": args.rate, "connections": args.connections, "jobs": None,
              "campaign_id": campaign_id}
    warm = run_pings(procs, **common, duration=args.warmup, first_n=first_n, post_fraction=1.0)
    wait_drained(jobs, control_port, len(warm.lead_ids), args.drain_timeout)
    bidders_reset(control_port)

    other_before = wait_quiet(procs, args.quiet_pct, args.quiet_wait) if args.quiet_wait > 0 else None
    print(f"[{name}] {args.rate:g} pings/s for {args.duration:g} s ...", flush=True)
    runner = ClientProcess(**common, duration=args.duration, first_n=first_n + 1_000_000,
                           post_fraction=args.post_fraction)
    try:
        procs.client = runner.pid
        rss = RssSampler(procs)
        kernel0 = procs.kernel()
        cpu0, (busy0, irq0), t0 = procs.cpu(), machine_cpu_seconds(), time.monotonic()
        client = runner.run()
        cpu1, (busy1, irq1), t1 = procs.cpu(), machine_cpu_seconds(), time.monotonic()
        kernel1 = procs.kernel()
        posted = [i for i in client.lead_ids if client.lead_ids[i]]
        drained = wait_drained(jobs, control_port, len(posted), args.drain_timeout)
        cpu2, t2 = procs.cpu(), time.monotonic()
        memory = rss.stop()
    finally:
        runner.close()
        procs.client = None
    stats = bidders_get(control_port, "stats")["buyers"]
    posts = bidders_get(control_port, "posts")["buyers"]
    fetched = time.monotonic()
    rounds = lead_rounds(port, key, [client.lead_ids[i] for i in posted])
    fetch_s = time.monotonic() - fetched
    statuses = lead_statuses(db, [client.lead_ids[i] for i in posted])

    r = client.result
    n = client.total
    answered = [i for i in range(n) if r.answered[i] and r.statuses[i] == 200]
    answer_ms = {i: 1000 * (r.answered[i] - r.scheduled[i]) for i in answered}
    accepted = [i for i in answered if (client.pings[i] or {}).get("accepted")]
    reasons = Counter((client.pings[i] or {}).get("reason") for i in answered if i not in set(accepted))

    # Per round (posted leads): own share = answer - slowest in-time buyer; outside = answer - durationMs.
    own, outside, slowest, duration, outcomes = [], [], [], [], Counter()
    arrivals: dict[str, list[tuple[int, float, str | None]]] = {}
    for b, keys in enumerate(posts):
        for k, seen in keys.items():
            arrivals.setdefault(k, []).extend((b, at, token) for at, token in seen)
    sale = Counter()
    bad: list[str] = []
    post_index = {q: p for p, q in client.post_of.items()}
    for i in posted:
        lead_id = client.lead_ids[i]
        items = rounds.get(lead_id) or []
        if len(items) != 1:
            sale["not one round"] += 1
            bad.append(f"{lead_id}: {len(items)} rounds")
            continue
        rnd = items[0]
        outcomes.update(b["outcome"] for b in rnd["bids"])
        times = [b["responseMs"] for b in rnd["bids"] if b["outcome"] in IN_TIME and b["responseMs"] is not None]
        if times:
            slowest.append(max(times))
            own.append(answer_ms[i] - max(times))
        duration.append(rnd["durationMs"])
        outside.append(answer_ms[i] - rnd["durationMs"])
        # Sold exactly once: one post, at the round's winner, carrying that buyer's token.
        got = arrivals.get(r.submission[post_index[i]], [])
        winners = [int(w.rsplit("-", 1)[1]) for w in rnd["winners"]]
        if not got:
            sale["never posted to a buyer"] += 1
            bad.append(f"{lead_id}: no post")
        elif len(got) > 1:
            sale["sold twice (different buyers)" if len({g[0] for g in got}) > 1 else "posted twice to one buyer"] += 1
            bad.append(f"{lead_id}: {len(got)} posts at buyers {[g[0] for g in got]}")
        elif [got[0][0]] != winners:
            sale["sold to a buyer that did not win"] += 1
            bad.append(f"{lead_id}: posted to {got[0][0]}, winners {winners}")
        elif not (got[0][2] or "").startswith(f"b{got[0][0]}-"):
            sale["token not the winner's"] += 1
            bad.append(f"{lead_id}: token {got[0][2]!r} at buyer {got[0][0]}")
        else:
            sale["sold once to the winner"] += 1

    wall = t1 - t0
    cpu_load = {role: round(cpu1[role] - cpu0.get(role, cpu1[role]), 3) for role in cpu1}
    cpu_all = {role: round(cpu2[role] - cpu0.get(role, cpu2[role]), 3) for role in cpu2}
    machine = (busy1 - busy0) + (irq1 - irq0)
    outbound = sum(s["pings"] for s in stats)
    out = {
        "campaign": campaign_id, "offered_rate": args.rate, "duration_s": args.duration,
        "post_fraction": args.post_fraction,
        "pings": n, "answered_200": len(answered), "accepted": len(accepted), "refused": dict(reasons),
        "posted": len(client.post_of), "posts_201": len(posted), "post_statuses": dict(client.post_statuses),
        "ping_statuses": dict(Counter(r.statuses[i] for i in range(n))), "client_errors": dict(r.errors),
        "max_backlog": r.max_backlog, "problems": client.problems,
        "answer_ms": summary_ms(list(answer_ms.values())),
        "answer_from_sent_ms": summary_ms([1000 * (r.answered[i] - r.sent[i]) for i in answered]),
        "post_answer_ms": summary_ms([1000 * (r.answered[p] - r.scheduled[p]) for p in client.post_of
                                      if r.answered[p]]),
        "rounds": {"n": len(duration), "slowest_in_time_buyer_ms": summary_ms(slowest),
                   "duration_ms": summary_ms(duration), "bid_outcomes": dict(outcomes), "fetch_s": round(fetch_s, 1)},
        "own_share_ms": summary_ms(own),
        "outside_round_ms": summary_ms(outside),
        "answer_less_delay_ms": summary_ms([answer_ms[i] - args.delay_ms for i in accepted]),
        "sales": dict(sale), "sale_problems": bad[:10], "drained": drained, "lead_statuses": dict(statuses),
        "bidders": {"outbound_pings": outbound, "outbound_pings_per_s": round(outbound / wall, 1),
                    "answered": sum(s["answered"] for s in stats), "posts": sum(s["posts"] for s in stats),
                    "duplicates": sum(s["duplicates"] for s in stats), "noKey": sum(s["noKey"] for s in stats),
                    "timer_late_ms_p99_worst": max((s["timerLateMs"]["p99"] or 0) for s in stats),
                    "never_pings": sum(s["pings"] for s in stats if s["never"])},
        "load_wall_s": round(wall, 2), "drain_s": round(t2 - t1, 2),
        "cpu_s_load": cpu_load, "cpu_s_with_drain": cpu_all,
        "cpu_pct_of_core_load": {role: round(100 * v / wall, 1) for role, v in cpu_load.items()},
        "kernel_share_pct_load": {role: round(100 * (kernel1[role] - kernel0.get(role, kernel1[role]))
                                              / max(cpu_load[role], 1e-9), 1) for role in kernel1 if role in cpu_load},
        "cpu_us_per_ping": {role: round(1e6 * v / max(1, len(answered))) for role, v in cpu_all.items()},
        "machine_busy_pct": round(100 * machine / (wall * (os.cpu_count() or 1)), 1),
        "other_cpu_pct": round(100 * (machine - sum(cpu_load.values())) / wall, 1),
        "memory": memory, "other_cpu_pct_before": other_before,
    }
    return out


# ---- main -------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.auction", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of offered pings per scenario")
    parser.add_argument("--rate", type=float, default=200.0, help="inbound pings offered per second")
    parser.add_argument("--scenario", choices=("both", "main", "never", "one"), action="append",
                        help="main, never, or both (default); one: a single buyer, to price an outbound ping "
                             "against main (repeatable)")
    parser.add_argument("--post-fraction", type=float, default=1.0, help="accepted pings posted (0..1)")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--connections", type=int, default=256, help="client connections (a pool: open loop)")
    parser.add_argument("--buyers", type=int, default=10)
    parser.add_argument("--delay-ms", type=float, default=5.0, help="the buyers' time to answer a ping")
    parser.add_argument("--never-timeout-ms", type=int, default=300)
    parser.add_argument("--bare-duration", type=float, default=10.0)
    parser.add_argument("--bare-connections", type=int, default=64)
    parser.add_argument("--drain-timeout", type=float, default=60.0)
    parser.add_argument("--quiet-wait", type=float, default=30.0,
                        help="before each measurement, wait up to this many seconds for the machine to be quiet")
    parser.add_argument("--quiet-pct", type=float, default=15.0, help="quiet: CPU outside the benchmark under this")
    parser.add_argument("--profile", action="store_true",
                        help="run the appliance server under cProfile (its event-loop thread) and print where its "
                             "CPU goes; slows the server down, so its latencies are not the product's")
    parser.add_argument("--top", type=int, default=30, help="with --profile: functions shown")
    parser.add_argument("--keep", action="store_true", help="keep the data folder and logs")
    parser.add_argument("--out", type=Path, default=RESULTS / "auction.json")
    args = parser.parse_args(argv)
    names = [n for s in (args.scenario or ["both"]) for n in (["main", "never"] if s == "both" else [s])]

    work = Path(tempfile.mkdtemp(prefix="bench-auction-"))
    started: list[subprocess.Popen] = []
    results: dict[str, Any] = {}
    app: subprocess.Popen | None = None
    try:
        port, bare_port, control_port = free_port(), free_port(), free_port()
        bidder_ports = [free_port() for _ in range(args.buyers + 1)]  # the last one never answers
        config = work / "appliance.toml"
        config.write_text(f'[server]\nlog_level = "warning"\n[storage]\npath = "{work / "data"}"\n'
                          f'[security]\nrate_limit_per_minute = 0\n[delivery]\nallow_private_addresses = true\n'
                          f'[plugins]\ndirs = []\n')
        appliance_cli(config, "init")
        tenant = json.loads(appliance_cli(config, "tenant", "create", "Bench", "--json"))["tenantId"]
        key = json.loads(appliance_cli(config, "key", "create", "--tenant", tenant, "--json"))["key"]
        (work / "bundle.json").write_text(json.dumps(bundle(bidder_ports, args.buyers, args.never_timeout_ms)))
        appliance_cli(config, "import", "--tenant", tenant, str(work / "bundle.json"))

        def start(name: str, cmd: list[str], listen: int) -> subprocess.Popen:
            log = open(work / f"{name}.log", "wb")
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            started.append(proc)
            wait_for_port(listen, proc=proc)
            return proc

        bidders = start("bidders", [sys.executable, "-m", "bench.bidders", "--ports",
                                    ",".join(map(str, bidder_ports)), "--control-port", str(control_port),
                                    "--delay-ms", str(args.delay_ms), "--never", str(args.buyers)], control_port)
        for p in bidder_ports:
            wait_for_port(p, proc=bidders)
        profiler = ["-m", "cProfile", "-o", str(work / "server.prof")] if args.profile else []
        app = start("appliance", [sys.executable, *profiler, "-m", "appliance", "--config", str(config), "serve",
                                  "--port", str(port)], port)
        bare = start("bare", [sys.executable, "-m", "bench.bare_app", "--port", str(bare_port)], bare_port)
        time.sleep(1.0)  # the delivery process starts after the server listens
        procs = Processes(app, bidders, bare)
        db = work / "data" / "appliance.db"
        jobs = JobCounter(db)
        for k, name in enumerate(names):
            results[name] = scenario(name, args, port, key, control_port, procs, jobs, db, (k + 1) * 2_000_000)
        jobs.close()
        bare_args = argparse.Namespace(connections=args.bare_connections, warmup=2.0, duration=args.bare_duration,
                                       processes=1, profile_threads=False)
        print(f"[bare] decode endpoint, {args.bare_connections} connections for {args.bare_duration:g} s ...",
              flush=True)
        bare_run = measure("bare decode", f"http://127.0.0.1:{bare_port}/decode", bare_request, bare, bare_args)
        roles = procs.roles()
        log_tail = (work / "appliance.log").read_text(errors="replace")[-2000:]
    finally:
        if args.profile and app is not None and app.poll() is None:
            # uvicorn re-raises the signal it stopped on: SIGTERM's default action would end the
            # process before cProfile writes its file; SIGINT's KeyboardInterrupt lets it write.
            app.send_signal(signal.SIGINT)
            try:
                app.wait(30)
            except subprocess.TimeoutExpired:
                pass
        stop_all(started, timeout=30)
        profile = profile_summary(work / "server.prof", args.top) if args.profile else None
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    report(results, bare_run, args, log_tail)
    if profile is not None:
        print_profile(profile)
    checks = judge(results)
    print("targets: " + "; ".join(f"{k}: {'PASS' if v else 'MISS'}" for k, v in checks.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "auction", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "versions": {n: _version(n) for n in ("litestar", "msgspec", "uvicorn", "uvloop", "httptools", "apsw")},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "processes": list(roles), "scenarios": results, "bare": bare_run, "checks": checks, "profile": profile,
        "appliance_log_tail": log_tail}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


def _where(file: str, func: str) -> str:
    """A function's package: appliance.<module>, a site-packages distribution, stdlib:<module>, or C."""
    if file == "~":
        return "C: " + func.split(" of ")[-1].strip("<>'") if " of " in func else "C: builtins"
    path = file.replace("\\", "/")
    if "/site-packages/" in path:
        return path.split("/site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if "/appliance/" in path:
        return "appliance." + path.rsplit("/appliance/", 1)[1].removesuffix(".py").replace("/", ".")
    if "/bench/" in path:
        return "bench"
    parts = path.split("/")
    lib = [i for i, p in enumerate(parts) if p.startswith("python3")]
    return "stdlib:" + (parts[lib[-1] + 1].removesuffix(".py") if lib and len(parts) > lib[-1] + 1 else path)


def profile_summary(path: Path, top: int) -> dict[str, Any] | None:
    """The server's cProfile: self time by package and by function, and the appliance's functions by
    inclusive time (a coroutine's inclusive time is the CPU of its resumptions, waits excluded).
    uvloop runs in C inside asyncio.run, so run()'s own time is uvloop's C work and the idle waits
    together; the percentages are of the rest, the Python code the loop ran."""
    if not path.exists():
        print(f"no profile written at {path}")
        return None
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    loop_self = sum(tt for (file, _line, func), (_cc, _nc, tt, _ct, _c) in stats.items()
                    if func == "run" and file.endswith("asyncio/runners.py"))
    busy = sum(tt for _cc, _nc, tt, _ct, _callers in stats.values()) - loop_self or 1.0
    by_package: Counter = Counter()
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in stats.items():
        if func == "run" and file.endswith("asyncio/runners.py"):
            continue
        where = _where(file, func)
        by_package[where] += tt
        name = func if file == "~" else f"{where}:{line}({func})"
        rows.append((tt, ct, nc, name, where.startswith("appliance.")))
    return {
        "python_s": round(busy, 2), "loop_and_idle_s": round(loop_self, 2),
        "self_by_package_pct": {k: round(100 * v / busy, 1) for k, v in by_package.most_common(top)},
        "self_by_function": [{"pct": round(100 * tt / busy, 1), "calls": nc, "function": name}
                             for tt, _ct, nc, name, _a in sorted(rows, reverse=True)[:top]],
        "appliance_inclusive": [{"pct": round(100 * ct / busy, 1), "calls": nc, "function": name}
                                for _tt, ct, nc, name, ours in sorted(rows, key=lambda r: -r[1]) if ours][:top],
    }


def print_profile(profile: dict[str, Any]) -> None:
    print(f"\nserver process under cProfile, its event-loop thread: {profile['python_s']} s of Python code "
          f"(percentages below are of it; start-up and warm-ups included), {profile['loop_and_idle_s']} s in "
          "asyncio.run itself (uvloop's C code and the idle waits)")
    print("self time by package: " + ", ".join(f"{k} {v}%" for k, v in profile["self_by_package_pct"].items()))
    print("self time by function:")
    for row in profile["self_by_function"]:
        print(f"  {row['pct']:5.1f}%  {row['calls']:>9}  {row['function']}")
    print("the appliance's functions by inclusive time:")
    for row in profile["appliance_inclusive"]:
        print(f"  {row['pct']:5.1f}%  {row['calls']:>9}  {row['function']}")


def judge(results: dict[str, Any]) -> dict[str, bool]:
    checks: dict[str, bool] = {}
    main_run, never = results.get("main"), results.get("never")
    if main_run:
        checks[f"p50 < {TARGET_P50_MS:g} ms"] = main_run["answer_ms"]["p50"] < TARGET_P50_MS
        checks[f"p99 < {TARGET_P99_MS:g} ms"] = main_run["answer_ms"]["p99"] < TARGET_P99_MS
        checks[f"own share p99 < {TARGET_OWN_P99_MS:g} ms"] = main_run["own_share_ms"]["p99"] < TARGET_OWN_P99_MS
    if never:
        checks[f"never: p99 < {TARGET_NEVER_P99_MS:g} ms"] = never["answer_ms"]["p99"] < TARGET_NEVER_P99_MS
    for name, run in results.items():
        if run["posted"] == 0 and run["post_fraction"] == 0:
            checks[f"{name}: RSS total < {TARGET_RSS_MB:g} MB"] = run["memory"]["sum_max_mb"] < TARGET_RSS_MB
            continue  # nothing posted: no sale to judge
        sold = run["sales"].get("sold once to the winner", 0)
        checks[f"{name}: every posted ping sold once"] = (
            run["drained"] and sold == run["posts_201"] == run["posted"] > 0 and run["answered_200"] == run["pings"])
        checks[f"{name}: RSS total < {TARGET_RSS_MB:g} MB"] = run["memory"]["sum_max_mb"] < TARGET_RSS_MB
    return checks


def report(results: dict[str, Any], bare: dict[str, Any], args: argparse.Namespace, log_tail: str) -> None:
    bare_us = bare["server_cpu_us_per_request"]
    print(f"\nbare decode: {bare['rps']:.0f} req/s, p99 {bare['latency_ms']['p99']:.1f} ms, "
          f"{bare_us:.0f} us of server CPU a request")
    for name, run in results.items():
        a, own, out, est = run["answer_ms"], run["own_share_ms"], run["outside_round_ms"], run["answer_less_delay_ms"]
        rounds = run["rounds"]
        print(f"\n== {name} ({run['campaign']}): {run['pings']} pings offered at {run['offered_rate']:g}/s, "
              f"{run['answered_200']} answered 200, {run['accepted']} accepted, refused {run['refused'] or '-'}; "
              f"{run['bidders']['outbound_pings_per_s']:.0f} outbound pings/s")
        print(f"ping answer ms (from the due moment): p50 {a['p50']} p90 {a['p90']} p99 {a['p99']} max {a['max']}; "
              f"post (submit with pingId) p50 {run['post_answer_ms']['p50']} p99 {run['post_answer_ms']['p99']}")
        print(f"rounds ({rounds['n']}): slowest in-time buyer p50 {rounds['slowest_in_time_buyer_ms']['p50']} "
              f"p99 {rounds['slowest_in_time_buyer_ms']['p99']} ms, durationMs p50 {rounds['duration_ms']['p50']} "
              f"p99 {rounds['duration_ms']['p99']}; bids {rounds['bid_outcomes']}")
        print(f"own share (answer - slowest in-time buyer) p50 {own['p50']} p99 {own['p99']} ms; outside the round "
              f"(answer - durationMs) p50 {out['p50']} p99 {out['p99']}; answer - {args.delay_ms:g} ms p50 "
              f"{est['p50']} p99 {est['p99']}")
        print(f"sales: {run['sales']} of {run['posts_201']} posted (201) / {run['posted']} sent; drained "
              f"{run['drained']}; lead statuses {run['lead_statuses']}; post statuses {run['post_statuses']}; "
              f"buyers' duplicate posts {run['bidders']['duplicates']}")
        if run["sale_problems"] or run["problems"]:
            print("problems: " + "; ".join(run["sale_problems"] + run["problems"]))
        cpu, pcts, per = run["cpu_s_load"], run["cpu_pct_of_core_load"], run["cpu_us_per_ping"]
        print("CPU over the load (s, % of a core, us a ping incl. drain): " + ", ".join(
            f"{role} {cpu[role]:.2f} s {pcts[role]:.0f}% {per[role]} us" for role in cpu)
            + f"; machine {run['machine_busy_pct']}% busy (all cores), other {run['other_cpu_pct']}%"
            + (" (NOT QUIET: another job shared the machine, figures skewed)" if run["other_cpu_pct"] > 25 else ""))
        print("of which in the kernel (syscalls): " + ", ".join(f"{k} {v}%" for k, v in run["kernel_share_pct_load"].items()))
        server_us = per.get("server", 0)
        print(f"server CPU a ping = {server_us / bare_us:.1f} bare decode requests; at {run['offered_rate']:g}/s "
              f"the server process needs {server_us * run['offered_rate'] / 1e4:.0f}% of a core")
        mem = run["memory"]
        print(f"resident memory: peak of the sum {mem['sum_max_mb']} MB (appliance, bidders, client; with the bare "
              f"app and this script {mem['sum_with_bare_and_orchestrator_max_mb']} MB), largest process "
              f"{mem['largest_process_mb']} MB; by process "
              + ", ".join(f"{k} {v}" for k, v in mem["by_process_max_mb"].items()))
    if "Traceback" in log_tail or "ERROR" in log_tail:
        print("\nappliance log (tail):\n" + log_tail)


if __name__ == "__main__":
    sys.exit(main())
