"""Every credential of a delivery endpoint lives in the sealed secret store: auth secrets, header
values that are credentials (by name, or marked in `secretHeaders`), user info and
credential-looking query parameters of the URL. The stored endpoint and its export keep `***`
where each one was; importing the export back keeps the stored credentials; deliveries send the
real values. URLs that can never be sent are refused at import."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from appliance.cli import main as cli_main
from appliance.config import load_config
from appliance.runtime import create_runtime
from tests.bundles import campaign
from tests.buyer_server import BuyerServer, wait_until
from tests.engine import stored_bytes
from tests.servers import live_server, person, write_config

USER, PASSWORD, API_KEY, TOKEN, MARKED, SIGNED = "bob", "pw-9Hk2", "key-3Jd8", "tok-5Lq1", "marked-2Pz7", "sig-4Vc6"
SECRETS = (PASSWORD, API_KEY, TOKEN, MARKED, SIGNED)


class Cli:
    def __init__(self, config: Path) -> None:
        self.config = config

    def __call__(self, *args: str, expect: int = 0):
        result = CliRunner().invoke(cli_main, ["--config", str(self.config), *args], catch_exceptions=False)
        assert result.exit_code == expect, (result.exit_code, result.output)
        return result


def endpoint(url: str, **extra) -> dict:
    return {"deliveryEndpointId": "ep", "url": url, "retry": {"maxAttempts": 1},
            "headers": {"X-Buyer-Token": TOKEN, "X-Marked": MARKED, "X-Plain": "plain"},
            "secretHeaders": ["X-Marked"], "auth": {"type": "header", "headerName": "X-Signature", "token": SIGNED},
            **extra}


@pytest.fixture
def buyer():
    with BuyerServer() as server:
        server.route("/in", status=200, body={"id": "B-1"})
        yield server


@pytest.fixture
def setup(tmp_path: Path, buyer: BuyerServer, backend_toml: str):
    cli = Cli(write_config(tmp_path, extra="\n[delivery]\nallow_private_addresses = true\n", backend=backend_toml))
    cli("init")
    tenant_id = json.loads(cli("tenant", "create", "Creds", "--json").stdout)["tenantId"]
    url = buyer.url("/in").replace("http://", f"http://{USER}:{PASSWORD}@") + f"?list=7&api_key={API_KEY}"
    bundle = {"deliveryEndpoints": [endpoint(url)],
              "campaigns": [campaign("CRD", "Creds", delivery={"deliveryEndpointId": "ep"})]}
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(bundle))
    cli("import", "--tenant", tenant_id, str(path))
    return cli, tenant_id, tmp_path


def database_text(cli: Cli) -> str:
    return stored_bytes(load_config(cli.config)).decode("latin-1")


def deliver_one(cli: Cli, tenant_id: str, buyer: BuyerServer, n: int):
    runtime = create_runtime(load_config(cli.config))
    try:
        from appliance.services import tenancy
        key = tenancy.create_key(runtime, tenant_id, name="t").key
        with live_server(runtime) as base, httpx.Client(base_url=base, headers={"X-API-Key": key}) as http:
            lead_id = http.post("/api/v1/leads/submit", json={"campaignId": "CRD", **person(n)}).json()["data"]["leadId"]
            assert wait_until(lambda: http.get(f"/api/v1/leads/{lead_id}").json()["data"]["status"] == "delivered",
                              timeout=10)
            return http.get(f"/api/v1/leads/{lead_id}").text
    finally:
        runtime.close()


def test_credentials_are_sealed_exported_as_placeholders_and_sent_for_real(setup, buyer):
    cli, tenant_id, tmp_path = setup
    stored = database_text(cli)
    assert not [s for s in SECRETS if s in stored]
    exported = cli("export", "--tenant", tenant_id).stdout
    assert not [s for s in SECRETS if s in exported]
    (shown,) = json.loads(exported)["deliveryEndpoints"]
    assert shown["url"].startswith("http://***@127.0.0.1:") and shown["url"].endswith("/in?list=7&api_key=***")
    assert shown["headers"] == {"X-Buyer-Token": "***", "X-Marked": "***", "X-Plain": "plain"}
    assert shown["auth"] == {"type": "header", "headerName": "X-Signature", "username": None, "password": None,
                             "token": None}

    # the export imports back and keeps the stored credentials
    (tmp_path / "export.json").write_text(exported)
    cli("import", "--tenant", tenant_id, str(tmp_path / "export.json"))
    record = deliver_one(cli, tenant_id, buyer, 1)
    (received,) = buyer.requests_to("/in")
    assert received.headers["x-buyer-token"] == TOKEN and received.headers["x-marked"] == MARKED
    assert received.headers["x-signature"] == SIGNED and received.headers["x-plain"] == "plain"
    assert received.params() == {"list": "7", "api_key": API_KEY}
    assert received.headers["authorization"].startswith("Basic ")
    assert not [s for s in SECRETS if s in record]


def test_a_new_value_replaces_the_stored_credential(setup, buyer):
    cli, tenant_id, tmp_path = setup
    shown = json.loads(cli("export", "--tenant", tenant_id).stdout)
    shown["deliveryEndpoints"][0]["headers"]["X-Buyer-Token"] = "tok-new-8Ww3"
    (tmp_path / "changed.json").write_text(json.dumps(shown))
    cli("import", "--tenant", tenant_id, str(tmp_path / "changed.json"))
    assert "tok-new-8Ww3" not in database_text(cli)
    deliver_one(cli, tenant_id, buyer, 2)
    (received,) = buyer.requests_to("/in")
    assert received.headers["x-buyer-token"] == "tok-new-8Ww3" and received.headers["x-marked"] == MARKED


def test_a_placeholder_with_nothing_stored_is_refused_and_changes_nothing(setup):
    cli, tenant_id, tmp_path = setup
    before = cli("export", "--tenant", tenant_id).stdout
    bundle = {"deliveryEndpoints": [
        {"deliveryEndpointId": "ep2", "url": "https://***@buyer.example.com/in?token=***",
         "headers": {"X-Api-Key": "***"}}]}
    (tmp_path / "placeholders.json").write_text(json.dumps(bundle))
    problems = cli("import", "--tenant", tenant_id, str(tmp_path / "placeholders.json"), expect=1).stderr
    for field in ("headers.x-api-key", "url.userinfo", "url.query.token"):
        assert f"deliveryEndpoints[0].{field}: is ***, which keeps a stored credential" in problems, problems
    assert cli("export", "--tenant", tenant_id).stdout == before


@pytest.mark.parametrize(("url", "reason"), [
    ("http://0177.0.0.1/in", "not a valid URL"),
    ("http://\uff11\uff12\uff17.0.0.1/in", "not a valid URL"),
    ("http://exa mple.com/in", "the host is not a valid name or address"),
])
def test_urls_that_can_never_be_sent_are_refused_at_import(setup, url, reason):
    cli, tenant_id, tmp_path = setup
    bundle = {"deliveryEndpoints": [{"deliveryEndpointId": "bad", "url": url}]}
    (tmp_path / "bad.json").write_text(json.dumps(bundle))
    problems = cli("import", "--tenant", tenant_id, str(tmp_path / "bad.json"), expect=1).stderr
    assert f"deliveryEndpoints[0].url: can never be sent ({reason})" in problems
    assert "bad" not in [e["deliveryEndpointId"] for e in
                         json.loads(cli("export", "--tenant", tenant_id).stdout)["deliveryEndpoints"]]


def test_credentials_an_earlier_version_stored_in_clear_are_sealed_at_the_next_open(setup, buyer):
    cli, tenant_id, tmp_path = setup
    from appliance.domain.endpoint import DeliveryEndpoint
    from appliance.storage import DELIVERY_ENDPOINTS

    runtime = create_runtime(load_config(cli.config))
    try:  # as an earlier version stored it: the header value in the document itself
        old = DeliveryEndpoint(delivery_endpoint_id="ep", url=buyer.url("/in"),
                               headers={"X-Buyer-Token": "tok-old-6Yu8"})
        runtime.store.write_sync(lambda tx: tx.catalog.upsert_doc(DELIVERY_ENDPOINTS, tenant_id, "ep", old, None))
    finally:
        runtime.close()
    (shown,) = json.loads(cli("export", "--tenant", tenant_id).stdout)["deliveryEndpoints"]
    assert shown["headers"] == {"X-Buyer-Token": "***"}
    deliver_one(cli, tenant_id, buyer, 3)
    (received,) = buyer.requests_to("/in")
    assert received.headers["x-buyer-token"] == "tok-old-6Yu8"


def test_a_placeholder_for_an_auth_secret_keeps_the_stored_one(setup, buyer):
    cli, tenant_id, tmp_path = setup
    shown = json.loads(cli("export", "--tenant", tenant_id).stdout)
    shown["deliveryEndpoints"][0]["auth"]["token"] = "***"
    (tmp_path / "sealed-auth.json").write_text(json.dumps(shown))
    cli("import", "--tenant", tenant_id, str(tmp_path / "sealed-auth.json"))
    deliver_one(cli, tenant_id, buyer, 4)
    (received,) = buyer.requests_to("/in")
    assert received.headers["x-signature"] == SIGNED
