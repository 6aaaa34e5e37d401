"""appliance/domain/approval: what a decision does to a lead's status and its delivery."""

from __future__ import annotations

import pytest

from appliance.domain.approval import holds_delivery, starts_delivery, status_after_decision, too_late
from appliance.domain.lead import Approval


@pytest.mark.parametrize(("status", "decision", "after"), [
    ("pending_action", "approved", "qualified"),
    ("pending_action", "rejected", "rejected"),
    ("pending_action", "pending", "pending_action"),
    ("qualified", "pending", "pending_action"),
    ("queued", "pending", "pending_action"),
    ("queued", "rejected", "rejected"),
    ("rejected", "pending", "pending_action"),
    # past delivery a decision changes nothing: it governs a delivery not yet made
    ("delivered", "pending", "delivered"),
    ("delivered", "rejected", "delivered"),
    ("failed", "rejected", "failed"),
    ("error", "pending", "error"),
    ("duplicate", "approved", "duplicate"),
    # nor does it change a lead the buyer sent back
    ("returned", "approved", "returned"),
    ("returned", "rejected", "returned"),
    ("returned", "pending", "returned"),
])
def test_status_after_decision(status, decision, after):
    assert status_after_decision(status, decision) == after


@pytest.mark.parametrize("decision", ["approved", "rejected", "pending"])
@pytest.mark.parametrize("status", ["qualified", "queued", "pending_action", "rejected", "delivered", "failed"])
def test_every_decision_is_too_late_while_a_delivery_attempt_runs(status, decision):
    assert "under way" in too_late(decision, status, delivery_running=True)


@pytest.mark.parametrize(("status", "decision", "why"), [
    ("delivered", "approved", "already delivered"),
    ("delivered", "rejected", "already delivered"),
    ("delivered", "pending", None),  # recorded; a delivered lead is never sent again whatever it says
    ("failed", "approved", "already failed"),
    ("failed", "rejected", "already failed"),
    ("failed", "pending", "already failed"),  # a pending approval would refuse the repost for good
    ("pending_action", "approved", None),
    ("pending_action", "rejected", None),
    ("qualified", "pending", None),
    ("queued", "pending", None),
    ("rejected", "pending", None),
    ("returned", "approved", None),  # its approval still governs a resale (a repost)
    ("error", "pending", None),
])
def test_a_decision_is_too_late_once_the_delivery_is_done(status, decision, why):
    found = too_late(decision, status, delivery_running=False)
    assert found is None if why is None else why in found
    assert found is None or found.startswith("approval: ")


def test_a_decision_starts_a_delivery_only_when_it_clears_a_held_lead_with_nothing_open_or_done():
    assert starts_delivery("qualified", "pending_action", delivery_open=False, delivered=False)
    assert not starts_delivery("qualified", "pending_action", delivery_open=True, delivered=False)
    assert not starts_delivery("qualified", "pending_action", delivery_open=False, delivered=True)
    assert not starts_delivery("qualified", "qualified", delivery_open=False, delivered=False)
    assert not starts_delivery("rejected", "pending_action", delivery_open=False, delivered=False)


@pytest.mark.parametrize(("approval", "status", "held"), [
    ("pending", "pending_action", True),
    ("rejected", "rejected", True),
    ("approved", "qualified", False),
    ("pending", "delivered", False),
    ("pending", "failed", False),
])
def test_holds_delivery(approval, status, held):
    assert holds_delivery(Approval(status=approval), status) is held
    assert holds_delivery(None, status) is False


@pytest.mark.parametrize(("status", "approval", "held"), [
    ("qualified", "pending", "pending_action"),
    ("qualified", "rejected", "rejected"),
    ("qualified", "approved", None),
    ("disqualified", "pending", None),
    ("duplicate", "rejected", None),
])
def test_a_lead_that_qualifies_again_is_held_by_an_open_or_refused_approval(status, approval, held):
    from appliance.domain.approval import held_by_approval

    assert held_by_approval(status, Approval(status=approval)) == held
    assert held_by_approval(status, None) is None
