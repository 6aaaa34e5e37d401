"""The delivery worker in one process under cProfile: CPU per delivered lead and call counts,
without the intake, a load client or other processes running beside it.

    python -m bench.delivery_profile [--leads 5000] [--rounds 1] [--profile [--writer]] [--top 40]
                                     [--sort tottime]

Builds bench.product's tenant (bench.submit's campaign, every campaign delivering to
bench/buyer.py on loopback) in a temporary data dir and starts the buyer as a subprocess. Each
round first commits `leads` submits through the app's ASGI (`create_app(..., background=False)`:
no worker runs, the leads wait as deliver jobs), then runs the real worker as `appliance
_deliver` runs it (its own runtime on the same database with `synchronous = NORMAL`, the plugins'
registry, `SettingsCache`, `settle_for_serving()`: the collector and the switch interval,
uvicorn's loop choice, `[delivery] concurrency`) until the buyer holds every qualified lead of the
round. Prints CPU us per delivered lead of the process and per thread (a warm-up round of 500 leads comes first). `--profile` adds one more round
under cProfile and prints the table of the event-loop thread, or with `--writer` of the database
writer thread (cProfile sees one thread at a time)."""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import itertools
import json
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from appliance.app import create_app
from appliance.config import load_config
from appliance.jobs.delivery import DeliveryWorker
from appliance.plugins import load_plugins
from appliance.runtime import Runtime, create_runtime, open_runtime
from appliance.services import tenancy
from appliance.services.tenant_settings import SettingsCache
from appliance.processes import settle_for_serving
from bench.campaigns_list import ROOT, stop_all
from bench.delivery import buyer_get
from bench.loadgen import free_port, wait_for_port
from bench.product import bundle
from bench.submit_profile import _drive, thread_cpu_seconds
from uvicorn.loops.auto import auto_loop_factory


def _queued(runtime) -> int:  # noqa: ANN001 - Runtime
    """Deliver jobs waiting to run."""
    return sum(n for kind, state, n in runtime.store.reader().jobs.open_jobs_by_kind_and_state()
               if kind == "deliver" and state == "ready")


async def _deliver(worker: DeliveryWorker, metrics, leads: int, profile: cProfile.Profile | None,  # noqa: ANN001
                   writer: bool) -> float:
    """Run the worker until `leads` deliveries are recorded; returns the wall seconds."""
    metrics.deliveries.clear()
    stop = asyncio.Event()
    store = worker.runtime.store
    if profile is not None:
        await store.write(lambda tx: profile.enable()) if writer else profile.enable()
    started = time.perf_counter()
    task = asyncio.create_task(worker.run(stop))
    while sum(metrics.deliveries.values()) < leads and not task.done():
        await asyncio.sleep(0.02)
    wall = time.perf_counter() - started
    if profile is not None:
        await store.write(lambda tx: profile.disable()) if writer else profile.disable()
    stop.set()
    worker.wake()
    await task
    return wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.delivery_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--leads", type=int, default=5000, help="submits committed, then delivered, per round")
    parser.add_argument("--rounds", type=int, default=1, help="measured rounds (each printed)")
    parser.add_argument("--concurrency", type=int, default=64, help="[delivery] concurrency of the worker")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--sort", default="tottime", choices=("tottime", "cumulative", "ncalls"))
    parser.add_argument("--profile", action="store_true", help="one more round under cProfile, its table printed")
    parser.add_argument("--writer", action="store_true",
                        help="profile the database writer thread instead of the event-loop thread")
    args = parser.parse_args(argv)

    with delivery_bench(args.concurrency) as parts:
        serial = itertools.count(1)
        delivered_total = 0

        async def one_round(leads: int, label: str | None, profile: cProfile.Profile | None = None) -> None:
            nonlocal delivered_total
            statuses = await _drive(parts.app, parts.key, leads, 64, serial)
            queued = _queued(parts.runtime)
            threads0, cpu0 = thread_cpu_seconds(), time.process_time()
            wall = await _deliver(parts.worker, parts.runtime.metrics, queued, profile, args.writer)
            cpu = time.process_time() - cpu0
            threads = thread_cpu_seconds()
            delivered_total += queued
            arrived = buyer_get(parts.buyer_port, "stats")
            if arrived["keys"] != delivered_total:
                print(f"  warning: the buyer holds {arrived['keys']} leads, {delivered_total} expected")
            if label is None:
                return
            print(f"{label}: {leads} submits (statuses {statuses}), {queued} delivered in {wall:.2f} s "
                  f"({queued / wall:.0f}/s), concurrency {args.concurrency}")
            print(f"  {1e6 * cpu / queued:.0f} us CPU per delivered lead (all threads)")
            for name, seconds in sorted(threads.items()):
                used = seconds - threads0.get(name, 0.0)
                if used > 0:
                    print(f"    {1e6 * used / queued:6.0f} us  {name}")

        async def rounds(profile: cProfile.Profile | None) -> None:
            await one_round(min(500, args.leads), None)  # warm caches, connections
            for n in range(args.rounds):
                await one_round(args.leads, f"round {n + 1}")
            if profile is not None:
                await one_round(args.leads, None, profile)

        profile = cProfile.Profile() if args.profile else None
        with asyncio.Runner(loop_factory=auto_loop_factory()) as runner:  # the delivery process's loop
            runner.run(rounds(profile))
        if profile is not None:
            pstats.Stats(profile).strip_dirs().sort_stats(args.sort).print_stats(args.top)
    return 0


