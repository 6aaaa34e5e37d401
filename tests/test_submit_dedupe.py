"""Submit, step 3: duplicate detection, tenant default and campaign dedupeOverride."""

from __future__ import annotations

from tests.submit_support import (  # noqa: F401
    accepted, api, clock, configured, events_of, jobs, lead_count, person, plain, read_lead, setup_tenant,
)


def override(window=7, email=True, phone=True, logic="OR", enabled=True) -> dict:
    return {"dedupeOverride": {"enabled": enabled, "window": window,
                               "matchFields": {"email": email, "phone": phone, "matchLogic": logic}}}


def same_contact(original: dict, campaign_id: str = "SC1", **changes) -> dict:
    body = {**person(campaign_id), "email": original["email"], "phone": original["phone"]}
    body.update(changes)
    return body


def tenant_with(runtime, **qualification):
    return setup_tenant(runtime, plain("SC1", qualification=qualification or {}), plain("SC2"))


def test_tenant_default_email_hit_is_duplicate_naming_the_original(api, runtime):
    tenant = tenant_with(runtime)
    original = person()
    first = accepted(api, tenant, original)
    second = accepted(api, tenant, same_contact(original, phone=person()["phone"]))
    assert first["status"] == "qualified"
    assert second["status"] == "duplicate"
    assert second["leadId"] != first["leadId"]
    lead = read_lead(api, runtime, tenant, second["leadId"])
    assert lead["status"] == "duplicate"
    submission = lead["submissions"][0]
    assert submission["status"] == "duplicate"
    assert first["leadId"] in submission["result"]
    dedupe = events_of(submission, "dedupe")
    assert dedupe and first["leadId"] in dedupe[0]["reason"]
    assert dedupe[0]["details"]["originalLeadId"] == first["leadId"]
    assert jobs(runtime, second["submissionId"]) == []
    assert lead_count(runtime) == 2  # a duplicate is still recorded


def test_tenant_default_phone_hit_is_duplicate(api, runtime):
    tenant = tenant_with(runtime)
    original = person(phone="(415) 555-0199")
    first = accepted(api, tenant, original)
    # The same number written differently: phones compare in E.164.
    second = accepted(api, tenant, same_contact(original, email=person()["email"], phone="+1 415 555 0199"))
    assert second["status"] == "duplicate"
    assert first["leadId"] in read_lead(api, runtime, tenant, second["leadId"])["submissions"][0]["result"]


def test_email_compares_after_normalization(api, runtime):
    tenant = tenant_with(runtime)
    original = person(email="Someone@Example.com")
    accepted(api, tenant, original)
    assert accepted(api, tenant, same_contact(original, email="  SOMEONE@example.COM ",
                                              phone=person()["phone"]))["status"] == "duplicate"


def test_different_email_and_phone_is_not_duplicate(api, runtime):
    tenant = tenant_with(runtime)
    accepted(api, tenant, person())
    assert accepted(api, tenant, person())["status"] == "qualified"


def test_duplicate_of_a_duplicate_names_the_first_lead(api, runtime):
    tenant = tenant_with(runtime)
    original = person()
    first = accepted(api, tenant, original)
    accepted(api, tenant, same_contact(original))
    third = accepted(api, tenant, same_contact(original))
    assert third["status"] == "duplicate"
    assert first["leadId"] in read_lead(api, runtime, tenant, third["leadId"])["submissions"][0]["result"]


def test_default_window_edges(api, runtime, clock):
    tenant = tenant_with(runtime)
    original = person()
    accepted(api, tenant, original)
    clock.advance(days=30, minutes=-1)
    assert accepted(api, tenant, same_contact(original))["status"] == "duplicate"
    clock.advance(minutes=2)  # 30 days and a minute after the original
    assert accepted(api, tenant, same_contact(original))["status"] == "qualified"


def test_override_window_edges(api, runtime, clock):
    tenant = tenant_with(runtime, **override(window=2))
    original = person()
    accepted(api, tenant, original)
    clock.advance(days=2, seconds=-1)
    assert accepted(api, tenant, same_contact(original))["status"] == "duplicate"
    clock.advance(seconds=2)
    assert accepted(api, tenant, same_contact(original))["status"] == "qualified"


def test_override_and_needs_both_fields(api, runtime):
    tenant = tenant_with(runtime, **override(logic="AND"))
    original = person()
    accepted(api, tenant, original)
    assert accepted(api, tenant, same_contact(original, phone=person()["phone"]))["status"] == "qualified"
    assert accepted(api, tenant, same_contact(original, email=person()["email"]))["status"] == "qualified"
    assert accepted(api, tenant, same_contact(original))["status"] == "duplicate"


