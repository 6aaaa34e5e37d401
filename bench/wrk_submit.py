"""The submit path measured the way a server's load test usually is (issue 40): wrk, a C client
(one thread, 64 connections, 10 s, a Lua script posting a realistic ~1.5 KB lead with a unique
email and phone each request to bench.submit's campaign BEN1: 10 rule sets, 3 routing rules,
dedupe on), pinned to CPU 0; the server's main process and all its threads pinned to CPU 1
(`taskset -acp 1 <pid>`), its delivery process left free and delivering every lead to
bench/buyer.py on loopback; the bare Litestar decode endpoint (bench/bare_app.py) pinned to CPU 1
in the same run, the two measured in turn, round by round.

wrk comes from the distribution's packages (Debian: `apt-get install -y wrk`), then:

    python -m bench.wrk_submit [--rounds 7] [--duration 10] [--warmup 3] [--connections 64] [--profile]

Prints each round and the medians: submits/s against bare requests/s and their ratio, p50/p99,
non-2xx answers, the intake core's CPU per submit (the server's main process, all its threads),
the delivery process's, and the server's resident memory; then waits for every qualified lead to
reach the buyer. `--profile` adds a round under py-spy (pinned beside wrk, on the client's CPU) and
prints where the intake core's time goes by stage, in microseconds a submit. bench.product stays
beside it: it measures the same product with nothing pinned
and the project's own Python client sharing the cores with it (a different, also honest figure).

Targets (issue 40): ratio >= 0.50, p99 < 20 ms at 64 connections, no non-2xx answers, every lead
delivered, resident memory within 10 % of the previous main's."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from bench.bare_app import sample_lead
from bench.campaigns_list import _version, cpu_seconds, stop_all, tree_cpu_seconds
from bench.delivery import JobCounter, wait_drained
from bench.product import RssSampler, start_product

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_RATIO, TARGET_P99_MS = 0.50, 20.0
CLIENT_CPU, SERVER_CPU = 0, 1
# Each wrk run numbers its leads from its own offset: no email or phone repeats across runs
# (dedupe would answer a repeat as a duplicate, a different path).
RUN_SPAN = 200_000

_SCRIPT = """
local headers = {["Content-Type"] = "application/json"%(key)s}
local offset, n = 0, 0
function init(args) offset = tonumber(args[1]) end
function request()
  n = n + 1
  local k = offset + n
  return wrk.format("POST", "%(path)s", headers, string.format([==[%(template)s]==], k, k %% 10000000))
