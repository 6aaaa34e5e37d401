"""psycopg 3 (as the PostgreSQL store uses it) against asyncpg on the submit's write unit.

    python -m bench.pg_drivers [--leads 2000] [--rounds 2] [--concurrency 1,8] [--fsync on|off]

Records the statements of real submit units (bench.submit's campaign: the lead, its name row,
the submission, the job, dedupe lookups, the report rollup upsert), driven through the real app
in this process on a PostgreSQL store, each unit rolled back once recorded. Then replays the same
units on a fresh copy of the database per variant and round (`CREATE DATABASE ... TEMPLATE`), each
unit one SERIALIZABLE transaction, retried on a serialization failure or deadlock as the store does:

- `psycopg as built`: the store's engine (`PgDatabase.write`: a psycopg_pool connection on a worker
  thread via `asyncio.to_thread`, statements through `PgConnection`'s `?` translation).
- `psycopg async`: psycopg's AsyncConnection from psycopg_pool's AsyncConnectionPool, the same
  translated statements, no threads.
- `asyncpg`: an asyncpg pool, the same statements with `$n` parameters cast to the type psycopg
  sends for the Python value (text, int8, float8, bytea, bool), prepared-statement cache on.

All three: a pool of 8 connections, `--concurrency` units in flight (1: one after another, the
driver's own cost; 8: the pool full, where units collide on the rollup's hot rows). Reports
units/s, this process's CPU per unit (the driver's side), PostgreSQL's CPU per unit, the retries,
and the units given up after 30 runs (the store fails those). asyncpg is not a dependency of the
appliance: `pip install asyncpg` to run this."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from appliance.app import create_app
from appliance.config import load_config
from appliance.runtime import create_runtime
from appliance.services import tenancy
from appliance.storage.db import StorageError
from appliance.storage.postgres.connection import (
    PgConnection,
    _values,
    configure,
    translate,
)
from appliance.storage.postgres.engine import PgDatabase
from bench.postgres import BenchCluster
from bench.submit import bundle
from bench.submit_profile import _drive
from tests.postgres_cluster import server_bin

POOL = 8
MAX_RUNS = 30
Unit = list[tuple[str, tuple]]  # (the repositories' SQL with `?`, its values)


class _Recorder(PgConnection):
    __slots__ = ("statements",)

    def __init__(self, raw: psycopg.Connection) -> None:
        super().__init__(raw)
        self.statements: Unit = []

    def execute(self, sql: str, params=None):
        self.statements.append((sql, tuple(params or ())))
        return super().execute(sql, params)

    def executemany(self, sql: str, rows) -> None:
        rows = list(rows)
        self.statements.extend((sql, tuple(row)) for row in rows)
        super().executemany(sql, rows)


def record(cluster: BenchCluster, work: Path, leads: int) -> list[Unit]:
    """Submit units' statements, in order; the template database `rec` is left as set up."""
    cluster.admin("CREATE DATABASE rec TEMPLATE template0 LOCALE 'C' ENCODING 'UTF8'")
    config_file = work / "appliance.toml"
    config_file.write_text(f'[storage]\npath = "{work / "data"}"\nbackend = "postgresql"\nurl = "{cluster.url("rec")}"\n'
                           '[security]\nrate_limit_per_minute = 0\n[delivery]\nconcurrency = 0\n[plugins]\ndirs = []\n')
    runtime = create_runtime(load_config(config_file))
    units: list[Unit] = []
    try:
        tenant = tenancy.create_tenant(runtime, "Bench")
        tenancy.import_bundle(runtime, tenant, json.dumps(bundle()).encode(), "json")
        key = tenancy.create_key(runtime, tenant, name="bench").key
        app = create_app(runtime, background=False)
        database: PgDatabase = runtime.store.postgres

        def recording(fn):
            with database._pool.connection() as raw, raw.transaction():
                conn = _Recorder(raw)
                result = fn(conn)
                if any(sql.lstrip().upper().startswith("INSERT INTO LEADS") for sql, _ in conn.statements):
                    units.append(conn.statements)
                raise psycopg.Rollback()  # each unit sees the template's state, as on replay
            return result

        database.write_sync = recording
        # One at a time: a recorded unit is not retried, so none may collide with another.
        statuses = asyncio.run(_drive(app, key, leads, 1, itertools.count(1)))
        if set(statuses) != {201}:
            raise RuntimeError(f"recording: submits answered {statuses}")
    finally:
        runtime.close()
    return units


