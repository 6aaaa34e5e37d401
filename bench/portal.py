"""The buyer and supplier portal at volume (issue 36): the database of bench/volume.py (one tenant,
--leads leads, default 1,000,000, over the last year), a buyer whose client bought --big-sales of
them (100,000: revenue entries spread over the year), a buyer whose client bought 10,000, and a
supplier whose source sent a quarter of all the leads. Each page is fetched through the real app
(Litestar TestClient, the person signed in with a session cookie): the buyer's first page, its
search and a lead's page, the supplier's first page, its payouts and acceptance by day, and the
10,000-lead buyer's whole CSV export (streamed, read to its end). First call on a fresh store
(empty SQLite cache) and the median of --runs calls. Targets: a first page < 200 ms, the export
of 10,000 leads < 2 s. Results: bench/results/portal.json.

    python -m bench.portal [--leads 1000000] [--big-sales 100000] [--runs 9] [--work DIR] [--reuse]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

from litestar.testing import TestClient

from appliance.app import create_app
from appliance.clock import iso
from appliance.config import load_config
from appliance.domain.ledger import LedgerLine
from appliance.runtime import create_runtime
from appliance.services import users
from bench.campaigns_list import build_bundle
from bench.report import timed
from bench.volume import volume_database

RESULTS = Path(__file__).resolve().parent / "results"
PAGE_MS, EXPORT_MS = 200.0, 2000.0
BIG, SMALL, SMALL_SALES = "bench-big-buyer", "bench-10k-buyer", 10_000
SUPPLIER, SUPPLIED_SOURCE = "sup-web", "src-web"  # bench/volume.py gives a quarter of its leads this source
PASSWORD = "a bench passphrase of some length"


def bundle() -> dict:
    """bench/campaigns_list.py's 40 campaigns, the two clients as records, and the volume's
    `src-web` source (in the first campaign at least) belonging to the supplier."""
    made = build_bundle(40)
    made["clients"] = [{"clientId": BIG, "name": "Big Buyer"}, {"clientId": SMALL, "name": "Ten Thousand Buyer"}]
    for campaign in made["campaigns"]:
        for source in campaign["ingestion"]["sources"]:
            if source["sourceId"] == SUPPLIED_SOURCE:
                source["supplierId"] = SUPPLIER
    first = made["campaigns"][0]["ingestion"]["sources"]
    if all(source["sourceId"] != SUPPLIED_SOURCE for source in first):
        first.append({"sourceId": SUPPLIED_SOURCE, "name": "Web supplier", "supplierId": SUPPLIER})
    return made


def sell(runtime, tenant_id: str, client_id: str, count: int, every: int, offset: int) -> int:
    """Revenue entries for `client_id`: every `every`-th submission from `offset`, up to `count`,
    each at its lead's creation time (a sale per lead, oldest first)."""
    rows = runtime.store.sqlite.reader().execute(
        "SELECT lead_id, submission_id, campaign_id, created_at FROM submissions WHERE tenant_id = ?"
        " ORDER BY submission_id LIMIT ?", (tenant_id, count * every + offset)).fetchall()[offset::every][:count]
    for first in range(0, len(rows), 5000):
        def unit(tx, batch=rows[first:first + 5000]):
            for lead_id, submission_id, campaign_id, created_at in batch:
                line = LedgerLine("revenue", f"revenue:{campaign_id}:bench", "delivered", 35.0, "USD", campaign_id,
                                  client_id, None, "buyer-0")
                tx.ledger.record(tenant_id, lead_id, submission_id, [line], created_at)
        runtime.store.write_sync(unit)
    return len(rows)


def person(runtime, tenant_id: str, email: str, role: str, **party: str) -> None:
    if runtime.store.reader().users.by_email(tenant_id, email) is not None:
        return
    made = asyncio.run(users.create(runtime, tenant_id, "cli", None,
                                    users.NewUser(email=email, role=role, **party)))
    asyncio.run(users.choose_password(runtime, made.setup_url.rsplit("/", 1)[1], PASSWORD, PASSWORD))


