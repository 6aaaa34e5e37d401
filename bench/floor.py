"""The least CPU a lead can cost in bench.product's setup, beside what issue 20's ratio allows.

    python -m bench.floor [--duration 8] [--warmup 2] [--connections 64] [--leads 8000] [--out FILE]

The ratio target (0.50 of the bare endpoint's submits/s, on this machine's cores, the load client
and the buyer on them too) sets a budget: the machine's CPU per lead may not exceed
cores x 1e6 / (0.50 x the bare endpoint's requests/s) microseconds. This measures, in one run,
the parts of a lead no design can leave out, each alone and with everything around it taken away:

(1) the submit's HTTP exchange: the bare decode endpoint (bench/bare_app.py) under bench.submit's
    closed loop, the machine's CPU per request (server, load client and the kernel's loopback
    work) -- it decodes the same body;
(2) the delivery's HTTP exchange: the built-in delivery client (appliance/adapters/http1.py)
    posting a lead's JSON to bench/buyer.py, `--connections` at a time for `--duration`, taking its
    requests in turn from 20,000 built before the clock starts, the machine's CPU per exchange
    (sender, buyer, kernel);
(3) the SQL a lead writes: `--leads` submits of bench.product's tenant, then their deliveries, run
    as bench.delivery_profile runs them, every statement of both write connections recorded (the
    transactions as they were grouped); then replayed statement by statement, nothing of Python
    around them but the loop that runs them, against a copy of the database as it was before:
    the machine's CPU per lead (the replaying thread's and the kernel's for its writes), the
    submit's transactions at synchronous FULL and the delivery's at NORMAL. The replay must add
    the leads and leave them delivered.

The floor is their sum, with everything else a lead takes (validation, normalization, rules,
routing, the dedupe's logic, building records and events, asyncio's per-request work, the claim's
and the load's reads) at zero. A floor above the budget means no arrangement of the work into
processes or threads reaches the ratio: each part must itself get cheaper. Nothing is pinned.
Results: bench/results/floor.json."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import apsw
import msgspec
from uvicorn.loops.auto import auto_loop_factory

from appliance.adapters import http1
from appliance.processes import settle_for_serving
from appliance.storage.db import _configure
from bench.bare_app import sample_lead
from bench.campaigns_list import cpu_seconds, machine_cpu_seconds
from bench.delivery import Procs, buyer_get
from bench.delivery_profile import _deliver, _queued, delivery_bench
from bench.loadgen import free_port
from bench.submit import bare_request, measure
from bench.submit_profile import _drive

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_RATIO = 0.50
WARM_LEADS = 500  # submitted and delivered before the SQL is recorded


def submit_exchange(args: argparse.Namespace, procs: Procs) -> dict[str, Any]:
    """(1): the bare endpoint under the closed loop."""
    port = free_port()
    bare = procs.start("bare", [sys.executable, "-m", "bench.bare_app", "--port", str(port)], port, None)
    try:
        run = measure("bare decode", f"http://127.0.0.1:{port}/decode", bare_request, bare, args)
    finally:
        procs.stop(bare)
    return {"rps": run["rps"], "server_us": run["server_cpu_us_per_request"],
            "client_us": run["client_cpu_us_per_request"], "machine_us": run["machine_cpu_us_per_request"]}


def delivery_exchange(args: argparse.Namespace, procs: Procs) -> dict[str, Any]:
    """(2): the delivery client and the buyer alone."""
    port = free_port()
    buyer = procs.start("buyer", [sys.executable, "-m", "bench.buyer", "--port", str(port)], port, None)
    origin = http1.Origin("http", "127.0.0.1", port, None)
    client = http1.Client()

    def request(n: int) -> http1.Request:
        return http1.build_request("POST", "/leads", [
            ("Host", f"127.0.0.1:{port}"), ("Content-Type", "application/json"),
            ("Idempotency-Key", f"floor-{n}"), ("User-Agent", "lead-appliance")],
            msgspec.json.encode(sample_lead(n)))

    async def send_for(seconds: float, pool: list[http1.Request]) -> int:
        """Exchanges over `args.connections` connections for `seconds`, taking requests from `pool`
        in turn (built beforehand: building them is not the exchange); how many were answered."""
        deadline, turns, sent = time.perf_counter() + seconds, itertools.cycle(pool), 0

        async def one_connection() -> None:
            nonlocal sent
            while time.perf_counter() < deadline:
                response = await client.send(origin, next(turns), max_body=65536)
                if response.status != 200:
                    raise RuntimeError(f"the buyer answered {response.status}")
                sent += 1

        await asyncio.gather(*(one_connection() for _ in range(args.connections)))
        return sent

    try:
        pool = [request(n) for n in range(20_000)]
        with asyncio.Runner(loop_factory=auto_loop_factory()) as runner:  # the delivery process's loop
            warm = runner.run(send_for(args.warmup, pool))  # connections, warm code
            def reading() -> tuple[float, float, float, float]:  # sender, buyer, machine, wall
                return cpu_seconds(os.getpid()), cpu_seconds(buyer.pid), sum(machine_cpu_seconds()), time.perf_counter()

            sender0, buyer0, machine0, t0 = reading()
            n = runner.run(send_for(args.duration, pool))
            sender1, buyer1, machine1, t1 = reading()
            runner.run(client.aclose())
        if buyer_get(port, "stats")["requests"] != warm + n:
            raise RuntimeError("the buyer did not record every exchange")
    finally:
        procs.stop(buyer)
    return {"exchanges": n, "per_second": round(n / (t1 - t0)), "sender_us": round(1e6 * (sender1 - sender0) / n, 1),
            "buyer_us": round(1e6 * (buyer1 - buyer0) / n, 1), "machine_us": round(1e6 * (machine1 - machine0) / n, 1)}


def _recorder(into: list[tuple[str, Any]]):  # an apsw exec tracer
    def trace(_cursor: apsw.Cursor, sql: str, bindings: Any) -> bool:
        into.append((sql, bindings))
        return True
    return trace


def recorded_sql(leads: int, before: Path) -> tuple[list, list]:
    """(3), first half: the statements of `leads` submits and of their deliveries, and at `before`
    a copy of the database from before them."""
    submits: list[tuple[str, Any]] = []
    deliveries: list[tuple[str, Any]] = []
    with delivery_bench(64) as parts:
        serial = itertools.count(1)
        intake_db, delivery_db = parts.intake.store.sqlite, parts.runtime.store.sqlite

        async def run() -> None:
            await _drive(parts.app, parts.key, WARM_LEADS, 64, serial)  # tables, caches, connections
            await _deliver(parts.worker, parts.runtime.metrics, _queued(parts.runtime), None, False)
            intake_db.backup_to(before)
            intake_db.write_connection.exec_trace = _recorder(submits)
            delivery_db.write_connection.exec_trace = _recorder(deliveries)
            statuses = await _drive(parts.app, parts.key, leads, 64, serial)
            if statuses != {201: leads}:
                raise RuntimeError(f"submits answered {statuses}")
            await _deliver(parts.worker, parts.runtime.metrics, _queued(parts.runtime), None, False)
            intake_db.write_connection.exec_trace = None
            delivery_db.write_connection.exec_trace = None
            if buyer_get(parts.buyer_port, "stats")["keys"] != WARM_LEADS + leads:
                raise RuntimeError("not every lead was delivered")

        with asyncio.Runner(loop_factory=auto_loop_factory()) as runner:
            runner.run(run())
    return submits, deliveries


def replayed_sql(before: Path, submits: list, deliveries: list, leads: int) -> dict[str, Any]:
    """(3), second half: the recorded statements run again on a copy, CPU per lead of each share."""
    conn = apsw.Connection(str(before))
    counts = "SELECT count(*), count(*) FILTER (WHERE status = 'delivered') FROM leads"
    try:
        first = conn.execute(counts).fetchone()
        figures: dict[str, Any] = {}
        for name, statements, synchronous in (("submit", submits, "FULL"), ("delivery", deliveries, "NORMAL")):
            _configure(conn, synchronous)
            started, machine0 = time.process_time(), sum(machine_cpu_seconds())
            for sql, bindings in statements:
                for _row in conn.execute(sql, bindings):
                    pass
            used, machine = time.process_time() - started, sum(machine_cpu_seconds()) - machine0
            commits = sum(1 for sql, _ in statements if sql.strip().upper() == "COMMIT")
            # `us_per_lead`: the replaying thread's CPU, exact; `machine_us_per_lead` adds the
            # kernel's work for the writes (in 10 ms ticks: read it over thousands of leads).
            figures[name] = {"statements": len(statements), "commits": commits,
                             "statements_per_lead": round(len(statements) / leads, 1),
                             "us_per_lead": round(1e6 * used / leads, 1),
                             "machine_us_per_lead": round(1e6 * machine / leads, 1)}
        last = conn.execute(counts).fetchone()
    finally:
        conn.close()
    if (last[0] - first[0], last[1] - first[1]) != (leads, leads):  # the replay did the work it stands for
        raise RuntimeError(f"the replay added {last[0] - first[0]} leads and delivered {last[1] - first[1]},"
                           f" {leads} of each expected")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=8.0, help="seconds of each closed loop")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--leads", type=int, default=8000, help="leads whose SQL is recorded and replayed")
    parser.add_argument("--out", type=Path, default=RESULTS / "floor.json")
    args = parser.parse_args(argv)
    args.processes, args.profile_threads = 1, False  # what bench.submit's measure() reads

    cores = os.cpu_count() or 1
    settle_for_serving()  # the delivery process's collector and switch interval, for (2) and (3)
    work = Path(tempfile.mkdtemp(prefix="bench-floor-"))
    procs = Procs(work)
    try:
        submit = submit_exchange(args, procs)
        delivery = delivery_exchange(args, procs)
        submits, deliveries = recorded_sql(args.leads, work / "before.db")
        sql = replayed_sql(work / "before.db", submits, deliveries, args.leads)
    finally:
        procs.close()
        shutil.rmtree(work, ignore_errors=True)

    budget = cores * 1e6 / (TARGET_RATIO * submit["rps"])
    floor = submit["machine_us"] + delivery["machine_us"] + sum(share["machine_us_per_lead"] for share in sql.values())
    print(f"budget at ratio {TARGET_RATIO}: {cores} cores / ({TARGET_RATIO} x {submit['rps']:.0f} bare requests/s) "
          f"= {budget:.0f} us of machine CPU a lead")
    print(f"(1) submit's HTTP exchange (bare endpoint): {submit['machine_us']:.0f} us a request "
          f"(server {submit['server_us']:.0f}, client {submit['client_us']:.0f}, the rest the kernel's)")
    print(f"(2) delivery's HTTP exchange: {delivery['machine_us']:.0f} us (sender {delivery['sender_us']:.0f}, "
          f"buyer {delivery['buyer_us']:.0f}); {delivery['per_second']} exchanges/s")
    for name, share in sql.items():
        print(f"(3) the {name}'s SQL replayed: {share['us_per_lead']:.0f} us a lead, {share['machine_us_per_lead']:.0f} "
              f"with the kernel's ({share['statements_per_lead']} statements a lead on the write connection, "
              f"{share['commits']} commits for {args.leads} leads)")
    print(f"floor {floor:.0f} us a lead against a budget of {budget:.0f}: the floor is {100 * floor / budget:.0f} % "
          f"of it, {budget - floor:.0f} us left for everything else a lead takes")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "floor", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": cores, "platform": platform.platform(), "python": platform.python_version()},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "budget_us": round(budget, 1), "floor_us": round(floor, 1),
        "submit_exchange": submit, "delivery_exchange": delivery, "sql": sql}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
