"""The writer's share of a submit, alone: record the write units of real submits, then replay
them in one thread against copies of the database, in groups of 64, and report CPU us per lead
for each variant (SQL run on the copy first), interleaved over rounds, best round kept.

    python -m bench.submit_writes [--leads 10000] [--rounds 3] [--savepoints] \
        ['name=PRAGMA wal_autocheckpoint=4000'] ['no-fk=PRAGMA foreign_keys=OFF'] ...

`base` (the database as `appliance serve` opens it) is always measured. `--savepoints` wraps each
unit in SAVEPOINT/RELEASE as the writer did before groups ran without them. The recorded units
are the bench.submit campaign's (`_Plan.commit` closures); during recording they are rolled back,
so each variant starts from the same copy."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import shutil
import tempfile
import time
from pathlib import Path

import apsw

from appliance.services import tenancy
from appliance.app import create_app
from appliance.config import load_config
from appliance.runtime import create_runtime
from appliance.storage.db import _configure
from appliance.storage.store import Session
from bench.submit import bundle
from bench.submit_profile import _drive

GROUP = 64


def record(work: Path, leads: int) -> tuple[Path, list]:
    config_file = work / "appliance.toml"
    config_file.write_text(f'[storage]\npath = "{work / "data"}"\nsynchronous = "FULL"\n'
                           '[security]\nrate_limit_per_minute = 0\n[delivery]\nconcurrency = 0\n'
                           '[plugins]\ndirs = []\n')
    runtime = create_runtime(load_config(config_file))
    snapshot = work / "snapshot.db"
    units: list = []
    try:
        tenant = tenancy.create_tenant(runtime, "Bench")
        tenancy.import_bundle(runtime, tenant, json.dumps(bundle()).encode(), "json")
        key = tenancy.create_key(runtime, tenant, name="bench").key
        app = create_app(runtime, background=False)
        write, serial = runtime.store.sqlite.write, itertools.count(1)

        async def recording(unit, **options):
            units.append(unit)

            def rolled_back(conn: apsw.Connection):
                conn.execute("SAVEPOINT recorded")
                try:
                    return unit(Session(conn))
                finally:
                    conn.execute("ROLLBACK TO recorded")
                    conn.execute("RELEASE recorded")

            return await write(rolled_back, **options)

        async def run() -> None:
            await _drive(app, key, 500, GROUP, serial)  # some leads already stored, caches warm
            runtime.store.backup_to(snapshot)
            runtime.store.write = recording
            await _drive(app, key, leads, GROUP, serial)

        asyncio.run(run())
    finally:
        runtime.close()
    return snapshot, units


def replay(snapshot: Path, units: list, setup: list[str], savepoints: bool, work: Path) -> float:
    copy = work / "replay.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{copy}{suffix}").unlink(missing_ok=True)
    shutil.copy(snapshot, copy)
    conn = apsw.Connection(str(copy))
    try:
        _configure(conn, "FULL")
        for sql in setup:
            conn.execute(sql)
        tx = Session(conn)
        started = time.thread_time()
        for start in range(0, len(units), GROUP):
            conn.execute("BEGIN IMMEDIATE")
            for fn in units[start:start + GROUP]:
                if savepoints:
                    conn.execute("SAVEPOINT unit")
                fn(tx)
                if savepoints:
                    conn.execute("RELEASE unit")
            conn.execute("COMMIT")
        return 1e6 * (time.thread_time() - started) / len(units)
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.submit_writes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--leads", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--savepoints", action="store_true", help="a savepoint around every unit")
    parser.add_argument("variants", nargs="*", help="name=SQL[;SQL...] run on the copy before replaying")
    args = parser.parse_args(argv)
    variants = {"base": []}
    for spec in args.variants:
        name, _, sql = spec.partition("=")
        variants[name] = [s for s in sql.split(";") if s.strip()]
    work = Path(tempfile.mkdtemp(prefix="bench-submit-writes-"))
    try:
        snapshot, units = record(work, args.leads)
        best: dict[str, float] = {}
        for round_number in range(1, args.rounds + 1):
            for name, setup in variants.items():
                us = replay(snapshot, units, setup, args.savepoints, work)
                best[name] = min(best.get(name, us), us)
                print(f"round {round_number}  {name:24} {us:7.1f} us CPU per lead")
        print(f"\nbest of {args.rounds} rounds, {len(units)} leads in groups of {GROUP}:")
        for name, us in best.items():
            print(f"  {name:24} {us:7.1f} us CPU per lead")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
