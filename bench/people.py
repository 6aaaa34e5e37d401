"""People (issue 35): what signing in costs and what a console page's session and role check
costs, in one process on this machine.

- sign-in: the CPU time (every thread of the process: the argon2id check runs on a worker
  thread) of whole email-and-password sign-ins through services/console.sign_in, and of the
  argon2id check alone; target < 300 ms of CPU a sign-in;
- session and role check: what console/session.session_guard does for every page (the session
  read by its cookie's hash, joined with its user and tenant, and the role looked up in
  domain/permissions.py), timed over --checks calls; target: it adds < 50 us to a page, so its
  whole cost is shown against that bound;
- a console page through the app (the account page, Litestar's TestClient) for scale.

    python -m bench.people [--sign-ins 10] [--checks 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from statistics import median

from appliance import passwords
from appliance.domain import permissions
from appliance.services import console, users
from appliance.storage import Principal

RESULTS = Path(__file__).resolve().parent / "results"
EMAIL, PASSWORD = "bench.person@example.com", "a bench passphrase of some length"


def person(runtime, tenant_id: str, role: str = "owner") -> None:
    """The bench's person with its password, made once (services, as the CLI makes one)."""
    if runtime.store.reader().users.by_email(tenant_id, EMAIL) is not None:
        return
    made = asyncio.run(users.create(runtime, tenant_id, "cli", None, users.NewUser(email=EMAIL, role=role)))
    asyncio.run(users.choose_password(runtime, made.setup_url.rsplit("/", 1)[1], PASSWORD, PASSWORD))


def sign_in_page(client) -> None:
    """Signs a TestClient in as the bench's person."""
    import re

    token = re.search(r'name="csrf" value="([^"]+)"', client.get("/admin/sign-in").text).group(1)
    signed = client.post("/admin/sign-in", data={"csrf": token, "email": EMAIL, "password": PASSWORD},
                         follow_redirects=False)
    assert signed.status_code == 303, signed.text


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.people", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sign-ins", type=int, default=10)
    parser.add_argument("--checks", type=int, default=20_000)
    parser.add_argument("--out", type=Path, default=RESULTS / "people.json")
    args = parser.parse_args()
    from litestar.testing import TestClient

    from appliance.app import create_app
    from bench.volume import setup

    runtime, tenant_id, _ = setup(Path(tempfile.mkdtemp(prefix="appliance-people-")))
    person(runtime, tenant_id)

    stored = runtime.store.reader().users.by_email(tenant_id, EMAIL).password_hash
    cpu = time.process_time()
    for _ in range(args.sign_ins):
        assert passwords.matches(stored, PASSWORD)
    check_ms = (time.process_time() - cpu) / args.sign_ins * 1000

    sessions = []
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(args.sign_ins):
        outcome = asyncio.run(console.sign_in(runtime, EMAIL, PASSWORD, "127.0.0.1"))
        assert outcome.session is not None
        sessions.append(outcome.session.token)
    sign_in_cpu_ms = (time.process_time() - cpu) / args.sign_ins * 1000
    sign_in_wall_ms = (time.perf_counter() - wall) / args.sign_ins * 1000

    token = sessions[-1]
    needed = permissions.needed_for("console:read")
    started = time.perf_counter()
    for _ in range(args.checks):
        found = console.find_session(runtime, token)
        assert permissions.allows(found.role, needed)
    guard_us = (time.perf_counter() - started) / args.checks * 1e6
    Principal(found.user_id, found.tenant_id, "user", None, found.config_rev, found.role)

    with TestClient(create_app(runtime, background=False)) as client:
        sign_in_page(client)
        times = []
        for _ in range(200):
            began = time.perf_counter()
            assert client.get("/admin/account").status_code == 200
            times.append((time.perf_counter() - began) * 1000)
    page_ms = median(times)
    runtime.close()

    result = {"argon2id": {"time_cost": passwords.TIME_COST, "memory_kib": passwords.MEMORY_KIB,
                           "parallelism": passwords.PARALLELISM},
              "password_check_cpu_ms": round(check_ms, 1), "sign_in_cpu_ms": round(sign_in_cpu_ms, 1),
              "sign_in_wall_ms": round(sign_in_wall_ms, 1), "session_and_role_check_us": round(guard_us, 1),
              "account_page_median_ms": round(page_ms, 2),
              "targets": {"sign_in_cpu_under_300_ms": sign_in_cpu_ms < 300, "check_under_50_us": guard_us < 50}}
    print(json.dumps(result, indent=2))
    RESULTS.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