_PARAM = re.compile(r"%s|%%")
_CAST = {str: "::text", int: "::int8", float: "::float8", bytes: "::bytea", bool: "::bool", type(None): ""}


def for_asyncpg(sql: str, params: tuple) -> tuple[str, tuple]:
    """psycopg's statement with `$n` placeholders, each cast to what psycopg would send."""
    text, order = translate(sql)
    values = tuple(_values(params, order) or ())
    numbers = itertools.count(1)

    def swap(match: re.Match) -> str:
        if match.group(0) == "%%":
            return "%"
        n = next(numbers)
        return f"${n}{_CAST[type(values[n - 1])]}"

    return _PARAM.sub(swap, text), values


def for_psycopg(sql: str, params: tuple) -> tuple[str, tuple]:
    text, order = translate(sql)
    return text, tuple(_values(params, order) or ())


class Stats:
    def __init__(self) -> None:
        self.retries = 0
        self.gave_up = 0  # units still conflicting after MAX_RUNS runs (the store answers those with an error)


async def _run(units: list, concurrency: int, one) -> None:
    queue = iter(units)

    async def worker() -> None:
        for unit in queue:
            await one(unit)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def _backoff(run: int) -> float:
    return random.uniform(0, min(0.001 * 2 ** run, 0.05))  # the store's (engine.write_sync)


async def replay_built(url: str, units: list[Unit], concurrency: int, stats: Stats) -> None:
    database = PgDatabase(url, pool_size=POOL).open()
    try:
        real = database.write_sync

        def counting(fn):
            runs = 0

            def unit(conn):
                nonlocal runs
                runs += 1
                return fn(conn)
            try:
                return real(unit)
            except StorageError:
                stats.gave_up += 1
            finally:
                stats.retries += runs - 1

        async def one(unit: Unit) -> None:
            await asyncio.to_thread(counting, lambda conn: [conn.execute(sql, params).fetchall() for sql, params in unit])

        await _run(units, concurrency, one)
    finally:
        database.close()


async def replay_psycopg_async(url: str, units: list[Unit], concurrency: int, stats: Stats) -> None:
    from psycopg_pool import AsyncConnectionPool

    async def configure_async(conn: psycopg.AsyncConnection) -> None:
        configure(conn)  # type: ignore[arg-type] - adapters only
        await conn.set_isolation_level(psycopg.IsolationLevel.SERIALIZABLE)

    prepared = [[for_psycopg(sql, params) for sql, params in unit] for unit in units]
    async with AsyncConnectionPool(url, min_size=POOL, max_size=POOL, configure=configure_async) as pool:
        async def one(unit) -> None:
            for run in range(1, MAX_RUNS + 1):
                try:
                    async with pool.connection() as conn, conn.transaction():
                        for sql, values in unit:
                            cur = await conn.execute(sql, values or None)
                            if cur.description is not None:
                                await cur.fetchall()
                    return
                except (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected):
                    stats.retries += 1
                    await asyncio.sleep(_backoff(run))
            stats.gave_up += 1

        await _run(prepared, concurrency, one)


async def replay_asyncpg(url: str, units: list[Unit], concurrency: int, stats: Stats) -> None:
    import asyncpg

    prepared = [[for_asyncpg(sql, params) for sql, params in unit] for unit in units]
    pool = await asyncpg.create_pool(url, min_size=POOL, max_size=POOL)
    try:
        async def one(unit) -> None:
            for run in range(1, MAX_RUNS + 1):
                try:
                    async with pool.acquire() as conn, conn.transaction(isolation="serializable"):
                        for sql, values in unit:
                            await conn.fetch(sql, *values)
                    return
                except (asyncpg.exceptions.SerializationError, asyncpg.exceptions.DeadlockDetectedError):
                    stats.retries += 1
                    await asyncio.sleep(_backoff(run))
            stats.gave_up += 1

        await _run(prepared, concurrency, one)
    finally:
        await pool.close()


