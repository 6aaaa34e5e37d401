"""GET /api/v1/reports/summary: lead counts (leads created in the range, by their current
status) and money (ledger entries created in the range, revenue net of returns) grouped by
campaign, client, source, endpoint or local day, read from rollups kept in the transaction of
every write (a trigger on ledger entries, the leads repository for leads), and filled from the
rows already there when the migration runs."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import apsw
import msgspec
import pytest
from litestar.testing import TestClient

from appliance.domain.lead import LeadRecord
from appliance.runtime import Runtime
from appliance.services import reports
from appliance.storage import MIGRATIONS, Store
from tests.api_helpers import validation_error
from tests.bundles import campaign
from tests.conftest import make_tenant
from tests.submit_support import START, clock, FakeClock, source_key  # noqa: F401 (the clock fixture)
from tests.worker_helpers import live_app, endpoint, lead_body, status_is, submit, wait_for
from tests.engine import engine

MONEY = ("cost", "revenue", "margin", "currency")


@pytest.fixture
def live(runtime: Runtime, clock: FakeClock, tmp_path) -> Iterator[TestClient]:
    with live_app(runtime, tmp_path) as client:
        yield client


def summary(client, tenant, query: str = "") -> dict:
    response = client.get(f"/api/v1/reports/summary{query}", headers=tenant.headers)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def rows_by_key(data: dict) -> dict:
    return {row["key"]: row for row in data["rows"]}


def counts(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("key", "label", "byCurrency", *MONEY) and v}


def shop(runtime: Runtime, name: str = "T"):
    """Two campaigns selling through `ep` and `ep2` (10 and 20 USD on delivery), a campaign
    holding its leads for review (no buyer), and a source `web` that costs 2.5 USD a lead."""
    web = {"sourceId": "web", "name": "Web form", "costMilestones": [{"leadStatus": "lead_ingested", "amount": 2.5}]}
    return make_tenant(runtime, name, {"deliveryEndpoints": [endpoint("ep"), endpoint("ep2")], "campaigns": [
        campaign("DL1", "Sells", ingestion={"sources": [web]}, delivery={
            "deliveryEndpointId": "ep", "revenueMilestones": [{"leadStatus": "delivered", "amount": 10}]}),
        campaign("DL2", "Resells", client=("cli-2", "Two"), delivery={
            "deliveryEndpointId": "ep2", "revenueMilestones": [{"leadStatus": "delivered", "amount": 20}]}),
        campaign("NB1", "Held", client=("cli-2", "Two"),
                 firstIntakeAction={"enabled": True, "action": "human_review"})]})


def delivered(live, tenant, code: str, script: str = "success", key: str | None = None) -> dict:
    headers = {"X-API-Key": key} if key else tenant.headers
    response = live.post("/api/v1/leads/submit", json=lead_body(code, script), headers=headers)
    assert response.status_code == 201, response.text
    data = response.json()["data"]
    wait_for(live, tenant, data["leadId"], status_is("delivered", "failed"))
    return data


@pytest.fixture
def sold(live, runtime):
    """DL1: two delivered through source `web` (one at the buyer's price 55.5), one failed;
    DL2: one delivered; NB1: one set to qualified by hand."""
    tenant = shop(runtime)
    web = source_key(runtime, tenant, "web")
    delivered(live, tenant, "DL1", key=web)
    delivered(live, tenant, "DL1", "price:55.5", key=web)
    delivered(live, tenant, "DL1", "failure,failure,failure")
    delivered(live, tenant, "DL2")
    held = submit(live, tenant, lead_body("NB1"))
    bulk = {"leadIds": [held["leadId"]], "updates": {"status": "qualified"}}
    assert live.patch("/api/v1/leads/bulk", json=bulk, headers=tenant.headers).status_code == 200
    return tenant


def test_by_campaign_counts_each_status_and_nets_the_money(live, sold):
    data = summary(live, sold, "?groupBy=campaign")
    assert data["groupBy"] == "campaign" and data["timezone"] == "UTC"
    assert (data["rangeStart"], data["rangeEnd"]) == ("2026-02-09T00:00:00.000Z", "2026-03-11T00:00:00.000Z")
    assert [(r["key"], r["label"]) for r in data["rows"]] == [("NB1", "Held"), ("DL2", "Resells"), ("DL1", "Sells")]
    by = rows_by_key(data)
    assert counts(by["DL1"]) == {"leads": 3, "delivered": 2, "failed": 1}
    assert [by["DL1"][k] for k in MONEY] == [5.0, 65.5, 60.5, "USD"]
    assert counts(by["NB1"]) == {"leads": 1, "qualified": 1}
    assert (by["NB1"]["cost"], by["NB1"]["revenue"], by["NB1"]["currency"]) == (0.0, 0.0, None)
    totals = data["totals"]
    assert counts(totals) == {"leads": 5, "qualified": 1, "delivered": 3, "failed": 1}
    assert (totals["cost"], totals["revenue"], totals["margin"], totals["currency"]) == (5.0, 85.5, 80.5, "USD")
    assert totals["byCurrency"] == [{"currency": "USD", "cost": 5.0, "revenue": 85.5, "margin": 80.5}]
    assert data == summary(live, sold)  # campaign is the default grouping


def test_by_client_source_and_endpoint(live, sold):
    by = rows_by_key(summary(live, sold, "?groupBy=client"))
    assert (by["cli-1"]["label"], by["cli-1"]["leads"], by["cli-1"]["revenue"]) == ("Client One", 3, 65.5)
    assert (by["cli-2"]["label"], by["cli-2"]["leads"], by["cli-2"]["revenue"]) == ("Two", 2, 20.0)

    data = summary(live, sold, "?groupBy=source")
    assert [(r["key"], r["label"]) for r in data["rows"]] == [("web", "Web form"), (None, "(none)")]
    web, none = data["rows"]
    assert (web["leads"], web["delivered"], web["cost"], web["revenue"]) == (2, 2, 5.0, 65.5)
    assert (none["leads"], none["cost"], none["revenue"]) == (3, 0.0, 20.0)  # tenant-key submits have no source

    # Money by the entries' endpoint; leads by their campaign's endpoint (NB1 has none).
    by = rows_by_key(summary(live, sold, "?groupBy=endpoint"))
    assert {k: (r["label"], r["leads"], r["revenue"]) for k, r in by.items()} == {
        "ep": ("ep", 3, 65.5), "ep2": ("ep2", 1, 20.0), None: ("(none)", 1, 0.0)}
    assert by["ep"]["cost"] == 5.0 and by[None]["currency"] is None


def test_by_day_in_the_request_time_zone(live, runtime, clock):
    tenant = shop(runtime)
    clock.set(datetime(2026, 3, 10, 23, 30, tzinfo=UTC))  # 05:00 on the 11th in Kolkata (+05:30)
    delivered(live, tenant, "DL2")
    clock.set(datetime(2026, 3, 10, 12, 0, tzinfo=UTC))  # 17:30 on the 10th in Kolkata
    submit(live, tenant, lead_body("NB1"))
    clock.set(datetime(2026, 3, 12, 9, 0, tzinfo=UTC))

    utc = summary(live, tenant, "?groupBy=day")
    assert [(r["key"], r["label"], r["leads"], r["revenue"]) for r in utc["rows"]] == [
        ("2026-03-10", "2026-03-10", 2, 20.0)]
    india = summary(live, tenant, "?groupBy=day&timezone=Asia/Kolkata")
    assert india["timezone"] == "Asia/Kolkata" and india["rangeEnd"] == "2026-03-12T18:30:00.000Z"
    assert [(r["key"], r["leads"], r["delivered"], r["revenue"]) for r in india["rows"]] == [
        ("2026-03-10", 1, 0, 0.0), ("2026-03-11", 1, 1, 20.0)]
    # A date is a whole day in the zone, for every grouping.
    only = "?startDate=2026-03-11&endDate=2026-03-11"
    assert summary(live, tenant, only)["totals"]["leads"] == 0
    assert summary(live, tenant, only + "&timezone=Asia/Kolkata")["totals"]["leads"] == 1
    # Timestamps: with an offset as given, without one in the zone; an end counts through it.
    assert summary(live, tenant, "?startDate=2026-03-10T23:30:00Z&endDate=2026-03-10T23:30:00Z")["totals"]["leads"] == 1
    assert summary(live, tenant, "?startDate=2026-03-11T04:00:00&endDate=2026-03-11T06:00:00"
                                 "&timezone=Asia/Kolkata")["totals"]["leads"] == 1
    assert summary(live, tenant, "?startDate=2026-03-11T00:00:00Z")["totals"]["leads"] == 0


def test_revenue_is_net_of_returns(live, runtime):
    tenant = shop(runtime)
    kept = delivered(live, tenant, "DL1")
    back = delivered(live, tenant, "DL1")
    response = live.post(f"/api/v1/leads/{back['leadId']}/return", json={"reason": "wrong number"},
                         headers=tenant.headers)
    assert response.status_code == 200, response.text
    row = rows_by_key(summary(live, tenant))["DL1"]
    assert counts(row) == {"leads": 2, "delivered": 1, "returned": 1}
    assert (row["revenue"], row["margin"]) == (10.0, 10.0)
    assert kept["leadId"] != back["leadId"]


def test_money_in_several_currencies(live, runtime):
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint("ep")], "campaigns": [
        campaign("EU1", "Euro", delivery={"deliveryEndpointId": "ep", "revenueMilestones": [
            {"leadStatus": "delivered", "amount": 3, "currency": "EUR"}]}),
        campaign("US1", "Dollar", delivery={"deliveryEndpointId": "ep", "revenueMilestones": [
            {"leadStatus": "delivered", "amount": 0.1, "currency": "USD"},
            {"leadStatus": "delivered", "amount": 0.2, "currency": "GBP"}]})]})
    for code in ("EU1", "US1", "US1"):
        delivered(live, tenant, code)
    data = summary(live, tenant)
    # One row per (key, currency), the lead counters on the key's first row only; the main
    # currency (most money moved) first. Sums carry no float noise (0.1 + 0.1 + ...).
    assert [(r["key"], r["currency"], r["leads"], r["revenue"]) for r in data["rows"]] == [
        ("US1", "GBP", 2, 0.4), ("US1", "USD", 0, 0.2), ("EU1", "EUR", 1, 3.0)]
    totals = data["totals"]
    assert (totals["leads"], totals["delivered"], totals["currency"], totals["revenue"]) == (3, 3, "EUR", 3.0)
    assert [(c["currency"], c["revenue"]) for c in totals["byCurrency"]] == [("EUR", 3.0), ("GBP", 0.4), ("USD", 0.2)]


def test_status_changes_move_the_counts(live, runtime):
    tenant = shop(runtime)
    first, second = (submit(live, tenant, lead_body("NB1")) for _ in range(2))
    assert counts(rows_by_key(summary(live, tenant))["NB1"]) == {"leads": 2}  # pending_action: no counter
    bulk = {"leadIds": [first["leadId"]], "updates": {"status": "disqualified"}}
    assert live.patch("/api/v1/leads/bulk", json=bulk, headers=tenant.headers).status_code == 200
    assert live.patch(f"/api/v1/submissions/{second['submissionId']}", json={"status": "duplicate"},
                      headers=tenant.headers).status_code == 200
    assert counts(rows_by_key(summary(live, tenant))["NB1"]) == {"leads": 2, "disqualified": 1, "duplicate": 1}
    bulk["updates"]["status"] = "qualified"
    assert live.patch("/api/v1/leads/bulk", json=bulk, headers=tenant.headers).status_code == 200
    assert counts(summary(live, tenant)["totals"]) == {"leads": 2, "qualified": 1, "duplicate": 1}


def test_tenants_see_only_their_own(live, runtime, sold):
    other = shop(runtime, "Other")
    data = summary(live, other)
    assert data["rows"] == [] and counts(data["totals"]) == {} and data["totals"]["byCurrency"] == []
    assert data["totals"]["currency"] is None


@pytest.mark.parametrize(("query", "field"), [
    ("?groupBy=week", "groupBy"),
    ("?timezone=Mars/Olympus_Mons", "timezone"),
    ("?timezone=America", "timezone"),
    ("?startDate=yesterday", "startDate"),
    ("?endDate=2026-02-30", "endDate"),
    ("?startDate=2026-03-10&endDate=2026-03-09", "endDate"),
    ("?startDate=2026-03-10T12:00:00Z&endDate=2026-03-10T11:59:59Z", "endDate"),
])
def test_bad_queries_are_validation_errors_naming_the_field(live, runtime, query, field):
    tenant = shop(runtime)
    validation_error(live.get(f"/api/v1/reports/summary{query}", headers=tenant.headers), field)


# ---- the rollups ------------------------------------------------------------------------------

def _at_m007(path: Path) -> None:
    """A database as the release before the rollups left it, with leads and entries."""
    conn = apsw.Connection(str(path))
    conn.execute("CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
    names = [name for name, _ in MIGRATIONS]
    for name, fn in MIGRATIONS[:names.index("m007_ledger_entries") + 1]:
        with conn:
            fn(conn)
            conn.execute("INSERT INTO migrations VALUES (?, '2026-01-01T00:00:00Z')", (name,))
    with conn:
        conn.execute("INSERT INTO tenants VALUES ('tnt_a', 'A', '2026-01-01T00:00:00.000Z', 0),"
                     " ('tnt_b', 'B', '2026-01-01T00:00:00.000Z', 0)")
        leads = [("lead_1", "tnt_a", "C1", "cli", "web", "delivered", "2026-03-10T23:30:00.000Z"),
                 ("lead_2", "tnt_a", "C1", "cli", None, "delivered", "2026-03-10T23:40:00.000Z"),
                 ("lead_3", "tnt_a", "C1", "cli", None, "failed", "2026-03-10T10:00:00.000Z"),
                 ("lead_4", "tnt_a", None, None, None, "disqualified", "2026-03-09T00:00:00.000Z"),
                 ("lead_5", "tnt_b", "C9", "cli", None, "qualified", "2026-03-10T10:00:00.000Z")]
        for lead_id, tenant, code, client, source, status, at in leads:
            conn.execute("INSERT INTO leads(lead_id, tenant_id, intake_campaign_id, campaign_id, client_id, source_id,"
                         " status, created_at, updated_at, doc) VALUES (?, ?, 'C1', ?, ?, ?, ?, ?, ?, x'')",
                         (lead_id, tenant, code, client, source, status, at, at))
        entries = [("led_1", "lead_1", "revenue", 10.0, "2026-03-10T23:31:00.000Z"),
                   ("led_2", "lead_1", "cost", 2.5, "2026-03-10T23:30:00.000Z"),
                   ("led_3", "lead_2", "revenue", 0.1, "2026-03-10T23:41:00.000Z"),
                   ("led_4", "lead_2", "revenue", 0.2, "2026-03-10T23:42:00.000Z"),
                   ("led_5", "lead_1", "return", -10.0, "2026-03-11T09:00:00.000Z")]
        for entry_id, lead_id, kind, amount, at in entries:
            conn.execute("INSERT INTO ledger_entries(entry_id, tenant_id, lead_id, submission_id, kind, lead_status,"
                         " amount, currency, campaign_id, client_id, source_id, delivery_endpoint_id, created_at)"
                         " VALUES (?, 'tnt_a', ?, 'sub', ?, 'delivered', ?, 'USD', 'C1', 'cli', NULL, 'ep', ?)",
                         (entry_id, lead_id, kind, amount, at))
    conn.close()


def _read(store: Store, tenant_id: str, query: str, timezone: str | None = None) -> dict:
    span = reports.summary_range(query, "2026-03-01", "2026-03-31", timezone, START)
    return {(r.key, r.currency): (r.leads, r.delivered, r.failed, r.disqualified, r.cost, r.revenue)
            for r in reports.read_summary(store.reader(), tenant_id, span, {}).rows}


def test_the_migration_fills_the_rollups_from_the_rows_already_there(tmp_path):
    path = tmp_path / "old.db"
    _at_m007(path)
    store = Store.open(path)
    try:
        assert _read(store, "tnt_a", "campaign") == {
            ("C1", "USD"): (3, 2, 1, 0, 2.5, 0.3), (None, None): (1, 0, 0, 1, 0.0, 0.0)}
        assert _read(store, "tnt_a", "day") == {
            ("2026-03-09", None): (1, 0, 0, 1, 0.0, 0.0), ("2026-03-10", "USD"): (3, 2, 1, 0, 2.5, 10.3),
            ("2026-03-11", "USD"): (0, 0, 0, 0, 0.0, -10.0)}
        assert _read(store, "tnt_a", "day", "Asia/Kolkata") == {
            ("2026-03-09", None): (1, 0, 0, 1, 0.0, 0.0), ("2026-03-10", None): (1, 0, 1, 0, 0.0, 0.0),
            ("2026-03-11", "USD"): (2, 2, 0, 0, 2.5, 0.3)}
        assert _read(store, "tnt_b", "source") == {(None, None): (1, 0, 0, 0, 0.0, 0.0)}
        # From here on every write keeps them: a new lead, its status change.
        at = "2026-03-10T12:00:00.000Z"
        lead = LeadRecord(lead_id="lead_6", status="delivered", campaign_id="C1", client_id="cli", created_at=at,
                          updated_at=at)
        store.write_sync(lambda tx: tx.leads.insert_lead("tnt_a", lead, "C1"))
        assert _read(store, "tnt_a", "campaign")[("C1", "USD")] == (4, 3, 1, 0, 2.5, 0.3)
        moved = msgspec.structs.replace(lead, status="failed", campaign_id="C2")
        store.write_sync(lambda tx: tx.leads.update_lead("tnt_a", moved))
        assert _read(store, "tnt_a", "campaign")[("C1", "USD")] == (3, 2, 1, 0, 2.5, 0.3)
        assert _read(store, "tnt_a", "campaign")[("C2", None)] == (1, 0, 1, 0, 0.0, 0.0)
    finally:
        store.close()


@pytest.mark.sqlite_only  # rebuilds with SQLite's m008; PostgreSQL's rebuild is still to write
def test_the_rollups_kept_on_every_write_path_equal_a_rebuild(live, runtime, sold):
    """The rollups kept through submits, deliveries, a buyer's price and a bulk update equal
    those the migration builds from the rows."""
    def rollups() -> dict:
        conn = engine(runtime.store).reader()
        return {table: sorted(conn.execute(f"SELECT * FROM {table} WHERE leads != 0" if "leads" in table
                                           else f"SELECT * FROM {table}").fetchall())
                for table in ("report_leads", "report_leads_daily", "report_money", "report_money_daily")}

    leads = live.get("/api/v1/leads", headers=sold.headers).json()["data"]["leads"]
    bulk = {"leadIds": [lead["leadId"] for lead in leads[:2]], "updates": {"status": "rejected"}}
    assert live.patch("/api/v1/leads/bulk", json=bulk, headers=sold.headers).status_code == 200
    kept = rollups()

    def rebuild(conn) -> None:
        conn.execute("DROP TRIGGER report_entry_added")
        for table in ("report_leads", "report_leads_daily", "report_money", "report_money_daily"):
            conn.execute(f"DROP TABLE {table}")
        dict(MIGRATIONS)["m008_report_rollups"](conn)

    engine(runtime.store).write_sync(rebuild)
    assert rollups() == kept and kept["report_leads"]


def test_leads_are_written_only_where_their_counts_are_kept():
    """Lead counts are kept by Leads.insert_lead and update_lead (no trigger on leads: see
    migration m008), so nothing else in the appliance may write a lead row."""
    root = Path(__file__).resolve().parent.parent
    writes = re.compile(r"INTO leads\b|UPDATE leads\b|DELETE FROM leads\b|REPLACE INTO leads\b")
    found = [str(path.relative_to(root)) for path in sorted((root / "appliance").rglob("*.py"))
             for line in path.read_text().splitlines() if writes.search(line)]
    # The migrations' one UPDATE fills the contact digests of stored leads, no counted column.
    assert found == ["appliance/storage/leads.py"] * 2 + ["appliance/storage/migrations.py",
                                                          "appliance/storage/postgres/migrations.py",
                                                          "appliance/storage/postgres/repositories.py"]