end
function done(summary, latency, requests)
  io.write(string.format(
    'WRK_RESULT {"requests": %%d, "duration_us": %%d, "non_2xx": %%d, "socket_errors": %%d, "p50_us": %%d, "p99_us": %%d, "max_us": %%d}\\n',
    summary.requests, summary.duration, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""


def lua_script(path: str, key: str | None, campaign_id: str | None) -> str:
    """A wrk script posting bench.bare_app's lead, its email and phone numbered per request."""
    lead = sample_lead(1)
    lead["email"], lead["phone"] = "\0EMAIL\0", "\0PHONE\0"
    body = {"campaignId": campaign_id, **lead} if campaign_id else lead
    template = msgspec.json.encode(body).decode().replace("%", "%%")
    template = template.replace("\\u0000EMAIL\\u0000", "wrk.%d@example.com").replace("\\u0000PHONE\\u0000", "+1555%07d")
    assert "%d" in template and "%07d" in template, "the lead's email and phone were not templated"
    return _SCRIPT % {"key": f', ["X-API-Key"] = "{key}"' if key else "", "path": path, "template": template}


def pin(pid: int, cpu: int) -> None:
    """Every thread of `pid` (not its child processes) onto `cpu`."""
    subprocess.run(["taskset", "-acp", str(cpu), str(pid)], check=True, stdout=subprocess.DEVNULL)


def wrk(port: int, script: Path, offset: int, duration: float, connections: int) -> dict[str, Any]:
    out = subprocess.run(
        ["taskset", "-c", str(CLIENT_CPU), "wrk", "-t1", f"-c{connections}", f"-d{duration:g}s", "--latency",
         "-s", str(script), f"http://127.0.0.1:{port}", "--", str(offset)],
        check=True, capture_output=True, text=True).stdout
    line = next(line for line in out.splitlines() if line.startswith("WRK_RESULT "))
    return json.loads(line.removeprefix("WRK_RESULT "))


def thread_cpu_seconds(pid: int) -> tuple[float, float]:
    """(CPU seconds of `pid`'s main thread, the event loop's; of all its other threads)."""
    main = others = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a thread that ended meanwhile
        seconds = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        if task.name == str(pid):
            main += seconds
        else:
            others += seconds
    return main, others


def measured(port: int, script: Path, offset: int, args: argparse.Namespace, pid: int) -> dict[str, Any]:
    """One timed wrk run; the CPU of `pid`'s process tree over it, per 2xx answer."""
    tree0, threads0 = tree_cpu_seconds(pid), thread_cpu_seconds(pid)
    result = wrk(port, script, offset, args.duration, args.connections)
    tree1, threads1 = tree_cpu_seconds(pid), thread_cpu_seconds(pid)
    ok = result["requests"] - result["non_2xx"]
    seconds = result["duration_us"] / 1e6
    by_process = {("main" if p == pid else "child"): tree1[p] - tree0.get(p, 0.0) for p in tree1}
    return {"rps": round(ok / seconds, 1), "requests": result["requests"], "non_2xx": result["non_2xx"],
            "socket_errors": result["socket_errors"], "p50_ms": result["p50_us"] / 1000,
            "p99_ms": result["p99_us"] / 1000, "max_ms": result["max_us"] / 1000,
            "main_cpu_pct": round(100 * by_process.get("main", 0.0) / seconds, 1),
            "main_cpu_us_per_request": round(1e6 * by_process.get("main", 0.0) / max(1, ok), 1),
            "child_cpu_us_per_request": round(1e6 * by_process.get("child", 0.0) / max(1, ok), 1),
            "loop_thread_us_per_request": round(1e6 * (threads1[0] - threads0[0]) / max(1, ok), 1),
            "other_threads_us_per_request": round(1e6 * (threads1[1] - threads0[1]) / max(1, ok), 1)}


# Where a sample's time goes: the leaf-most frame that matches decides (path fragment, function
# names or None for any).
STAGES: tuple[tuple[str, tuple[str, ...], frozenset[str] | None], ...] = (
    ("write unit (SQL and the storage code)", ("appliance/storage/",), None),
    ("logging and metrics", ("logging/", "appliance/logs.py", "appliance/metrics.py", "prometheus_client/"), None),
    ("response encoding", ("appliance/api/io.py",), frozenset({"ok", "ok_body", "ok_raw"})),
    ("decode (JSON into the request struct)", ("appliance/api/io.py",), None),
    ("rules, routing, caps, dedupe", tuple(f"appliance/domain/{m}.py" for m in (
        "rules", "routing", "intake_decision", "constraints", "caps", "dedupe", "schedule", "distribution")), None),
    ("validation and normalization", ("appliance/domain/", "phonenumbers/"), None),
    ("use case (services)", ("appliance/services/",), None),
    ("submit edge and authentication", ("appliance/api/", "appliance/apikeys.py"), None),
    ("HTTP server: parsing, routing, middleware", ("uvicorn/", "httptools/", "h11/", "litestar/"), None),
    ("event loop and thread hand-off", ("asyncio/", "uvloop/", "selectors.py", "threading.py", "concurrent/",
                                        "queue.py"), None),
)


def stage_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        name, _, where = frame.partition(" (")
        for stage, paths, names in STAGES:
            if any(path in where for path in paths) and (names is None or name in names):
                return stage
    return "other"


def profiled(port: int, script: Path, offset: int, args: argparse.Namespace, pid: int, out: Path) -> dict[str, Any]:
    """A round under py-spy (every thread of the server's main process, on-CPU samples only),
    the samples split by stage and turned into microseconds of the intake core a submit."""
    exe = Path(sys.executable).with_name("py-spy")
    spy = subprocess.Popen(["taskset", "-c", str(CLIENT_CPU), str(exe if exe.exists() else "py-spy"), "record",
                            "-p", str(pid), "-d", str(max(1, int(args.duration))), "-r", "250", "-f", "raw",
                            "-o", str(out), "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    run = measured(port, script, offset, args, pid)
    _, err = spy.communicate(timeout=120)
    if not out.exists():
        return {"error": err.decode(errors="replace")[-500:]}
    # The event loop's thread apart from the others (the writer's): py-spy counts a thread waiting
    # on the disk as busy, the CPU figures do not, so each side is scaled by its own CPU.
    stages: dict[str, dict[str, int]] = {"loop": {}, "threads": {}}
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            frames = stack.split(";")
            side = stages["threads" if any(f.startswith("_bootstrap ") or "Thread._bootstrap" in f for f in frames)
                          else "loop"]
            stage = stage_of(frames)
            side[stage] = side.get(stage, 0) + int(count)
    cpu = {"loop": run["loop_thread_us_per_request"], "threads": run["other_threads_us_per_request"]}
    return {"round": run, "samples": {side: sum(counts.values()) for side, counts in stages.items()}, "stages": {
        side: {stage: {"pct": round(100 * n / sum(counts.values()), 1),
                       "us_per_submit": round(cpu[side] * n / sum(counts.values()), 1)}
               for stage, n in sorted(counts.items(), key=lambda item: -item[1])}
        for side, counts in stages.items() if counts}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wrk_submit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load before each case's first round")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--drain-timeout", type=float, default=180.0)
    parser.add_argument("--profile", action="store_true", help="one more round under py-spy: the intake core by stage")
    parser.add_argument("--stacks", type=Path, default=None, help="with --profile: keep py-spy's raw stacks here")
    parser.add_argument("--out", type=Path, default=RESULTS / "wrk_submit.json")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None or shutil.which("taskset") is None:
        sys.exit("wrk and taskset are needed: apt-get install -y wrk util-linux")
    if (os.cpu_count() or 1) < 2:
        sys.exit("two CPUs are needed: the client on one, the server on the other")

    work = Path(tempfile.mkdtemp(prefix="bench-wrk-"))
    procs: list[subprocess.Popen] = []
    try:
        started = start_product(work, procs, "own")
        port, bare_port, buyer_port, app, bare, buyer = (
            started.port, started.bare_port, started.buyer_port, started.app, started.bare, started.buyer)
        submit_script, bare_script = work / "submit.lua", work / "bare.lua"
        submit_script.write_text(lua_script("/api/v1/leads/submit", started.key, "BEN1"))
        bare_script.write_text(lua_script("/decode", None, None))
        time.sleep(1.0)  # the delivery process is up (started by the server) before the server is pinned
        pin(app.pid, SERVER_CPU)
        pin(bare.pid, SERVER_CPU)
        jobs = JobCounter(work / "data" / "appliance.db")

        runs = iter(range(1, 1000))
        wrk(port, submit_script, next(runs) * RUN_SPAN, args.warmup, args.connections)
        wrk(bare_port, bare_script, next(runs) * RUN_SPAN, args.warmup, args.connections)
        rss = RssSampler(app.pid)
        buyer_cpu0 = cpu_seconds(buyer.pid)
        rounds: list[dict[str, Any]] = []
        for number in range(1, args.rounds + 1):
            product = measured(port, submit_script, next(runs) * RUN_SPAN, args, app.pid)
            bare_run = measured(bare_port, bare_script, next(runs) * RUN_SPAN, args, bare.pid)
            ratio = round(product["rps"] / bare_run["rps"], 3)
            rounds.append({"round": number, "product": product, "bare": bare_run, "ratio": ratio})
            print(f"round {number}: {product['rps']:,.0f} submits/s (p50 {product['p50_ms']:.1f}, p99 "
                  f"{product['p99_ms']:.1f} ms, non-2xx {product['non_2xx']}, intake core {product['main_cpu_pct']}% "
                  f"{product['main_cpu_us_per_request']:.0f} us/submit: loop {product['loop_thread_us_per_request']:.0f}"
                  f" + threads {product['other_threads_us_per_request']:.0f}; delivery process "
                  f"{product['child_cpu_us_per_request']:.0f} us/submit) | bare {bare_run['rps']:,.0f}/s "
                  f"({bare_run['main_cpu_us_per_request']:.0f} us/request) | ratio {ratio:.3f}", flush=True)
        rss_median, rss_max = rss.median(), rss.stop()
        profile = profiled(port, submit_script, next(runs) * RUN_SPAN, args, app.pid,
                             args.stacks or work / "profile.txt") \
            if args.profile else None
        buyer_cpu_s = cpu_seconds(buyer.pid) - buyer_cpu0
        statuses = jobs.lead_statuses()
        qualified = sum(n for status, n in statuses.items() if status in ("qualified", "delivered"))
        drained = wait_drained(jobs, buyer_port, qualified, args.drain_timeout)
        statuses = jobs.lead_statuses()
        all_delivered = drained and statuses.get("qualified", 0) == 0
        jobs.close()
    finally:
        stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)

    def median(case: str, key: str) -> float:
        return statistics.median(r[case][key] for r in rounds)

    summary = {
        "submits_per_s": median("product", "rps"), "bare_per_s": median("bare", "rps"),
        "ratio": statistics.median(r["ratio"] for r in rounds),
        "ratio_range": [min(r["ratio"] for r in rounds), max(r["ratio"] for r in rounds)],
        "p50_ms": median("product", "p50_ms"), "p99_ms": median("product", "p99_ms"),
        "p99_ms_range": [min(r["product"]["p99_ms"] for r in rounds), max(r["product"]["p99_ms"] for r in rounds)],
        "non_2xx": sum(r["product"]["non_2xx"] + r["bare"]["non_2xx"] for r in rounds),
        "intake_cpu_us_per_submit": median("product", "main_cpu_us_per_request"),
        "intake_loop_thread_us_per_submit": median("product", "loop_thread_us_per_request"),
        "intake_other_threads_us_per_submit": median("product", "other_threads_us_per_request"),
        "delivery_cpu_us_per_submit": median("product", "child_cpu_us_per_request"),
        "bare_cpu_us_per_request": median("bare", "main_cpu_us_per_request"),
        "rss_mb_median": round(rss_median, 1), "rss_mb_max": round(rss_max, 1),
        "all_delivered": all_delivered, "lead_statuses": statuses,
        "buyer_cpu_s": round(buyer_cpu_s, 1),
    }
    checks = {f"ratio >= {TARGET_RATIO}": summary["ratio"] >= TARGET_RATIO,
              f"p99 < {TARGET_P99_MS} ms": summary["p99_ms"] < TARGET_P99_MS,
              "no non-2xx answers": summary["non_2xx"] == 0, "every lead delivered": all_delivered}
    print(f"\nmedians of {len(rounds)} rounds: {summary['submits_per_s']:,.0f} submits/s against "
          f"{summary['bare_per_s']:,.0f} bare: ratio {summary['ratio']:.3f} ({summary['ratio_range'][0]:.3f}-"
          f"{summary['ratio_range'][1]:.3f}); p50 {summary['p50_ms']:.1f} ms, p99 {summary['p99_ms']:.1f} ms "
          f"({summary['p99_ms_range'][0]:.1f}-{summary['p99_ms_range'][1]:.1f}); intake core "
          f"{summary['intake_cpu_us_per_submit']:.0f} us a submit (event loop thread "
          f"{summary['intake_loop_thread_us_per_submit']:.0f}, other threads {summary['intake_other_threads_us_per_submit']:.0f}; bare {summary['bare_cpu_us_per_request']:.0f} us "
          f"a request), delivery process {summary['delivery_cpu_us_per_submit']:.0f} us a submit; resident memory "
          f"{summary['rss_mb_median']:.0f} MB (max {summary['rss_mb_max']:.0f}); {statuses}")
    print(", ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in checks.items()))
    if profile is not None and "stages" in profile:
        run = profile["round"]
        print(f"\nthe intake core by stage (a round of {run['rps']:,.0f} submits/s at "
              f"{run['main_cpu_us_per_request']:.0f} us a submit; samples {profile['samples']}):")
        for side, title in (("loop", f"event loop thread, {run['loop_thread_us_per_request']:.0f} us"),
                            ("threads", f"other threads (the writer), {run['other_threads_us_per_request']:.0f} us")):
            print(f"  {title}:")
            for stage, share in profile["stages"].get(side, {}).items():
                print(f"    {stage:45} {share['pct']:5.1f} %  {share['us_per_submit']:6.0f} us")
    elif profile is not None:
        print(f"profile failed: {profile['error']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "wrk_submit", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "versions": {n: _version(n) for n in ("litestar", "msgspec", "uvicorn", "uvloop", "httptools", "apsw")},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "summary": summary, "rounds": rounds, "checks": checks, "profile": profile}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
