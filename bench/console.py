"""Admin console pages at volume: the database of bench/volume.py (one tenant, --leads leads,
default 1,000,000, over the last year, each with its ~1.5 KB document, a submission and its
report counts; built by its `generate`, or reused with --work DIR --reuse), then each page timed
through the real app
(Litestar TestClient, a person signed in with a session cookie: routing, the session check, the services,
the template): the overview, the leads list (first page, a page filtered by status and campaign,
a month by date, a search by email, by phone and by name), a lead's page, the review queue and
the failures page. First call on a fresh store (empty SQLite
cache) and the median of --runs calls. Target: every page < 200 ms. Results go to
bench/results/console.json.

    python -m bench.console [--leads 1000000] [--batch 5000] [--runs 9] [--work DIR] [--reuse]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from urllib.parse import urlencode
from datetime import UTC, datetime
from pathlib import Path

from litestar.testing import TestClient

from appliance.app import create_app
from appliance.clock import iso
from appliance.config import load_config
from appliance.runtime import create_runtime
from bench.people import person, sign_in_page
from bench.report import timed
from bench.volume import volume_database

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_MS = 200.0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.console", description=__doc__.split("\n\n")[0])
    parser.add_argument("--leads", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--reuse", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "console.json")
    args = parser.parse_args()
    work, tenant_id, build = volume_database(args.work, "appliance-console-", args.leads, args.batch, args.reuse)
    runtime = create_runtime(load_config(work / "appliance.toml"))  # a fresh store: empty SQLite cache
    probes = build["probes"]
    lead_id = runtime.store.sqlite.reader().execute("SELECT lead_id FROM leads WHERE email = ?",
                                                    (probes["email"],)).fetchone()[0]
    month = probes["rangeStart"][:8] + "01"
    pages = [
        ("overview", "/admin/"),
        ("leads, first page", "/admin/leads"),
        ("leads, failed in the biggest campaign", f"/admin/leads?status=failed&campaignIds={probes['bigCampaign']}"),
        ("leads, delivered in the smallest", f"/admin/leads?status=delivered&campaignIds={probes['rareCampaign']}"),
        ("leads, from a date", f"/admin/leads?startDate={month}"),
        ("leads, search by email", f"/admin/leads?{urlencode({'search': probes['email']})}"),
        ("leads, search by phone", f"/admin/leads?{urlencode({'search': probes['phone']})}"),
        ("leads, search by name", "/admin/leads?search=maria+garcia"),
        ("lead page", f"/admin/leads/{lead_id}"),
        ("review queue", "/admin/review"),
        ("failures", "/admin/failures"),
    ]
    results = []
    person(runtime, tenant_id)
    with TestClient(create_app(runtime, background=False), raise_server_exceptions=True) as client:
        sign_in_page(client)
        for label, path in pages:
            def fetch(path: str = path) -> None:
                answer = client.get(path)
                assert answer.status_code == 200, (path, answer.status_code, answer.text[:500])

            figures = timed(fetch, args.runs)
            results.append({"page": label, "path": path, **figures})
            print(f"  {label:<36} first {figures['first_ms']:7.1f} ms  median {figures['median_ms']:7.1f} ms",
                  flush=True)
    runtime.close()
    met = all(r["median_ms"] < TARGET_MS for r in results)
    out = {"when": iso(datetime.now(UTC)), "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                                                      "platform": platform.platform()},
           "build": build, "pages": results, "target": {"ms": TARGET_MS, "met": met}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"target < {TARGET_MS:.0f} ms (median of every page): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
