"""The shipped examples and documentation stay true to the code: examples/bundle.toml imports
through the real CLI and its export re-imports, so do the two auction examples (their campaigns
selling at auction), a lead posted to one of its campaigns is taken,
docs/api.md names every route the app serves, docs/bundle.md every bundle key, and nothing the
repository ships points outside it."""

from __future__ import annotations

import csv
import json
import tomllib
import time
import typing
from pathlib import Path

import msgspec
import pytest
from litestar.routes import HTTPRoute

from appliance.services import tenancy
from appliance.services.bundle import TenantBundle
from appliance.domain.campaign import Campaign
from appliance.domain.endpoint import DeliveryEndpoint
from appliance.domain.submission import SubmitLead

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / "examples" / "bundle.toml"
LEADS = ROOT / "examples" / "leads.csv"
API_DOC = ROOT / "docs" / "api.md"
BUNDLE_DOC = ROOT / "docs" / "bundle.md"
SUBMIT = "/api/v1/leads/submit"
# The auction examples: file -> (its campaign, its auction mode, its pinged buyers, its fixed bids).
AUCTION_EXAMPLES = {
    "auction-exclusive.toml": ("AUCX", "exclusive", {"buyer-a"}, {"buyer-b": 18.5}),
    "auction-shared.toml": ("AUCS", "shared", {"buyer-c", "buyer-d"}, {"buyer-e": 9}),
}
SOURCE_API_KEY = "replace-me-with-a-long-random-web-form-source-key"  # the example's web-form apiKey


# ---- (a) the example bundle imports through the CLI, and so does its export ------------------

def test_example_bundle_imports_and_its_export_reimports(cli, tmp_path):
    cli("init")
    tenant_id = cli.json("tenant", "create", "Example Agency")["tenantId"]
    out = cli("import", "--tenant", tenant_id, str(BUNDLE)).stdout
    assert "3 campaigns" in out and "2 deliveryEndpoints" in out and "2 pixels" in out and "1 sms" in out

    for name in ("export.toml", "export.json"):
        exported = tmp_path / name
        cli("export", "--tenant", tenant_id, str(exported))
        cli("import", "--tenant", tenant_id, str(exported))

    again = json.loads(cli("export", "--tenant", tenant_id).stdout)
    assert [c["campaignId"] for c in again["campaigns"]] == ["AUTB", "AUTO1", "AUTTX"]
    assert {e["deliveryEndpointId"] for e in again["deliveryEndpoints"]} == {"smith-law-api", "intake-hub-form"}
    text = json.dumps(again)
    assert "replace-me" not in text  # every placeholder secret was sealed, none exported
    form = next(e for e in again["deliveryEndpoints"] if e["deliveryEndpointId"] == "intake-hub-form")
    assert form["headers"] == {"X-Vendor-Ref": "***"}


def test_example_bundle_uses_every_section_and_only_example_hosts():
    data = tomllib.loads(BUNDLE.read_text())
    assert set(data) == {f.encode_name for f in msgspec.structs.fields(TenantBundle)}
    urls = [e["url"] for e in data["deliveryEndpoints"]] + [p["baseUrl"] for p in data["sms"]["providers"]
                                                             if "baseUrl" in p]
    assert urls and all(".example.com" in url.split("/")[2] for url in urls)


def test_the_auction_examples_import_into_a_tenant_and_sell_at_auction(cli, tmp_path):
    tenant_id = cli.json("tenant", "create", "Auction Agency")["tenantId"]
    for name, (_, _, pinged, fixed) in AUCTION_EXAMPLES.items():
        out = cli("import", "--tenant", tenant_id, str(ROOT / "examples" / name)).stdout
        assert "1 campaigns" in out and f"{len(pinged | set(fixed))} deliveryEndpoints" in out, (name, out)

    exported = tmp_path / "export.json"
    cli("export", "--tenant", tenant_id, str(exported))
    cli("import", "--tenant", tenant_id, str(exported))  # the sealed credentials (***) are kept
    again = json.loads(exported.read_text())
    assert "replace-me" not in json.dumps(again)  # every placeholder secret was sealed, none exported
    campaigns = {c["campaignId"]: c for c in again["campaigns"]}
    endpoints = {e["deliveryEndpointId"]: e for e in again["deliveryEndpoints"]}
    for name, (code, mode, pinged, fixed) in AUCTION_EXAMPLES.items():
        distribution = campaigns[code]["delivery"]["distribution"]
        assert distribution["method"] == "auction" and distribution["auction"]["mode"] == mode, name
        items = {e["deliveryEndpointId"]: e for e in distribution["endpoints"]}
        assert set(items) == pinged | set(fixed), name
        assert {e for e in items if endpoints[e].get("ping")} == pinged, name
        assert {e: items[e]["bid"] for e in fixed} == fixed, name


