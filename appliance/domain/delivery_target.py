"""Which delivery endpoint a submission goes to: its campaign's, unless a repost named another
(`deliveryInfo.deliveryEndpointId`, kept in the repost's journey event)."""

from __future__ import annotations

from appliance.domain.campaign import Campaign
from appliance.domain.lead import Submission

REPOST_EVENT = "repost"


def endpoint_override(submission: Submission) -> str | None:
    """The endpoint the latest repost of this submission named, or None."""
    for item in reversed(submission.journey_events):
        if item.type == REPOST_EVENT and item.details and item.details.get("deliveryEndpointId"):
            return item.details["deliveryEndpointId"]
    return None


def delivery_endpoint_id(submission: Submission, campaign: Campaign) -> str | None:
    return endpoint_override(submission) or campaign.delivery.delivery_endpoint_id
