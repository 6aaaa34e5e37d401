"""Submit throughput and latency: a real `appliance serve` on loopback, 64
connections, realistic ~1.5 KB leads, a campaign with 10 rule sets, 3 routing rules and dedupe
on, `synchronous=FULL`; and, in the same run, a bare Litestar endpoint that only decodes the same
body into a struct. Reports submits/s, p50/p99 and the ratio appliance / bare.

    python -m bench.submit [--duration 10] [--connections 64] [--repeat 3] [--webhook] [--verifier]

`--webhook` subscribes a webhook to every event: each submit also writes its events to the
outbox. Like delivery, sending is left to the job loop and off here (`[webhooks] concurrency = 0`),
so the figure stays the intake's; `--webhook-send` turns the sender on as well (a local receiver,
bench/buyer.py, on the client's CPU), and then the server's one core also sends every event.

`--verifier` measures a verification step's price instead of the bare endpoint: the same
campaign with the built-in `phone` verifier (`onFail: flag`, so every lead goes on as without it:
the bench leads' 555 numbers are not valid) against it without, in alternating runs, and prints
the ratio of their submits/s and CPU per submit.

The server runs with `[delivery] concurrency = 0` (intake only) so the figure is the intake's;
bench/delivery.py measures delivery. Server pinned to CPU 0, load client to CPU 1 (2 cores)."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from bench.bare_app import sample_lead
from bench.campaigns_list import ROOT, _pin, _version, appliance_cli, machine_cpu_seconds, stop_all, tree_cpu_seconds
from bench.delivery import Profiler, print_profile
from bench.loadgen import Request, free_port, run_load, wait_for_port

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_RPS, TARGET_P99_MS, TARGET_RATIO = 4000, 30.0, 0.40
TARGET_VERIFIER_RATIO = 0.9  # submits/s with the phone verifier against the same campaign without (issue 38)
_KEY = os.environ.get("BENCH_SUBMIT_KEY", "")


def _rule(name: str, field: str, operator: str, value: list | None = None, **extra: Any) -> dict:
    condition = {"field": field, "operator": operator, **({"value": value} if value is not None else {}), **extra}
    return {"name": name, "subRules": [{"conditions": [condition]}]}


def bundle() -> dict:
    """One intake campaign: 10 qualification rule sets (realistic leads pass them), 3 routing
    rules (about a fifth of the leads route), dedupe from the tenant default (30 days)."""
    rules = [
        _rule("Minors", "age", "less_than", [18]),
        _rule("Seniors", "age", "greater_than", [99]),
        _rule("Outside served states", "address.state", "not_in_value_set", valueSetId="states"),
        _rule("Test emails", "email", "ends_with", ["@test.invalid", "@mailinator.com"]),
        _rule("No phone", "phoneE164", "not_exists"),
        _rule("Blocked names", "lastName", "in_value_set", valueSetId="blocked"),
        _rule("At fault", "questionnaire.at_fault", "equals", ["yes"]),
        _rule("Attorney retained", "questionnaire.attorney_retained", "equals", ["yes"]),
        _rule("Bad zip", "address.zip", "matches", ["^0000"]),
        {"name": "Old accidents", "logicalOperator": "AND", "subRules": [
            {"logicalOperator": "AND", "conditions": [
                {"field": "questionnaire.accident_date", "operator": "less_than", "value": ["2020-01-01"]},
                {"field": "questionnaire.injured", "operator": "equals", "value": ["no"]}]}]},
    ]
    routes = [
        {"routeName": "Texas", "priority": 1, "routeTo": {"campaignId": "BTX"},
         "subRules": [{"conditions": [{"field": "address.state", "operator": "equals", "value": ["TX"]}]}]},
        {"routeName": "Bing traffic", "priority": 2, "routeTo": {"campaignId": "BMS"},
         "subRules": [{"conditions": [{"field": "attribution.utm_source", "operator": "equals", "value": ["bing"]}]}]},
        {"routeName": "Trucks", "priority": 3, "routeTo": {"campaignId": "BTK"},
         "subRules": [{"conditions": [{"field": "questionnaire.vehicle_type", "operator": "equals",
                                       "value": ["truck", "semi"]}]}]},
    ]
    plain = [{"campaignId": code, "name": name, "qualification": {"rules": rules[:3]}}
             for code, name in (("BTX", "Texas"), ("BMS", "Microsoft ads"), ("BTK", "Trucks"))]
    intake = {"rules": rules, "autoRoutingEnabled": True, "routingRules": routes}
    phone = {**intake, "verifications": [{"verifier": "phone", "onFail": "flag"}]}
    return {
        "valueSets": [{"valueSetId": "states", "values": ["CA", "TX", "FL", "NY", "AZ"]},
                      {"valueSetId": "blocked", "values": ["Fraud", "Tester", "Asdf"]}],
        "fieldLibrary": [{"key": k, "label": k.replace("_", " ").title(), "question": f"{k.replace('_', ' ')}?",
                          "category": "question"} for k in ("accident_date", "injured", "at_fault",
                                                            "medical_treatment", "attorney_retained", "vehicle_type",
                                                            "police_report", "insurance_carrier")],
        "campaigns": [{"campaignId": "BEN1", "name": "Auto accident", "qualification": intake},
                      {"campaignId": "BPH1", "name": "Auto accident, phone verified", "qualification": phone},
                      *plain],
    }


def submit_body(n: int, campaign_id: str = "BEN1") -> bytes:
    lead = sample_lead(n)
    return msgspec.json.encode({"campaignId": campaign_id, **lead})


_SERIAL = itertools.count(1)


def submit_request(n: int, campaign_id: str = "BEN1") -> Request:
    # Every run in a process counts n from 0 and client processes run side by side: a serial per
    # process plus the process id keeps emails unique, so dedupe never fires by accident.
    n = os.getpid() * 10_000_000 + next(_SERIAL)
    return Request(method="POST", path="/api/v1/leads/submit",
                   headers={"X-API-Key": _KEY, "Content-Type": "application/json"}, body=submit_body(n, campaign_id))


def verified_request(n: int) -> Request:
    """A submit to the campaign with the phone verifier (BPH1, otherwise BEN1)."""
    return submit_request(n, "BPH1")


def bare_request(n: int) -> Request:
    return Request(method="POST", path="/decode", headers={"Content-Type": "application/json"},
                   body=msgspec.json.encode(sample_lead(n)))


def measure(label: str, url: str, factory, server: subprocess.Popen, args: argparse.Namespace,
            profile_to: Path | None = None) -> dict[str, Any]:
    run_load(url, connections=args.connections, duration=args.warmup, factory=factory, processes=args.processes)
    profiler = Profiler(server.pid, args.duration, profile_to, not args.profile_threads) if profile_to else None
    tree0, (busy0, irq0), t0 = tree_cpu_seconds(server.pid), machine_cpu_seconds(), time.perf_counter()
    result = run_load(url, connections=args.connections, duration=args.duration, factory=factory,
                      processes=args.processes)
    tree1, (busy1, irq1), t1 = tree_cpu_seconds(server.pid), machine_cpu_seconds(), time.perf_counter()
    # The server's processes (its delivery process too): those alive at both ends of the run.
    cpu0, cpu1 = sum(tree0.get(pid, 0.0) for pid in tree1), sum(tree1.values())
    out = result.to_dict() | {"label": label}
    if len(tree1) > 1:
        out["server_cpu_pct_by_process"] = {
            "server" if pid == server.pid else f"child {pid}":
                round(100 * (tree1[pid] - tree0.get(pid, 0.0)) / (t1 - t0), 1) for pid in tree1}
    out["server_cpu_us_per_request"] = round(1e6 * (cpu1 - cpu0) / max(1, result.ok), 1)
    if profiler is not None:
        out["profile"] = profiler.finish()
        print_profile(label, out["profile"])
    wall = t1 - t0
    out["server_cpu_pct"] = round(100 * (cpu1 - cpu0) / wall, 1)
    out["other_cpu_pct"] = round(100 * ((busy1 - busy0) + (irq1 - irq0) - (cpu1 - cpu0) - result.client_cpu) / wall, 1)
    # Every process and the kernel, per request, over the one window the server's figure uses.
    out["machine_cpu_us_per_request"] = round(1e6 * ((busy1 - busy0) + (irq1 - irq0)) / max(1, result.ok), 1)
    out["client_cpu_us_per_request"] = round(1e6 * result.client_cpu / max(1, result.ok), 1)
    return out


def main(argv: list[str] | None = None) -> int:
    global _KEY
    parser = argparse.ArgumentParser(prog="python -m bench.submit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--out", type=Path, help="default: bench/results/submit.json (--verifier: submit_verifier.json)")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                        help="server on CPU 0, client on CPU 1 (--no-pin: the OS places them)")
    parser.add_argument("--webhook", action="store_true",
                        help="subscribe a webhook to every event (the events are written, not sent)")
    parser.add_argument("--webhook-send", action="store_true",
                        help="with --webhook: send the events too (receiver: bench/buyer.py on the client CPU)")
    parser.add_argument("--verifier", action="store_true",
                        help="the campaign with the built-in phone verifier against it without, alternating")
    parser.add_argument("--profile", action="store_true",
                        help="py-spy record the appliance server during its measurement (slows it down)")
    parser.add_argument("--profile-threads", action="store_true",
                        help="with --profile: sample every non-idle thread, not only the GIL holder")
    args = parser.parse_args(argv)
    args.out = args.out or RESULTS / ("submit_verifier.json" if args.verifier else "submit.json")

    cpus = sorted(os.sched_getaffinity(0))
    server_cpu, client_cpu = (cpus[0], cpus[1]) if len(cpus) >= 2 and args.pin else (None, None)
    work = Path(tempfile.mkdtemp(prefix="bench-submit-"))
    procs: list[subprocess.Popen] = []
    old_affinity = os.sched_getaffinity(0)
    try:
        port, bare_port = free_port(), free_port()
        config = work / "appliance.toml"
        private = "allow_private_addresses = true\n" if args.webhook else ""
        senders = 16 if args.webhook_send else 0
        config.write_text(f'[server]\nlog_level = "warning"\n[storage]\npath = "{work / "data"}"\nsynchronous = "FULL"\n'
                          f'[security]\nrate_limit_per_minute = 0\n[delivery]\nconcurrency = 0\n{private}'
                          f'[webhooks]\nconcurrency = {senders}\n[plugins]\ndirs = []\n')
        appliance_cli(config, "init")
        tenant = json.loads(appliance_cli(config, "tenant", "create", "Bench", "--json"))["tenantId"]
        _KEY = os.environ["BENCH_SUBMIT_KEY"] = json.loads(
            appliance_cli(config, "key", "create", "--tenant", tenant, "--json"))["key"]
        receiver_port = free_port()
        tenant_bundle = bundle()
        if args.webhook:
            tenant_bundle["webhooks"] = [{"webhookId": "bench", "url": f"http://127.0.0.1:{receiver_port}/hooks"}]
        (work / "bundle.json").write_text(json.dumps(tenant_bundle))
        appliance_cli(config, "import", "--tenant", tenant, str(work / "bundle.json"))

        def start(name: str, cmd: list[str], listen: int, cpu: int | None = server_cpu) -> subprocess.Popen:
            log = open(work / f"{name}.log", "wb")
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_pin(cpu))
            procs.append(proc)
            wait_for_port(listen, proc=proc)
            return proc

        if args.webhook and args.webhook_send:
            start("receiver", [sys.executable, "-m", "bench.buyer", "--port", str(receiver_port)], receiver_port,
                  client_cpu)

        app = start("appliance", [sys.executable, "-m", "appliance", "--config", str(config), "serve", "--port",
                                  str(port)], port)
        bare = None if args.verifier else start("bare", [sys.executable, "-m", "bench.bare_app", "--port",
                                                         str(bare_port)], bare_port)
        if client_cpu is not None:
            os.sched_setaffinity(0, {client_cpu})
        submit_url = f"http://127.0.0.1:{port}/api/v1/leads/submit"
        cases = [("appliance submit", submit_url, submit_request, app),
                 ("submit, phone verifier", submit_url, verified_request, app) if args.verifier else
                 ("bare decode", f"http://127.0.0.1:{bare_port}/decode", bare_request, bare)]
        rounds: list[list[dict]] = [[] for _ in cases]
        for round_number in range(args.repeat):
            # With --verifier the two cases swap places every round (A B, B A, ...): the database
            # grows through the run, and a case always measured second would pay for it.
            order = list(enumerate(cases))
            if args.verifier and round_number % 2:
                order.reverse()
            for i, (label, url, factory, server) in order:
                profile_to = work / "profile.txt" if args.profile and server is app else None
                rounds[i].append(measure(label, url, factory, server, args, profile_to))
                print(f"  {label}: {rounds[i][-1]['rps']} req/s")
        runs = [max(rs, key=lambda r: r["rps"]) for rs in rounds]
        conn_db = work / "data" / "appliance.db"
        import apsw

        db = apsw.Connection(str(conn_db), flags=apsw.SQLITE_OPEN_READONLY)
        statuses = dict(db.execute("SELECT status, count(*) FROM leads GROUP BY status").fetchall())
        waiting_events = db.execute("SELECT count(*) FROM webhook_outbox").fetchone()[0]
        db.close()
    finally:
        os.sched_setaffinity(0, old_affinity)
        stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)

    app_run, other_run = runs
    ratio = round(other_run["rps"] / app_run["rps"] if args.verifier else app_run["rps"] / other_run["rps"], 3)
    print(f"\n{'case':20} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'server':>7} {'us/req':>7} {'other':>6}"
          "  non-2xx/errors")
    for r in runs:
        lat = r["latency_ms"]
        bad = {k: v for k, v in r["statuses"].items() if not k.startswith("2")}
        print(f"{r['label']:20} {r['rps']:>8.0f} {lat['p50']:>8.2f} {lat['p99']:>8.2f} {r['server_cpu_pct']:>6.0f}% "
              f"{r['server_cpu_us_per_request']:>7.0f} "
              f"{r['other_cpu_pct']:>5.0f}%  {bad or '-'} {r['errors'] or '-'}")
    print(f"lead statuses stored: {statuses}")
    if args.webhook:
        print(f"webhook outbox rows (changes) still waiting at the end: {waiting_events}")
    if args.verifier:
        pairs = [round(phone["rps"] / plain["rps"], 3) for plain, phone in zip(*rounds)]
        mean = round(sum(r["rps"] for r in rounds[1]) / sum(r["rps"] for r in rounds[0]), 3)
        cpu = round(sum(r["server_cpu_us_per_request"] for r in rounds[0])
                    / sum(r["server_cpu_us_per_request"] for r in rounds[1]), 3)
        print(f"ratio with the phone verifier / without (target >= {TARGET_VERIFIER_RATIO}): {mean:.3f} over all"
              f" rounds, {ratio:.3f} best rounds, {pairs} round by round; server CPU a submit without / with:"
              f" {cpu:.3f}")
    else:
        print(f"ratio appliance/bare: {ratio:.2f} (target >= {TARGET_RATIO})")
    print(f"targets: >= {TARGET_RPS}/s {'met' if app_run['rps'] >= TARGET_RPS else 'MISSED'}, "
          f"p99 < {TARGET_P99_MS} ms {'met' if app_run['latency_ms']['p99'] < TARGET_P99_MS else 'MISSED'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "submit", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "versions": {n: _version(n) for n in ("litestar", "msgspec", "uvicorn", "uvloop", "httptools", "apsw")},
        "settings": vars(args) | {"out": str(args.out)}, "runs": runs, "rounds": rounds, "ratio": ratio,
        "lead_statuses": statuses, "webhook_events_waiting": waiting_events if args.webhook else None},
        indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