@pytest.mark.parametrize("name", sorted(AUCTION_EXAMPLES))
def test_the_auction_examples_use_only_example_hosts(name):
    data = tomllib.loads((ROOT / "examples" / name).read_text())
    urls = [e["url"] for e in data["deliveryEndpoints"]] + [e["ping"]["url"] for e in data["deliveryEndpoints"]
                                                            if "ping" in e]
    assert len(urls) > len(data["deliveryEndpoints"])
    assert all(url.split("/")[2].endswith(".example.com") for url in urls), urls


# ---- (b) a lead posted to an example campaign is accepted -------------------------------------

def _person(**extra) -> dict:
    return {
        "campaignId": "AUTO1", "firstName": "maria", "lastName": "garcia-lopez",
        "email": "maria.garcia@example.com", "phone": "(415) 555-0142",
        "address": {"street": "1200 Valencia St", "city": "San Francisco", "state": "CA", "zip": "94110"},
        "dateOfBirth": "1988-04-12",
        "questionnaire": {"injured": "yes", "monthsSinceAccident": 3, "hasAttorney": "no"},
        "compliance": {"tcpaConsent": True, "consentTimestamp": "2026-11-21T09:30:00Z",
                       "trustedFormCertUrl": "https://trustedform.example.com/certs/0123abcd"},
        **extra,
    }


def test_a_lead_submitted_to_an_example_campaign_is_accepted(client, runtime):
    tenant_id = tenancy.create_tenant(runtime, "Example Agency")
    tenancy.import_bundle(runtime, tenant_id, BUNDLE.read_bytes(), "toml")
    key = tenancy.create_key(runtime, tenant_id, name="docs").key

    answer = client.post(SUBMIT, json=_person(), headers={"X-API-Key": key})
    assert answer.status_code == 201, answer.text
    data = answer.json()["data"]
    assert data["status"] == "qualified" and data["leadId"].startswith("lead_")

    # a Texas lead is routed to the reviewed campaign and waits for a person
    texan = _person(email="james.oneil@example.net", phone="512-555-0147",
                    address={"city": "Austin", "state": "TX", "zip": "78751"})
    answer = client.post(SUBMIT, json=texan, headers={"X-API-Key": key})
    assert answer.status_code == 201, answer.text
    assert answer.json()["data"]["status"] == "pending_action"
    lead = client.get(f"/api/v1/leads/{answer.json()['data']['leadId']}", headers={"X-API-Key": key}).json()["data"]
    assert lead["campaignId"] == "AUTTX" and lead["approval"]["status"] == "pending"

    # the web-form source's imported apiKey works as a source key
    answer = client.post(SUBMIT, json=_person(email="aisha.rahman@example.org", phone="+1 305 555 0142"),
                         headers={"X-API-Key": SOURCE_API_KEY})
    assert answer.status_code == 201, answer.text


def test_example_csv_columns_are_submit_fields():
    with LEADS.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 5
    wire = {f.encode_name: f for f in msgspec.structs.fields(SubmitLead)}
    for column in rows[0]:
        head = column.split(".", 1)[0]
        assert head in wire and head not in ("campaignId", "leadId"), column


# ---- (c) docs/api.md names every route the app serves -----------------------------------------

def served_routes(app) -> list[tuple[str, str]]:
    """(method, path) of every documented route and every public one (the schema router's own
    pages aside: only its OpenAPI document is part of the interface)."""
    found = set()
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        for handler in route.route_handlers:
            if not (handler.opt.get("public") or handler.resolve_include_in_schema()):
                continue
            # The admin console's pages are documented in docs/console.md, not in the API's.
            if route.path_format.startswith(("/schema", "/admin")):
                continue
            found.update((method, route.path_format) for method in handler.http_methods)
    return sorted(found)


def test_api_doc_mentions_every_endpoint(client):
    text = API_DOC.read_text()
    routes = served_routes(client.app)
    assert len(routes) >= 19
    missing = [f"{method} {path}" for method, path in routes if f"{method} {path}" not in text]
    assert not missing, missing
    assert "GET /schema/openapi.json" in text
    assert client.get("/schema/openapi.json").status_code == 200


