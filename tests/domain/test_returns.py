"""appliance/domain/returns: whether a delivered lead may be returned, and the entries reversing
the revenue of its delivery."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from appliance.domain.ledger import LedgerLine
from appliance.domain.returns import return_milestone, return_refusal, reversal_lines

DELIVERED = datetime(2026, 3, 10, 15, 0, tzinfo=UTC)


@pytest.mark.parametrize("after", [timedelta(0), timedelta(days=29, hours=23), timedelta(days=30)])
def test_a_delivered_lead_may_be_returned_inside_its_window(after):
    assert return_refusal("delivered", DELIVERED, 30, DELIVERED + after) is None


def test_the_window_closes_after_its_last_moment():
    refusal = return_refusal("delivered", DELIVERED, 30, DELIVERED + timedelta(days=30, milliseconds=1))
    assert refusal == "returnWindowDays: the return window of 30 days closed at 2026-04-09T15:00:00.000Z"
    assert return_refusal("delivered", DELIVERED, 1, DELIVERED + timedelta(days=2)).startswith(
        "returnWindowDays: the return window of 1 days closed")


def test_an_endpoint_with_a_window_of_zero_takes_no_returns():
    assert return_refusal("delivered", DELIVERED, 0, DELIVERED) == \
        "returnWindowDays: the delivery endpoint takes no returns (returnWindowDays is 0)"


@pytest.mark.parametrize("status", ["new", "pending", "qualified", "queued", "pending_action", "failed",
                                    "rejected", "error", "disqualified", "duplicate"])
def test_only_a_delivered_lead_may_be_returned(status):
    assert return_refusal(status, DELIVERED, 30, DELIVERED) == \
        f"status: the lead is {status}; only a delivered lead can be returned"


def test_a_returned_lead_is_not_returned_twice():
    assert return_refusal("returned", DELIVERED, 30, DELIVERED) == "status: the lead is returned already"


def test_a_delivery_without_a_time_cannot_be_measured():
    assert return_refusal("delivered", None, 30, DELIVERED).startswith("delivery: ")


def test_the_status_is_checked_before_the_window():
    assert return_refusal("failed", None, 0, DELIVERED).startswith("status: ")


def test_reversal_is_one_negative_line_per_currency():
    lines = reversal_lines([(10.0, "USD", None, None), (2.5, "USD", None, None), (7.0, "EUR", None, None)],
                           submission_id="sub_1", campaign_id="C1", client_id="cli", source_id="web",
                           delivery_endpoint_id="ep")
    assert lines == [
        LedgerLine("return", "return:sub_1:USD", "returned", -12.5, "USD", "C1", "cli", "web", "ep"),
        LedgerLine("return", "return:sub_1:EUR", "returned", -7.0, "EUR", "C1", "cli", "web", "ep"),
    ]


def test_a_lead_sold_to_several_buyers_gives_each_its_own_money_back():
    lines = reversal_lines([(30.0, "USD", "cli-a", "a"), (20.0, "USD", "cli-b", "b")], submission_id="sub_1",
                           campaign_id="C1", client_id="campaign-client", source_id=None, delivery_endpoint_id="b")
    assert lines == [
        LedgerLine("return", "return:sub_1:USD", "returned", -30.0, "USD", "C1", "cli-a", None, "a"),
        LedgerLine("return", "return:sub_1:USD:b", "returned", -20.0, "USD", "C1", "cli-b", None, "b"),
    ]


def test_no_revenue_no_reversal():
    assert reversal_lines([], submission_id="sub_1", campaign_id="C1", client_id=None, source_id=None,
                          delivery_endpoint_id=None) == []


def test_the_milestone_identity_is_per_submission_and_currency():
    assert return_milestone("sub_1", "USD") == "return:sub_1:USD"
    assert return_milestone("sub_1", "USD") != return_milestone("sub_2", "USD")
