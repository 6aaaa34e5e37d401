"""`appliance backup` taken while leads are being submitted: the copy passes
integrity_check and holds every lead acknowledged (201) before the backup began, with its
submission and delivery job; restored as the data folder of a new install, the service answers
for those leads. Everything runs as separate processes, as in production: `appliance serve`,
clients submitting, and `appliance backup` from another process at the same time."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time

import httpx
import pytest
from litestar.testing import TestClient

from appliance.app import create_app
from appliance.config import load_config
from appliance.runtime import create_runtime
from tests.bundles import standard_bundle
from tests.buyer_server import wait_until
from tests.processes import free_port, stop_process
from tests.servers import person, write_config

# SQLite's file backup: PostgreSQL's pg_dump backup is tested in test_postgresql_operations.py.
pytestmark = pytest.mark.sqlite_only

SUBMIT = "/api/v1/leads/submit"
CLIENTS = 6


def _cli(env: dict, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "appliance", *args], capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def _up(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


class Load:
    """CLIENTS concurrent submitters; every 201 is recorded with the moment it was received."""

    def __init__(self, base: str, key: str) -> None:
        self.base, self.key = base, key
        self.acked: list[tuple[float, str]] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.numbers = itertools.count(10_000)
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _client(self, http: httpx.AsyncClient) -> None:
        while not self.stop.is_set():
            n = next(self.numbers)
            try:
                answer = await http.post(SUBMIT, json={"campaignId": "AC01", **person(n)})
            except httpx.HTTPError as exc:
                self.errors.append(repr(exc))
                continue
            if answer.status_code == 201:
                self.acked.append((time.monotonic(), answer.json()["data"]["leadId"]))
            else:
                self.errors.append(f"{answer.status_code} {answer.text[:200]}")

    async def _run(self) -> None:
        async with httpx.AsyncClient(base_url=self.base, headers={"X-API-Key": self.key}, timeout=30) as http:
            await asyncio.gather(*(self._client(http) for _ in range(CLIENTS)))

    def __enter__(self) -> "Load":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def test_backup_during_submits_restores_every_acknowledged_lead(tmp_path):
    port = free_port()
    config = write_config(tmp_path, extra=f'\n[server]\nhost = "127.0.0.1"\nport = {port}\n'
                                          f'\n[delivery]\nconcurrency = 0\n')
    env = {**os.environ, "APPLIANCE_CONFIG": str(config)}
    _cli(env, "init")
    tenant_id = json.loads(_cli(env, "tenant", "create", "Busy", "--json"))["tenantId"]
    (tmp_path / "bundle.json").write_text(json.dumps(standard_bundle()))
    _cli(env, "import", "--tenant", tenant_id, str(tmp_path / "bundle.json"))
    key = json.loads(_cli(env, "key", "create", "--tenant", tenant_id, "--json"))["key"]

    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "appliance", "serve"], stdout=log, stderr=subprocess.STDOUT,
                              env=env)
    backup_file = tmp_path / "backup" / "appliance-copy.db"
    backup_file.parent.mkdir()
    try:
        assert wait_until(lambda: _up(base), timeout=20), (tmp_path / "server.log").read_text()
        with Load(base, key) as load:
            assert wait_until(lambda: len(load.acked) >= 150, timeout=30), load.errors[:5]
            began = time.monotonic()
            acked_before = [lead for at, lead in load.acked if at < began]
            result = subprocess.run([sys.executable, "-m", "appliance", "backup", str(backup_file)],
                                    capture_output=True, text=True, env=env, timeout=60)
            ended = time.monotonic()
            time.sleep(0.3)  # keep writing a little after the backup, too
        assert result.returncode == 0, result.stderr
        assert "backup written to" in result.stdout
        assert not load.errors, load.errors[:5]
        during = [lead for at, lead in load.acked if began <= at <= ended]
        assert during, "no submit was acknowledged while the backup ran: the test proves nothing"
    finally:
        stop_process(server)
        log.close()

    with sqlite3.connect(f"file:{backup_file}?mode=ro", uri=True) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        in_copy = {row[0] for row in conn.execute("SELECT lead_id FROM leads")}
        missing = set(acked_before) - in_copy
        assert not missing, f"{len(missing)} acknowledged leads missing from the backup"
        with_submission = {row[0] for row in conn.execute("SELECT DISTINCT lead_id FROM submissions")}
        assert set(acked_before) <= with_submission
        jobs = conn.execute("SELECT count(*) FROM jobs WHERE kind = 'deliver'").fetchone()[0]
        assert jobs >= len(acked_before)  # delivery is off (concurrency 0): every job is still queued
    copied = len(in_copy)
    assert len(acked_before) <= copied <= len(load.acked)

    # Restore: the copy becomes the database of a new install (with the same master key).
    restored = tmp_path / "restored"
    restored.mkdir()
    restored_config = write_config(restored)
    settings = load_config(restored_config)
    settings.database_file.parent.mkdir(parents=True)
    shutil.copy(backup_file, settings.database_file)
    shutil.copy(load_config(config).master_key_path, settings.master_key_path)
    os.chmod(settings.master_key_path, 0o600)
    doctor = subprocess.run([sys.executable, "-m", "appliance", "--config", str(restored_config), "doctor"],
                            capture_output=True, text=True, timeout=60)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    runtime = create_runtime(settings)
    try:
        with TestClient(create_app(runtime, background=False)) as client:
            headers = {"X-API-Key": key}
            for lead_id in acked_before[:: max(1, len(acked_before) // 20)] + acked_before[-3:]:
                answer = client.get(f"/api/v1/leads/{lead_id}", headers=headers)
                assert answer.status_code == 200, answer.text
                assert answer.json()["data"]["submissions"]
            assert client.get("/api/v1/campaigns", headers=headers).json()["data"]["pagination"]["total"] == 2
    finally:
        runtime.close()
