"""Concurrent submits against a real server (uvicorn on a free local port): dedupe yields exactly
one original and a source cap is never overrun (intake.py decides both inside the write
transaction, where concurrent submits are serialized)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from tests.servers import live_server
from tests.submit_support import (
    lead_count,
    person,
    plain,
    setup_tenant,
    source_key,
)
from tests.engine import engine

TIMEOUT = httpx.Timeout(20.0, connect=5.0)


@pytest.fixture
def server(runtime) -> Iterator[str]:
    with live_server(runtime, background=False) as base_url:
        yield base_url


def burst(base_url: str, key: str, bodies: list[dict]) -> list[httpx.Response]:
    async def main() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=len(bodies))
        async with httpx.AsyncClient(base_url=base_url, timeout=TIMEOUT, limits=limits) as client:
            return await asyncio.wait_for(asyncio.gather(*(
                client.post("/api/v1/leads/submit", json=body, headers={"X-API-Key": key}) for body in bodies
            )), timeout=60)

    return asyncio.run(main())


def test_fifty_identical_submits_yield_exactly_one_original(runtime, server):
    tenant = setup_tenant(runtime, plain("SC1", qualification={"dedupeOverride": {
        "enabled": True, "window": 30, "matchFields": {"email": True, "phone": False, "matchLogic": "OR"}}}))
    same = person()
    bodies = [{**person(), "email": same["email"]} for _ in range(50)]
    responses = burst(server, tenant.key, bodies)
    assert [r.status_code for r in responses] == [201] * 50, {r.status_code for r in responses}
    statuses = Counter(r.json()["data"]["status"] for r in responses)
    assert statuses == {"qualified": 1, "duplicate": 49}
    assert len({r.json()["data"]["leadId"] for r in responses}) == 50
    assert lead_count(runtime) == 50
    conn = engine(runtime.store).reader()
    assert conn.execute("SELECT count(*) FROM leads WHERE status != 'duplicate'").fetchone()[0] == 1
    assert conn.execute("SELECT count(*) FROM jobs WHERE kind = 'deliver'").fetchone()[0] == 1


def test_forty_submits_against_a_daily_cap_of_ten(runtime, server):
    tenant = setup_tenant(runtime, plain("SC1", ingestion={"sources": [
        {"sourceId": "web", "caps": [{"cap": 10, "type": "daily"}]}]}))
    key = source_key(runtime, tenant, "web")
    responses = burst(server, key, [person() for _ in range(40)])
    assert [r.status_code for r in responses] == [201] * 40, {r.status_code for r in responses}
    statuses = Counter(r.json()["data"]["status"] for r in responses)
    assert statuses == {"qualified": 10, "disqualified": 30}
    assert lead_count(runtime) == 40
    conn = engine(runtime.store).reader()
    assert conn.execute("SELECT count(*) FROM jobs WHERE kind = 'deliver'").fetchone()[0] == 10
