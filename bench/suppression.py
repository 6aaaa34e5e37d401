"""Suppression lists at volume: a list of --entries values (default 1,000,000: half emails, half
phones) loaded from a generated CSV file through the real `appliance suppress` command (click's
CliRunner, in process: CSV parsing, normalization, hashing, 10,000-row batches), timed; then the
check intake and the delivery worker make (`first_match` of a lead's email and phone digests
against the campaign's lists, one indexed query) timed over --checks leads, half on the list and
half not, on a fresh store: the median and the 99th percentile. Targets: load < 60 s, check
< 1 ms. Results go to bench/results/suppression.json.

    python -m bench.suppression [--entries 1000000] [--checks 20000] [--work DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from click.testing import CliRunner

from appliance.cli import main as cli_main
from appliance.config import load_config
from appliance.domain.suppression import lead_hashes
from appliance.runtime import create_runtime, open_runtime
from appliance.services import suppression, tenancy
from appliance.services.suppression import SuppressionListCreate

RESULTS = Path(__file__).resolve().parent / "results"
LOAD_TARGET_S, CHECK_TARGET_MS = 60.0, 1.0


def email_of(i: int) -> str:
    return f"Person.{i}@Example{i % 97}.com"


def phone_of(i: int) -> str:
    return f"({212 + i // 10_000_000}) {i // 10_000 % 1000:03d}-{i % 10_000:04d}"


def e164_of(i: int) -> str:
    return f"+1{212 + i // 10_000_000}{i // 10_000 % 1000:03d}{i % 10_000:04d}"


def write_csv(path: Path, entries: int) -> None:
    with path.open("w") as f:
        f.write("email,phone\n")
        for i in range(entries):  # even rows an email, odd rows a phone, written as people do
            f.write(f"{email_of(i)},\n" if i % 2 == 0 else f",{phone_of(i)}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--checks", type=int, default=20_000)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-suppression-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        run(work, args.entries, args.checks)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


def run(work: Path, entries: int, checks: int) -> None:
    config_file = work / "appliance.toml"
    config_file.write_text(f'[storage]\npath = "{work / "data"}"\n')
    runner = CliRunner()
    assert runner.invoke(cli_main, ["--config", str(config_file), "init"]).exit_code == 0
    config = load_config(config_file)
    runtime = create_runtime(config)
    try:
        tenant_id = tenancy.create_tenant(runtime, "Bench")
        made = asyncio.run(suppression.create(runtime, tenant_id, "cli", SuppressionListCreate(name="Opt-outs")))
    finally:
        runtime.close()
    csv_file = work / "optouts.csv"
    started = time.perf_counter()
    write_csv(csv_file, entries)
    generate_s = time.perf_counter() - started
    print(f"generated {entries:,} rows ({csv_file.stat().st_size / 1e6:.1f} MB) in {generate_s:.1f} s", flush=True)

    started = time.perf_counter()
    result = runner.invoke(cli_main, ["--config", str(config_file), "suppress", "--tenant", tenant_id,
                                      "--list", made.list_id, str(csv_file), "--json"])
    load_s = time.perf_counter() - started
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["loaded"] == entries and report["badRows"] == 0, report
    print(f"loaded {report['loaded']:,} entries through `appliance suppress` in {load_s:.1f} s "
          f"({entries / load_s:,.0f} rows/s)", flush=True)

    runtime = open_runtime(config)  # a fresh store: nothing of the load in its cache
    try:
        rng = random.Random(7)
        leads = []
        for n in range(checks):
            i = rng.randrange(entries)
            if n % 2 == 0:  # on the list: its email (even rows) or its phone (odd rows), plus the other
                email, phone = (email_of(i).lower(), e164_of(i + 1)) if i % 2 == 0 else \
                    (f"other{n}@example.org", e164_of(i))
            else:  # not on it: an email never listed and a phone past the listed range
                email, phone = f"nobody{n}@example.org", e164_of(entries + n * 2 + 1)
            leads.append((email, phone, n % 2 == 0))
        reader = runtime.store.reader()
        list_ids = [made.list_id]
        timings, hits = [], 0
        for email, phone, listed in leads:
            t0 = time.perf_counter()
            found = reader.suppression.first_match(tenant_id, list_ids, lead_hashes(email, phone))
            timings.append((time.perf_counter() - t0) * 1000)
            assert (found is not None) == listed, (email, phone)
            hits += found is not None
        first_ms = timings[0]
        timings.sort()
        median = statistics.median(timings)
        p99 = timings[int(len(timings) * 0.99) - 1]
        print(f"check (digests + one query): median {median * 1000:.1f} us, p99 {p99 * 1000:.1f} us, "
              f"first {first_ms:.3f} ms over {checks:,} leads ({hits:,} on the list)", flush=True)
        db_file = config.database_file
        db_bytes = sum(p.stat().st_size for p in db_file.parent.iterdir() if p.name.startswith(db_file.name))
    finally:
        runtime.close()

    out = {
        "benchmark": "suppression", "entries": entries, "checks": checks,
        "csv_generate_s": round(generate_s, 2), "load_s": round(load_s, 2),
        "load_rows_per_s": round(entries / load_s), "load_target_s": LOAD_TARGET_S,
        "check_median_ms": round(median, 4), "check_p99_ms": round(p99, 4), "check_first_ms": round(first_ms, 4),
        "check_target_ms": CHECK_TARGET_MS, "hits": hits, "database_mb": round(db_bytes / 1e6, 1),
        "python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count(),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "suppression.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    ok = load_s < LOAD_TARGET_S and median < CHECK_TARGET_MS
    print("targets met" if ok else "TARGET MISSED")


if __name__ == "__main__":
    main()
