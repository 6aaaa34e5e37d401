"""SQLite against PostgreSQL with one and two `appliance serve` processes, same machine, same run:
submits/s (closed loop) and deliveries/s (a queue drained by the delivery workers).

    python -m bench.postgres [--repeat 2] [--duration 6] [--preload-seconds 4] [--fsync on|off|both]
                             [--cases sqlite,pg1,pg2] [--connections 64] [--keep]

Cases, each on a fresh database (a fresh data folder for SQLite, a fresh `CREATE DATABASE` on the
cluster for PostgreSQL), interleaved round by round so a drifting machine touches them alike:

- `sqlite`: one `appliance serve` on SQLite (`synchronous = "FULL"`).
- `pg1`: one `appliance serve` on PostgreSQL.
- `pg2`: two `appliance serve` processes on one PostgreSQL database (their own data folders, one
  master key); the load client splits its connections between them, the two delivery workers
  claim from one queue.

Per case: (1) deliveries/s: qualified leads for bench.delivery's campaign (one endpoint at
bench/buyer.py) are submitted for `--preload-seconds` with the delivery worker off (so each case
queues what it takes in in that time), the servers are restarted with `[delivery] concurrency =
64` and timed until the buyer has every lead: deliveries/s = leads / (last - first arrival), and
the steady rate between the 10th and 90th percentile arrival. (2) submits/s: `--connections`
keep-alive connections post bench.submit's leads (its campaign: 10 rule sets, 3 routing rules,
dedupe on) for `--duration` s after `--warmup` s, with the worker off again (intake alone).

PostgreSQL: a throwaway cluster (initdb + pg_ctl, as tests/postgres_cluster.py) on 127.0.0.1,
`fsync` and `synchronous_commit` on by default (a commit waits for the disk, like SQLite's FULL);
`--fsync both` runs the PostgreSQL cases with it off too. Nothing is pinned: the appliance
processes, PostgreSQL, the buyer and this client share every core, and the CPU columns (in % of
one core) say where the time went. `other` is the machine's CPU used by anything else.
Results: bench/results/postgres.json."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import delivery, submit
from bench.campaigns_list import (
    _version,
    appliance_cli,
    cpu_seconds,
    machine_cpu_seconds,
)
from bench.delivery import JobCounter, Procs, buyer_get, pct
from bench.loadgen import LoadResult, _new_loop, free_port, run_load_async
from tests.postgres_cluster import Cluster, server_bin

RESULTS = Path(__file__).resolve().parent / "results"


class BenchCluster(Cluster):
    """The tests' throwaway cluster, with durability as asked: the tests run with fsync off."""

    def start(self, fsync: bool = True) -> None:  # type: ignore[override]
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--locale=C", "-E", "UTF8",
                  "--no-sync")
        durability = "" if fsync else " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c max_connections=200"
                   f"{durability}")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-o", options, "-w", "start")

    def cpu_seconds(self) -> float:
        """CPU of the whole server: the postmaster, its live backends, and those that ended (the
        postmaster has waited for them, so the kernel adds them to its children's time)."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        hz = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            pid = int(stat.parent.name)
            if pid == postmaster:
                total += sum(int(f) for f in fields[11:15]) / hz  # utime stime cutime cstime
            elif int(fields[1]) == postmaster:
                total += (int(fields[11]) + int(fields[12])) / hz
        return total


class PgJobs:
    """bench.delivery.JobCounter's questions, asked of PostgreSQL."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)

    def _rows(self, sql: str) -> list[tuple]:
        return self.conn.execute(sql).fetchall()

    def open_jobs(self) -> int:
        return self._rows("SELECT count(*) FROM jobs WHERE state IN ('ready', 'running')")[0][0]

    def states(self) -> dict[str, int]:
        return dict(self._rows("SELECT state, count(*) FROM jobs GROUP BY state"))

    def lead_statuses(self) -> dict[str, int]:
        return dict(self._rows("SELECT status, count(*) FROM leads GROUP BY status"))

    def close(self) -> None:
        self.conn.close()


@dataclass
class Case:
    name: str
    backend: str
    processes: int
    fsync: bool = True

    @property
    def label(self) -> str:
        if self.backend == "sqlite":
            return "SQLite, 1 process"
        return f"PostgreSQL{'' if self.fsync else ' fsync off'}, {self.processes} process{'es' * (self.processes > 1)}"


