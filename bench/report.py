"""Report summaries at volume: one tenant with --leads leads (default 1,000,000) and two ledger
entries per lead (2,000,000, plus the return entries of returned leads) spread over 90 days,
across 20 campaigns (10 clients, 10 delivery endpoints, 3 of 20 sources each; one campaign
priced in CAD).

Rows are written straight into `leads` and `ledger_entries` with bulk SQL through
`store.sqlite.write_sync` (the report reads neither documents nor submissions, so the rows carry
an empty document); the report rollups are kept as the rows go in, as on every write path of the
appliance (lead counts by `storage.reports.count_lead`, which the leads repository calls; money
by the trigger on ledger_entries), and the build rate is printed with that cost in it.
Then, on a fresh store (empty SQLite cache), it times the service function GET
/api/v1/reports/summary runs (`services.reports.read_summary`: the range, one read transaction
over the rollups, labels from the campaigns, the fold) for the last 30 days, by each grouping
and by day in UTC and in zones whose midnights are not UTC's; the first call and the median of
--runs calls; the main case through the real app too (Litestar TestClient: routing, auth,
envelope); and, for comparison, the same 30 days aggregated from the raw rows. It checks that
the report's totals equal the raw counts. Target: a 30-day summary by campaign < 300 ms.
Results go to bench/results/report.json.

    python -m bench.report [--leads 1000000] [--runs 9] [--work DIR] [--reuse]

--work keeps the data folder there; with --reuse an existing database of that size is measured
again without generating it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import apsw

from appliance.clock import iso
from appliance.config import load_config
from appliance.runtime import Runtime, create_runtime
from appliance.services import reports
from appliance.storage import Store
from appliance.storage.reports import count_lead
from bench.volume import lead_id_at, setup as volume_setup

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_MS = 300.0
DAYS = 90
STATUSES = [("delivered", 45), ("disqualified", 15), ("duplicate", 9), ("failed", 9), ("qualified", 5),
            ("pending_action", 5), ("queued", 4), ("rejected", 4), ("returned", 2), ("error", 2)]
CASES = [  # (label, groupBy, timezone)
    ("30 days by campaign, UTC", "campaign", "UTC"),
    ("30 days by campaign, Asia/Kolkata", "campaign", "Asia/Kolkata"),
    ("30 days by client, UTC", "client", "UTC"),
    ("30 days by source, UTC", "source", "UTC"),
    ("30 days by endpoint, UTC", "endpoint", "UTC"),
    ("30 days by day, UTC", "day", "UTC"),
    ("30 days by day, America/New_York", "day", "America/New_York"),
    ("30 days by day, Asia/Kolkata", "day", "Asia/Kolkata"),
]


def bundle() -> dict[str, Any]:
    endpoints = [{"deliveryEndpointId": f"ep-{i:02d}", "url": f"https://buyer{i:02d}.example.com/in"} for i in range(10)]
    campaigns = []
    for i in range(20):
        currency = "CAD" if i == 19 else "USD"
        campaigns.append({
            "campaignId": f"RC{i:02d}", "name": f"Campaign {i:02d}",
            "client": {"clientId": f"cli-{i // 2:02d}", "clientName": f"Client {i // 2:02d}"},
            "ingestion": {"sources": [{"sourceId": f"src-{(3 * i + k) % 20:02d}", "name": f"Source {(3 * i + k) % 20:02d}",
                                       "costMilestones": [{"leadStatus": "lead_ingested", "amount": 2.5,
                                                           "currency": currency}]} for k in range(3)]},
            "delivery": {"deliveryEndpointId": f"ep-{i % 10:02d}", "revenueMilestones": [
                {"leadStatus": "delivered", "amount": 35 + i, "currency": currency}]},
        })
    return {"deliveryEndpoints": endpoints, "campaigns": campaigns}


def setup(work: Path) -> tuple[Runtime, str, str]:
    return volume_setup(work, "Report Agency", bundle())


def _ms_iso(ms: int) -> str:
    return iso(datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms))


def generate(runtime: Runtime, tenant_id: str, n: int, end_ms: int, batch: int = 20_000,
             seed: int = 7) -> dict[str, Any]:
    """n leads, oldest first, over the DAYS days before end_ms; entries: a source cost at intake,
    then the delivery's revenue (delivered and returned leads) or a second cost, and a return
    entry for each returned lead."""
    rng = random.Random(seed)
    start_ms = end_ms - DAYS * 86_400_000
    stamps = sorted(rng.randrange(start_ms, end_ms) for _ in range(n))
    values, weights = zip(*STATUSES)
    statuses = rng.choices(values, weights=weights, k=n)
    lead_rows, entry_rows = [], []
    timings = {"leads": 0.0, "entries": 0.0}
    counts = {"leads": 0, "entries": 0}

    def flush(force: bool = False) -> None:
        for table, rows, sql in (
                ("leads", lead_rows,
                 "INSERT INTO leads(lead_id, tenant_id, intake_campaign_id, campaign_id, client_id, offer_id,"
                 " source_id, status, email, phone_e164, is_test, created_at, updated_at, doc)"
                 " VALUES (?, ?, ?, ?, ?, NULL, ?, ?, ?, NULL, 0, ?, ?, x'')"),
                ("entries", entry_rows,
                 "INSERT INTO ledger_entries(entry_id, tenant_id, lead_id, submission_id, kind, milestone, lead_status,"
                 " amount, currency, campaign_id, client_id, source_id, delivery_endpoint_id, created_at)"
                 " VALUES (?, ?, ?, ?, ?, NULL, ?, ?, ?, ?, ?, ?, ?, ?)")):
            if rows and (force or len(rows) >= batch):
                started = time.perf_counter()
                runtime.store.sqlite.write_sync(lambda conn, table=table, rows=rows, sql=sql: _insert(conn, table, rows, sql))
                timings[table] += time.perf_counter() - started
                counts[table] += len(rows)
                rows.clear()

    started = time.perf_counter()
    for i, (ms, status) in enumerate(zip(stamps, statuses)):
        c = rng.randrange(20) if rng.random() < 0.5 else rng.randrange(5)  # a few campaigns are bigger
        campaign, client, endpoint = f"RC{c:02d}", f"cli-{c // 2:02d}", f"ep-{c % 10:02d}"
        source = f"src-{(3 * c + rng.randrange(3)) % 20:02d}" if rng.random() < 0.9 else None
        currency = "CAD" if c == 19 else "USD"
        lead_id, at = lead_id_at(ms, rng), _ms_iso(ms)
        lead_rows.append((lead_id, tenant_id, campaign, campaign, client, source, status, f"p{i}@example.com",
                          at, at))
        submission = "sub_" + lead_id[5:]
        later = ms + rng.randrange(1_000, 600_000)
        entry_rows.append((lead_id_at(ms, rng, "led"), tenant_id, lead_id, submission, "cost", "new", 2.5, currency,
                           campaign, client, source, endpoint, at))
        if status in ("delivered", "returned"):
            entry_rows.append((lead_id_at(later, rng, "led"), tenant_id, lead_id, submission, "revenue", "delivered",
                               float(35 + c), currency, campaign, client, source, endpoint, _ms_iso(later)))
        else:
            entry_rows.append((lead_id_at(later, rng, "led"), tenant_id, lead_id, submission, "cost", status, 0.35,
                               currency, campaign, client, source, endpoint, _ms_iso(later)))
        if status == "returned":
            back = later + rng.randrange(3_600_000, 5 * 86_400_000)
            if back < end_ms:
                entry_rows.append((lead_id_at(back, rng, "led"), tenant_id, lead_id, submission, "return", "returned",
                                   -float(35 + c), currency, campaign, client, source, endpoint, _ms_iso(back)))
        flush()
        if (i + 1) % 200_000 == 0:
            print(f"  {i + 1:>9,} leads  {(i + 1) / (time.perf_counter() - started):,.0f}/s", flush=True)
    flush(force=True)
    seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 1), "leads": counts["leads"], "entries": counts["entries"],
            "leadInsertSeconds": round(timings["leads"], 1), "entryInsertSeconds": round(timings["entries"], 1),
            "leadsPerSecondInserted": round(counts["leads"] / timings["leads"]),
            "entriesPerSecondInserted": round(counts["entries"] / timings["entries"])}


def _insert(conn: apsw.Connection, table: str, rows: list[tuple], sql: str) -> None:
    conn.executemany(sql, rows)
    if table == "leads":  # what Leads.insert_lead does after its row
        for lead_id, tenant_id, _, campaign, client, source, status, _, at, _ in rows:
            count_lead(conn, tenant_id, at, campaign, client, source, status, 1)


def checkpoint(runtime: Runtime) -> None:
    """Planner statistics as the running service keeps them, then the WAL folded into the file."""
    runtime.store.sqlite.write_sync(lambda conn: conn.execute("PRAGMA optimize"))
    conn = apsw.Connection(str(runtime.config.database_file))
    try:
        conn.setbusytimeout(10_000)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def timed(fn, runs: int) -> dict[str, float]:
    started = time.perf_counter()
    fn()
    first = (time.perf_counter() - started) * 1000
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return {"first_ms": round(first, 1), "median_ms": round(statistics.median(times), 1),
            "best_ms": round(min(times), 1)}


def raw_totals(store: Store, tenant_id: str, first: int, end: int) -> tuple[int, dict[str, float]]:
    """The leads and net revenue per currency of the range, from the raw rows (for the check)."""
    conn = store.sqlite.reader()
    lo, hi = _ms_iso(first * 900_000), _ms_iso(end * 900_000)
    (leads,), = conn.execute("SELECT count(*) FROM leads WHERE tenant_id = ? AND created_at >= ? AND created_at < ?",
                             (tenant_id, lo, hi)).fetchall()
    revenue = dict(conn.execute(
        "SELECT currency, total(amount) FROM ledger_entries WHERE tenant_id = ? AND kind != 'cost'"
        " AND created_at >= ? AND created_at < ? GROUP BY 1", (tenant_id, lo, hi)).fetchall())
    return leads, revenue


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--leads", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--reuse", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "report.json")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="appliance-report-"))
    work.mkdir(parents=True, exist_ok=True)
    runtime, tenant_id, key = setup(work)
    meta = work / "build.json"
    try:
        if args.reuse and meta.exists():
            build = json.loads(meta.read_text())
            print(f"reusing {build['leads']:,} leads in {work}")
        else:
            today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
            print(f"writing {args.leads:,} leads and their entries to {work} ...", flush=True)
            build = generate(runtime, tenant_id, args.leads, int(today.timestamp() * 1000))
            build["endDay"] = today.date().isoformat()
            checkpoint(runtime)
            meta.write_text(json.dumps(build))
            print(f"  done in {build['seconds']} s: leads {build['leadsPerSecondInserted']:,}/s, "
                  f"entries {build['entriesPerSecondInserted']:,}/s inserted, the rollups kept as they went in")
        runtime.close()
        runtime = create_runtime(load_config(work / "appliance.toml"))  # a fresh store: empty SQLite cache
        store = runtime.store
        conn = store.sqlite.reader()
        sizes = {table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                 for table in ("report_leads", "report_leads_daily", "report_money", "report_money_daily")}
        db_bytes = runtime.config.database_file.stat().st_size
        try:  # what the rollups take of it (SQLite's dbstat table, when compiled in)
            rollup_bytes = dict(conn.execute("SELECT name, sum(pgsize) FROM dbstat WHERE name LIKE 'report%'"
                                             " GROUP BY name").fetchall())
        except Exception:  # noqa: BLE001
            rollup_bytes = {}
        last = datetime.fromisoformat(build["endDay"]).date() - timedelta(days=1)
        first = last - timedelta(days=29)
        campaigns = {c.campaign_id: c for c in store.reader().catalog.all_campaigns(tenant_id)}
        results = []
        for label, group, zone in CASES:
            span = reports.summary_range(group, first.isoformat(), last.isoformat(), zone, datetime.now(UTC))
            data = reports.read_summary(store.reader(), tenant_id, span, campaigns)
            figures = timed(lambda span=span: reports.read_summary(store.reader(), tenant_id, span, campaigns),
                            args.runs)
            results.append({"case": label, **figures, "rows": len(data.rows), "leads": data.totals.leads})
            print(f"  {label:<36} first {figures['first_ms']:7.1f} ms  median {figures['median_ms']:7.1f} ms"
                  f"  ({len(data.rows)} rows, {data.totals.leads:,} leads)", flush=True)
        main_span = reports.summary_range("campaign", first.isoformat(), last.isoformat(), "UTC", datetime.now(UTC))
        summary = reports.read_summary(store.reader(), tenant_id, main_span, campaigns)
        leads, revenue = raw_totals(store, tenant_id, main_span.first, main_span.end)
        report_revenue = {c.currency: c.revenue for c in summary.totals.by_currency}
        assert summary.totals.leads == leads, (summary.totals.leads, leads)
        assert all(abs(report_revenue[c] - v) < 1e-6 * max(1.0, abs(v)) for c, v in revenue.items()), (report_revenue,
                                                                                                        revenue)
        raw = timed(lambda: raw_totals(store, tenant_id, main_span.first, main_span.end), 2)
        print(f"  {'the same 30 days from the raw rows':<36} first {raw['first_ms']:7.1f} ms  median {raw['median_ms']:7.1f} ms"
              f"  (two aggregates only; the check)")

        from litestar.testing import TestClient

        from appliance.app import create_app

        with TestClient(create_app(runtime, background=False), raise_server_exceptions=True) as client:
            query = f"/api/v1/reports/summary?groupBy=campaign&startDate={first}&endDate={last}"

            def over_http() -> None:
                response = client.get(query, headers={"X-API-Key": key})
                assert response.status_code == 200, response.text

            http = timed(over_http, args.runs)
        print(f"  {'30 days by campaign over HTTP':<36} first {http['first_ms']:7.1f} ms  median {http['median_ms']:7.1f} ms")
        main_case = results[0]
        out = {
            "when": iso(datetime.now(UTC)), "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                                                        "platform": platform.platform()},
            "build": build, "databaseBytes": db_bytes, "rollupRows": sizes, "rollupBytes": rollup_bytes, "range": [first.isoformat(), last.isoformat()],
            "cases": results, "http": {"case": "30 days by campaign, UTC", **http}, "rawRows": raw,
            "target": {"ms": TARGET_MS, "met": main_case["median_ms"] < TARGET_MS and http["median_ms"] < TARGET_MS},
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2) + "\n")
        print(f"rollup rows: {sizes}; database {db_bytes / 1e6:,.0f} MB; target < {TARGET_MS:.0f} ms: "
              f"{'met' if out['target']['met'] else 'NOT met'}; written to {args.out}")
    finally:
        runtime.close()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
