"""The product as shipped (issue 20): one `appliance serve` with its defaults, intake and delivery
at once, beside the bare decode endpoint in the same run, nothing pinned (the machine's cores are
the product's to use; the load client and the buyer share them and their CPU is reported).

The tenant is bench.submit's (campaign BEN1: 10 rule sets, 3 routing rules, dedupe on) with every
campaign delivering to bench/buyer.py on loopback, so each qualified lead is also delivered while
the submits are measured.

(1) closed loop, `--connections` (64) for `--duration` (10) s: submits/s, p50/p99, against the
    bare endpoint (bench/bare_app.py) measured the same way; the ratio appliance / bare; then the
    queue must drain with every qualified lead at the buyer.
(2) open loop, `--rate` (1,000) leads/s for `--open-duration` (20) s (bench/delivery.py's client:
    latency from the scheduled moment): submit p50/p99 and submit-to-delivered p50/p99.
Resident memory and CPU: the server's process tree (its delivery process too), memory sampled every
second under load; for the open loop also the CPU per acknowledged lead of each of its processes and
how busy the whole machine was (a fixed rate's latency depends on the headroom left).
`--delivery-process shared` measures delivery inside the server's process.

Targets (issue 20): ratio >= 0.50, p99 < 20 ms at 64 connections, submit-to-delivered p50 < 10 ms
at 1,000 leads/s with every lead delivered, resident memory < 300 MB.

    python -m bench.product [--duration 10] [--connections 64] [--rate 1000] [--open-duration 20]
                            [--delivery-process auto|own|shared]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

from bench import submit as submit_bench
from bench.campaigns_list import ROOT, _version, appliance_cli, cpu_seconds, machine_cpu_seconds, stop_all, \
    tree_cpu_seconds
from bench.delivery import JobCounter, OpenLoop, bundle as delivery_bundle, buyer_get, buyer_reset, pct, \
    wait_drained, _new_loop
from bench.loadgen import Request, encode_request, free_port, wait_for_port
from bench.submit import bare_request, measure, submit_body, submit_request

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_RATIO, TARGET_P99_MS, TARGET_DELIVERED_P50_MS, TARGET_RSS_MB = 0.50, 20.0, 10.0, 300.0


def bundle(buyer_port: int) -> dict[str, Any]:
    """bench.submit's tenant, every campaign delivering to the loopback buyer."""
    tenant = submit_bench.bundle()
    tenant["deliveryEndpoints"] = delivery_bundle(buyer_port)["deliveryEndpoints"]
    endpoint_id = tenant["deliveryEndpoints"][0]["deliveryEndpointId"]
    for campaign in tenant["campaigns"]:
        campaign["delivery"] = {"deliveryEndpointId": endpoint_id}
    return tenant


class SubmitOpenLoop(OpenLoop):
    """bench/delivery.py's open-loop client with bench.submit's leads and campaign."""

    def request(self, index: int) -> bytes:
        return encode_request(Request("POST", "/api/v1/leads/submit", {"X-API-Key": self.key,
                                      "Content-Type": "application/json"}, submit_body(self.first_n + index)),
                              self.hostname)


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total / 1024


