"""`appliance demo` as a newcomer runs it: a fresh folder, one command; the banner's curl lines
are run as printed (with the machine's curl) and the submitted lead reaches `delivered` through
the demo buyer inside the appliance."""

from __future__ import annotations

import json
import re
import os
import shlex
import subprocess
import time

import httpx
import pytest

from tests.people import csrf_of
from tests.processes import appliance_command, free_port, stop_process, wait_healthy


@pytest.mark.skipif(not any(os.access(os.path.join(d, "curl"), os.X_OK) for d in os.environ["PATH"].split(":")),
                    reason="the banner's lines are curl commands")
def test_the_demo_banner_curl_lines_work_and_the_lead_is_delivered(tmp_path, backend_toml):
    port = free_port()
    config = tmp_path / "demo.toml"
    config.write_text(f'[storage]\npath = "{tmp_path / "data"}"\n{backend_toml}[server]\nport = {port}\n')
    log = tmp_path / "demo.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*appliance_command(), "--config", str(config), "demo"],
                                stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
        try:
            # Listening, not just started up: uvicorn binds its port after "Application startup
            # complete", and a request in between is refused.
            wait_healthy(f"http://127.0.0.1:{port}", proc, log)
            commands = [line.strip() for line in log.read_text().splitlines() if line.strip().startswith("curl ")]
            assert len(commands) == 2, log.read_text()

            def run(command: str) -> dict:
                done = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=20)
                assert done.returncode == 0, done.stderr
                return json.loads(done.stdout)

            submitted = run(commands[0])["data"]
            assert submitted["status"] == "qualified", submitted
            deadline = time.monotonic() + 10
            while True:
                leads = run(commands[1])["data"]["leads"]
                if leads and leads[0]["status"] == "delivered":
                    break
                assert time.monotonic() < deadline, leads
                time.sleep(0.2)
            assert leads[0]["leadId"] == submitted["leadId"]
            again = run(commands[0])["data"]  # pasted twice, or on the next demo start: not a duplicate
            assert again["status"] == "qualified" and again["leadId"] != submitted["leadId"], again
            # The console line: the owner's setup link, then a sign-in that shows the lead.
            link = re.search(r"password at (http://\S+/admin/setup/\S+)", log.read_text()).group(1)
            owner = re.search(r"sign in at \S+ as (\S+)", log.read_text()).group(1)
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as browser:
                form = browser.get(link)
                assert form.status_code == 200 and owner in form.text
                browser.post(link, data={"csrf": csrf_of(form.text), "password": "demo passphrase 1",
                                         "repeat": "demo passphrase 1"})
                page = browser.get("/admin/sign-in")
                browser.post("/admin/sign-in", data={"csrf": csrf_of(page.text), "email": owner,
                                                     "password": "demo passphrase 1"})
                assert submitted["leadId"] in browser.get("/admin/leads").text
        finally:
            stop_process(proc)
