"""appliance/domain/approval: what a decision does to a lead's status and its delivery."""

from __future__ import annotations

import pytest

from appliance.domain.approval import holds_delivery, starts_delivery, status_after_decision
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
