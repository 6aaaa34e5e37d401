"""Verification steps (`qualification.verifications`): which steps check a lead, what a step's
outcome does under its `onFail` / `onUnknown` policy, and what the steps of one lead come to
together. Pure: services/verification.py runs the steps, intake and the deferred evaluation
apply the verdict to what routing and qualification decided.

Decisions:
- A step checks a lead when a uniform draw in [0, 1) is below its `sample` (1: every lead, 0:
  none). A step left out has no result: rules see `verification.<name>` missing.
- `pass` lets the lead go on; `fail` does what `onFail` says (disqualify, review, flag) and
  `unknown` what `onUnknown` says (pass, review, error).
- The steps of a lead come to their most severe action: disqualify > error > review > flag >
  pass; the first step (in the campaign's order) with that action gives the reason.
- The verdict never undoes rules: a lead the rules disqualified stays disqualified with their
  reason. Otherwise `disqualify` disqualifies, `error` sets the lead to `error`, `review` holds
  it for a person's decision (an approval, as a rule of severity `review` does) and `flag` only
  marks the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal

import msgspec

from appliance.domain.campaign import Verification
from appliance.domain.lead import Approval, JourneyEvent
from appliance.domain.pipeline import Evaluation, event

Outcome = Literal["pass", "fail", "unknown"]
Action = Literal["pass", "flag", "review", "error", "disqualify"]
OUTCOMES: Final = frozenset(("pass", "fail", "unknown"))
# What a step's `data` may be (a verifier's answer past either is `unknown`): its JSON size, and how
# deep its objects and lists nest (code that walks data recursively, a scrubber, a template, must
# never run out of stack on a lead).
MAX_DATA_BYTES: Final = 16 * 1024
MAX_DATA_DEPTH: Final = 32
_SEVERITY: Final = {"pass": 0, "flag": 1, "review": 2, "error": 3, "disqualify": 4}


class StepResult(msgspec.Struct, frozen=True):
    """What one step answered for one lead."""

    verifier: str
    outcome: Outcome
    reason: str | None = None
    data: dict[str, Any] = {}
    cached: bool = False  # reused from an earlier lead with the same value (the step's cacheSeconds)


class Verdict(msgspec.Struct, frozen=True):
    action: Action
    reason: str | None  # the deciding step's, for anything but pass
    results: dict[str, dict[str, Any]]  # verification.<name> = {outcome, reason, data}
    event: JourneyEvent  # `verified`, with each step's outcome and what it did


def nested_deeper(value: Any, limit: int = MAX_DATA_DEPTH) -> bool:
    """Whether objects and lists in `value` (plain JSON values) nest more than `limit` levels
    (`{}` is one level); walked without recursion."""
    pending = [(value, 1)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, (list, tuple)):
            children = node
        else:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children if isinstance(child, (dict, list, tuple)))
    return False


def sampled(step: Verification, draw: float) -> bool:
    """Whether `step` checks this lead; `draw` is uniform in [0, 1)."""
    return draw < step.sample


def action_of(step: Verification, outcome: str) -> Action:
    if outcome == "fail":
        return step.on_fail
    if outcome == "unknown":
        return step.on_unknown
    return "pass"


def _reason(result: StepResult) -> str:
    said = "failed" if result.outcome == "fail" else "could not tell"
    return f"verification {result.verifier} {said}: {result.reason}" if result.reason \
        else f"verification {result.verifier} {said}"


def judge(steps: Sequence[Verification], results: Sequence[StepResult], now: str) -> Verdict:
    """The verdict of a lead's steps; `results` holds one result per step that checked the lead
    (the others were left out by `sample`), in the steps' order."""
    action: Action = "pass"
    reason = None
    shown: dict[str, dict[str, Any]] = {}
    stored: dict[str, dict[str, Any]] = {}
    summary: list[str] = []
    found = iter(results)
    result = next(found, None)
    for step in steps:
        name = step.verifier
        if result is None or result.verifier != name:
            shown[name] = {"outcome": None, "action": "not_sampled"}
            summary.append(f"{name}: not sampled")
            continue
        step_action = action_of(step, result.outcome)
        stored[name] = {"outcome": result.outcome, "reason": result.reason, "data": result.data}
        shown[name] = {"outcome": result.outcome, "reason": result.reason, "action": step_action,
                       "cached": result.cached}
        summary.append(f"{name}: {result.outcome}" if step_action == "pass" else
                       f"{name}: {result.outcome} ({step_action})")
        if _SEVERITY[step_action] > _SEVERITY[action]:
            action, reason = step_action, _reason(result)
        result = next(found, None)
    return Verdict(action, reason, stored, event(now, "verified", "; ".join(summary), details={"steps": shown}))


def apply_verdict(evaluation: Evaluation, verdict: Verdict, now: str) -> Evaluation:
    """What routing and qualification decided, once the lead's steps have spoken (see the module
    docstring); the `verified` event comes first among the evaluation's events."""
    events = [verdict.event, *evaluation.events]
    if verdict.action in ("pass", "flag") or evaluation.status == "disqualified":
        return msgspec.structs.replace(evaluation, events=events)
    campaign, reason = evaluation.campaign, verdict.reason
    qualification = msgspec.structs.replace(evaluation.qualification, method="verification", reason=reason)
    if verdict.action == "disqualify":
        return Evaluation(campaign=campaign, status="disqualified", routing=evaluation.routing, events=events,
                          qualification=msgspec.structs.replace(qualification, passed=False))
    if verdict.action == "error":
        return Evaluation(campaign=campaign, status="error", qualification=qualification, routing=evaluation.routing,
                          events=events)
    events.append(event(now, "held_for_review", reason, campaign))
    return Evaluation(campaign=campaign, status="pending_action", qualification=qualification,
                      routing=evaluation.routing, approval=Approval(status="pending", campaign_id=campaign.campaign_id,
                                                                   reason=reason),
                      intake_action="human_review", events=events)