def test_api_doc_lists_every_error_code():
    from appliance.errors import ERRORS_BY_STATUS

    text = API_DOC.read_text()
    for kind in ERRORS_BY_STATUS.values():
        assert f"| `{kind.code}` | {kind.status} |" in text, kind.code
    assert "| `INTERNAL_ERROR` | 500 |" in text


# ---- (d) docs/bundle.md names every section and every key --------------------------------------

def _structs_in(annotation) -> list[type[msgspec.Struct]]:
    found = []
    for arg in typing.get_args(annotation):
        found += _structs_in(arg)
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        found.append(annotation)
    return found


def wire_names(root: type[msgspec.Struct], *, nested: bool) -> set[tuple[str, str]]:
    """(struct, camelCase key) of `root`'s fields and, with `nested`, of every struct inside it."""
    names, todo, seen = set(), [root], set()
    while todo:
        kind = todo.pop()
        if kind in seen:
            continue
        seen.add(kind)
        for field in msgspec.structs.fields(kind):
            names.add((kind.__name__, field.encode_name))
            if nested:
                todo += _structs_in(field.type)
    return names


@pytest.mark.parametrize("root, nested", [(TenantBundle, False), (Campaign, False), (DeliveryEndpoint, False),
                                          (TenantBundle, True)])
def test_bundle_doc_mentions_every_key(root, nested):
    text = BUNDLE_DOC.read_text()
    missing = sorted(f"{owner}.{name}" for owner, name in wire_names(root, nested=nested) if f"`{name}`" not in text)
    assert not missing, missing


# ---- (e) nothing shipped points outside the repository ----------------------------------------

SHIPPED = [ROOT / "README.md", ROOT / "docs", ROOT / "examples", ROOT / "plugins"]


def _files(place: Path) -> list[Path]:
    if place.is_file():
        return [place]
    return sorted(p for p in place.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


@pytest.mark.parametrize("place", SHIPPED, ids=lambda p: p.name)
def test_nothing_points_outside_the_repository(place):
    assert place.exists(), place
    offending = [f"{path.relative_to(ROOT)}:{number}"
                 for path in _files(place)
                 for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
                 if "../shared" in line or "shared/" in line]
    assert not offending, offending


def test_the_served_api_description_points_nowhere_outside(client):
    text = client.get("/schema/openapi.json").text
    assert "../" not in text and "shared/" not in text and "CONTRACT" not in text and "DESIGN.md" not in text


# ---- (f) the example CSV through the example bundle's own campaign ----------------------------

def test_the_example_csv_meets_the_example_campaigns_rules(client, runtime):
    tenant_id = tenancy.create_tenant(runtime, "Example Agency")
    tenancy.import_bundle(runtime, tenant_id, BUNDLE.read_bytes(), "toml")
    headers = {"X-API-Key": tenancy.create_key(runtime, tenant_id, name="docs").key}
    answer = client.post("/api/v1/leads/import", headers=headers, data={"campaignId": "AUTO1"},
                         files={"file": ("leads.csv", LEADS.read_bytes(), "text/csv")})
    assert answer.status_code == 202, answer.text
    import_id = answer.json()["data"]["importId"]
    deadline = time.monotonic() + 20
    while (state := client.get(f"/api/v1/imports/{import_id}", headers=headers).json()["data"])["state"] == "running":
        assert time.monotonic() < deadline, state
        time.sleep(0.05)
    assert (state["state"], state["created"], state["failed"], state["errors"]) == ("done", 5, 0, []), state

    leads = client.get("/api/v1/leads?limit=100", headers=headers).json()["data"]["leads"]
    outcome = {lead["email"]: (lead["campaignId"], lead["status"]) for lead in leads}
    assert outcome["maria.garcia@example.com"] == ("AUTO1", "qualified")
    assert outcome["james.oneil@example.net"] == ("AUTTX", "pending_action")  # Texas, routed on and held for review
    assert outcome["aisha.rahman@example.org"] == ("AUTO1", "qualified")
    assert outcome["dan.kowalski@example.com"] == ("AUTB", "qualified")  # not injured: AUTO1's fallback takes him
    assert outcome["qa+grace@example.com"] == ("AUTO1", "disqualified")  # already represented
    assert next(lead["isTest"] for lead in leads if lead["email"] == "qa+grace@example.com") is True
