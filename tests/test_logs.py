"""Logs of a real `appliance serve`: JSON lines (or text) through one handler, uvicorn's included,
with the ids of what each line is about; deliveries that error, are retried, give up or are
refused, and plugin exceptions (with where they were raised, also in the journey event's `error`)
are logged; no secret of the tenant's bundle appears anywhere in the log."""

from __future__ import annotations

import contextvars
import json
import os
import logging
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx

from appliance import logs
from tests.bundles import campaign, standard_bundle
from tests.buyer_server import BuyerServer, Reply
from tests.processes import free_port, stop_process, wait_healthy

RAISING_PLUGIN = '''
from appliance.sdk import DeliveryAdapter, hookimpl

class Raising(DeliveryAdapter):
    name = "raising"

    async def deliver(self, request, http):
        raise RuntimeError("kaboom with " + request.secrets["auth.token"])

@hookimpl
def appliance_delivery_adapters(settings):
    return [Raising()]
'''
PLUGIN_TOKEN = "plugin-secret-token-5Gh2"
HEADER_TOKEN = "buyer-header-token-8Jk4"
BUNDLE_SECRETS = (PLUGIN_TOKEN, HEADER_TOKEN, "endpoint-secret-token-123", "sms-secret-token-456",
                  "pixel-secret-token-789", "imported-source-key-A-0123456789")
DATABASE_PASSWORD = "database-password-3Qz7"