class Parts(NamedTuple):
    """What a round needs: the intake's app and key, the delivery process's runtime and worker."""
    intake: Runtime
    app: Any
    key: str
    runtime: Runtime
    worker: DeliveryWorker
    buyer_port: int


@contextmanager
def delivery_bench(concurrency: int) -> Iterator[Parts]:
    """bench.product's tenant in a temporary data dir, the buyer running, the intake's app (no
    worker: submits wait as deliver jobs) and the worker as `appliance _deliver` runs it (its own
    runtime on the same database with `synchronous = NORMAL`, the plugins' registry,
    `SettingsCache`, `settle_for_serving()`). Run the worker on `auto_loop_factory()`'s loop."""
    work = Path(tempfile.mkdtemp(prefix="bench-delivery-"))
    buyer_port = free_port()
    buyer = subprocess.Popen([sys.executable, "-m", "bench.buyer", "--port", str(buyer_port)], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(buyer_port, proc=buyer)
        config_file = work / "appliance.toml"
        config_file.write_text(f'[storage]\npath = "{work / "data"}"\nsynchronous = "FULL"\n'
                               '[security]\nrate_limit_per_minute = 0\n'
                               f'[delivery]\nconcurrency = {concurrency}\nallow_private_addresses = true\n'
                               '[plugins]\ndirs = []\n')
        config = load_config(config_file)
        intake = create_runtime(config)
        try:
            tenant = tenancy.create_tenant(intake, "Bench")
            tenancy.import_bundle(intake, tenant, json.dumps(bundle(buyer_port)).encode(), "json")
            key = tenancy.create_key(intake, tenant, name="bench").key
            app = create_app(intake, background=False)
            # As run_delivery_process: its own runtime, commits without a sync of their own.
            delivery_config = msgspec.structs.replace(
                config, storage=msgspec.structs.replace(config.storage, synchronous="NORMAL"))
            runtime = open_runtime(delivery_config)
            try:
                registry = load_plugins(delivery_config)
                worker = DeliveryWorker(runtime, SettingsCache(runtime.store,
                                                               plugins_listen=registry.listens_to_lead_events),
                                        registry, concurrency=max(delivery_config.delivery.concurrency, 1))
                settle_for_serving()
                yield Parts(intake, app, key, runtime, worker, buyer_port)
            finally:
                runtime.close()
        finally:
            intake.close()
    finally:
        stop_all([buyer])
        shutil.rmtree(work, ignore_errors=True)

if __name__ == "__main__":
    raise SystemExit(main())
