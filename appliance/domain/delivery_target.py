"""Which delivery endpoint a submission goes to, or went to: the endpoint its latest delivery
attempt named (each attempt's journey event carries `deliveryEndpointId`), else the one a repost
named (`deliveryInfo.deliveryEndpointId`, kept in the repost's journey event), else its
campaign's."""

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


def delivery_endpoint_id(submission: Submission, campaign: Campaign | None) -> str | None:
    for item in reversed(submission.journey_events):
        if item.details and item.details.get("deliveryEndpointId"):
            return item.details["deliveryEndpointId"]  # an attempt's, or a repost's
    return campaign.delivery.delivery_endpoint_id if campaign is not None else None
