from datetime import UTC, datetime

from appliance.domain.campaign import DedupeOverride, MatchFields
from appliance.domain.dedupe import DedupePolicy, effective_policy, find_duplicate, window_start

NOW = datetime(2024, 6, 15, tzinfo=UTC)
EARLIER = [
    ("L1", "other@example.com", "+15550000001", NOW),
    ("L2", "Ann@Example.com ", "+15550000002", NOW),
    ("L3", "ann@example.com", "+15551234567", NOW),
    ("L4", None, "+15551234567", NOW),
]


def policy(logic, *, email=True, phone=True):
    return DedupePolicy(enabled=True, window_days=30, match_email=email, match_phone=phone,
                        match_logic=logic)


def test_or_matches_any_configured_field():
    assert find_duplicate(policy("OR"), "ann@example.com", "+19999999999", EARLIER) == "L2"
    assert find_duplicate(policy("OR"), "x@example.com", "+15551234567", EARLIER) == "L3"
    assert find_duplicate(policy("OR"), "x@example.com", "+19999999999", EARLIER) is None


def test_and_needs_every_configured_field():
    assert find_duplicate(policy("AND"), "ANN@example.com", "+15551234567", EARLIER) == "L3"
    assert find_duplicate(policy("AND"), "ann@example.com", "+19999999999", EARLIER) is None
    assert find_duplicate(policy("AND"), None, "+15551234567", EARLIER) is None


def test_only_configured_fields_count():
    assert find_duplicate(policy("AND", email=False), None, "+15551234567", EARLIER) == "L3"
    assert find_duplicate(policy("OR", phone=False), "x@example.com", "+15551234567",
                          EARLIER) is None
    assert find_duplicate(policy("OR", email=False, phone=False), "ann@example.com",
                          "+15551234567", EARLIER) is None


def test_missing_values_never_match():
    rows = [("L9", None, None, NOW), ("L8", "", " ", NOW)]
    assert find_duplicate(policy("OR"), None, None, rows) is None
    assert find_duplicate(policy("OR"), "", "", rows) is None


def test_disabled_policy_never_matches():
    disabled = DedupePolicy(enabled=False, window_days=30)
    assert find_duplicate(disabled, "ann@example.com", "+15551234567", EARLIER) is None


def test_tenant_default_policy():
    assert effective_policy(30, None) == DedupePolicy(
        enabled=True, window_days=30, match_email=True, match_phone=True, match_logic="OR")
    assert not effective_policy(0, None).enabled


def test_override_wins_whole():
    override = DedupeOverride(enabled=True, window=7,
                              match_fields=MatchFields(email=False, phone=True, match_logic="AND"))
    assert effective_policy(30, override) == DedupePolicy(
        enabled=True, window_days=7, match_email=False, match_phone=True, match_logic="AND")
    assert not effective_policy(30, DedupeOverride(enabled=False)).enabled
    assert effective_policy(0, DedupeOverride()).enabled


def test_window_start():
    assert window_start(policy("OR"), NOW) == datetime(2024, 5, 16, tzinfo=UTC)
