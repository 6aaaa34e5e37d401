"""What a human decision does to a lead and its delivery.

A decision governs a delivery not yet made. One that comes too late to take effect (the lead's
delivery under way, delivered or failed: `too_late`) is refused and not recorded. Once a lead has
otherwise left the statuses an approval holds it in, a decision is recorded and changes nothing
else: it never makes a lead repostable or sends it again, and `approved` never starts a second
delivery of a submission whose delivery succeeded or is under way."""

from __future__ import annotations

from appliance.domain.lead import Approval, ApprovalStatus

# The statuses of a lead whose delivery an approval still governs: held, cleared and waiting to
# be sent (or for its documents to be signed), waiting for a window, or refused. Not `delivered`
# nor `returned`: a decision never changes a lead a buyer took or sent back.
GOVERNED_STATUSES = frozenset({"pending_action", "qualified", "queued", "rejected", "document_sent", "signed"})


def too_late(decision: ApprovalStatus, lead_status: str, *, delivery_running: bool) -> str | None:
    """Why `decision` can no longer take effect on the lead (the 409's detail), or None.
    `delivery_running`: an attempt to deliver the lead (any submission's) is running (claimed by
    the worker): it cannot be called back, so even a reset would be answered by a delivery. After
    a failure a reset is refused too: it could change nothing (only a repost sends a failed lead
    again, and the repost decides the approval itself). A reset of a delivered lead is kept: it is
    recorded, the lead stays delivered, and a delivered lead is never sent again whatever its
    approval says."""
    if delivery_running:
        return "approval: the lead's delivery is already under way and cannot be called back"
    if lead_status == "failed":
        return "approval: the lead's delivery already failed; repost the lead to send it again"
    if lead_status == "delivered" and decision != "pending":
        return "approval: the lead is already delivered; a decision no longer changes it"
    return None


def status_after_decision(lead_status: str, decision: ApprovalStatus) -> str:
    if lead_status not in GOVERNED_STATUSES:
        return lead_status
    if decision == "approved":
        return "qualified" if lead_status == "pending_action" else lead_status
    if decision == "rejected":
        return "rejected"
    return "pending_action"


def holds_documents(approval: Approval | None) -> bool:
    """Whether a lead's documents must not be sent or settled now: a person's decision on it is
    open or refused (a decision made while they were under way stops them where they are)."""
    return approval is not None and approval.status in ("pending", "rejected")


def holds_delivery(approval: Approval | None, lead_status: str) -> bool:
    """Whether a delivery job of the lead must not send now: its approval is open or refused and
    the lead waits on it."""
    return (approval is not None and approval.status in ("pending", "rejected")
            and lead_status in ("pending_action", "rejected"))


def starts_delivery(new_status: str, old_status: str, *, delivery_open: bool, delivered: bool) -> bool:
    """Whether a decision that left the lead at `new_status` schedules its submission's delivery:
    only when it cleared a held lead, and never beside an open delivery job or after a success."""
    return new_status == "qualified" and old_status != "qualified" and not delivery_open and not delivered


def held_by_approval(status: str, approval: Approval | None) -> str | None:
    """The status a lead that qualified again takes while its approval is open (`pending_action`)
    or refused (`rejected`): a resubmission must not slip past a human decision. None when
    nothing holds it."""
    if status == "qualified" and approval is not None and approval.status in ("pending", "rejected"):
        return "pending_action" if approval.status == "pending" else "rejected"
    return None
