"""GET /metrics: Prometheus text (parsed with prometheus-client's own parser) with submits by
status, deliveries by outcome and endpoint, queue depth and request latency histograms; an
optional bearer token; `[metrics] enabled = false` is a 404 in the envelope."""

from __future__ import annotations

import httpx
from litestar.testing import TestClient

from appliance.app import create_app
from appliance.config import load_config
from appliance.runtime import create_runtime

from tests.api_helpers import samples
from tests.bundles import campaign, standard_bundle
from tests.buyer_server import BuyerServer, wait_until
from tests.conftest import make_tenant
from tests.servers import live_server, person, write_config


def test_metrics_count_submits_deliveries_queue_and_latency(tmp_path, backend_toml):
    runtime = create_runtime(load_config(write_config(tmp_path, extra='\n[delivery]\nallow_private_addresses = true\n'
                                                                     '\n[metrics]\ntoken = "scrape-token-1234"\n', backend=backend_toml)))
    try:
        with BuyerServer() as buyer:
            buyer.route("/in", status=200, body={"id": "B-1"})
            bundle = standard_bundle()
            bundle["deliveryEndpoints"].append({"deliveryEndpointId": "local", "url": buyer.url("/in")})
            bundle["campaigns"].append(campaign("LOC", "Local", delivery={"deliveryEndpointId": "local"}))
            tenant = make_tenant(runtime, "Metered", bundle)
            with live_server(runtime) as base, httpx.Client(base_url=base, headers=tenant.headers) as http:
                for n in range(3):
                    assert http.post("/api/v1/leads/submit", json={"campaignId": "LOC", **person(n)}).status_code == 201
                duplicate = http.post("/api/v1/leads/submit", json={"campaignId": "LOC", **person(0)})
                assert duplicate.json()["data"]["status"] == "duplicate"
                assert wait_until(lambda: len(buyer.requests) == 3, timeout=10)
                assert httpx.get(f"{base}/metrics").status_code == 401
                wrong = httpx.get(f"{base}/metrics", headers={"Authorization": "Bearer nope"})
                assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "UNAUTHORIZED"
                assert wrong.headers["www-authenticate"] == 'Bearer realm="appliance"'  # a token, not X-API-Key
                scrape = {"Authorization": "Bearer scrape-token-1234"}

                def scraped() -> dict:
                    answer = httpx.get(f"{base}/metrics", headers=scrape)
                    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
                    return samples(answer.text)

                # The buyer has the third lead before the worker has recorded (and counted) its delivery.
                delivered = ("appliance_deliveries_total", (("endpoint", "local"), ("outcome", "success")))
                assert wait_until(lambda: scraped().get(delivered) == 3, timeout=10)
                found = scraped()
    finally:
        runtime.close()
    assert found[("appliance_submits_total", (("status", "qualified"),))] == 3
    assert found[("appliance_submits_total", (("status", "duplicate"),))] == 1
    assert found[delivered] == 3
    assert found[("appliance_request_duration_seconds_bucket", (
        ("le", "+Inf"), ("method", "POST"), ("route", "/api/v1/leads/submit")))] == 4
    assert not [k for k in found if k[0] == "appliance_queue_depth"]  # nothing waits now


def test_queue_depth_shows_waiting_jobs_and_disabled_metrics_are_a_404(client, tenant, tmp_path, module_backend_toml):
    for n in range(2):  # no background loops here: the delivery jobs stay queued
        assert client.post("/api/v1/leads/submit", json={"campaignId": "AC01", **person(n)},
                           headers=tenant.headers).status_code == 201
    found = samples(client.get("/metrics").text)
    assert found[("appliance_queue_depth", (("kind", "deliver"), ("state", "ready")))] == 2
    (tmp_path / "off").mkdir()
    off = create_runtime(load_config(write_config(tmp_path / "off", extra="\n[metrics]\nenabled = false\n", backend=module_backend_toml())))
    try:
        with TestClient(create_app(off, background=False)) as off_client:
            answer = off_client.get("/metrics")
            assert answer.status_code == 404 and answer.json()["error"]["code"] == "NOT_FOUND"
    finally:
        off.close()