def write_config(folder: Path, case: Case, url: str, concurrency: int, master_key: Path | None) -> Path:
    storage = f'backend = "postgresql"\nurl = "{url}"\n' if case.backend == "postgresql" else 'synchronous = "FULL"\n'
    key = f'master_key_file = "{master_key}"\n' if master_key else ""
    config = folder / "appliance.toml"
    config.write_text(f'[server]\nhost = "127.0.0.1"\nlog_level = "warning"\n'
                      f'[storage]\npath = "{folder / "data"}"\n{storage}'
                      f'[security]\nrate_limit_per_minute = 0\n{key}'
                      f'[delivery]\nallow_private_addresses = true\nconcurrency = {concurrency}\n'
                      f'[plugins]\ndirs = []\n')
    return config


def tenant_bundle(buyer_port: int) -> dict[str, Any]:
    """bench.submit's campaigns (intake) and bench.delivery's endpoint and campaign in one tenant."""
    intake, deliver = submit.bundle(), delivery.bundle(buyer_port)
    return {**intake, "deliveryEndpoints": deliver["deliveryEndpoints"],
            "campaigns": intake["campaigns"] + deliver["campaigns"]}


async def _split_load(ports: list[int], connections: int, factory, duration: float | None,
                      requests: int | None) -> LoadResult:
    """One closed-loop client, its connections (and request budget) split over the servers."""
    n = len(ports)
    parts = await asyncio.gather(*(
        run_load_async(f"http://127.0.0.1:{port}/api/v1/leads/submit", factory=factory, timeout=30,
                       connections=connections // n + (i < connections % n), duration=duration,
                       requests=None if requests is None else requests // n + (i < requests % n))
        for i, port in enumerate(ports)))
    return LoadResult.merge(parts)


def split_load(ports: list[int], connections: int, factory, duration: float | None = None,
               requests: int | None = None) -> tuple[LoadResult, float]:
    """(the merged result, this process's CPU seconds: the parts share one process)."""
    loop = _new_loop()
    cpu0 = time.process_time()
    try:
        result = loop.run_until_complete(_split_load(ports, connections, factory, duration, requests))
    finally:
        loop.close()
    return result, time.process_time() - cpu0


class Meter:
    """CPU seconds of the appliance processes, PostgreSQL, the buyer and the whole machine."""

    def __init__(self, servers: list, cluster: BenchCluster | None, buyer) -> None:
        self.servers, self.cluster, self.buyer = servers, cluster, buyer
        self.start = self._read()

    def _read(self) -> tuple[float, ...]:
        busy, irq = machine_cpu_seconds()
        return (time.perf_counter(), sum(cpu_seconds(p.pid) for p in self.servers),
                self.cluster.cpu_seconds() if self.cluster else 0.0, cpu_seconds(self.buyer.pid), busy + irq)

    def stop(self, client_cpu: float) -> dict[str, float]:
        end = self._read()
        wall, server, pg, buyer, machine = (b - a for a, b in zip(self.start, end))
        pct_of = lambda s: round(100 * s / wall, 1)
        return {"wall_s": round(wall, 2), "server_cpu_pct": pct_of(server), "postgres_cpu_pct": pct_of(pg),
                "buyer_cpu_pct": pct_of(buyer), "client_cpu_pct": pct_of(client_cpu),
                "other_cpu_pct": pct_of(machine - server - pg - buyer - client_cpu),
                "server_cpu_s": server, "postgres_cpu_s": pg}


def run_case(case: Case, args: argparse.Namespace, work: Path, cluster: BenchCluster | None,
             round_no: int) -> dict[str, Any]:
    folder = work / f"{case.name}-{round_no}"
    folders = [folder / f"p{i}" for i in range(case.processes)]
    for f in folders:
        # `serve` wants an existing data folder; the others share the first one's master key.
        (f / "data").mkdir(parents=True, mode=0o700)
    url = ""
    if case.backend == "postgresql":
        assert cluster is not None
        database = f"bench_{case.name}_{round_no}"
        cluster.admin(f"CREATE DATABASE {database} TEMPLATE template0 LOCALE 'C' ENCODING 'UTF8'")
        url = cluster.url(database)
    procs = Procs(folder)
    try:
        buyer_port = free_port()
        buyer = procs.start("buyer", [sys.executable, "-m", "bench.buyer", "--port", str(buyer_port)], buyer_port, None)
        first = write_config(folders[0], case, url, 0, None)
        appliance_cli(first, "init")
        tenant = json.loads(appliance_cli(first, "tenant", "create", "Bench", "--json"))["tenantId"]
        key = json.loads(appliance_cli(first, "key", "create", "--tenant", tenant, "--json"))["key"]
        (folder / "bundle.json").write_text(json.dumps(tenant_bundle(buyer_port)))
        appliance_cli(first, "import", "--tenant", tenant, str(folder / "bundle.json"))
        master_key = folders[0] / "data" / "master.key"
        configs = [first, *(write_config(f, case, url, 0, master_key) for f in folders[1:])]
        submit._KEY = delivery._KEY = key

        def serve(concurrency: int, tag: str) -> tuple[list, list[int]]:
            servers, ports = [], []
            for i, (f, config) in enumerate(zip(folders, configs)):
                write_config(f, case, url, concurrency, master_key if i else None)
                ports.append(free_port())
                servers.append(procs.appliance(config, ports[-1], None, f"appliance-{tag}-{i}"))
            return servers, ports

        # (1) deliveries/s: a queue filled with the worker off, drained by the worker(s). First, so
        # the queue holds only these leads (bench.submit's campaign queues jobs of its own).
        servers, ports = serve(0, "load")
        preload, _ = split_load(ports, args.connections, delivery.preload_request, duration=args.preload_seconds)
        for proc in servers:
            procs.stop(proc)
        jobs = PgJobs(url) if url else JobCounter(folders[0] / "data" / "appliance.db")
        try:
            queued = jobs.open_jobs()
            servers, ports = serve(args.worker_concurrency, "drain")
            meter = Meter(servers, cluster, buyer)
            drained = delivery.wait_drained(jobs, buyer_port, queued, args.drain_timeout)
            drain = meter.stop(0.0)
            states = jobs.states()
        finally:
            jobs.close()
        for proc in servers:
            procs.stop(proc)
        arrivals = buyer_get(buyer_port, "keys")["keys"]
        firsts = sorted(v[0] for v in arrivals.values())
        span = firsts[-1] - firsts[0] if len(firsts) > 1 else 0.0
        lo, hi = (pct(firsts, 10), pct(firsts, 90)) if firsts else (0.0, 0.0)
        deliveries = drain | {
            "preload_statuses": {str(k): v for k, v in preload.statuses.items()}, "queued": queued,
            "delivered": len(firsts), "duplicates": sum(len(v) for v in arrivals.values()) - len(firsts),
            "drained": drained, "job_states": states,
            "deliveries_per_s": round(len(firsts) / span, 1) if span > 0 else None,
            "steady_deliveries_per_s": round(0.8 * len(firsts) / (hi - lo), 1) if hi > lo else None,
        }
        deliveries["server_cpu_us_per_delivery"] = round(1e6 * deliveries.pop("server_cpu_s") / max(1, len(firsts)), 1)
        deliveries["postgres_cpu_us_per_delivery"] = round(1e6 * deliveries.pop("postgres_cpu_s") / max(1, len(firsts)), 1)
        print(f"  {case.label}: {deliveries['deliveries_per_s']} deliveries/s ({len(firsts)}/{queued}"
              f"{', NOT drained' if not drained else ''})")

        # (2) submits/s, intake only.
        servers, ports = serve(0, "submit")
        split_load(ports, args.connections, submit.submit_request, duration=args.warmup)
        meter = Meter(servers, cluster, buyer)
        load, client_cpu = split_load(ports, args.connections, submit.submit_request, duration=args.duration)
        submits = load.to_dict() | meter.stop(client_cpu)
        submits["server_cpu_us_per_submit"] = round(1e6 * submits.pop("server_cpu_s") / max(1, load.ok), 1)
        submits["postgres_cpu_us_per_submit"] = round(1e6 * submits.pop("postgres_cpu_s") / max(1, load.ok), 1)
        print(f"  {case.label}: {load.rps:,.0f} submits/s, p99 {load.p99 * 1000:.1f} ms")
    finally:
        procs.close()
        if url and cluster is not None and not args.keep:
            cluster.admin(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
    return {"case": case.name, "label": case.label, "round": round_no, "submits": submits, "deliveries": deliveries}


def _spread(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return f"{lo:,.0f}" if len(values) == 1 or round(lo) == round(hi) else f"{lo:,.0f}-{hi:,.0f}"


def report(runs: list[dict[str, Any]], cases: list[Case]) -> None:
    print(f"\n{'case':32} {'rnd':>3} {'submits/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'app':>5} {'pg':>5} {'client':>6} "
          f"{'other':>5} {'us app/pg':>10}  {'deliv/s':>7} {'steady':>7} {'app':>5} {'pg':>5} {'buyer':>5} {'other':>5}")
    for r in runs:
        s, d = r["submits"], r["deliveries"]
        bad = {k: v for k, v in s["statuses"].items() if not k.startswith("2")}
        print(f"{r['label']:32} {r['round']:>3} {s['rps']:>9,.0f} {s['latency_ms']['p50']:>7.1f} "
              f"{s['latency_ms']['p99']:>7.1f} {s['server_cpu_pct']:>4.0f}% {s['postgres_cpu_pct']:>4.0f}% "
              f"{s['client_cpu_pct']:>5.0f}% {s['other_cpu_pct']:>4.0f}% "
              f"{s['server_cpu_us_per_submit']:>4.0f}/{s['postgres_cpu_us_per_submit']:<5.0f} "
              f"{d['deliveries_per_s'] or 0:>7,.0f} {d['steady_deliveries_per_s'] or 0:>7,.0f} "
              f"{d['server_cpu_pct']:>4.0f}% {d['postgres_cpu_pct']:>4.0f}% {d['buyer_cpu_pct']:>4.0f}% "
              f"{d['other_cpu_pct']:>4.0f}%" + (f"  non-2xx {bad}" if bad else "")
              + ("" if d["drained"] else "  NOT DRAINED") + (f"  duplicates {d['duplicates']}" if d["duplicates"] else ""))
    print("\nCPU in % of one core (the machine has", os.cpu_count(), "cores, shared by everything above);"
          " us app/pg: CPU microseconds per submit in the appliance processes / in PostgreSQL.")
    base = [r["submits"]["rps"] for r in runs if r["case"] == "sqlite"]
    base_d = [r["deliveries"]["deliveries_per_s"] or 0 for r in runs if r["case"] == "sqlite"]
    print(f"\n{'case':32} {'submits/s':>12} {'vs SQLite':>9} {'deliveries/s':>13} {'vs SQLite':>9}")
    for case in cases:
        mine = [r for r in runs if r["case"] == case.name]
        rps = [r["submits"]["rps"] for r in mine]
        dps = [r["deliveries"]["deliveries_per_s"] or 0 for r in mine]
        ratio = f"{statistics.median(rps) / statistics.median(base):.2f}" if base else "-"
        ratio_d = f"{statistics.median(dps) / statistics.median(base_d):.2f}" if base_d and statistics.median(base_d) else "-"
        print(f"{case.label:32} {_spread(rps):>12} {ratio:>9} {_spread(dps):>13} {ratio_d:>9}")
    print("(ranges: lowest-highest over the rounds; ratios: medians)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.postgres", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2, help="rounds; each runs every case once")
    parser.add_argument("--duration", type=float, default=6.0, help="submit measurement, seconds")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--preload-seconds", type=float, default=4.0,
                        help="how long leads are submitted (worker off) to fill the queue the workers drain")
    parser.add_argument("--worker-concurrency", type=int, default=64, help="[delivery] concurrency of each process")
    parser.add_argument("--drain-timeout", type=float, default=120.0)
    parser.add_argument("--fsync", choices=("on", "off", "both"), default="on",
                        help="PostgreSQL durability (SQLite always runs synchronous = FULL)")
    parser.add_argument("--cases", default="sqlite,pg1,pg2", help="comma-separated: sqlite, pg1, pg2")
    parser.add_argument("--keep", action="store_true", help="keep the work folder and databases (logs)")
    parser.add_argument("--out", type=Path, default=RESULTS / "postgres.json")
    args = parser.parse_args(argv)

    wanted = args.cases.split(",")
    fsyncs = {"on": [True], "off": [False], "both": [True, False]}[args.fsync]
    cases = [Case("sqlite", "sqlite", 1)] if "sqlite" in wanted else []
    for fsync in fsyncs:
        suffix = "" if fsync else "_nofsync"
        cases += [Case(f"pg{n}{suffix}", "postgresql", n, fsync) for n in (1, 2) if f"pg{n}" in wanted]
    cluster = None
    if any(c.backend == "postgresql" for c in cases):
        bin_dir = server_bin()
        if bin_dir is None:
            print("PostgreSQL server binaries (initdb, pg_ctl) not found: install the distribution's "
                  "postgresql package", file=sys.stderr)
            return 2
    work = Path(tempfile.mkdtemp(prefix="bench-postgres-"))
    clusters: dict[bool, BenchCluster] = {}
    runs: list[dict[str, Any]] = []
    try:
        for fsync in fsyncs if any(c.backend == "postgresql" for c in cases) else []:
            clusters[fsync] = BenchCluster(bin_dir)
            clusters[fsync].start(fsync)
        for round_no in range(1, args.repeat + 1):
            print(f"round {round_no}/{args.repeat}")
            for case in cases:
                cluster = clusters.get(case.fsync) if case.backend == "postgresql" else None
                runs.append(run_case(case, args, work, cluster, round_no))
    finally:
        for c in clusters.values():
            if args.keep:
                print(f"PostgreSQL cluster left running at {c.root} (port {c.port})")
            else:
                c.stop()
        if args.keep:
            print(f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    report(runs, cases)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "postgres", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "versions": {n: _version(n) for n in ("litestar", "uvicorn", "apsw", "psycopg", "psycopg-pool")},
        "settings": vars(args) | {"out": str(args.out)}, "runs": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
