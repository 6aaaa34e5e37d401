"""Submit, step 2: source keys, source caps counted in the campaign's time zone,
the ingestion TCPA attestation, cost milestones and shortCircuitSyncEvaluation."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.submit_support import (  # noqa: F401
    accepted, api, clock, events_of, jobs, lead_count, ledger, person, plain, read_lead, setup_tenant, source_key,
    submit,
)


def source(source_id: str, **extra) -> dict:
    return {"sourceId": source_id, "name": f"Source {source_id}", **extra}


def with_sources(code: str, *sources: dict, timezone: str | None = None, **extra) -> dict:
    campaign = plain(code, ingestion={"sources": list(sources)}, **extra)
    if timezone:
        campaign["delivery"] = {"deliverySchedule": {"timezone": timezone}}
    return campaign


def outcome(api, runtime, tenant, lead_id) -> tuple[str, str | None]:
    submission = read_lead(api, runtime, tenant, lead_id)["submissions"][-1]
    return submission["status"], submission["result"]


# ---- source keys --------------------------------------------------------------------------------

def test_source_key_binds_the_source_to_the_lead(api, runtime):
    tenant = setup_tenant(runtime, with_sources("SC1", source("web")), plain("SC2"))
    key = source_key(runtime, tenant, "web")
    data = accepted(api, key, person())
    lead = read_lead(api, runtime, tenant, data["leadId"])
    assert lead["sourceId"] == "web"
    assert lead["submissions"][0]["journeyEvents"][0]["details"]["sourceId"] == "web"
    tenant_lead = read_lead(api, runtime, tenant, accepted(api, tenant, person())["leadId"])
    assert tenant_lead["sourceId"] is None


def test_source_key_for_a_campaign_without_that_source_is_403(api, runtime):
    tenant = setup_tenant(runtime, with_sources("SC1", source("web")), with_sources("SC2", source("other")),
                          plain("SC3"))
    key = source_key(runtime, tenant, "web")
    for campaign_id in ("SC2", "SC3"):
        response = submit(api, key, person(campaign_id), expect=403)
        assert response.json()["error"]["code"] == "FORBIDDEN"
    assert lead_count(runtime) == 0


def test_source_key_for_an_inactive_source_is_403(api, runtime):
    tenant = setup_tenant(runtime, with_sources("SC1", source("web", active=False)))
    key = source_key(runtime, tenant, "web")
    assert submit(api, key, person(), expect=403).json()["error"]["code"] == "FORBIDDEN"
    assert lead_count(runtime) == 0


def test_imported_source_api_key_works_like_a_source_key(api, runtime):
    tenant = setup_tenant(runtime, with_sources("SC1", source("web", apiKey="imported-web-key-0123456789abcdef")),
                          plain("SC2"))
    data = accepted(api, "imported-web-key-0123456789abcdef", person())
    assert read_lead(api, runtime, tenant, data["leadId"])["sourceId"] == "web"
    submit(api, "imported-web-key-0123456789abcdef", person("SC2"), expect=403)


def test_source_key_outside_its_campaigns_is_forbidden_whether_they_exist_or_not(api, runtime):
    # A source key submits only to campaigns that have its source. Another tenant's
    # campaign, an unknown one and an inactive one of its own tenant answer alike, so the key
    # learns nothing of what exists elsewhere.
    tenant = setup_tenant(runtime, with_sources("SC1", source("web")),
                          with_sources("SC3", source("web"), active=False))
    setup_tenant(runtime, with_sources("OC1", source("web")), name="Other")
    key = source_key(runtime, tenant, "web")
    answers = [submit(api, key, person(code), expect=403).json() for code in ("OC1", "NOPE", "SC3")]
    assert answers[0] == answers[1] == answers[2]
    assert answers[0]["error"]["code"] == "FORBIDDEN"
    # a tenant key still gets the field-named VALIDATION_ERROR
    response = submit(api, tenant, person("OC1"), expect=400)
    assert response.json()["error"]["details"] == ["campaignId: unknown campaign"]


def test_source_key_may_resubmit_only_its_own_leads(api, runtime):
    tenant = setup_tenant(runtime, with_sources("SC1", source("web"), source("partner")))
    web, partner = source_key(runtime, tenant, "web"), source_key(runtime, tenant, "partner")
    own = accepted(api, web, person())["leadId"]
    by_tenant_key = accepted(api, tenant, person())["leadId"]
    assert accepted(api, web, {"leadId": own, "campaignId": "SC1"})["leadId"] == own
    for other in (by_tenant_key, own, "lead_00000000000000000000000000"):
        key = partner if other == own else web
        response = submit(api, key, {"leadId": other, "campaignId": "SC1"}, expect=403)
        assert response.json()["error"]["code"] == "FORBIDDEN"
    assert read_lead(api, runtime, tenant, own)["sourceId"] == "web"


# ---- caps -------------------------------------------------------------------------------------

def test_daily_cap_disqualifies_beyond_the_cap(api, runtime):
    tenant = setup_tenant(runtime, with_sources("SC1", source("web", caps=[{"cap": 2, "type": "daily"}])))
    key = source_key(runtime, tenant, "web")
    statuses = [accepted(api, key, person()) for _ in range(4)]
    assert [s["status"] for s in statuses] == ["qualified", "qualified", "disqualified", "disqualified"]
    status, result = outcome(api, runtime, tenant, statuses[2]["leadId"])
    assert status == "disqualified"
    assert "daily" in result and "cap" in result and "2" in result
    submission = read_lead(api, runtime, tenant, statuses[2]["leadId"])["submissions"][0]
    assert submission["qualification"]["passed"] is False
    assert "cap" in submission["qualification"]["reason"]
    assert any("cap" in (e["reason"] or "") for e in events_of(submission, "source_check"))
    assert jobs(runtime, statuses[2]["submissionId"]) == []


def test_cap_is_per_source_and_tenant_key_is_not_capped(api, runtime):
    tenant = setup_tenant(runtime, with_sources("SC1", source("web", caps=[{"cap": 1, "type": "daily"}]),
                                                source("tv", caps=[{"cap": 1, "type": "daily"}])))
    web, tv = source_key(runtime, tenant, "web"), source_key(runtime, tenant, "tv")
    assert accepted(api, web, person())["status"] == "qualified"
    assert accepted(api, web, person())["status"] == "disqualified"
    assert accepted(api, tv, person())["status"] == "qualified"
    assert accepted(api, tenant, person())["status"] == "qualified"


def test_rejected_submissions_do_not_use_up_the_cap(api, runtime):
    tenant = setup_tenant(runtime, with_sources("SC1", source("web", caps=[{"cap": 2, "type": "daily"}])))
    key = source_key(runtime, tenant, "web")
    first = person()
    assert accepted(api, key, first)["status"] == "qualified"
    submit(api, key, person(email="broken"), expect=400)                           # refused: not counted
    assert accepted(api, key, {**person(), "email": first["email"]})["status"] == "duplicate"  # not counted
    assert accepted(api, key, person())["status"] == "qualified"
    assert accepted(api, key, person())["status"] == "disqualified"


def test_daily_cap_counts_days_in_the_campaign_time_zone(api, runtime, clock):
    tenant = setup_tenant(runtime, with_sources("SC1", source("web", caps=[{"cap": 1, "type": "daily"}]),
                                                timezone="America/New_York"))
    key = source_key(runtime, tenant, "web")
    # 03:00 UTC on 10 March is 23:00 on 9 March in New York (EDT, UTC-4).
    clock.set(datetime(2026, 3, 10, 3, 0, tzinfo=UTC))
    assert accepted(api, key, person())["status"] == "qualified"
    # 05:00 UTC the same UTC day is 01:00 on 10 March in New York: a new local day.
    clock.set(datetime(2026, 3, 10, 5, 0, tzinfo=UTC))
    assert accepted(api, key, person())["status"] == "qualified"
    # 23:00 UTC is 19:00 on 10 March; 01:00 UTC on the 11th is still 21:00 on 10 March.
    clock.set(datetime(2026, 3, 11, 1, 0, tzinfo=UTC))
    assert accepted(api, key, person())["status"] == "disqualified"
    # Local midnight (04:00 UTC) opens the next day.
    clock.set(datetime(2026, 3, 11, 3, 59, 59, tzinfo=UTC))
    assert accepted(api, key, person())["status"] == "disqualified"
    clock.set(datetime(2026, 3, 11, 4, 0, 0, tzinfo=UTC))
    assert accepted(api, key, person())["status"] == "qualified"


def test_daily_cap_without_a_campaign_zone_counts_utc_days(api, runtime, clock):
    tenant = setup_tenant(runtime, with_sources("SC1", source("web", caps=[{"cap": 1, "type": "daily"}])))
    key = source_key(runtime, tenant, "web")
    clock.set(datetime(2026, 3, 10, 23, 59, tzinfo=UTC))
    assert accepted(api, key, person())["status"] == "qualified"
    assert accepted(api, key, person())["status"] == "disqualified"
    clock.set(datetime(2026, 3, 11, 0, 0, tzinfo=UTC))
    assert accepted(api, key, person())["status"] == "qualified"


def test_hourly_and_monthly_caps(api, runtime, clock):
    tenant = setup_tenant(runtime, with_sources("SC1", source("web", caps=[{"cap": 1, "type": "hourly"},
                                                                            {"cap": 2, "type": "monthly"}])))
    key = source_key(runtime, tenant, "web")
    clock.set(datetime(2026, 3, 10, 10, 15, tzinfo=UTC))
    assert accepted(api, key, person())["status"] == "qualified"
    clock.set(datetime(2026, 3, 10, 10, 59, tzinfo=UTC))
    assert accepted(api, key, person())["status"] == "disqualified"
    clock.set(datetime(2026, 3, 10, 11, 0, tzinfo=UTC))
    assert accepted(api, key, person())["status"] == "qualified"
    clock.set(datetime(2026, 3, 20, 11, 0, tzinfo=UTC))
    data = accepted(api, key, person())
    assert data["status"] == "disqualified"
    assert "monthly" in outcome(api, runtime, tenant, data["leadId"])[1]
    clock.set(datetime(2026, 4, 1, 0, 0, tzinfo=UTC))
    assert accepted(api, key, person())["status"] == "qualified"


def test_lifetime_cap_never_resets(api, runtime, clock):
    tenant = setup_tenant(runtime, with_sources("SC1", source("web", caps=[{"cap": 2, "type": "lifetime"}])))
    key = source_key(runtime, tenant, "web")
    assert accepted(api, key, person())["status"] == "qualified"
    clock.advance(days=40)
    assert accepted(api, key, person())["status"] == "qualified"
    clock.advance(days=400)
    data = accepted(api, key, person())
    assert data["status"] == "disqualified"
    assert "lifetime" in outcome(api, runtime, tenant, data["leadId"])[1]


def test_inactive_cap_is_ignored(api, runtime):
    tenant = setup_tenant(runtime, with_sources("SC1", source("web", caps=[{"cap": 0, "type": "daily",
                                                                            "active": False}])))
    key = source_key(runtime, tenant, "web")
    assert [accepted(api, key, person())["status"] for _ in range(3)] == ["qualified"] * 3


def test_cap_of_zero_blocks_everything(api, runtime):
    tenant = setup_tenant(runtime, with_sources("SC1", source("web", caps=[{"cap": 0, "type": "daily"}])))
    key = source_key(runtime, tenant, "web")
    assert accepted(api, key, person())["status"] == "disqualified"


def test_date_ranged_cap_applies_only_inside_its_range(api, runtime, clock):
    tenant = setup_tenant(runtime, with_sources("SC1", source("web", caps=[
        {"cap": 0, "type": "daily", "startDate": "2026-03-01", "endDate": "2026-03-05"}])))
    key = source_key(runtime, tenant, "web")
    clock.set(datetime(2026, 2, 28, 23, 59, tzinfo=UTC))
    assert accepted(api, key, person())["status"] == "qualified"
    clock.set(datetime(2026, 3, 1, 0, 0, tzinfo=UTC))
    assert accepted(api, key, person())["status"] == "disqualified"
    clock.set(datetime(2026, 3, 5, 23, 59, tzinfo=UTC))  # the end date covers its whole day
    assert accepted(api, key, person())["status"] == "disqualified"
    clock.set(datetime(2026, 3, 6, 0, 0, tzinfo=UTC))
    assert accepted(api, key, person())["status"] == "qualified"


def test_date_ranged_cap_days_are_local_to_the_campaign(api, runtime, clock):
    tenant = setup_tenant(runtime, with_sources("SC1", source("web", caps=[
        {"cap": 0, "type": "daily", "startDate": "2026-03-11"}]), timezone="America/New_York"))
    key = source_key(runtime, tenant, "web")
    clock.set(datetime(2026, 3, 11, 3, 59, tzinfo=UTC))  # still 10 March in New York
    assert accepted(api, key, person())["status"] == "qualified"
    clock.set(datetime(2026, 3, 11, 4, 0, tzinfo=UTC))
    assert accepted(api, key, person())["status"] == "disqualified"


# ---- TCPA ingestion attestation ----------------------------------------------------------------

@pytest.fixture
def attested(runtime):
    return setup_tenant(runtime, plain("SC1", qualification={
        "tcpaPolicy": {"ingestionPolicy": {"requireSourceAttestation": True}}}), plain("SC2"))


@pytest.mark.parametrize(("compliance", "reason_part"), [
    (None, "tcpaConsent"),
    ({}, "tcpaConsent"),
    ({"tcpaConsent": False, "consentTimestamp": "2026-03-10T14:00:00Z"}, "tcpaConsent"),
    ({"tcpaConsent": True}, "consentTimestamp"),
    ({"consentTimestamp": "2026-03-10T14:00:00Z"}, "tcpaConsent"),
], ids=["absent", "empty", "consent-false", "no-timestamp", "no-consent"])
def test_missing_attestation_disqualifies_with_reason(api, runtime, attested, compliance, reason_part):
    body = person()
    if compliance is not None:
        body["compliance"] = compliance
    data = accepted(api, attested, body)
    assert data["status"] == "disqualified"
    status, result = outcome(api, runtime, attested, data["leadId"])
    assert status == "disqualified"
    assert "TCPA" in result and reason_part in result
    assert jobs(runtime, data["submissionId"]) == []


def test_present_attestation_passes(api, runtime, attested):
    data = accepted(api, attested, person(compliance={"tcpaConsent": True,
                                                      "consentTimestamp": "2026-03-10T14:00:00.000Z"}))
    assert data["status"] == "qualified"
    assert [kind for kind, _ in jobs(runtime, data["submissionId"])] == ["deliver"]


def test_attestation_not_required_elsewhere(api, attested):
    assert accepted(api, attested, person("SC2"))["status"] == "qualified"


# ---- cost milestones ---------------------------------------------------------------------------

def test_cost_milestone_for_lead_ingested_writes_a_ledger_entry(api, runtime):
    tenant = setup_tenant(runtime, with_sources("SC1", source("web", costMilestones=[
        {"leadStatus": "lead_ingested", "amount": 2.5},
        {"leadStatus": "qualified", "amount": 1, "currency": "EUR"},
        {"leadStatus": "disqualified", "amount": 0.1},
        {"leadStatus": "lead_ingested", "amount": 99, "active": False},
        {"leadStatus": "lead_ingested", "amount": 98, "validTo": "2026-01-31"},
        {"leadStatus": "lead_ingested", "amount": 97, "validFrom": "2027-01-01"},
    ])))
    key = source_key(runtime, tenant, "web")
    data = accepted(api, key, person())
    assert sorted(ledger(runtime, tenant, data["leadId"])) == sorted([
        ("cost", "lead_ingested", 2.5, "USD", "SC1", "web"),
        ("cost", "qualified", 1.0, "EUR", "SC1", "web"),
    ])


def test_cost_milestone_conditions_and_status(api, runtime):
    tenant = setup_tenant(runtime, with_sources("SC1", source("web", caps=[{"cap": 1, "type": "daily"}],
                                                              costMilestones=[
        {"leadStatus": "lead_ingested", "amount": 2.5},
        {"leadStatus": "disqualified", "amount": -2.5},
        {"leadStatus": "lead_ingested", "amount": 4, "conditions": {"subRules": [{"conditions": [
            {"field": "address.state", "operator": "equals", "value": ["CA"]}]}]}},
    ])))
    key = source_key(runtime, tenant, "web")
    ca = accepted(api, key, person(address={"state": "CA"}))
    capped = accepted(api, key, person())
    assert sorted(e[2] for e in ledger(runtime, tenant, ca["leadId"])) == [2.5, 4.0]
    assert capped["status"] == "disqualified"
    assert sorted(e[2] for e in ledger(runtime, tenant, capped["leadId"])) == [-2.5, 2.5]


def test_no_cost_without_a_source(api, runtime):
    tenant = setup_tenant(runtime, with_sources("SC1", source("web", costMilestones=[
        {"leadStatus": "lead_ingested", "amount": 2.5}])))
    data = accepted(api, tenant, person())
    assert ledger(runtime, tenant, data["leadId"]) == []


# ---- shortCircuitSyncEvaluation ----------------------------------------------------------------

def test_short_circuit_source_answers_pending_with_an_evaluate_job(api, runtime):
    blocking = {"rules": [{"subRules": [{"conditions": [{"field": "email", "operator": "exists"}]}]}]}
    tenant = setup_tenant(runtime, with_sources("SC1", source("fast", shortCircuitSyncEvaluation=True),
                                                source("slow"), qualification=blocking))
    fast, slow = source_key(runtime, tenant, "fast"), source_key(runtime, tenant, "slow")
    data = accepted(api, fast, person())
    assert data["status"] == "pending"  # the disqualifying rule set has not run yet
    assert jobs(runtime, data["submissionId"]) == [("evaluate", "ready")]
    submission = read_lead(api, runtime, tenant, data["leadId"])["submissions"][0]
    assert submission["status"] == "pending"
    assert events_of(submission, "evaluation_deferred")
    assert accepted(api, slow, person())["status"] == "disqualified"


def test_short_circuit_source_still_applies_caps_and_dedupe(api, runtime):
    tenant = setup_tenant(runtime, with_sources("SC1", source("fast", shortCircuitSyncEvaluation=True,
                                                              caps=[{"cap": 2, "type": "daily"}])))
    fast = source_key(runtime, tenant, "fast")
    first = person()
    assert accepted(api, fast, first)["status"] == "pending"
    duplicate = accepted(api, fast, {**person(), "email": first["email"]})
    assert duplicate["status"] == "duplicate"
    assert jobs(runtime, duplicate["submissionId"]) == []
    assert accepted(api, fast, person())["status"] == "pending"
    capped = accepted(api, fast, person())
    assert capped["status"] == "disqualified"
    assert jobs(runtime, capped["submissionId"]) == []