def cli(config: Path, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "appliance", "--config", str(config), *args, "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_served_run_logs_json_lines_with_ids_and_no_secrets(tmp_path, backend_toml):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "raising.py").write_text(RAISING_PLUGIN)
    port = free_port()
    # On PostgreSQL the URL carries a password (the test cluster accepts any): it is never logged.
    storage = backend_toml.replace("://postgres@", f"://postgres:{DATABASE_PASSWORD}@")
    assert DATABASE_PASSWORD in storage or not backend_toml
    config = tmp_path / "appliance.toml"
    config.write_text(f'[storage]\npath = "{tmp_path / "data"}"\n{storage}[server]\nport = {port}\n'
                      f'[logging]\nformat = "json"\nlevel = "debug"\n[delivery]\nallow_private_addresses = true\n'
                      f'[plugins]\ndirs = ["{plugins}"]\n')
    subprocess.run([sys.executable, "-m", "appliance", "--config", str(config), "init"], check=True,
                   capture_output=True, timeout=60)
    with BuyerServer() as buyer:
        buyer.route("/flaky", Reply(status=503, body={"error": "busy"}))
        buyer.route("/no", Reply(status=400, body={"error": "not buying"}))
        bundle = standard_bundle()
        retry = {"maxAttempts": 2, "backoffSeconds": [0.2]}
        bundle["deliveryEndpoints"] += [
            {"deliveryEndpointId": "flaky", "url": buyer.url("/flaky"), "retry": retry,
             "headers": {"X-Buyer-Token": HEADER_TOKEN}},
            {"deliveryEndpointId": "no", "url": buyer.url("/no"), "retry": retry},
            {"deliveryEndpointId": "boom", "adapter": "raising", "url": "https://buyer.example.com/in",
             "retry": {"maxAttempts": 1}, "auth": {"type": "bearer", "token": PLUGIN_TOKEN}}]
        bundle["campaigns"] += [campaign(code, code, delivery={"deliveryEndpointId": endpoint})
                                for code, endpoint in (("FLK", "flaky"), ("NOB", "no"), ("BOM", "boom"))]
        tenant_id = cli(config, "tenant", "create", "Logged")["tenantId"]
        (tmp_path / "bundle.json").write_text(json.dumps(bundle))
        cli(config, "import", "--tenant", tenant_id, str(tmp_path / "bundle.json"))
        key = cli(config, "key", "create", "--tenant", tenant_id)["key"]

        log_path = tmp_path / "server.log"
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen([sys.executable, "-m", "appliance", "--config", str(config), "serve"],
                                    stdout=log_file, stderr=subprocess.STDOUT)
            try:
                base = f"http://127.0.0.1:{port}"
                wait_healthy(base, proc, log_path)
                leads = {}
                with httpx.Client(base_url=base, headers={"X-API-Key": key}, timeout=10) as http:
                    for n, code in enumerate(("FLK", "NOB", "BOM")):
                        answer = http.post("/api/v1/leads/submit", json={
                            "campaignId": code, "firstName": "Lo", "lastName": f"Gged{n}",
                            "email": f"logged{n}@example.com", "phone": f"+1415555{n:04d}"})
                        assert answer.status_code == 201, answer.text
                        leads[code] = answer.json()["data"]
                    deadline = time.monotonic() + 15
                    while any(http.get(f"/api/v1/leads/{d['leadId']}").json()["data"]["status"] != "failed"
                              for d in leads.values()):
                        assert time.monotonic() < deadline, log_path.read_text()
                        time.sleep(0.1)
                    boom = http.get(f"/api/v1/leads/{leads['BOM']['leadId']}").json()["data"]
            finally:
                stop_process(proc)
    text = log_path.read_text()
    lines = [json.loads(line) for line in text.splitlines()]  # every line is one JSON object
    for line in lines:
        assert {"time", "level", "logger", "message"} <= set(line), line
    assert any(line["logger"].startswith("uvicorn") for line in lines)  # uvicorn's own lines, same handler

    def about(lead: dict, words: str) -> dict:
        found = [line for line in lines if words in line["message"] and line.get("leadId") == lead["leadId"]]
        assert found, (words, text)
        assert found[0]["submissionId"] == lead["submissionId"] and found[0]["tenantId"] == tenant_id
        return found[0]

    assert about(leads["FLK"], "to be retried")["level"] == "WARNING"
    assert about(leads["FLK"], "gave up after 2 attempts")["level"] == "ERROR"
    assert about(leads["NOB"], "refused by the buyer")["level"] == "WARNING"
    crash = about(leads["BOM"], "delivery adapter 'raising' raised RuntimeError: kaboom with ***")
    assert "raising.py" in crash["message"] and "in deliver" in crash["message"]  # where it was raised
    error = boom["submissions"][-1]["journeyEvents"][-1]["error"]
    assert error["code"] == "adapter_exception" and error["message"] == "RuntimeError: kaboom with ***"
    assert "raising.py" in error["stack"]
    for secret in (*BUNDLE_SECRETS, DATABASE_PASSWORD):
        assert secret not in text, secret


def test_text_and_json_lines_carry_the_bound_ids(capsys):
    # In a context of its own: the ids bound here stay out of the tests that follow.
    contextvars.copy_context().run(log_two_lines, capsys)


def log_two_lines(capsys):
    for fmt in ("json", "text"):
        logs.configure(fmt, "info")
        logs.bind(requestId="req_1", tenantId="tnt_1")
        logging.getLogger("appliance.test").info("hello %s", "there")
        logging.getLogger("appliance.test").debug("not at info")
        line = capsys.readouterr().err.strip()
        if fmt == "json":
            record = json.loads(line)
            assert record["message"] == "hello there" and record["level"] == "INFO"
            assert record["logger"] == "appliance.test"
            assert record["requestId"] == "req_1" and record["tenantId"] == "tnt_1"
            assert record["time"].endswith("Z")
            assert record["process"] == "server" and record["pid"] == os.getpid()
        else:
            assert line.endswith(f"Z INFO    server[{os.getpid()}] appliance.test: hello there "
                                 "[requestId=req_1 tenantId=tnt_1]")
            assert "\n" not in line
    # a request's context: the tenant is read from the request state when a line is written
    state: dict = {}
    logs.bind_request("req_2", state)
    logging.getLogger("appliance.test").info("before authentication")
    state["principal"] = SimpleNamespace(tenant_id="tnt_2")
    logging.getLogger("appliance.test").info("after")
    before, after = capsys.readouterr().err.strip().splitlines()
    assert before.endswith("[requestId=req_2]") and after.endswith("[requestId=req_2 tenantId=tnt_2]")


RAISING_KINDS = '''
from appliance.sdk import SmsProvider, hookimpl

class Sms(SmsProvider):
    name = "raising_sms"
    async def send(self, message, http):
        raise RuntimeError("sms down, token " + message.credentials["authToken"])

@hookimpl
def appliance_sms_providers(settings):
    return [Sms()]
'''


def test_an_sms_plugin_exception_is_logged_with_its_message_and_traceback(runtime, tmp_path, caplog):
    from litestar.testing import TestClient

    from appliance.app import create_app
    from tests.conftest import make_tenant

    (tmp_path / "plugins").mkdir(exist_ok=True)
    (tmp_path / "plugins" / "raising_kinds.py").write_text(RAISING_KINDS)
    bundle = standard_bundle()
    bundle["sms"]["providers"][0].update(type="raising_sms")
    tenant = make_tenant(runtime, "T", bundle)
    with TestClient(create_app(runtime, background=False), raise_server_exceptions=False) as client:
        lead = client.post("/api/v1/leads/submit", headers=tenant.headers, json={
            "campaignId": "AC01", "firstName": "Ann", "lastName": "Lee", "email": "ann@example.com",
            "phone": "+14155550100"})
        assert lead.status_code == 201, lead.text
        lead_id = lead.json()["data"]["leadId"]
        sms = client.post("/api/v1/sms/send", json={"leadId": lead_id, "message": "hi"}, headers=tenant.headers)
    assert sms.status_code == 502
    assert "SMS provider failed: RuntimeError: sms down, token ***" in sms.json()["error"]["details"]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "raising_sms' raised RuntimeError: sms down, token ***" in logged
    assert "raising_kinds.py" in logged and "in send" in logged  # where it was raised
    assert "sms-secret-token-456" not in logged


def test_configured_logging_keeps_httpx_request_urls_out(capsys):
    """httpx logs each request's full URL at INFO (a buyer's URL may carry a credential): every
    process that configures logging, the delivery process too, keeps it below WARNING."""
    logs.configure("text", "debug", process="delivery")
    logging.getLogger("httpx").info("HTTP Request: POST https://buyer.example/leads?api_key=SECRET")
    logging.getLogger("appliance.delivery").info("delivered")
    err = capsys.readouterr().err
    assert "SECRET" not in err and f"delivery[{os.getpid()}] appliance.delivery: delivered" in err
    logs.configure("text", "info")
