"""Schemathesis against the live server's own /schema/openapi.json, with a real tenant key.

A real server (uvicorn, background loops on) serves a tenant with the standard bundle, a
campaign that holds leads for human review, a few submitted leads, and an empty second tenant.
The schemathesis CLI then runs every phase (examples, coverage, fuzzing, stateful) over every
operation in the document, so routes added later are covered without touching this file, with
all built-in checks: no server errors, status codes, content types, response bodies and headers
conform to the schema, negative (schema-violating) data rejected, schema-valid data accepted,
missing auth rejected, undeclared methods answered 405 with `Allow`, and the rest of
`schemathesis run --help`'s list. Generation is reproducible (fixed seed, no example database)
and bounded (SCHEMATHESIS_MAX_EXAMPLES per operation, default 25), so the run takes well under
a minute on two cores; set SCHEMATHESIS_MAX_EXAMPLES higher and SCHEMATHESIS_SEED to another
number to fuzz longer locally (SCHEMATHESIS_LOG=FILE keeps the report).

Identifiers: schemathesis cannot guess tenant ids, so dictionaries bind path `leadId` and
`submissionId`, body `campaignId` and `leadIds[*]` to real values part of the time, and the
`before_call` hook below (loaded by the CLI through SCHEMATHESIS_HOOKS) replaces a leads
`cursor` that is not a lead of the tenant and orders startDate/endDate (the API answers 400 for
both, by design, and JSON Schema cannot say either) in every phase. SMS and pixel calls go to
a local fake Twilio / Meta (install-wide base_url), so sms/send can succeed instead of
answering 502 for an unreachable provider.

Deliberately excluded, and why:
- `positive_data_acceptance` for operations whose bodies are checked beyond what JSON Schema
  can say: submitLead, pingLead, repostLead, deliverLead (the campaign must exist and be active; email,
  phone for the country, time zone, dateOfBirth as a real date, attribution/compliance member
  types, field library rules, source caps), bulkUpdateLeads (time zone, field library rules),
  and every operation under /api/v1/sms, /api/v1/pixels and /api/v1/files (sender formats,
  the pixel's platform must match `platform`, document URLs must be absolute http(s)), and
  createWebhook, updateWebhook (the receiver URL must be https with a public host, the secret
  `whsec_` and base64 of 24+ bytes), redeliverLeads (campaigns and endpoints must exist, dates
  parse), changeSuppressionEntries (each value must be an email or a phone number, and at
  least one of add and remove given), updateLead (email, phone for the country, time zone,
  dateOfBirth as a real date, field library rules, as bulk update and submit), importLeads (the
  file must be UTF-8 CSV whose header names submit fields, the campaign must exist), createUser
  and updateUser (a real email address unique in the tenant, `clientId` only and always with
  `buyer`, `supplierId` with `supplier`, no staff role turned into a party's), createClient and
  updateClient (a clientId not in use; a `creditLimit` only on a `credit` client),
  createReturnRequest (the lead must be delivered and within its client's policy; `reason` must
  hold a character Python counts as not white space, where JSON Schema's "not white space"
  class is ECMAScript's),
  updateSubmission (its free-form members, e.g. firstSubmissionActions, may hold any JSON but
  never a NUL character, which a free-form schema cannot say). Every other
  check still runs on them, negative data included.
- `object_level_authorization` needs a second principal inside schemathesis; cross-tenant access
  is covered route by route in tests/test_security.py instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from appliance.config import load_config
from appliance.runtime import create_runtime
from tests.bundles import campaign, standard_bundle
from tests.buyer_server import BuyerServer
from tests.conftest import make_tenant
from tests.servers import live_server, person, write_config
from tests.engine import engine

MAX_EXAMPLES = int(os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "25"))
TIME_LIMIT = 240  # seconds; the run takes far less, this only bounds a hang

# Bodies of these operations refer to tenant data or have rules beyond JSON Schema (see above).
SEMANTIC_BODIES = ("submitLead", "pingLead", "repostLead", "deliverLead", "bulkUpdateLeads", "createWebhook", "updateWebhook",
                   "redeliverLeads", "changeSuppressionEntries", "updateLead", "importLeads", "createUser", "updateUser",
                   "createClient", "updateClient", "createReturnRequest", "updateSubmission")
SEMANTIC_PATH_REGEX = "^/api/v1/(sms|pixels|files)(/|$)"


KNOWN_LEADS_ENV = "APPLIANCE_SCHEMATHESIS_LEADS"

if os.environ.get(KNOWN_LEADS_ENV):  # inside the schemathesis CLI (SCHEMATHESIS_HOOKS=this module)
    import schemathesis

    _KNOWN_LEADS = os.environ[KNOWN_LEADS_ENV].split(",")

    from appliance.services.lead_updates import parse_iso

    @schemathesis.hook
    def before_call(context, case, kwargs):
        """GET /api/v1/leads refuses, by design, a cursor that is not a lead of the tenant and an
        endDate before startDate (400): neither is expressible in JSON Schema, so a string cursor
        is replaced by a real lead id and the two dates are put in order. Values of other types
        stay as generated (negative cases)."""
        query = case.query or {}
        cursor = query.get("cursor")
        if isinstance(cursor, str) and cursor and cursor not in _KNOWN_LEADS:
            query["cursor"] = _KNOWN_LEADS[len(cursor) % len(_KNOWN_LEADS)]
        start, end = query.get("startDate"), query.get("endDate")
        if isinstance(start, str) and isinstance(end, str):
            start_at, end_at = parse_iso(start), parse_iso(end)
            if start_at and end_at and end_at[0] < start_at[0]:
                query["startDate"], query["endDate"] = end, start
            if case.operation.path == "/api/v1/reports/summary":  # dates there are days in `timezone`
                _order_report_dates(query)

    def _order_report_dates(query):
        """GET /api/v1/reports/summary reads a date as a day in `timezone`: the order of a date and
        a timestamp can differ from their order in UTC."""
        from datetime import UTC, datetime

        from appliance.domain.report import ReportQueryError, report_range

        zone = query.get("timezone") if isinstance(query.get("timezone"), str) else None
        try:
            report_range(None, query["startDate"], query["endDate"], zone, datetime.now(UTC))
        except ReportQueryError as exc:
            if exc.problems == ["endDate: must not be before startDate"]:
                query["startDate"], query["endDate"] = query["endDate"], query["startDate"]


def _toml_list(values) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def _config(base: str, key: str, leads: list[str], submissions: list[str], campaigns: list[str]) -> str:
    operations = "".join(f"""