VARIANTS = {"psycopg as built": replay_built, "psycopg async": replay_psycopg_async, "asyncpg": replay_asyncpg}


def _wait_backends_gone(cluster: BenchCluster, database: str) -> None:
    """Until the closed pool's backends have ended: a backend that is exiting is counted neither
    among the live ones nor in the postmaster's children's time, so reading earlier loses its CPU."""
    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        for _ in range(100):
            (left,) = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (database,)).fetchone()
            if not left:
                break
            time.sleep(0.02)
    time.sleep(0.1)  # the postmaster reaps them


def measure(cluster: BenchCluster, name: str, units: list[Unit], concurrency: int, tag: str) -> dict[str, Any]:
    database = f"replay_{tag}"
    cluster.admin(f"CREATE DATABASE {database} TEMPLATE rec")
    stats = Stats()
    try:
        cpu0, pg0, t0 = time.process_time(), cluster.cpu_seconds(), time.perf_counter()
        asyncio.run(VARIANTS[name](cluster.url(database), units, concurrency, stats))
        cpu1, t1 = time.process_time(), time.perf_counter()
        _wait_backends_gone(cluster, database)
        pg1 = cluster.cpu_seconds()
    finally:
        cluster.admin(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
    n = len(units)
    return {"variant": name, "concurrency": concurrency, "units": n, "units_per_s": round(n / (t1 - t0), 1),
            "client_cpu_us_per_unit": round(1e6 * (cpu1 - cpu0) / n, 1),
            "postgres_cpu_us_per_unit": round(1e6 * (pg1 - pg0) / n, 1), "retries": stats.retries,
            "gave_up": stats.gave_up}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pg_drivers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--leads", type=int, default=2000, help="submit units recorded and replayed")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", default="1,8", help="units in flight, comma-separated")
    parser.add_argument("--fsync", choices=("on", "off"), default="on")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "pg_drivers.json")
    args = parser.parse_args(argv)
    bin_dir = server_bin()
    if bin_dir is None:
        print("PostgreSQL server binaries (initdb, pg_ctl) not found", file=sys.stderr)
        return 2
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        print("asyncpg is not installed: pip install asyncpg (for this bench only)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-pg-drivers-"))
    cluster = BenchCluster(bin_dir)
    runs: list[dict[str, Any]] = []
    try:
        cluster.start(args.fsync == "on")
        units = record(cluster, work, args.leads)
        statements = sum(len(u) for u in units) / len(units)
        print(f"recorded {len(units)} submit units, {statements:.1f} statements each:")
        for sql, _ in units[0]:
            print("   ", " ".join(sql.split())[:100])
        tags = itertools.count()
        for round_no in range(1, args.rounds + 1):
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                for name in VARIANTS:
                    r = measure(cluster, name, units, concurrency, str(next(tags))) | {"round": round_no}
                    runs.append(r)
                    print(f"round {round_no} concurrency {concurrency:>2} {name:18} {r['units_per_s']:>8,.0f} units/s "
                          f"{r['client_cpu_us_per_unit']:>7.0f} us client CPU {r['postgres_cpu_us_per_unit']:>7.0f} us "
                          f"PostgreSQL CPU per unit, {r['retries']} retries, {r['gave_up']} given up")
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{'concurrency':>11} {'variant':18} {'units/s':>13} {'client us/unit':>15} {'pg us/unit':>11} {'retries':>11} {'given up':>9}")
    for concurrency in sorted({r["concurrency"] for r in runs}):
        for name in VARIANTS:
            mine = [r for r in runs if r["variant"] == name and r["concurrency"] == concurrency]
            def span(key: str, mine: list = mine) -> str:
                return f"{min(r[key] for r in mine):,.0f}-{max(r[key] for r in mine):,.0f}"
            print(f"{concurrency:>11} {name:18} {span('units_per_s'):>13} {span('client_cpu_us_per_unit'):>15} "
                  f"{span('postgres_cpu_us_per_unit'):>11} {span('retries'):>11} {span('gave_up'):>9}")
    print("(lowest-highest over the rounds; CPU in microseconds per unit)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "pg_drivers", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                    "settings": vars(args) | {"out": str(args.out)}, "runs": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
