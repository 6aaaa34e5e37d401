"""appliance/domain/delivery_target: the campaign's endpoint, unless the latest repost named another."""

from __future__ import annotations

from appliance.domain.campaign import Campaign, Delivery
from appliance.domain.delivery_target import REPOST_EVENT, delivery_endpoint_id, endpoint_override
from appliance.domain.lead import CampaignSnapshot, JourneyEvent, Submission


def submission(*events: JourneyEvent) -> Submission:
    return Submission(submission_id="sub_1", lead_id="lead_1", submission_number=1,
                      campaign=CampaignSnapshot(campaign_id="C01"), status="qualified", journey_events=list(events),
                      created_at="2026-11-24T00:00:00.000Z", updated_at="2026-11-24T00:00:00.000Z")


CAMPAIGN = Campaign(campaign_id="C01", name="C", delivery=Delivery(delivery_endpoint_id="own"))


def test_the_campaigns_endpoint_without_a_repost_naming_another():
    plain = submission(JourneyEvent(type="received"), JourneyEvent(type=REPOST_EVENT, details={"reason": "x"}))
    assert endpoint_override(plain) is None
    assert delivery_endpoint_id(plain, CAMPAIGN) == "own"


def test_the_latest_repost_that_names_an_endpoint_wins():
    reposted = submission(JourneyEvent(type=REPOST_EVENT, details={"deliveryEndpointId": "first"}),
                          JourneyEvent(type="delivery_error"),
                          JourneyEvent(type=REPOST_EVENT, details={"deliveryEndpointId": "second"}))
    assert delivery_endpoint_id(reposted, CAMPAIGN) == "second"
