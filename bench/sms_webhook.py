"""Inbound SMS webhooks (issue 38): a real `appliance serve` on loopback receives Twilio-signed
replies at a fixed rate (open loop: each request is sent at its scheduled time whatever the
answers before it, and its latency counts from that time, so a stall is not hidden), from
`--phones` leads' phones, so every reply is checked, joined to its lead's conversation and
stored. The first `--warmup` seconds at the same rate are not counted (the server's first
requests fill its caches). Reports p50/p99/max against the target p99 < 20 ms at 200/s.

    python -m bench.sms_webhook [--rate 200] [--duration 20] [--warmup 2] [--phones 1000]

Server pinned to CPU 0, this client to CPU 1 (2 cores); `synchronous = FULL`."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import quantiles
from urllib.parse import urlencode

import httpx

from appliance.adapters.twilio import signature
from bench.campaigns_list import ROOT, _pin, _version, appliance_cli, stop_all
from bench.loadgen import free_port, wait_for_port

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_RATE, TARGET_P99_MS = 200, 20.0
TOKEN, NUMBER = "bench-twilio-auth-token", "+14155550100"


def phone(i: int) -> str:
    return f"+1415556{i % 10_000:04d}"


def bundle(phones: int) -> dict:
    return {
        "sms": {"providers": [{"providerId": "tw", "type": "twilio", "accountSid": "ACBENCH", "authToken": TOKEN}],
                "numbers": [{"number": NUMBER}], "defaultProviderId": "tw", "helpText": "Bench: reply STOP to opt out."},
        "campaigns": [{"campaignId": "BENCH", "name": "Bench", "active": True}],
    }


async def leads(base: str, key: str, phones: int) -> None:
    async with httpx.AsyncClient(base_url=base, headers={"X-API-Key": key}, timeout=30) as client:
        for start in range(0, phones, 50):
            answers = await asyncio.gather(*(client.post("/api/v1/leads/submit", json={
                "campaignId": "BENCH", "firstName": "Sam", "lastName": f"Lee{i}", "email": f"sam{i}@example.com",
                "phone": phone(i)}) for i in range(start, min(phones, start + 50))))
            bad = [a.text for a in answers if a.status_code != 201]
            if bad:
                raise RuntimeError(f"submit failed: {bad[0]}")


async def drive(base: str, url_of_hook: str, path: str, rate: float, duration: float, phones: int,
                warmup: float) -> dict:
    skipped = int(rate * warmup)
    total = skipped + int(rate * duration)
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=10) as client:
        bodies = []
        for n in range(total):
            form = {"MessageSid": f"SMbench{n:08d}", "AccountSid": "ACBENCH", "From": phone(n % phones),
                    "To": NUMBER, "Body": f"Yes, call me tomorrow ({n})", "NumMedia": "0"}
            bodies.append((urlencode(form), signature(TOKEN, url_of_hook, sorted(form.items()))))

        async def one(n: int, due: float) -> None:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            content, signed = bodies[n]
            try:
                answer = await client.post(path, content=content, headers={
                    "Content-Type": "application/x-www-form-urlencoded", "X-Twilio-Signature": signed})
                statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
            except httpx.HTTPError:
                statuses[0] = statuses.get(0, 0) + 1
                return
            if n >= skipped:
                latencies.append(time.perf_counter() - due)

        start = time.perf_counter() + 0.2
        await asyncio.gather(*(one(n, start + n / rate) for n in range(total)))
        elapsed = time.perf_counter() - start
    cuts = quantiles(latencies, n=100) if len(latencies) >= 100 else [max(latencies or [0])] * 99
    return {"rate": rate, "sent": total, "counted": total - skipped, "elapsed_s": round(elapsed, 2),
            "statuses": statuses,
            "latency_ms": {"p50": round(1e3 * cuts[49], 2), "p99": round(1e3 * cuts[98], 2),
                           "max": round(1e3 * max(latencies or [0]), 2)}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sms_webhook", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=TARGET_RATE)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--phones", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=RESULTS / "sms_webhook.json")
    args = parser.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu, client_cpu = (cpus[0], cpus[1]) if len(cpus) >= 2 else (None, None)
    work = Path(tempfile.mkdtemp(prefix="bench-sms-"))
    procs: list[subprocess.Popen] = []
    try:
        port = free_port()
        config = work / "appliance.toml"
        config.write_text(f'[server]\nlog_level = "warning"\n[storage]\npath = "{work / "data"}"\nsynchronous = "FULL"\n'
                          f'[security]\nrate_limit_per_minute = 0\n[delivery]\nconcurrency = 0\n[plugins]\ndirs = []\n')
        appliance_cli(config, "init")
        tenant = json.loads(appliance_cli(config, "tenant", "create", "Bench", "--json"))["tenantId"]
        key = json.loads(appliance_cli(config, "key", "create", "--tenant", tenant, "--json"))["key"]
        (work / "bundle.json").write_text(json.dumps(bundle(args.phones)))
        appliance_cli(config, "import", "--tenant", tenant, str(work / "bundle.json"))
        log = open(work / "appliance.log", "wb")
        app = subprocess.Popen([sys.executable, "-m", "appliance", "--config", str(config), "serve", "--port",
                                str(port)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_pin(server_cpu))
        procs.append(app)
        wait_for_port(port, proc=app)
        if client_cpu is not None:
            os.sched_setaffinity(0, {client_cpu})
        base = f"http://127.0.0.1:{port}"
        path = f"/hooks/sms/twilio/{tenant}"
        asyncio.run(leads(base, key, args.phones))
        result = asyncio.run(drive(base, base + path, path, args.rate, args.duration, args.phones,
                                 args.warmup))
        orphans = httpx.get(f"{base}/api/v1/sms/orphan-messages", headers={"X-API-Key": key}).json()["data"]["items"]
        result["orphans"] = len(orphans)  # 0: every reply found its lead
        result.update(target_p99_ms=TARGET_P99_MS, python=platform.python_version(), appliance=_version("appliance"),
                      machine=platform.machine(), at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        lat = result["latency_ms"]
        print(f"{result['rate']:.0f}/s for {args.duration:.0f} s: p50 {lat['p50']} ms, p99 {lat['p99']} ms, "
              f"max {lat['max']} ms, statuses {result['statuses']} (target p99 < {TARGET_P99_MS} ms)")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        return 0 if result["statuses"] == {200: result["sent"]} and lat["p99"] < TARGET_P99_MS else 1
    finally:
        stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
