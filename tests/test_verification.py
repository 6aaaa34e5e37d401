"""Verification steps (`qualification.verifications`) through the HTTP API, the CLI import and
verifiers from a real plugin file: the built-in `phone` verifier and rules reading its results,
what `onFail` / `onUnknown` do, sampling, the per-process cache, the duplicate check before
steps that cost, a verifier that raises, answers garbage, blocks or runs past its timeout, and
the deferred (job loop) path."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import phonenumbers
import pytest
from litestar.testing import TestClient

from appliance import sdk
from appliance.adapters.phone_verifier import LINE_TYPES, appliance_verifiers
from appliance.app import create_app
from appliance.config import load_config
from appliance.plugins import Registry, load_plugins
from appliance.services import tenancy
from appliance.services.bundle import BundleError, load_bundle
from tests.bundles import campaign
from tests.conftest import Tenant, make_tenant
from tests.servers import live_server
from tests.submit_support import START, FakeClock
from tests.worker_helpers import status_is, wait_for

SUBMIT = "/api/v1/leads/submit"
TOKEN = "verifier-secret-token-0042"
US = "+14155550001"          # fixed_line_or_mobile, US
GB_MOBILE = "+447400123456"  # mobile, GB
DE_LANDLINE = "+4930901820"  # fixed_line, DE
INVALID = "+15551234567"     # possible (the normaliser takes it) but no assigned range

SCRIPTED = '''
import asyncio
import threading
import time

from appliance.sdk import VerificationResult, Verifier, hookimpl

CALLS = []  # (verifier, tag, phone, thread name)
SETTINGS = {}


def answer(name, config, lead):
    CALLS.append((name, config.get("tag"), lead.get("phoneE164"), threading.current_thread().name))
    said = config.get("answer", "pass")
    if said == "raise":
        raise RuntimeError(f"the lookup refused token {SETTINGS['token']}")
    if said == "garbage":
        return {"outcome": "pass"}
    if said == "bad_outcome":
        return VerificationResult(outcome="maybe")
    if said == "list_outcome":  # a struct is built without checks: any value can come back
        return VerificationResult(outcome=["pass"])
    if said == "not_json":
        return VerificationResult(outcome="pass", data={"when": object()})
    if said == "huge":
        return VerificationResult(outcome="pass", data={"x": "y" * 20_000})
    if said in ("deep", "nested"):  # past the encoder's recursion limit; small, but 600 levels deep
        data = {}
        for _ in range(5000 if said == "deep" else 600):
            data = {"a": data}
        return VerificationResult(outcome="pass", data=data)
    if said == "circular":
        data = {}
        data["self"] = data
        return VerificationResult(outcome="pass", data=data)
    if said == "leak":
        return VerificationResult(outcome="fail", reason=f"denied for {SETTINGS['token']}",
                                  data={"echo": SETTINGS["token"]})
    return VerificationResult(outcome=said, reason=config.get("reason"), data={"score": 7})


class Inline(Verifier):
    name = "inline"
    blocking = False

    def cache_key(self, request):
        return request.lead.get("phoneE164")

    def verify(self, request, http):
        return answer(self.name, request.config, request.lead)


class Sleepy(Verifier):  # a plain function that blocks: a worker thread runs it
    name = "sleepy"

    def verify(self, request, http):
        time.sleep(request.config.get("seconds", 0))
        return answer(self.name, request.config, request.lead)


class Waiting(Verifier):  # a coroutine: awaited on the loop
    name = "waiting"

    async def verify(self, request, http):
        await asyncio.sleep(request.config.get("seconds", 0))
        return answer(self.name, request.config, request.lead)


@hookimpl
def appliance_verifiers(settings):
    SETTINGS.update(settings)
    return [Inline(), Sleepy(), Waiting()]
'''


@pytest.fixture
def registry(config_file: Path, tmp_path: Path) -> Registry:
    (tmp_path / "plugins").mkdir(exist_ok=True)
    (tmp_path / "plugins" / "scripted.py").write_text(SCRIPTED)
    with config_file.open("a") as f:  # the [plugins] table is the file's last
        f.write(f'\n[plugins.scripted]\ntoken = "{TOKEN}"\n')
    loaded = load_plugins(load_config(config_file))
    assert loaded.errors == []
    return loaded


@pytest.fixture
def clock(runtime) -> FakeClock:
    fake = FakeClock(START)
    runtime.clock = fake
    return fake


@pytest.fixture
def api(runtime, registry: Registry, clock: FakeClock) -> Iterator[TestClient]:
    with TestClient(create_app(runtime, background=False, registry=registry),
                    raise_server_exceptions=False) as client:
        yield client


def calls(registry: Registry) -> list[tuple]:
    return registry.pm.get_plugin("scripted").CALLS


def steps(*verifications: dict, rules: list | None = None, **qualification) -> dict:
    return {"qualification": {"verifications": list(verifications), "rules": rules or [], **qualification}}


def tenant_with(runtime, *campaigns: dict) -> Tenant:
    """A tenant whose bundle went in without the import's verifier checks (a verifier may go
    away after an import: what then happens at intake is tested too)."""
    return make_tenant(runtime, "Verifying", {"campaigns": list(campaigns)})


_serial = iter(range(1, 100_000))


def person(phone: str | None = None, **extra) -> dict:
    """A new lead: its own email and, unless given, its own (valid, US) phone."""
    n = next(_serial)
    return {"firstName": "Pat", "lastName": f"Lee{n}", "email": f"pat{n}@example.com",
            "phone": phone or f"+1415555{n:04d}", **extra}


def submit(api: TestClient, tenant: Tenant, code: str, body: dict) -> dict:
    response = api.post(SUBMIT, json={"campaignId": code, **body}, headers=tenant.headers)
    assert response.status_code == 201, response.text
    return response.json()["data"]


def lead_of(api: TestClient, tenant: Tenant, lead_id: str) -> dict:
    response = api.get(f"/api/v1/leads/{lead_id}", headers=tenant.headers)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def checked(api: TestClient, tenant: Tenant, code: str, body: dict) -> tuple[dict, dict]:
    """The lead after its submit, and the `verified` event of its submission (None without one)."""
    lead = lead_of(api, tenant, submit(api, tenant, code, body)["leadId"])
    found = [e for e in lead["submissions"][-1]["journeyEvents"] if e["type"] == "verified"]
    return lead, found[0] if found else None


# ---- the built-in phone verifier, read by rules -------------------------------------------------

LANDLINES = {"name": "Landlines", "subRules": [{"conditions": [
    {"field": "verification.phone.data.lineType", "operator": "equals", "value": ["fixed_line"]}]}]}


def test_phone_results_are_on_the_lead_and_a_rule_disqualifies_landlines(api, runtime):
    tenant = tenant_with(runtime, campaign("PH1", "Phones", **steps({"verifier": "phone"}, rules=[LANDLINES])))

    lead, verified = checked(api, tenant, "PH1", person(US))
    assert lead["status"] == "qualified"
    assert lead["verification"] == {"phone": {"outcome": "pass", "reason": None, "data": {
        "valid": True, "lineType": "fixed_line_or_mobile", "region": "US"}}}
    assert verified["reason"] == "phone: pass"
    assert verified["details"] == {"steps": {"phone": {"outcome": "pass", "reason": None, "action": "pass",
                                                       "cached": False}}}
    events = [e["type"] for e in lead["submissions"][0]["journeyEvents"]]
    assert events.index("verified") < events.index("qualification")  # rules read what the steps found

    mobile, _ = checked(api, tenant, "PH1", person(GB_MOBILE))
    assert mobile["status"] == "qualified"
    assert mobile["verification"]["phone"]["data"] == {"valid": True, "lineType": "mobile", "region": "GB"}

    landline, _ = checked(api, tenant, "PH1", person(DE_LANDLINE))
    assert landline["status"] == "disqualified"
    assert landline["verification"]["phone"]["data"] == {"valid": True, "lineType": "fixed_line", "region": "DE"}
    qualification = landline["submissions"][0]["qualification"]
    assert (qualification["method"], qualification["passed"]) == ("rules", False)
    assert "Landlines" in qualification["reason"]

    invalid, verified = checked(api, tenant, "PH1", person(INVALID))
    assert invalid["status"] == "disqualified"  # onFail defaults to disqualify
    assert invalid["verification"]["phone"] == {"outcome": "fail", "reason": "not a valid phone number",
                                                "data": {"valid": False, "lineType": "unknown", "region": None}}
    assert invalid["submissions"][0]["result"] == "verification phone failed: not a valid phone number"
    assert invalid["submissions"][0]["qualification"]["method"] == "verification"
    assert verified["reason"] == "phone: fail (disqualify)"


def test_on_fail_disqualifies_holds_for_review_or_flags(api, runtime):
    mobile_only = {"verifier": "phone", "config": {"lineTypes": ["mobile"]}}
    tenant = tenant_with(runtime, campaign("PF1", "Disqualify", **steps(mobile_only)),
                         campaign("PF2", "Review", **steps({**mobile_only, "onFail": "review"})),
                         campaign("PF3", "Flag", **steps({**mobile_only, "onFail": "flag"})))
    why = "verification phone failed: line type fixed_line is not one of mobile"

    disqualified, _ = checked(api, tenant, "PF1", person(DE_LANDLINE))
    assert disqualified["status"] == "disqualified" and disqualified["submissions"][0]["result"] == why

    held, verified = checked(api, tenant, "PF2", person(DE_LANDLINE))
    assert held["status"] == "pending_action"
    assert held["approval"]["status"] == "pending" and held["approval"]["reason"] == why
    assert "held_for_review" in [e["type"] for e in held["submissions"][0]["journeyEvents"]]
    assert verified["reason"] == "phone: fail (review)"
    decided = api.post(f"/api/v1/leads/{held['leadId']}/approve", json={"status": "approved"},
                       headers=tenant.headers)
    assert decided.status_code == 200, decided.text
    assert lead_of(api, tenant, held["leadId"])["status"] == "qualified"  # a person's word lets it go on

    flagged, verified = checked(api, tenant, "PF3", person(DE_LANDLINE))
    assert flagged["status"] == "qualified"
    assert flagged["verification"]["phone"]["outcome"] == "fail"
    assert verified["reason"] == "phone: fail (flag)" and verified["details"]["steps"]["phone"]["action"] == "flag"

    passed, _ = checked(api, tenant, "PF1", person(GB_MOBILE))
    assert passed["status"] == "qualified"


def test_a_lead_the_rules_disqualify_stays_disqualified(api, runtime):
    everyone = {"name": "Nobody", "subRules": [{"conditions": [{"field": "email", "operator": "exists"}]}]}
    tenant = tenant_with(runtime, campaign("PR1", "Rules first", **steps(
        {"verifier": "phone", "config": {"lineTypes": ["mobile"]}, "onFail": "review"}, rules=[everyone])))
    lead, verified = checked(api, tenant, "PR1", person(DE_LANDLINE))
    assert lead["status"] == "disqualified" and lead["approval"] is None
    assert lead["submissions"][0]["qualification"]["method"] == "rules"
    assert "Nobody" in lead["submissions"][0]["result"]
    assert verified["details"]["steps"]["phone"]["action"] == "review"  # what it would have done


def test_on_unknown_passes_holds_or_errors(api, runtime, registry):
    unknown = {"verifier": "inline", "config": {"answer": "unknown", "reason": "the service had no record"}}
    tenant = tenant_with(runtime, campaign("PU1", "Pass", **steps(unknown)),
                         campaign("PU2", "Review", **steps({**unknown, "onUnknown": "review"})),
                         campaign("PU3", "Error", **steps({**unknown, "onUnknown": "error"})))
    why = "verification inline could not tell: the service had no record"

    passed, verified = checked(api, tenant, "PU1", person())
    assert passed["status"] == "qualified" and verified["reason"] == "inline: unknown"
    assert passed["verification"]["inline"] == {"outcome": "unknown", "reason": "the service had no record",
                                                "data": {"score": 7}}
    held, _ = checked(api, tenant, "PU2", person())
    assert held["status"] == "pending_action" and held["approval"]["reason"] == why
    failed, verified = checked(api, tenant, "PU3", person())
    assert failed["status"] == "error" and failed["submissions"][0]["result"] == why
    assert verified["reason"] == "inline: unknown (error)"


def test_a_rule_reads_a_plugin_verifiers_data(api, runtime):
    low_score = {"name": "Low score", "subRules": [{"conditions": [
        {"field": "verification.waiting.data.score", "operator": "less_than", "value": [10]}]}]}
    tenant = tenant_with(runtime, campaign("PD1", "Score", **steps({"verifier": "waiting"}, rules=[low_score])))
    lead, _ = checked(api, tenant, "PD1", person())
    assert lead["status"] == "disqualified" and "Low score" in lead["submissions"][0]["result"]


def test_the_phone_verifier_says_what_the_phone_number_library_says():
    """Its own search for a number's region (metadata compiled once) against the library's
    functions: every region's example number of every type, each with its last digit changed,
    shortened and lengthened, random North American numbers and numbers of every calling code."""
    numbers = set()
    for region in phonenumbers.SUPPORTED_REGIONS:
        for kind in LINE_TYPES:
            example = phonenumbers.example_number_for_type(region, kind)
            if example is None:
                continue
            e164 = phonenumbers.format_number(example, phonenumbers.PhoneNumberFormat.E164)
            numbers |= {e164[:-1] + digit for digit in "0123456789"} | {e164[:-1], e164 + "1"}
    draw = random.Random(38)
    numbers |= {f"+1{draw.randint(2_000_000_000, 9_999_999_999)}" for _ in range(5000)}
    numbers |= {f"+{code}{draw.randint(10 ** 5, 10 ** 11)}" for code in phonenumbers.COUNTRY_CODE_TO_REGION_CODE
                for _ in range(10)}
    (verifier,) = appliance_verifiers({})
    differ = []
    for e164 in sorted(numbers):
        number = phonenumbers.parse(e164, None)
        said = verifier.verify(sdk.VerificationRequest(lead={"phoneE164": e164}, config={}, settings={},
                                                       timeout_seconds=1), None).data
        library = {"valid": phonenumbers.is_valid_number(number), "lineType": LINE_TYPES[phonenumbers.number_type(number)],
                   "region": phonenumbers.region_code_for_number(number)}
        if said != library:
            differ.append((e164, said, library))
    assert len(numbers) > 15_000 and differ == []


# ---- verifiers that misbehave --------------------------------------------------------------------

@pytest.mark.parametrize(("answer", "reason"), [
    ("raise", "verification inline could not tell: inline raised RuntimeError: the lookup refused token ***"),
    ("garbage", "verification inline could not tell: inline answered dict, not a VerificationResult"),
    ("bad_outcome", "verification inline could not tell: inline answered an outcome other than pass, fail or unknown"),
    ("list_outcome", "verification inline could not tell: inline answered an outcome other than pass, fail or unknown"),
    ("not_json", "verification inline could not tell: inline answered data that is not JSON (TypeError)"),
    ("huge", "verification inline could not tell: inline answered 20008 bytes of data, more than 16384"),
    ("deep", "verification inline could not tell: inline answered data nested deeper than 32 levels"),
    ("nested", "verification inline could not tell: inline answered data nested deeper than 32 levels"),
    ("circular", "verification inline could not tell: inline answered data nested deeper than 32 levels"),
])
def test_a_verifier_that_raises_or_answers_garbage_is_unknown_never_a_500(api, runtime, caplog, answer, reason):
    tenant = tenant_with(runtime, campaign("PG1", "Garbage", **steps(
        {"verifier": "inline", "config": {"answer": answer}, "onUnknown": "error"})))
    lead, verified = checked(api, tenant, "PG1", person())
    assert lead["status"] == "error" and lead["submissions"][0]["result"] == reason
    assert lead["verification"]["inline"]["outcome"] == "unknown"
    assert verified["details"]["steps"]["inline"]["action"] == "error"
    assert TOKEN not in json.dumps(lead) and TOKEN not in caplog.text


def test_a_verifiers_secrets_are_masked_in_what_it_answers(api, runtime):
    tenant = tenant_with(runtime, campaign("PS1", "Leaky", **steps(
        {"verifier": "inline", "config": {"answer": "leak"}, "onFail": "flag"})))
    lead, _ = checked(api, tenant, "PS1", person())
    assert lead["verification"]["inline"] == {"outcome": "fail", "reason": "denied for ***", "data": {"echo": "***"}}
    assert TOKEN not in json.dumps(lead)


@pytest.mark.parametrize("verifier", ["waiting", "sleepy"])
def test_a_verifier_past_its_timeout_is_unknown(api, runtime, verifier):
    tenant = tenant_with(runtime, campaign("PT1", "Slow", **steps(
        {"verifier": verifier, "config": {"seconds": 1.5}, "timeoutMs": 100, "onUnknown": "error"})))
    started = time.monotonic()
    lead, _ = checked(api, tenant, "PT1", person())
    assert time.monotonic() - started < 1.2  # answered at the timeout, not when the verifier is done
    assert lead["status"] == "error"
    assert lead["verification"][verifier] == {"outcome": "unknown", "data": {},
                                              "reason": f"{verifier} did not answer within 0.1 s"}


# ---- where blocking verifiers run -----------------------------------------------------------------

def test_a_blocking_verifier_runs_in_a_worker_thread_and_the_loop_stays_free(runtime, registry):
    tenant = tenant_with(runtime, campaign("PB1", "Blocking", **steps(
        {"verifier": "sleepy", "config": {"seconds": 0.8}, "timeoutMs": 5000})))
    answers: list[tuple[int, float]] = []

    def post(base: str) -> None:
        with httpx.Client(base_url=base, timeout=10) as http:
            response = http.post(SUBMIT, json={"campaignId": "PB1", **person()}, headers=tenant.headers)
            answers.append((response.status_code, time.monotonic()))

    with live_server(runtime, background=False, registry=registry) as base:
        started = time.monotonic()
        posts = [threading.Thread(target=post, args=(base,)) for _ in range(2)]
        for thread in posts:
            thread.start()
        time.sleep(0.2)  # both submits are in their verifier's sleep now
        health = httpx.get(f"{base}/healthz", timeout=5)
        health_took = time.monotonic() - started
        for thread in posts:
            thread.join(10)
    assert health.status_code == 200 and health_took < 0.6  # the loop answered during the sleeps
    assert [status for status, _ in answers] == [201, 201]
    assert max(done for _, done in answers) - started < 1.5  # the two sleeps overlapped (not 1.6 s)
    assert [name.startswith("verifier") for *_, name in calls(registry)] == [True, True]


def test_the_steps_of_a_lead_run_concurrently(api, runtime, registry):
    tenant = tenant_with(runtime, campaign("PC1", "Both", **steps(
        {"verifier": "sleepy", "config": {"seconds": 0.6}}, {"verifier": "waiting", "config": {"seconds": 0.6}},
        {"verifier": "inline"})))
    started = time.monotonic()
    lead, verified = checked(api, tenant, "PC1", person())
    assert time.monotonic() - started < 1.1  # one wait, not two
    assert lead["status"] == "qualified" and set(lead["verification"]) == {"sleepy", "waiting", "inline"}
    assert verified["reason"] == "sleepy: pass; waiting: pass; inline: pass"  # the campaign's order
    threads = {verifier: name for verifier, _, _, name in calls(registry)}
    assert threads["sleepy"].startswith("verifier") and not threads["waiting"].startswith("verifier")
    assert threads["inline"] == threads["waiting"]  # both on the event loop's thread


# ---- sampling, caching, duplicates ----------------------------------------------------------------

def test_sample_decides_which_leads_are_checked(api, runtime, registry):
    tenant = tenant_with(runtime, campaign("PM0", "None", **steps({"verifier": "inline", "sample": 0})),
                         campaign("PM5", "Half", **steps({"verifier": "inline", "sample": 0.5})))
    skipped, verified = checked(api, tenant, "PM0", person())
    assert skipped["status"] == "qualified" and skipped["verification"] == {}
    assert verified["details"] == {"steps": {"inline": {"outcome": None, "action": "not_sampled"}}}
    assert verified["reason"] == "inline: not sampled"
    assert calls(registry) == []
    for _ in range(40):
        submit(api, tenant, "PM5", person())
    assert 5 <= len(calls(registry)) <= 35  # about half (the chance of falling outside: 1 in 10^5)


def test_a_result_is_cached_per_value_and_unknown_never(api, runtime, registry, clock):
    no_dedupe = {"dedupeOverride": {"enabled": False}}
    tenant = tenant_with(runtime, campaign("PK1", "Cached", **steps(
        {"verifier": "inline", "config": {"answer": "fail"}, "onFail": "flag", "cacheSeconds": 60}, **no_dedupe)),
        campaign("PK2", "Unknown", **steps(
            {"verifier": "inline", "config": {"answer": "unknown", "tag": "u"}, "cacheSeconds": 60}, **no_dedupe)))
    first, verified = checked(api, tenant, "PK1", person(US))
    assert verified["details"]["steps"]["inline"]["cached"] is False
    again, verified = checked(api, tenant, "PK1", person(US))
    assert verified["details"]["steps"]["inline"]["cached"] is True
    assert again["verification"] == first["verification"]
    checked(api, tenant, "PK1", person(GB_MOBILE))  # another value: asked
    assert [phone for _, _, phone, _ in calls(registry)] == [US, GB_MOBILE]
    clock.advance(seconds=61)
    checked(api, tenant, "PK1", person(US))  # kept 60 s only
    assert len(calls(registry)) == 3

    for _ in range(2):
        checked(api, tenant, "PK2", person(US))
    assert [tag for _, tag, _, _ in calls(registry)].count("u") == 2


def test_a_duplicate_is_not_looked_up_by_a_step_that_costs(api, runtime, registry):
    tenant = tenant_with(runtime, campaign("PX1", "Costly", **steps({"verifier": "sleepy"})))
    first = person()
    assert submit(api, tenant, "PX1", first)["status"] == "qualified"
    again, verified = checked(api, tenant, "PX1", {**person(), "email": first["email"]})
    assert again["status"] == "duplicate" and verified is None and again["verification"] == {}
    assert len(calls(registry)) == 1


def test_a_verifier_gone_since_the_import_is_unknown(api, runtime):
    tenant = tenant_with(runtime, campaign("PN1", "Gone", **steps({"verifier": "retired"})))
    lead, _ = checked(api, tenant, "PN1", person())
    assert lead["status"] == "qualified"  # onUnknown defaults to pass
    assert lead["verification"]["retired"] == {"outcome": "unknown", "data": {},
                                               "reason": "no verifier named 'retired' is loaded"}


def test_a_lead_refused_at_source_is_not_checked(api, runtime, registry):
    attested = {"tcpaPolicy": {"ingestionPolicy": {"requireSourceAttestation": True}}}
    tenant = tenant_with(runtime, campaign("PA1", "Attested", **steps({"verifier": "inline"}, **attested)))
    lead, verified = checked(api, tenant, "PA1", person())
    assert lead["status"] == "disqualified" and verified is None and calls(registry) == []


# ---- the job loop's evaluation ----------------------------------------------------------------------

def test_a_deferred_evaluation_runs_the_steps_before_the_rules(runtime, registry):
    tenant = tenant_with(runtime, campaign("PQ1", "Later", ingestion={"sources": [
        {"sourceId": "fast", "shortCircuitSyncEvaluation": True}]}, **steps(
        {"verifier": "phone", "config": {"lineTypes": ["mobile"]}}, {"verifier": "sleepy", "onFail": "flag"},
        rules=[LANDLINES])))
    key = tenancy.create_key(runtime, tenant.tenant_id, source_id="fast").key
    app = create_app(runtime, registry=registry)
    app.state.worker.poll_seconds = 0.05
    with TestClient(app, raise_server_exceptions=False) as client:
        client.app_state = app.state
        answer = client.post(SUBMIT, json={"campaignId": "PQ1", **person(DE_LANDLINE)}, headers={"X-API-Key": key})
        assert answer.status_code == 201 and answer.json()["data"]["status"] == "pending"
        lead_id = answer.json()["data"]["leadId"]
        assert calls(registry) == []  # nothing checked before the submit answered
        lead = wait_for(client, tenant, lead_id, status_is("disqualified"))
    assert lead["verification"]["phone"]["outcome"] == "fail"
    assert lead["verification"]["sleepy"]["outcome"] == "pass"
    submission = lead["submissions"][0]
    # The rule read what the step found (and a lead the rules disqualify keeps their reason).
    assert submission["result"] == 'Disqualified by rule set "Landlines": verification.phone.data.lineType equals' \
                                   ' [fixed_line]'
    types = [e["type"] for e in submission["journeyEvents"]]
    assert types.index("evaluation_deferred") < types.index("verified") < types.index("qualification")
    assert len(calls(registry)) == 1


# ---- the import -----------------------------------------------------------------------------------

def imported(cli, tmp_path: Path, tenant_id: str, campaigns: list[dict], expect: int = 1):
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps({"campaigns": campaigns}))
    return cli("import", "--tenant", tenant_id, str(path), expect=expect)


def test_the_import_refuses_bad_steps_naming_the_field(cli, tmp_path, registry):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    shapes = imported(cli, tmp_path, tenant_id, [
        campaign("IV0", "Sample", **steps({"verifier": "phone", "sample": 1.5})),
        campaign("IV1", "Timeout", **steps({"verifier": "phone", "timeoutMs": 0})),
        campaign("IV2", "Too long", **steps({"verifier": "phone", "timeoutMs": 60_001})),
        campaign("IV3", "Cache", **steps({"verifier": "phone", "cacheSeconds": -1})),
        campaign("IV4", "Policy", **steps({"verifier": "phone", "onFail": "ignore"})),
        campaign("IV5", "Twice", **steps({"verifier": "phone"}, {"verifier": "phone", "onFail": "flag"})),
    ]).stderr
    for problem in ("campaigns[0].qualification.verifications[0].sample: must be between 0 and 1",
                    "campaigns[1].qualification.verifications[0].timeoutMs: must be between 1 and 60000",
                    "campaigns[2].qualification.verifications[0].timeoutMs: must be between 1 and 60000",
                    "campaigns[3].qualification.verifications[0].cacheSeconds: must be between 0 and 2592000",
                    "campaigns[4].qualification.verifications[0].onFail: must be one of disqualify, review, flag",
                    "campaigns[5].qualification.verifications[1].verifier: 'phone' is already a step of this"
                    " campaign"):
        assert problem in shapes, shapes

    known = imported(cli, tmp_path, tenant_id, [
        campaign("IV6", "Unknown", **steps({"verifier": "carrier_lookup"})),
        campaign("IV7", "Line types", **steps({"verifier": "phone", "config": {"lineTypes": ["landline"]}})),
        campaign("IV8", "Plugin", **steps({"verifier": "inline"})),
    ]).stderr
    assert "campaigns[0].qualification.verifications[0].verifier: unknown verifier 'carrier_lookup' (loaded:" \
           " http_lookup, inline, phone, sleepy, waiting)" in known
    assert "campaigns[1].qualification.verifications[0].config.lineTypes[0]: unknown line type 'landline'" in known
    assert "campaigns[2]" not in known  # a plugin's verifier is known to the import
    assert json.loads(cli("export", "--tenant", tenant_id).stdout)["campaigns"] == []  # nothing imported

    imported(cli, tmp_path, tenant_id, [campaign("IV9", "Good", **steps(
        {"verifier": "phone", "config": {"lineTypes": ["mobile"]}, "onFail": "review", "sample": 0.25,
         "cacheSeconds": 3600, "timeoutMs": 500}))], expect=0)
    (stored,) = json.loads(cli("export", "--tenant", tenant_id).stdout)["campaigns"]
    assert stored["qualification"]["verifications"] == [
        {"verifier": "phone", "config": {"lineTypes": ["mobile"]}, "onFail": "review", "onUnknown": "pass",
         "sample": 0.25, "cacheSeconds": 3600, "timeoutMs": 500}]


@pytest.mark.parametrize("said", [None, "config: not a list", 7])
def test_a_verifier_whose_validate_answers_no_list_is_named_at_import(said):
    class Odd(sdk.Verifier):
        name = "odd"

        def validate(self, config):
            return said

    raw = json.dumps({"campaigns": [campaign("IO1", "Odd", **steps({"verifier": "odd"}))]}).encode()
    with pytest.raises(BundleError) as refused:
        load_bundle(raw, "json", verifiers={"odd": Odd()})
    assert refused.value.problems == ["campaigns[0].qualification.verifications[0].config: the odd verifier could"
                                      " not check it (it answered no list of problems)"]
