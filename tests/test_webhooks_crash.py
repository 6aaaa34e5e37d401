"""Kill -9 between commit and send: a real `appliance serve` process acknowledges submits while
its receiver holds every event's answer back, is killed with SIGKILL, and started again on the
same data folder. Every acknowledged lead's event reaches the receiver after the restart, under
the webhook-id it was first sent with (at least once; a repeat carries the same id)."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from standardwebhooks.webhooks import Webhook as Verifier

from tests.buyer_server import BuyerServer, wait_until
from tests.conftest import Cli
from tests.processes import free_port, stop_process, wait_healthy
from tests.servers import person

ROOT = Path(__file__).resolve().parent.parent
SECRET = "whsec_" + base64.b64encode(b"crash-test-secret-bytes!").decode()
LEADS = 30


def start(config: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "appliance", "--config", str(config), "serve", "--port",
                                 str(port)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, log)
    return proc, url


def test_no_event_is_lost_to_a_kill_between_commit_and_send(tmp_path, backend_toml):
    config = tmp_path / "appliance.toml"
    config.write_text(f'[storage]\npath = "{tmp_path / "data"}"\nsynchronous = "FULL"\n{backend_toml}\n'
                      '[security]\nrate_limit_per_minute = 0\n\n'
                      '[delivery]\nallow_private_addresses = true\nconcurrency = 0\n\n[plugins]\ndirs = []\n')
    cli = Cli(config)
    cli("init")
    tenant_id = cli.json("tenant", "create", "Crash Hooks")["tenantId"]
    key = cli.json("key", "create", "--tenant", tenant_id)["key"]
    log = tmp_path / "server.log"
    with BuyerServer() as receiver:
        receiver.route("/hooks", delay=30)  # recorded on arrival, answered long after the kill
        (tmp_path / "bundle.json").write_text(json.dumps({
            "campaigns": [{"campaignId": "KH1", "name": "Kill hooks"}],
            "webhooks": [{"webhookId": "crm", "url": receiver.url("/hooks"), "secret": SECRET,
                          "events": ["lead.processed"]}]}))
        cli("import", "--tenant", tenant_id, str(tmp_path / "bundle.json"))
        proc, url = start(config, log)
        try:
            acked = []
            with httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=10) as client:
                for n in range(LEADS):
                    response = client.post("/api/v1/leads/submit", json={"campaignId": "KH1", **person(n)})
                    assert response.status_code == 201, response.text
                    acked.append(response.json()["data"]["leadId"])
            assert wait_until(lambda: len(receiver.requests_to("/hooks")) >= 3, 10)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            first_ids = {r.json()["data"]["leadId"]: r.headers["webhook-id"] for r in receiver.requests_to("/hooks")}
            assert len(first_ids) < LEADS  # the kill came before every event was sent

            receiver.route("/hooks", status=200)
            proc, url = start(config, log)
            assert wait_until(lambda: {r.json()["data"]["leadId"] for r in receiver.requests_to("/hooks")}
                              >= set(acked), 30), log.read_text()
        finally:
            stop_process(proc)
    verifier = Verifier(SECRET)
    for request in receiver.requests_to("/hooks"):
        event = verifier.verify(request.body, request.headers)
        lead_id = event["data"]["leadId"]
        assert event["type"] == "lead.processed"
        assert request.headers["webhook-id"] == first_ids.get(lead_id, request.headers["webhook-id"])
