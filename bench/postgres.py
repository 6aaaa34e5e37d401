"""SQLite against PostgreSQL with one and more `appliance serve` processes, same machine, same run:
submits/s (closed loop) and deliveries/s (a queue drained by the delivery workers).

    python -m bench.postgres [--repeat 2] [--duration 6] [--preload-seconds 4] [--fsync on|off|both]
                             [--cases sqlite,pg1,pg2] [--connections 64] [--keep]
    python -m bench.postgres --scale-out [--quota 0.4] [--quota-process shared|own|auto] ...
                             (= --cases qsqlite,q1,q2,q3)

Cases, each on a fresh database (a fresh data folder for SQLite, a fresh `CREATE DATABASE` on the
cluster for PostgreSQL), interleaved round by round so a drifting machine touches them alike:

- `sqlite`: one `appliance serve` on SQLite (`synchronous = "FULL"`).
- `pg1`: one `appliance serve` on PostgreSQL.
- `pg2`: two `appliance serve` processes on one PostgreSQL database (their own data folders, one
  master key); the load client splits its connections between them, the two delivery workers
  claim from one queue. `pgN`: N such processes (any N).

Scale-out cases: separate machines, simulated on this one. Each appliance process runs in a CPU
group of its own (cgroup v1, /sys/fs/cgroup/cpu: `cpu.cfs_quota_us` over a 100 ms period) limited
to `--quota` of one core (0.4); PostgreSQL, the load client and the buyer run outside the groups,
unlimited, as a database server and clients on machines of their own would. The process joins its
group before it runs a line (so a delivery process it starts is in the group too). Needs root and
the cgroup v1 cpu controller; without them these cases stop with one line before anything runs.

- `qsqlite`: one `appliance serve` on SQLite in one quota: the reference, a single machine.
- `q1`, `q2`, `q3` (`qN`): 1, 2, 3 (N) PostgreSQL-backed processes as `pgN`, each in its own quota.

The quota'd processes run their delivery worker in the server's process (`[delivery] process =
"shared"`, what `auto` picks on a machine or a cgroup v2 container with under two cores; cgroup v1
quotas are not seen by `auto`); `--quota-process own` or `auto` changes that. Each quota case also
records, per process and per phase, its group's `cpu.stat`: periods, periods throttled and the
time throttled (a process throttled in most periods was bound by its quota). The summary gives
q1 against qsqlite, qN against q1, and PostgreSQL's CPU (when it nears a core or the machine's
spare, PostgreSQL, not the appliances, is the bound).

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
one core) say where the time went: `app` is every appliance process with its descendants (a
delivery process of its own included), `other` is the machine's CPU used by anything else.
Results: bench/results/postgres.json."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
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
    tree_cpu_seconds,
)
from bench.delivery import ROOT, JobCounter, Procs, buyer_get, pct
from bench.loadgen import LoadResult, _new_loop, free_port, run_load_async, wait_for_port
from tests.postgres_cluster import Cluster, server_bin

RESULTS = Path(__file__).resolve().parent / "results"
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")  # cgroup v1, the cpu controller
CFS_PERIOD_US = 100_000


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


class QuotaUnavailable(Exception):
    """No CPU group could be made or joined (not root, no cgroup v1 cpu controller)."""


class CpuGroup:
    """A cgroup v1 cpu group limited to `fraction` of one core (CFS quota over a 100 ms period),
    for one appliance process and whatever it starts. Removed by `remove`, once its processes ended."""

    def __init__(self, name: str, fraction: float) -> None:
        self.path = CGROUP_CPU / name
        self.fraction = fraction
        if not (CGROUP_CPU / "cgroup.procs").is_file() or not (CGROUP_CPU / "cpu.cfs_quota_us").is_file():
            raise QuotaUnavailable(f"no cgroup v1 cpu controller at {CGROUP_CPU} (cpu.cfs_quota_us)")
        try:
            self.path.mkdir()
        except OSError as exc:
            raise QuotaUnavailable(f"cannot create the CPU group {self.path}: {exc.strerror or exc}") from None
        try:
            (self.path / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(max(1000, round(fraction * CFS_PERIOD_US))))
        except OSError as exc:
            self.remove()
            raise QuotaUnavailable(f"cannot set the CPU quota of {self.path}: {exc.strerror or exc}") from None

    def join(self):
        """A preexec_fn: the child moves itself into the group before it execs (low-level calls only)."""
        procs = os.fsencode(self.path / "cgroup.procs")

        def move() -> None:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        return move

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def stat(self) -> dict[str, int]:
        """cpu.stat: nr_periods, nr_throttled, throttled_time (ns), ..."""
        try:
            return {k: int(v) for k, v in (line.split() for line in (self.path / "cpu.stat").read_text().splitlines())}
        except (OSError, ValueError):
            return {}

    def remove(self, timeout: float = 10.0) -> None:
        """rmdir, once the group is empty: processes still in it after `timeout` (a delivery process
        outliving its server) are killed by pid first."""
        if not self.path.is_dir():
            return
        deadline = time.monotonic() + timeout
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + 5
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if time.monotonic() > deadline:
                    print(f"  could not remove the CPU group {self.path}: {exc.strerror or exc}", file=sys.stderr)
                    return
                time.sleep(0.1)


def check_cpu_groups(fraction: float) -> None:
    """Raises QuotaUnavailable unless a CPU group can be made, limited and joined."""
    group = CpuGroup(f"bench-postgres-{os.getpid()}-probe", fraction)
    try:
        probe = subprocess.run(["sleep", "0"], preexec_fn=group.join(), capture_output=True)
        if probe.returncode != 0:
            raise QuotaUnavailable(f"a process cannot join {group.path}")
    except (OSError, subprocess.SubprocessError) as exc:
        raise QuotaUnavailable(f"a process cannot join {group.path}: {exc}") from None
    finally:
        group.remove()


class GroupProcs(Procs):
    """bench.delivery.Procs, whose appliance processes start together (all launched, then waited
    for: one started after another would work alone while the next one starts, for seconds under a
    quota) and may start inside a CPU group."""

    def launch(self, config: Path, port: int, group: CpuGroup | None, name: str) -> subprocess.Popen:
        log = open(self.work / f"{name}.log", "ab")
        self.logs.append(log)
        cmd = [sys.executable, "-m", "appliance", "--config", str(config), "serve", "--port", str(port)]
        try:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                    preexec_fn=group.join() if group else None)
        except subprocess.SubprocessError as exc:
            raise QuotaUnavailable(f"a process cannot join {group.path if group else '?'}: {exc}") from None
        self.all.append(proc)
        if group is not None and proc.pid not in group.pids():
            raise QuotaUnavailable(f"process {proc.pid} is not in {group.path}")
        return proc

    def ready(self, proc: subprocess.Popen, port: int, name: str) -> None:
        try:
            wait_for_port(port, proc=proc, timeout=60)
        except Exception:
            sys.stderr.write((self.work / f"{name}.log").read_text(errors="replace")[-3000:])
            raise


@dataclass
class Case:
    name: str
    backend: str
    processes: int
    fsync: bool = True
    quota: float | None = None  # fraction of one core per appliance process (its own CPU group)

    @property
    def label(self) -> str:
        quota = f", {self.quota:g} core each" if self.quota else ""
        if self.backend == "sqlite":
            return f"SQLite, 1 process{quota}"
        return (f"PostgreSQL{'' if self.fsync else ' fsync off'}, {self.processes} "
                f"process{'es' * (self.processes > 1)}{quota}")


def write_config(folder: Path, case: Case, url: str, concurrency: int, master_key: Path | None,
                 process: str | None = None) -> Path:
    storage = f'backend = "postgresql"\nurl = "{url}"\n' if case.backend == "postgresql" else 'synchronous = "FULL"\n'
    key = f'master_key_file = "{master_key}"\n' if master_key else ""
    where = f'process = "{process}"\n' if process else ""
    config = folder / "appliance.toml"
    config.write_text(f'[server]\nhost = "127.0.0.1"\nlog_level = "warning"\n'
                      f'[storage]\npath = "{folder / "data"}"\n{storage}'
                      f'[security]\nrate_limit_per_minute = 0\n{key}'
                      f'[delivery]\nallow_private_addresses = true\nconcurrency = {concurrency}\n{where}'
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


def process_tree_cpu(pid: int) -> float:
    """CPU seconds of an appliance process and its live descendants (its delivery process)."""
    return sum(v for v in tree_cpu_seconds(pid).values() if v == v)


class Meter:
    """CPU seconds of the appliance processes (each with its descendants), PostgreSQL, the buyer and
    the whole machine; with CPU groups, each group's throttling over the same time."""

    def __init__(self, servers: list, cluster: BenchCluster | None, buyer,
                 groups: list[CpuGroup | None] | None = None) -> None:
        self.servers, self.cluster, self.buyer = servers, cluster, buyer
        self.groups = [g for g in groups or [] if g is not None]
        self.start = self._read()
        self.start_stats = [g.stat() for g in self.groups]

    def _read(self) -> tuple[float, ...]:
        busy, irq = machine_cpu_seconds()
        return (time.perf_counter(), self.cluster.cpu_seconds() if self.cluster else 0.0, cpu_seconds(self.buyer.pid),
                busy + irq, *(process_tree_cpu(p.pid) for p in self.servers))

    def stop(self, client_cpu: float) -> dict[str, Any]:
        end = self._read()
        wall, pg, buyer, machine, *each = (b - a for a, b in zip(self.start, end))
        server = sum(each)
        pct_of = lambda s: round(100 * s / wall, 1)  # noqa: E731
        out: dict[str, Any] = {
            "wall_s": round(wall, 2), "server_cpu_pct": pct_of(server), "postgres_cpu_pct": pct_of(pg),
            "buyer_cpu_pct": pct_of(buyer), "client_cpu_pct": pct_of(client_cpu),
            "other_cpu_pct": pct_of(machine - server - pg - buyer - client_cpu),
            "server_cpu_pct_each": [pct_of(s) for s in each], "server_cpu_s": server, "postgres_cpu_s": pg}
        if self.groups:
            out["throttling"] = []
            for group, before in zip(self.groups, self.start_stats):
                after = group.stat()
                delta = {k: after.get(k, 0) - before.get(k, 0) for k in ("nr_periods", "nr_throttled", "throttled_time")}
                out["throttling"].append({
                    "group": group.path.name, "quota_pct": round(100 * group.fraction, 1),
                    "periods": delta["nr_periods"], "throttled_periods": delta["nr_throttled"],
                    "throttled_pct_of_periods": round(100 * delta["nr_throttled"] / delta["nr_periods"], 1)
                    if delta["nr_periods"] else 0.0,
                    "throttled_ms": round(delta["throttled_time"] / 1e6, 1)})
        return out


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
    procs = GroupProcs(folder)
    groups: list[CpuGroup | None] = [None] * case.processes
    process = args.quota_process if case.quota and args.quota_process != "auto" else None
    try:
        for i in range(case.processes if case.quota else 0):
            groups[i] = CpuGroup(f"bench-postgres-{os.getpid()}-{case.name}-{round_no}-p{i}", case.quota)
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
            """All the processes launched at once, then each waited for. Sets up["at"], when the last
            answered, and up["after_s"], how long after the launch that was."""
            servers, ports = [], []
            launched = time.monotonic()
            for i, (f, config, group) in enumerate(zip(folders, configs, groups)):
                write_config(f, case, url, concurrency, master_key if i else None, process)
                ports.append(free_port())
                servers.append(procs.launch(config, ports[-1], group, f"appliance-{tag}-{i}"))
            for i, (proc, port) in enumerate(zip(servers, ports)):
                procs.ready(proc, port, f"appliance-{tag}-{i}")
            up["at"] = time.monotonic()
            up["after_s"] = round(up["at"] - launched, 2)
            return servers, ports

        up: dict[str, float] = {}

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
            meter = Meter(servers, cluster, buyer, groups)
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
            # the buyer's arrival times are time.monotonic() too: leads delivered before the last
            # process answered (by the processes up first: the workers start before the port opens).
            "all_up_after_s": up["after_s"], "delivered_before_all_up": sum(t < up["at"] for t in firsts),
            "delivered": len(firsts), "duplicates": sum(len(v) for v in arrivals.values()) - len(firsts),
            "drained": drained, "job_states": states,
            "deliveries_per_s": round(len(firsts) / span, 1) if span > 0 else None,
            "steady_deliveries_per_s": round(0.8 * len(firsts) / (hi - lo), 1) if hi > lo else None,
        }
        deliveries["server_cpu_us_per_delivery"] = round(1e6 * deliveries.pop("server_cpu_s") / max(1, len(firsts)), 1)
        deliveries["postgres_cpu_us_per_delivery"] = round(1e6 * deliveries.pop("postgres_cpu_s") / max(1, len(firsts)), 1)
        early = (f", {deliveries['delivered_before_all_up']} before all {case.processes} were up"
                 if case.processes > 1 else "")
        print(f"  {case.label}: {deliveries['deliveries_per_s']} deliveries/s ({len(firsts)}/{queued}"
              f"{', NOT drained' if not drained else ''}"
              f"{early})"
              + (f", throttled in {_throttled(deliveries)} of the quota periods" if case.quota else ""))

        # (2) submits/s, intake only.
        servers, ports = serve(0, "submit")
        split_load(ports, args.connections, submit.submit_request, duration=args.warmup)
        meter = Meter(servers, cluster, buyer, groups)
        load, client_cpu = split_load(ports, args.connections, submit.submit_request, duration=args.duration)
        submits = load.to_dict() | meter.stop(client_cpu)
        submits["server_cpu_us_per_submit"] = round(1e6 * submits.pop("server_cpu_s") / max(1, load.ok), 1)
        submits["postgres_cpu_us_per_submit"] = round(1e6 * submits.pop("postgres_cpu_s") / max(1, load.ok), 1)
        print(f"  {case.label}: {load.rps:,.0f} submits/s, p99 {load.p99 * 1000:.1f} ms"
              + (f", throttled in {_throttled(submits)} of the quota periods" if case.quota else ""))
    finally:
        procs.close()
        for group in groups:
            if group is not None:
                group.remove()
        if url and cluster is not None and not args.keep:
            cluster.admin(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
    return {"case": case.name, "label": case.label, "round": round_no, "processes": case.processes,
            "backend": case.backend, "fsync": case.fsync,
            "quota": {"cores_per_process": case.quota, "cfs_period_us": CFS_PERIOD_US,
                      "cfs_quota_us": max(1000, round(case.quota * CFS_PERIOD_US)),
                      "delivery_process": process or "auto"} if case.quota else None,
            "submits": submits, "deliveries": deliveries}


def _throttled(phase: dict[str, Any]) -> str:
    """The share of quota periods each process was throttled in, e.g. "92%/88%"."""
    return "/".join(f"{t['throttled_pct_of_periods']:.0f}%" for t in phase.get("throttling", [])) or "-"


def _spread(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return f"{lo:,.0f}" if len(values) == 1 or round(lo) == round(hi) else f"{lo:,.0f}-{hi:,.0f}"


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _ratio(mine: float | None, base: float | None) -> str:
    return f"{mine / base:.2f}" if mine is not None and base else "-"


def report(runs: list[dict[str, Any]], cases: list[Case]) -> None:
    w = max([32, *(len(c.label) for c in cases)])
    print(f"\n{'case':{w}} {'rnd':>3} {'submits/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'app':>5} {'pg':>5} {'client':>6} "
          f"{'other':>5} {'us app/pg':>10}  {'deliv/s':>7} {'steady':>7} {'app':>5} {'pg':>5} {'buyer':>5} {'other':>5}")
    for r in runs:
        s, d = r["submits"], r["deliveries"]
        bad = {k: v for k, v in s["statuses"].items() if not k.startswith("2")}
        print(f"{r['label']:{w}} {r['round']:>3} {s['rps']:>9,.0f} {s['latency_ms']['p50']:>7.1f} "
              f"{s['latency_ms']['p99']:>7.1f} {s['server_cpu_pct']:>4.0f}% {s['postgres_cpu_pct']:>4.0f}% "
              f"{s['client_cpu_pct']:>5.0f}% {s['other_cpu_pct']:>4.0f}% "
              f"{s['server_cpu_us_per_submit']:>4.0f}/{s['postgres_cpu_us_per_submit']:<5.0f} "
              f"{d['deliveries_per_s'] or 0:>7,.0f} {d['steady_deliveries_per_s'] or 0:>7,.0f} "
              f"{d['server_cpu_pct']:>4.0f}% {d['postgres_cpu_pct']:>4.0f}% {d['buyer_cpu_pct']:>4.0f}% "
              f"{d['other_cpu_pct']:>4.0f}%" + (f"  non-2xx {bad}" if bad else "")
              + ("" if d["drained"] else "  NOT DRAINED") + (f"  duplicates {d['duplicates']}" if d["duplicates"] else ""))
    print("\nCPU in % of one core (the machine has", os.cpu_count(), "cores, shared by everything above);"
          " app: the appliance processes with their descendants;"
          " us app/pg: CPU microseconds per submit in the appliance processes / in PostgreSQL.")

    def medians(name: str) -> tuple[list[dict[str, Any]], float | None, float | None]:
        mine = [r for r in runs if r["case"] == name]
        return (mine, _median([r["submits"]["rps"] for r in mine]),
                _median([r["deliveries"]["deliveries_per_s"] for r in mine]))

    plain = [c for c in cases if not c.quota]
    if plain:
        _, base, base_d = medians("sqlite")
        print(f"\n{'case':{w}} {'submits/s':>12} {'vs SQLite':>9} {'deliveries/s':>13} {'vs SQLite':>9}")
        for case in plain:
            mine, rps, dps = medians(case.name)
            print(f"{case.label:{w}} {_spread([r['submits']['rps'] for r in mine]):>12} {_ratio(rps, base):>9} "
                  f"{_spread([r['deliveries']['deliveries_per_s'] for r in mine]):>13} {_ratio(dps, base_d):>9}")
    scaled = [c for c in cases if c.quota]
    if scaled:
        _, ref, ref_d = medians("qsqlite")
        cores = os.cpu_count() or 1
        print(f"\nScale-out: each appliance process in a CPU group of its own ({scaled[0].quota:g} core, cgroup v1 "
              f"quota); PostgreSQL, the client and the buyer outside the groups. Medians over the rounds.")
        print(f"{'case':{w}} {'submits/s':>9} {'vs qsqlite':>10} {'vs q1':>6} {'deliv/s':>8} {'vs qsqlite':>10} "
              f"{'vs q1':>6}  {'app % each (sub | del)':>24}  {'pg % sub|del':>12}  {'busy % sub|del':>14}  "
              f"{'throttled sub | del':>19}")
        for case in scaled:
            mine, rps, dps = medians(case.name)
            q1 = next((c.name for c in scaled if c.backend == "postgresql" and c.processes == 1
                       and c.fsync == case.fsync), None)
            _, one, one_d = medians(q1) if q1 and case.backend == "postgresql" else ([], None, None)

            def each(phase: str) -> str:
                per = [_median([r[phase]["server_cpu_pct_each"][i] for r in mine]) for i in range(case.processes)]
                return "/".join(f"{v:.0f}" for v in per if v is not None)

            def phase_median(phase: str, key: str) -> str:
                v = _median([r[phase][key] for r in mine])
                return "-" if v is None else f"{v:.0f}"

            def busy(phase: str) -> str:
                v = _median([sum(r[phase][k] for k in ("server_cpu_pct", "postgres_cpu_pct", "client_cpu_pct",
                                                         "buyer_cpu_pct", "other_cpu_pct")) / cores for r in mine])
                return "-" if v is None else f"{v:.0f}"

            def throttled(phase: str) -> str:
                per = [_median([r[phase]["throttling"][i]["throttled_pct_of_periods"] for r in mine
                                if r[phase].get("throttling")]) for i in range(case.processes)]
                return "/".join(f"{v:.0f}%" for v in per if v is not None) or "-"

            print(f"{case.label:{w}} {_spread([r['submits']['rps'] for r in mine]):>9} {_ratio(rps, ref):>10} "
                  f"{_ratio(rps, one):>6} {_spread([r['deliveries']['deliveries_per_s'] for r in mine]):>8} "
                  f"{_ratio(dps, ref_d):>10} {_ratio(dps, one_d):>6}  "
                  f"{each('submits') + ' | ' + each('deliveries'):>24}  "
                  f"{phase_median('submits', 'postgres_cpu_pct') + ' | ' + phase_median('deliveries', 'postgres_cpu_pct'):>12}  "
                  f"{busy('submits') + ' | ' + busy('deliveries'):>14}  "
                  f"{throttled('submits') + ' | ' + throttled('deliveries'):>19}")
        print(f"vs qsqlite: against one SQLite process in the same quota; vs q1: against one PostgreSQL process "
              f"(q2/q1, q3/q1). app % each: each process's CPU in % of one core (at most its quota); pg %: "
              f"PostgreSQL's CPU in % of one core (unlimited: near {100 * cores} % it is the bound, not the "
              f"appliances); busy %: the whole machine's CPU in % of its {cores} cores; throttled: the share of "
              f"100 ms quota periods in which each process used up its quota (most of them: bound by it).")
    print("(ranges: lowest-highest over the rounds; ratios: medians)")


CASE_NAME = re.compile(r"(sqlite|qsqlite|pg[1-9][0-9]*|q[1-9][0-9]*)")


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
    parser.add_argument("--cases", default=None,
                        help="comma-separated: sqlite, pgN (pg1, pg2, ...), and the quota cases qsqlite, qN (q1, q2, "
                             "q3, ...); default sqlite,pg1,pg2")
    parser.add_argument("--scale-out", action="store_true", help="the quota cases: --cases qsqlite,q1,q2,q3")
    parser.add_argument("--quota", type=float, default=0.4,
                        help="quota cases: the CPU of each appliance process, in cores (0.4: 40 %% of one core)")
    parser.add_argument("--quota-process", choices=("shared", "own", "auto"), default="shared",
                        help="quota cases: [delivery] process of the appliances (shared: the worker in the server's "
                             "process, what a machine of under two cores runs)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder and databases (logs)")
    parser.add_argument("--out", type=Path, default=RESULTS / "postgres.json")
    args = parser.parse_args(argv)
    if args.scale_out and args.cases is not None:
        parser.error("--scale-out selects the cases: leave out --cases")
    args.cases = "qsqlite,q1,q2,q3" if args.scale_out else args.cases or "sqlite,pg1,pg2"
    if not 0 < args.quota <= (os.cpu_count() or 1):
        parser.error(f"--quota must be above 0 and at most the machine's {os.cpu_count()} cores")

    wanted = [w.strip() for w in args.cases.split(",") if w.strip()]
    unknown = [w for w in wanted if not CASE_NAME.fullmatch(w)]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}: sqlite, pgN, qsqlite, qN")
    wanted = list(dict.fromkeys(wanted))
    fsyncs = {"on": [True], "off": [False], "both": [True, False]}[args.fsync]
    cases = [Case("sqlite", "sqlite", 1)] if "sqlite" in wanted else []
    cases += [Case("qsqlite", "sqlite", 1, quota=args.quota)] if "qsqlite" in wanted else []
    for fsync in fsyncs:
        suffix = "" if fsync else "_nofsync"
        for w in wanted:
            if w.startswith("pg"):
                cases.append(Case(f"{w}{suffix}", "postgresql", int(w[2:]), fsync))
            elif re.fullmatch(r"q[0-9]+", w):
                cases.append(Case(f"{w}{suffix}", "postgresql", int(w[1:]), fsync, quota=args.quota))
    if any(c.quota for c in cases):
        try:
            check_cpu_groups(args.quota)
        except QuotaUnavailable as exc:
            print(f"bench.postgres: the quota cases need CPU groups (root, cgroup v1 cpu controller): {exc}",
                  file=sys.stderr)
            return 2
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
    except QuotaUnavailable as exc:
        print(f"bench.postgres: the quota cases need CPU groups (root, cgroup v1 cpu controller): {exc}",
              file=sys.stderr)
        return 2
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