def sign_in(client: TestClient, email: str) -> None:
    client.cookies.clear()
    token = re.search(r'name="csrf" value="([^"]+)"', client.get("/admin/sign-in").text).group(1)
    signed = client.post("/admin/sign-in", data={"csrf": token, "email": email, "password": PASSWORD},
                         follow_redirects=False)
    assert signed.status_code == 303 and signed.headers["location"].startswith("/portal"), signed.text[:300]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.portal", description=__doc__.split("\n\n")[0])
    parser.add_argument("--leads", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--big-sales", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--reuse", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "portal.json")
    args = parser.parse_args()
    def sales(runtime, tenant_id: str) -> dict:
        return {"sales": {
            BIG: sell(runtime, tenant_id, BIG, args.big_sales, max(1, args.leads // args.big_sales), 0),
            SMALL: sell(runtime, tenant_id, SMALL, SMALL_SALES, max(1, args.leads // SMALL_SALES), 1)}}

    work, tenant_id, build = volume_database(args.work, "appliance-portal-", args.leads, args.batch, args.reuse,
                                             bundle(), sales)
    runtime = create_runtime(load_config(work / "appliance.toml"))  # a fresh store: empty SQLite cache
    person(runtime, tenant_id, "big@buyer.example.com", "buyer", client_id=BIG)
    person(runtime, tenant_id, "small@buyer.example.com", "buyer", client_id=SMALL)
    person(runtime, tenant_id, "web@supplier.example.com", "supplier", supplier_id=SUPPLIER)
    conn = runtime.store.sqlite.reader()
    (sold,) = conn.execute("SELECT lead_id FROM ledger_entries WHERE tenant_id = ? AND client_id = ? AND"
                           " kind = 'revenue' ORDER BY created_at DESC LIMIT 1 OFFSET 500", (tenant_id, BIG)).fetchone()
    (supplied,) = conn.execute("SELECT lead_id FROM leads WHERE tenant_id = ? AND source_id = ? ORDER BY lead_id"
                               " LIMIT 1 OFFSET 1000", (tenant_id, SUPPLIED_SOURCE)).fetchone()
    email = conn.execute("SELECT email FROM leads WHERE lead_id = ?", (sold,)).fetchone()[0]
    pages = [
        ("big@buyer.example.com", "buyer: first page (100,000 sales)", "/portal/", PAGE_MS),
        ("big@buyer.example.com", "buyer: search by email", f"/portal/?search={email}", PAGE_MS),
        ("big@buyer.example.com", "buyer: a lead's page", f"/portal/leads/{sold}", PAGE_MS),
        ("big@buyer.example.com", "buyer: statement", "/portal/statement", PAGE_MS),
        ("small@buyer.example.com", "buyer: CSV export of 10,000 leads", "/portal/leads.csv", EXPORT_MS),
        ("web@supplier.example.com", "supplier: first page (a quarter of the leads)", "/portal/", PAGE_MS),
        ("web@supplier.example.com", "supplier: a lead's page", f"/portal/leads/{supplied}", PAGE_MS),
        ("web@supplier.example.com", "supplier: payouts", "/portal/payouts", PAGE_MS),
        ("web@supplier.example.com", "supplier: acceptance by day", "/portal/acceptance", PAGE_MS),
        ("web@supplier.example.com", "supplier: sources and posting specs", "/portal/sources", PAGE_MS),
    ]
    results = []
    with TestClient(create_app(runtime, background=False), raise_server_exceptions=True) as client:
        signed_in = None
        for email, label, path, target in pages:
            if email != signed_in:
                sign_in(client, email)
                signed_in = email

            def fetch(path: str = path, label: str = label) -> None:
                answer = client.get(path)
                assert answer.status_code == 200, (path, answer.status_code, answer.text[:500])
                if path.endswith(".csv"):
                    assert answer.text.count("\n") == SMALL_SALES + 1, answer.text.count("\n")
                if path == "/portal/":  # a whole first page of leads, not an empty list
                    assert answer.text.count('href="/portal/leads/') >= 25, answer.text[:2000]

            figures = timed(fetch, args.runs)
            results.append({"page": label, "path": path, "target_ms": target, **figures,
                            "met": figures["median_ms"] < target})
            print(f"  {label:<46} first {figures['first_ms']:7.1f} ms  median {figures['median_ms']:7.1f} ms",
                  flush=True)
    runtime.close()
    met = all(r["met"] for r in results)
    out = {"when": iso(datetime.now(UTC)), "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                                                      "platform": platform.platform()},
           "build": build, "pages": results, "met": met}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"targets (pages < {PAGE_MS:.0f} ms, export < {EXPORT_MS:.0f} ms): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
