"""`appliance report`: the summary GET /api/v1/reports/summary answers, on the server's command
line: an aligned table by default, `--json` the API's data object, `--csv` a header row and a row
per key and currency; a bad option is one line and exit code 2."""

from __future__ import annotations

import csv
import io

import pytest

from tests.bundles import campaign
from tests.conftest import make_tenant
from tests.worker_helpers import lead_body, submit


@pytest.fixture
def shop(runtime, client, cli):
    """Two leads in AC1 (qualified: 12.5 USD each), one in AC2 (no money)."""
    tenant = make_tenant(runtime, "Acme", {"campaigns": [
        campaign("AC1", "Auto West", delivery={"revenueMilestones": [{"leadStatus": "qualified", "amount": 12.5}]}),
        campaign("AC2", "Solar", client=("cli-2", "Sunny Co"))]})
    for code in ("AC1", "AC1", "AC2"):
        submit(client, tenant, lead_body(code))
    return tenant


def test_the_default_output_is_an_aligned_table(cli, shop):
    out = cli("report", "--tenant", shop.tenant_id).stdout.splitlines()
    assert out[0].startswith("Leads and money by campaign, ") and out[0].endswith(", UTC")
    header, auto, solar, rule, total = out[2:]
    assert header.split() == ["campaign", "leads", "qualified", "delivered", "failed", "duplicate", "disqualified",
                              "returned", "cost", "revenue", "margin"]
    assert auto.split() == ["Auto", "West", "(AC1)", "2", "2", "0", "0", "0", "0", "0", "0.00", "25.00", "25.00", "USD"]
    assert solar.split() == ["Solar", "(AC2)", "1", "1", "0", "0", "0", "0", "0", "-", "-", "-"]
    assert set(rule) == {"-"} and total.split()[:3] == ["total", "3", "3"] and total.endswith("USD")
    assert len({len(line) for line in (header, rule)}) == 1
    assert header.index("revenue") + len("revenue") == auto.index("25.00", auto.index("0.00")) + len("25.00")


def test_json_is_the_api_data_and_csv_has_a_header(cli, client, shop):
    for group in ("campaign", "client", "source", "endpoint", "day"):
        api = client.get(f"/api/v1/reports/summary?groupBy={group}&timezone=America/Chicago", headers=shop.headers)
        assert cli.json("report", "--tenant", shop.tenant_id, "--group-by", group,
                        "--timezone", "America/Chicago") == api.json()["data"]
    rows = list(csv.reader(io.StringIO(cli("report", "--tenant", shop.tenant_id, "--group-by", "client",
                                            "--csv").stdout)))
    assert rows[0] == ["key", "label", "leads", "qualified", "delivered", "failed", "duplicate", "disqualified",
                       "returned", "cost", "revenue", "margin", "currency"]
    assert rows[1:] == [["cli-1", "Client One", "2", "2", "0", "0", "0", "0", "0", "0.0", "25.0", "25.0", "USD"],
                        ["cli-2", "Sunny Co", "1", "1", "0", "0", "0", "0", "0", "0.0", "0.0", "0.0", ""]]
    dated = cli.json("report", "--tenant", shop.tenant_id, "--from", "2020-01-01", "--to", "2020-01-31")
    assert (dated["rangeStart"], dated["rangeEnd"], dated["rows"]) == (
        "2020-01-01T00:00:00.000Z", "2020-02-01T00:00:00.000Z", [])


@pytest.mark.parametrize(("args", "says"), [
    (("--timezone", "Mars/Base"), "error: --timezone: unknown time zone"),
    (("--group-by", "week"), "error: --group-by: must be one of campaign, client, source, endpoint, day"),
    (("--from", "last week"), "error: --from: must be a date (YYYY-MM-DD) or an ISO 8601 timestamp"),
    (("--from", "2026-03-10", "--to", "2026-03-01"), "error: --to: must not be before --from"),
    (("--json", "--csv"), "error: --json and --csv: choose one"),
])
def test_a_bad_option_is_one_line_and_exit_code_2(cli, shop, args, says):
    result = cli("report", "--tenant", shop.tenant_id, *args, expect=2)
    assert result.stdout == "" and result.stderr.startswith(says) and result.stderr.count("\n") == 1, result.stderr


def test_an_unknown_tenant_is_refused(cli):
    assert cli("report", "--tenant", "tnt_nope", expect=1).stderr == "error: tenant tnt_nope does not exist\n"


def test_a_label_a_spreadsheet_would_run_is_written_as_text(cli, runtime, client):
    tenant = make_tenant(runtime, "Acme", {"campaigns": [
        campaign("AC1", "=HYPERLINK(\"https://evil.example.com\")", client=("cli-1", "@SUM(A1)"),
                 delivery={"revenueMilestones": [{"leadStatus": "qualified", "amount": -3}]})]})
    submit(client, tenant, lead_body("AC1"))
    rows = list(csv.reader(io.StringIO(cli("report", "--tenant", tenant.tenant_id, "--group-by", "client",
                                            "--csv").stdout)))
    assert rows[1][:2] == ["cli-1", "'@SUM(A1)"] and rows[1][10] == "-3.0"  # numbers stay numbers