class RssSampler:
    def __init__(self, pid: int) -> None:
        self.pid, self.samples, self._stop = pid, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.samples.append(tree_rss_mb(self.pid))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.samples, default=tree_rss_mb(self.pid))

    def median(self) -> float:
        """The steady state: the middle sample under load."""
        ordered = sorted(self.samples) or [tree_rss_mb(self.pid)]
        return ordered[len(ordered) // 2]


class Product(NamedTuple):
    """What `start_product` started: the appliance, the bare endpoint and the buyer, their ports, and
    the tenant's API key."""
    key: str
    port: int
    bare_port: int
    buyer_port: int
    app: subprocess.Popen
    bare: subprocess.Popen
    buyer: subprocess.Popen


def start_product(work: Path, procs: list[subprocess.Popen], delivery_process: str) -> Product:
    """One `appliance serve` as shipped (but for what a benchmark must change: no rate limit, quiet
    logs, no plugins) with `bundle`'s tenant, its buyer, and the bare decode endpoint beside it; each
    process appended to `procs` as it starts, its log in `work`."""
    port, bare_port, buyer_port = free_port(), free_port(), free_port()
    config = work / "appliance.toml"
    config.write_text(f'[server]\nlog_level = "warning"\n[storage]\npath = "{work / "data"}"\n'
                      f'[security]\nrate_limit_per_minute = 0\n[delivery]\nallow_private_addresses = true\n'
                      f'process = "{delivery_process}"\n[plugins]\ndirs = []\n')
    appliance_cli(config, "init")
    tenant = json.loads(appliance_cli(config, "tenant", "create", "Bench", "--json"))["tenantId"]
    key = json.loads(appliance_cli(config, "key", "create", "--tenant", tenant, "--json"))["key"]
    (work / "bundle.json").write_text(json.dumps(bundle(buyer_port)))
    appliance_cli(config, "import", "--tenant", tenant, str(work / "bundle.json"))

    def start(name: str, cmd: list[str], listen: int) -> subprocess.Popen:
        log = open(work / f"{name}.log", "wb")
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        wait_for_port(listen, proc=proc)
        return proc

    buyer = start("buyer", [sys.executable, "-m", "bench.buyer", "--port", str(buyer_port)], buyer_port)
    app = start("appliance", [sys.executable, "-m", "appliance", "--config", str(config), "serve", "--port",
                              str(port)], port)
    bare = start("bare", [sys.executable, "-m", "bench.bare_app", "--port", str(bare_port)], bare_port)
    return Product(key, port, bare_port, buyer_port, app, bare, buyer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.product", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--open-duration", type=float, default=20.0)
    parser.add_argument("--drain-timeout", type=float, default=120.0)
    parser.add_argument("--delivery-process", choices=("auto", "own", "shared"), default="auto",
                        help="[delivery] process (default: as shipped)")
    parser.add_argument("--out", type=Path, default=RESULTS / "product.json")
    args = parser.parse_args(argv)
    args.processes, args.profile_threads = 1, False  # what bench.submit's measure() reads

    work = Path(tempfile.mkdtemp(prefix="bench-product-"))
    procs: list[subprocess.Popen] = []
    try:
        started = start_product(work, procs, args.delivery_process)
        port, bare_port, buyer_port, key = started.port, started.bare_port, started.buyer_port, started.key
        app, bare, buyer = started.app, started.bare, started.buyer
        submit_bench._KEY = os.environ["BENCH_SUBMIT_KEY"] = key
        jobs = JobCounter(work / "data" / "appliance.db")

        # (1) closed loop, delivery running beside the submits.
        rss = RssSampler(app.pid)
        buyer_cpu0 = cpu_seconds(buyer.pid)
        product = measure("appliance submit + delivery", f"http://127.0.0.1:{port}/api/v1/leads/submit",
                          submit_request, app, args)
        product["buyer_cpu_pct"] = round(100 * (cpu_seconds(buyer.pid) - buyer_cpu0) / product["elapsed_s"], 1)
        qualified = sum(n for status, n in jobs.lead_statuses().items() if status in ("qualified", "delivered"))
        drained = wait_drained(jobs, buyer_port, qualified, args.drain_timeout)
        product["rss_mb_max"] = round(rss.stop(), 1)
        product["rss_mb_median"] = round(rss.median(), 1)
        product["all_delivered"] = drained and jobs.lead_statuses().get("qualified", 0) == 0
        product["lead_statuses"] = jobs.lead_statuses()
        bare_run = measure("bare decode", f"http://127.0.0.1:{bare_port}/decode", bare_request, bare, args)

        # (2) open loop at --rate: submit-to-delivered.
        buyer_reset(buyer_port)
        rss = RssSampler(app.pid)
        tree0, machine0, started = tree_cpu_seconds(app.pid), sum(machine_cpu_seconds()), time.perf_counter()
        buyer_cpu0 = cpu_seconds(buyer.pid)
        loop = _new_loop()
        try:
            # sample_lead(n) repeats its email and phone every 10,000,000 n and the closed loop took
            # the first ones: start half way, or dedupe would turn these leads away as duplicates.
            result = loop.run_until_complete(SubmitOpenLoop(port, key, args.rate, args.open_duration,
                                                            args.connections, 5_000_000, jobs).run())
        finally:
            loop.close()
        open_elapsed = time.perf_counter() - started
        tree1, machine1, buyer_cpu1 = tree_cpu_seconds(app.pid), sum(machine_cpu_seconds()), cpu_seconds(buyer.pid)
        wanted = sum(1 for s in result.submission if s)
        open_drained = wait_drained(jobs, buyer_port, 0, args.drain_timeout)
        open_rss = rss.stop()
        arrivals = buyer_get(buyer_port, "keys")["keys"]
        jobs.close()
    finally:
        stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)

    n = len(result.scheduled)
    submit_ms = [1000 * (result.answered[i] - result.scheduled[i]) for i in range(n) if result.answered[i]]
    delivered_ms = [1000 * (arrivals[s][0] - result.scheduled[i]) for i, s in enumerate(result.submission)
                    if s and arrivals.get(s)]
    open_run = {
        "offered_rate": args.rate, "duration_s": args.open_duration, "acknowledged": wanted,
        "delivered": len(delivered_ms), "drained": open_drained, "rss_mb_max": round(open_rss, 1),
        "submit_ms": {"p50": round(pct(submit_ms, 50), 2), "p99": round(pct(submit_ms, 99), 2)},
        "submit_to_delivered_ms": {"p50": round(pct(delivered_ms, 50), 2), "p99": round(pct(delivered_ms, 99), 2)},
        "client_cpu_pct": round(100 * result.client_cpu / args.open_duration, 1),
        "buyer_cpu_pct": round(100 * (buyer_cpu1 - buyer_cpu0) / open_elapsed, 1),
        # CPU per acknowledged lead by process, and how busy the whole machine was (all cores):
        # at a fixed rate, what headroom the machine has left is what keeps latency low.
        "server_cpu_us_per_lead_by_process": {
            "server" if pid == app.pid else f"child {pid}": round(1e6 * (tree1[pid] - tree0.get(pid, 0.0)) / max(1, wanted))
            for pid in tree1},
        "machine_busy_pct": round(100 * (machine1 - machine0) / (open_elapsed * (os.cpu_count() or 1)), 1),
    }
    ratio = round(product["rps"] / bare_run["rps"], 3)
    rss_max = max(product["rss_mb_max"], open_run["rss_mb_max"])
    print(f"\n{'case':30} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'server':>7} {'client':>7} {'non-2xx':>8}")
    for r in (product, bare_run):  # req/s and latencies count 2xx answers only
        print(f"{r['label']:30} {r['rps']:>8.0f} {r['latency_ms']['p50']:>8.2f} {r['latency_ms']['p99']:>8.2f} "
              f"{r['server_cpu_pct']:>6.0f}% {r['client_cpu_pct']:>6.0f}% {r['non_2xx']:>8}")
    if product.get("server_cpu_pct_by_process"):
        # CPU per answered request (us): what bounds the closed loop's rate once a process is busy.
        print("server CPU by process: " + ", ".join(
            f"{k} {v}% ({1e4 * v / max(product['rps'], 1):.0f} us a submit)"
            for k, v in product["server_cpu_pct_by_process"].items())
            + f"; bare endpoint {bare_run['server_cpu_us_per_request']:.0f} us a request")
    print(f"buyer CPU {product['buyer_cpu_pct']}%; every lead delivered after the load: {product['all_delivered']} "
          f"{product['lead_statuses']}")
    print(f"open loop {args.rate:.0f}/s for {args.open_duration:.0f} s: submit p50/p99 "
          f"{open_run['submit_ms']['p50']}/{open_run['submit_ms']['p99']} ms, submit-to-delivered p50/p99 "
          f"{open_run['submit_to_delivered_ms']['p50']}/{open_run['submit_to_delivered_ms']['p99']} ms, "
          f"{open_run['delivered']}/{wanted} delivered")
    print("open loop CPU per lead: " + ", ".join(f"{k} {v} us" for k, v in
                                                  open_run["server_cpu_us_per_lead_by_process"].items())
          + f"; client {open_run['client_cpu_pct']}%, buyer {open_run['buyer_cpu_pct']}%, "
          f"machine {open_run['machine_busy_pct']}% busy (all cores)")
    print(f"resident memory of the server's processes under load: steady {product['rss_mb_median']:.0f} MB "
          f"(closed loop, median), max {rss_max:.0f} MB")
    checks = {
        "closed loop answered 2xx only": product["non_2xx"] == 0 and bare_run["non_2xx"] == 0,
        f"ratio >= {TARGET_RATIO}": ratio >= TARGET_RATIO,
        f"p99 < {TARGET_P99_MS} ms": product["latency_ms"]["p99"] < TARGET_P99_MS,
        f"submit-to-delivered p50 < {TARGET_DELIVERED_P50_MS} ms":
            open_run["submit_to_delivered_ms"]["p50"] < TARGET_DELIVERED_P50_MS,
        "every lead delivered": product["all_delivered"] and open_run["delivered"] == wanted,
        f"memory < {TARGET_RSS_MB:.0f} MB": rss_max < TARGET_RSS_MB,
    }
    print(f"ratio appliance/bare: {ratio:.2f}; " + ", ".join(f"{k}: {'met' if v else 'MISSED'}"
                                                             for k, v in checks.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "product", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "versions": {n: _version(n) for n in ("litestar", "msgspec", "uvicorn", "uvloop", "httptools", "apsw")},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "closed_loop": {"product": product, "bare": bare_run, "ratio": ratio}, "open_loop": open_run,
        "rss_mb_max": rss_max, "checks": checks}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