[[operations]]
include-operation-id = "{op}"
checks.positive_data_acceptance.enabled = false
""" for op in SEMANTIC_BODIES)
    operations += f"""
[[operations]]
include-path-regex = "{SEMANTIC_PATH_REGEX}"
checks.positive_data_acceptance.enabled = false
"""
    return f"""
base-url = "{base}"
seed = {os.environ.get("SCHEMATHESIS_SEED", "20261121")}
workers = 1
request-timeout = 20
continue-on-failure = true

[headers]
X-API-Key = "{key}"

[generation]
max-examples = {MAX_EXAMPLES}
database = "none"
deterministic = false

[checks]
object_level_authorization.enabled = false

[phases.stateful]
max-steps = 12

[dictionaries.leads]
values = {_toml_list(leads)}

[dictionaries.submissions]
values = {_toml_list(submissions)}

[dictionaries.campaigns]
values = {_toml_list(campaigns)}

[dictionaries.pixels]
values = ["A-px"]

[dictionaries.fileKeys]
values = ["license"]

[parameters]
"path.leadId" = {{ dictionary = "leads", probability = 0.5 }}
"path.submissionId" = {{ dictionary = "submissions", probability = 0.5 }}
"query.cursor" = {{ dictionary = "leads", probability = 1.0 }}
"body.campaignId" = {{ dictionary = "campaigns", probability = 0.6 }}
"body.leadIds[*]" = {{ dictionary = "leads", probability = 0.5 }}
"body.leadId" = {{ dictionary = "leads", probability = 0.5 }}
"body.pixelId" = {{ dictionary = "pixels", probability = 0.5 }}
"path.fileKey" = {{ dictionary = "fileKeys", probability = 0.5 }}
{operations}"""


@pytest.fixture(scope="module")
def providers():
    with BuyerServer() as fake:
        fake.route("/2010-04-01/Accounts/AC123/Messages.json", status=201, body={"sid": "SM1", "status": "queued"})
        fake.route("/v21.0/A-px/events", status=200, body={"events_received": 1, "fbtrace_id": "x"})
        yield fake


@pytest.fixture(scope="module")
def seeded(tmp_path_factory, providers, module_backend_toml):
    tmp = tmp_path_factory.mktemp("schemathesis")
    base_url = providers.url("").rstrip("/")
    extra = f'\n[sms.twilio]\nbase_url = "{base_url}"\n\n[pixels.social]\nbase_url = "{base_url}"\n'
    runtime = create_runtime(load_config(write_config(tmp, extra=extra, backend=module_backend_toml())))
    bundle = standard_bundle()
    bundle["campaigns"].append(campaign("AC04", "Held for review",
                                        firstIntakeAction={"enabled": True, "action": "human_review"}))
    tenant = make_tenant(runtime, "Fuzzed", bundle)
    make_tenant(runtime, "Bystander", standard_bundle(prefix="B"))
    try:
        with live_server(runtime) as base:
            leads, submissions = [], []
            with httpx.Client(base_url=base, headers=tenant.headers, timeout=20) as http:
                for n, code in enumerate(["AC01", "AC01", "AC04", "AC04", "AC01"]):
                    answer = http.post("/api/v1/leads/submit", json={"campaignId": code, **person(500 + n)})
                    assert answer.status_code == 201, answer.text
                    leads.append(answer.json()["data"]["leadId"])
                for lead_id in leads:
                    detail = http.get(f"/api/v1/leads/{lead_id}").json()["data"]
                    submissions += [s["submissionId"] for s in detail["submissions"]]
                http.post("/api/v1/files", json={  # a file to read back, where files exist
                    "leadId": leads[0], "fileKey": "license", "fileName": "license.pdf",
                    "fileType": "pdf", "documentUrl": "https://files.example.com/license.pdf"})
            yield base, tenant, runtime, leads, submissions, tmp
    finally:
        runtime.close()


def test_schemathesis_finds_nothing(seeded):
    base, tenant, runtime, leads, submissions, tmp = seeded
    config = tmp / "schemathesis.toml"
    config.write_text(_config(base, tenant.key, leads, submissions, ["AC01", "AC02", "AC03", "AC04"]))
    # Checks and phases come from the config (all of them, less the exclusions above): a --checks
    # option on the command line would override the per-operation settings.
    command = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "--no-color",
               "run", f"{base}/schema/openapi.json"]
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONHASHSEED": "0", "COLUMNS": "120", "SCHEMATHESIS_HOOKS": "tests.test_schemathesis",
           KNOWN_LEADS_ENV: ",".join(leads),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(command, cwd=tmp, capture_output=True, text=True, timeout=TIME_LIMIT, env=env)
    output = result.stdout + result.stderr
    Path(os.environ.get("SCHEMATHESIS_LOG") or tmp / "schemathesis.log").write_text(output)
    assert result.returncode == 0, output[-30000:]
    assert "Operations:" in output and "failures" not in output.split("SUMMARY")[-1].lower(), output[-5000:]
    # the server stayed healthy and never logged an internal error
    assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
    assert not engine(runtime.store).reader().execute(
        "SELECT route, count(*) FROM activity_log WHERE status >= 500 GROUP BY route").fetchall()


def test_document_covers_every_route(seeded):
    """The document lists every route the app serves (schemathesis only sees what it lists)."""
    base, tenant, *_ = seeded
    doc = httpx.get(f"{base}/schema/openapi.json", timeout=5).json()
    from appliance.app import create_app  # the routes of a fresh app, whatever others add later
    from litestar.routes import HTTPRoute
    runtime = seeded[2]
    app = create_app(runtime, background=False)
    # The admin console (/admin) is HTML pages behind a session, not the API: never in the document.
    served = {(route.path_format, method.lower())
              for route in app.routes if isinstance(route, HTTPRoute) and not route.path_format.startswith("/admin")
              for handler in route.route_handlers if handler.resolve_include_in_schema()
              for method in handler.http_methods}
    documented = {(path, method) for path, ops in doc["paths"].items() for method in ops}
    assert served <= documented, served - documented
    for path, ops in doc["paths"].items():
        for method, operation in ops.items():
            assert operation.get("operationId"), (method, path)
            assert "500" in operation["responses"], (method, path)
            if operation.get("security"):
                assert "401" in operation["responses"] and "429" in operation["responses"], (method, path)
            for parameter in operation.get("parameters", ()):
                schema = parameter["schema"]
                assert {"type": "null"} not in schema.get("oneOf", []), (path, parameter)  # cannot be sent


def test_allow_header_lists_every_method_of_the_route(seeded):
    """405 answers carry Allow (RFC 9110); OPTIONS lists every handler of a path, not only the
    first one registered (Litestar's own answer would omit PATCH here)."""
    base, tenant, runtime, leads, submissions, _ = seeded
    path = f"{base}/api/v1/submissions/{submissions[0]}"
    options = httpx.options(path, headers=tenant.headers, timeout=5)
    assert options.status_code == 204
    assert set(options.headers["allow"].replace(" ", "").split(",")) == {"GET", "PATCH", "OPTIONS"}
    refused = httpx.delete(path, headers=tenant.headers, timeout=5)
    assert refused.status_code == 405 and refused.json()["error"]["code"] == "METHOD_NOT_ALLOWED"
    assert {"GET", "PATCH"} <= set(refused.headers["allow"].replace(" ", "").split(","))