def test_override_or_needs_either_field(api, runtime):
    tenant = tenant_with(runtime, **override(logic="OR"))
    original = person()
    accepted(api, tenant, original)
    assert accepted(api, tenant, same_contact(original, phone=person()["phone"]))["status"] == "duplicate"
    assert accepted(api, tenant, same_contact(original, email=person()["email"]))["status"] == "duplicate"
    assert accepted(api, tenant, person())["status"] == "qualified"


def test_override_matching_on_email_only(api, runtime):
    tenant = tenant_with(runtime, **override(phone=False))
    original = person()
    accepted(api, tenant, original)
    assert accepted(api, tenant, same_contact(original, email=person()["email"]))["status"] == "qualified"
    assert accepted(api, tenant, same_contact(original, phone=person()["phone"]))["status"] == "duplicate"


def test_override_disabled_turns_dedupe_off(api, runtime):
    tenant = tenant_with(runtime, **override(enabled=False))
    original = person()
    accepted(api, tenant, original)
    assert accepted(api, tenant, same_contact(original))["status"] == "qualified"
    assert accepted(api, tenant, same_contact(original))["status"] == "qualified"


def test_override_wins_over_the_tenant_default_window(api, runtime, clock):
    tenant = tenant_with(runtime, **override(window=60))
    original = person()
    accepted(api, tenant, original)
    clock.advance(days=45)  # outside the 30-day default, inside the campaign's 60 days
    assert accepted(api, tenant, same_contact(original))["status"] == "duplicate"


def test_scope_is_the_campaign(api, runtime):
    tenant = tenant_with(runtime)
    original = person()
    accepted(api, tenant, original)
    assert accepted(api, tenant, same_contact(original, "SC2"))["status"] == "qualified"
    assert accepted(api, tenant, same_contact(original, "SC2"))["status"] == "duplicate"


def test_scope_is_the_tenant(api, runtime):
    tenant = tenant_with(runtime)
    other = setup_tenant(runtime, plain("SC1"), name="Other")
    original = person()
    accepted(api, tenant, original)
    assert accepted(api, other, same_contact(original))["status"] == "qualified"


def test_test_leads_skip_dedupe_and_are_not_originals(api, runtime):
    tenant = tenant_with(runtime)
    original = person(isTest=True)
    assert accepted(api, tenant, original)["status"] == "qualified"
    assert accepted(api, tenant, same_contact(original, isTest=True))["status"] == "qualified"
    real = accepted(api, tenant, same_contact(original))
    assert real["status"] == "qualified"  # the test leads before it do not count
    assert accepted(api, tenant, same_contact(original, isTest=True))["status"] == "qualified"
    assert accepted(api, tenant, same_contact(original))["status"] == "duplicate"


def test_duplicates_are_counted_against_routed_leads_by_intake_campaign(api, runtime):
    # A lead routed from SC1 to SC2 was posted to SC1: a second post to SC1 is its duplicate.
    routing = {"autoRoutingEnabled": True, "routingRules": [
        {"routeName": "all", "priority": 1, "subRules": [{"conditions": [{"field": "email", "operator": "exists"}]}],
         "routeTo": {"campaignId": "SC2"}}]}
    tenant = setup_tenant(runtime, plain("SC1", qualification=routing), plain("SC2"))
    original = person()
    first = accepted(api, tenant, original)
    assert read_lead(api, runtime, tenant, first["leadId"])["campaignId"] == "SC2"
    assert accepted(api, tenant, same_contact(original))["status"] == "duplicate"


def test_tenant_default_window_comes_from_config(tmp_path, backend_toml):
    with configured(tmp_path, "[defaults]\ndedupe_window_days = 3", backend_toml) as (runtime, client, clock):
        tenant = tenant_with(runtime)
        original = person()
        accepted(client, tenant, original)
        clock.advance(days=2, hours=23)
        assert accepted(client, tenant, same_contact(original))["status"] == "duplicate"
        clock.advance(hours=2)
        assert accepted(client, tenant, same_contact(original))["status"] == "qualified"
        overridden = setup_tenant(runtime, plain("SC1", qualification=override(window=10)), name="Override")
        accepted(client, overridden, original)
        clock.advance(days=5)
        assert accepted(client, overridden, same_contact(original))["status"] == "duplicate"


def test_tenant_default_window_zero_turns_default_dedupe_off(tmp_path, backend_toml):
    with configured(tmp_path, "[defaults]\ndedupe_window_days = 0", backend_toml) as (runtime, client, _clock):
        tenant = setup_tenant(runtime, plain("SC1"), plain("SC2", qualification=override()))
        original = person()
        accepted(client, tenant, original)
        assert accepted(client, tenant, same_contact(original))["status"] == "qualified"
        accepted(client, tenant, same_contact(original, "SC2"))
        assert accepted(client, tenant, same_contact(original, "SC2"))["status"] == "duplicate"
