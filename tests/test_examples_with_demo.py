"""The shipped examples as a newcomer tries them after the README's first command: `appliance
demo` serving, examples/bundle.toml imported into a tenant of its own, examples/leads.csv
imported into that bundle's campaign with no row error, and into the demo's campaign, where
every one of its leads qualifies and reaches the demo buyer. The banner names the console and
the API docs, and both answer (their templates, stylesheet and Swagger UI come from the
installed package).

The appliance runs as a separate process started as `tests.processes.appliance_command` says, so
.ci/smoke-install and .ci/smoke-binary run this same file against a regular install and the
binary."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import httpx

from tests.processes import appliance_command, free_port, stop_process, wait_healthy

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / "examples" / "bundle.toml"
LEADS = ROOT / "examples" / "leads.csv"


def _banner_value(log: Path, pattern: str) -> str:
    found = re.search(pattern, log.read_text(), re.MULTILINE)
    assert found, log.read_text()
    return found.group(1)


def _import_csv(base: str, key: str, campaign_id: str, process: bool) -> dict:
    """POST examples/leads.csv as an integrator does, then its import once it has finished."""
    answer = httpx.post(f"{base}/api/v1/leads/import", headers={"X-API-Key": key},
                        files={"file": ("leads.csv", LEADS.read_bytes(), "text/csv")},
                        data={"campaignId": campaign_id, "process": "true" if process else "false"}, timeout=20)
    assert answer.status_code == 202, answer.text
    import_id = answer.json()["data"]["importId"]
    deadline = time.monotonic() + 30
    while True:
        state = httpx.get(f"{base}/api/v1/imports/{import_id}", headers={"X-API-Key": key}, timeout=10).json()["data"]
        if state["state"] != "running":
            return state
        assert time.monotonic() < deadline, state
        time.sleep(0.1)


def test_the_examples_import_into_a_running_demo_and_reach_the_demo_buyer(tmp_path, backend_toml):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    config = tmp_path / "demo.toml"
    config.write_text(f'[storage]\npath = "{tmp_path / "data"}"\n{backend_toml}[server]\nport = {port}\n')
    log = tmp_path / "demo.log"

    def appliance(*args: str) -> str:
        done = subprocess.run([*appliance_command(), "--config", str(config), *args], capture_output=True,
                              text=True, timeout=60, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    with open(log, "wb") as out:
        proc = subprocess.Popen([*appliance_command(), "--config", str(config), "demo"],
                                stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
        try:
            wait_healthy(base, proc, log)
            demo_key = _banner_value(log, r"^API key \(shown once\): (\S+)$")

            # The banner names the console and the API docs; both are served, with their files.
            setup = _banner_value(log, r"^admin console: choose the demo owner's password at (\S+)$")
            console = _banner_value(log, r"then sign in at (\S+) as \S+$")
            docs = _banner_value(log, r"^API docs: (\S+)")
            assert console == f"{base}/admin/" and docs == f"{base}/schema/swagger", log.read_text()
            assert setup.startswith(f"{base}/admin/setup/"), log.read_text()
            assert httpx.get(setup, timeout=10).status_code == 200
            sign_in = httpx.get(console, follow_redirects=True, timeout=10)
            assert sign_in.status_code == 200 and 'name="csrf"' in sign_in.text, sign_in.text[:300]
            stylesheet = httpx.get(f"{base}/admin/static/console.css", timeout=10)
            assert stylesheet.status_code == 200 and "--accent" in stylesheet.text
            swagger = httpx.get(docs, timeout=10)
            assert swagger.status_code == 200 and "swagger-ui" in swagger.text
            assert httpx.get(f"{base}/schema/openapi.json", timeout=10).json()["paths"]

            # The example bundle imports into a tenant of its own, and the CSV into its campaign
            # with no row error (booleans as a person writes them: true/false, yes/no).
            tenant_id = json.loads(appliance("tenant", "create", "Example Agency", "--json"))["tenantId"]
            appliance("import", "--tenant", tenant_id, str(BUNDLE))
            example_key = json.loads(appliance("key", "create", "--tenant", tenant_id, "--json"))["key"]
            # process=false checks and stores every row as a submit would, without sending the
            # leads on to the example's buyers (their hosts are placeholders).
            stored = _import_csv(base, example_key, "AUTO1", process=False)
            assert (stored["state"], stored["created"], stored["failed"], stored["errors"]) == ("done", 5, 0, []), stored

            # Into the demo's own campaign: every lead qualifies and the demo buyer takes it.
            imported = _import_csv(base, demo_key, "AUTO2", process=True)
            assert (imported["state"], imported["created"], imported["failed"]) == ("done", 5, 0), imported
            deadline = time.monotonic() + 30
            while True:
                leads = httpx.get(f"{base}/api/v1/leads?campaignId=AUTO2&limit=100", headers={"X-API-Key": demo_key},
                                  timeout=10).json()["data"]["leads"]
                if len(leads) == 5 and all(lead["status"] == "delivered" for lead in leads):
                    break
                assert time.monotonic() < deadline, [(lead["email"], lead["status"]) for lead in leads]
                time.sleep(0.2)
            expected = {line.split(",")[2] for line in LEADS.read_text().splitlines()[1:]}
            assert {lead["email"] for lead in leads} == expected
        finally:
            stop_process(proc)
