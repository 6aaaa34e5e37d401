"""The submit path in one process under cProfile: deterministic call counts and CPU per request,
without a network, a load client or other processes skewing the figure.

    python -m bench.submit_profile [--requests 5000] [--concurrency 64] [--top 40] [--sort tottime]

Builds the bench.submit tenant (same campaign, rules, routing, dedupe) in a temporary data dir,
creates the real app (`create_app(..., background=False)`, the real writer thread, synchronous =
FULL, the collector and switch interval `serve` sets: `settle_for_serving()`) and drives it
through ASGI directly: `concurrency` tasks each send a submit, wait for the answer and send the
next. Prints CPU us per request without the profiler (process time, and per
thread) and then the cProfile table of the event-loop thread, or with `--writer` of the database
writer thread (cProfile sees one thread at a time)."""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import itertools
import json
import os
import pstats
import threading
import shutil
import tempfile
import time
from pathlib import Path

from appliance.services import tenancy
from appliance.app import create_app
from appliance.config import load_config
from appliance.processes import settle_for_serving
from appliance.runtime import create_runtime
from bench.submit import bundle, submit_body


def _scope(key: str, body_length: int) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/api/v1/leads/submit", "raw_path": b"/api/v1/leads/submit", "query_string": b"",
            "root_path": "", "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8080),
            "headers": [(b"host", b"127.0.0.1:8080"), (b"x-api-key", key.encode()),
                        (b"content-type", b"application/json"), (b"content-length", str(body_length).encode())]}


async def _drive(app, key: str, requests: int, concurrency: int, serial: itertools.count) -> dict[int, int]:
    statuses: dict[int, int] = {}
    remaining = iter(range(requests))

    async def one_client() -> None:
        for _ in remaining:
            body = submit_body(next(serial))
            sent = False

            async def receive() -> dict:
                nonlocal sent
                if sent:
                    await asyncio.sleep(3600)
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}

            async def send(message: dict) -> None:
                if message["type"] == "http.response.start":
                    statuses[message["status"]] = statuses.get(message["status"], 0) + 1

            await app(_scope(key, len(body)), receive, send)

    await asyncio.gather(*(one_client() for _ in range(concurrency)))
    return statuses


def thread_cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) of each thread of this process, by thread name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        name = names.get(int(tid), f"thread {tid}")
        found[name] = found.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.submit_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--top", type=int, default=40, help="rows of the profile's table; 0: no profiled pass")
    parser.add_argument("--sort", default="tottime", choices=("tottime", "cumulative", "ncalls"))
    parser.add_argument("--webhook", action="store_true",
                        help="subscribe a webhook to every event: the submit also writes its events to the outbox"
                             " (nothing is sent: no background loops run here)")
    parser.add_argument("--writer", action="store_true",
                        help="profile the database writer thread instead of the event-loop thread")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench-submit-profile-"))
    try:
        config_file = work / "appliance.toml"
        config_file.write_text(f'[storage]\npath = "{work / "data"}"\nsynchronous = "FULL"\n'
                               '[security]\nrate_limit_per_minute = 0\n[delivery]\nconcurrency = 0\n'
                               '[plugins]\ndirs = []\n')
        runtime = create_runtime(load_config(config_file))
        try:
            tenant = tenancy.create_tenant(runtime, "Bench")
            tenant_bundle = bundle()
            if args.webhook:
                tenant_bundle["webhooks"] = [{"webhookId": "bench", "url": "https://hooks.example.com/leads"}]
            tenancy.import_bundle(runtime, tenant, json.dumps(tenant_bundle).encode(), "json")
            key = tenancy.create_key(runtime, tenant, name="bench").key
            app = create_app(runtime, background=False)
            settle_for_serving()  # as `serve` does once loaded: the collector's settings, the switch interval
            serial = itertools.count(1)

            async def run(profile: cProfile.Profile | None) -> None:
                await _drive(app, key, min(500, args.requests), args.concurrency, serial)  # warm caches
                threads0, cpu0, wall0 = thread_cpu_seconds(), time.process_time(), time.perf_counter()
                if profile:
                    # A write unit runs on the writer thread: that is how its profiler is switched.
                    await runtime.store.write(lambda tx: profile.enable()) if args.writer else profile.enable()
                statuses = await _drive(app, key, args.requests, args.concurrency, serial)
                if profile:
                    await runtime.store.write(lambda tx: profile.disable()) if args.writer else profile.disable()
                cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
                if profile is None:
                    print(f"{args.requests} submits, {args.concurrency} at a time: statuses {statuses}")
                    print(f"  {1e6 * cpu / args.requests:.0f} us CPU per submit (all threads), "
                          f"{args.requests / wall:.0f} submits/s in one process without HTTP")
                    for name, seconds in sorted(thread_cpu_seconds().items()):
                        used = seconds - threads0.get(name, 0.0)
                        if used > 0:
                            print(f"    {1e6 * used / args.requests:6.0f} us  {name}")

            asyncio.run(run(None))
            if args.top > 0:
                profile = cProfile.Profile()
                asyncio.run(run(profile))
                pstats.Stats(profile).strip_dirs().sort_stats(args.sort).print_stats(args.top)
        finally:
            runtime.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
