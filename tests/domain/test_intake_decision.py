"""appliance/domain/intake_decision: what a submission comes to once source checks, dedupe and the
evaluation are known."""

from __future__ import annotations

from appliance.domain.campaign import Campaign
from appliance.domain.intake_decision import decide_intake
from appliance.domain.lead import Approval, QualificationOutcome, RoutingOutcome
from appliance.domain.pipeline import Evaluation

NOW = "2026-11-24T00:00:00.000Z"
INTAKE = Campaign(campaign_id="IN1", name="Intake")
ROUTED = Campaign(campaign_id="RT1", name="Routed")


def evaluation(status: str = "qualified", approval: Approval | None = None) -> Evaluation:
    return Evaluation(campaign=ROUTED, status=status, approval=approval,
                      qualification=QualificationOutcome(passed=status == "qualified", reason=f"{status} by rules"),
                      routing=RoutingOutcome(was_routed=True))


def types(decision) -> list[str]:
    return [e.type for e in decision.events]


def test_a_source_refusal_disqualifies_before_anything_else():
    decision = decide_intake(intake=INTAKE, now=NOW, refused_at_source="daily source cap of 2 reached",
                             duplicate_of="lead_1", evaluation=evaluation(), approval=None)
    assert (decision.status, decision.campaign, decision.job) == ("disqualified", INTAKE, None)
    assert decision.reason == "daily source cap of 2 reached" and not decision.counts_against_caps
    assert decision.qualification.method == "source_check" and decision.qualification.passed is False
    assert types(decision) == ["source_check"]


def test_a_duplicate_takes_no_cap_slot_and_no_job():
    decision = decide_intake(intake=INTAKE, now=NOW, refused_at_source=None, duplicate_of="lead_1",
                             evaluation=evaluation(), approval=None)
    assert (decision.status, decision.reason, decision.job) == ("duplicate", "duplicate of lead_1", None)
    assert not decision.counts_against_caps and decision.events[0].details == {"originalLeadId": "lead_1"}


def test_without_an_evaluation_the_job_loop_evaluates_later():
    decision = decide_intake(intake=INTAKE, now=NOW, refused_at_source=None, duplicate_of=None, evaluation=None,
                             approval=None)
    assert (decision.status, decision.job, decision.counts_against_caps) == ("pending", "evaluate", True)
    assert types(decision) == ["evaluation_deferred"]


def test_a_qualified_lead_is_scheduled_for_delivery_to_the_campaign_it_was_routed_to():
    decision = decide_intake(intake=INTAKE, now=NOW, refused_at_source=None, duplicate_of=None,
                             evaluation=evaluation(), approval=None)
    assert (decision.status, decision.campaign, decision.job) == ("qualified", ROUTED, "deliver")
    assert decision.reason == "qualified by rules" and decision.routing.was_routed
    assert types(decision)[-1] == "delivery_scheduled"


def test_an_open_or_refused_approval_holds_a_lead_that_qualifies_again():
    for stored, held in (("pending", "pending_action"), ("rejected", "rejected")):
        decision = decide_intake(intake=INTAKE, now=NOW, refused_at_source=None, duplicate_of=None,
                                 evaluation=evaluation(), approval=Approval(status=stored))
        assert (decision.status, decision.job) == (held, None)
        assert types(decision) == ["held_by_approval"]


def test_the_evaluations_own_approval_replaces_the_stored_one():
    review = Approval(status="pending", campaign_id="RT1")
    decision = decide_intake(intake=INTAKE, now=NOW, refused_at_source=None, duplicate_of=None,
                             evaluation=evaluation("pending_action", review), approval=Approval(status="approved"))
    assert (decision.status, decision.approval, decision.job) == ("pending_action", review, None)
