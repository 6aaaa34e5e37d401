from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from appliance.domain.campaign import DeliveryLimit, SourceCap
from appliance.domain.caps import (
    cap_applies, cap_reached, local_to_utc, period_bounds, zone,
)

NY = ZoneInfo("America/New_York")
TOKYO = ZoneInfo("Asia/Tokyo")


def utc(*args):
    return datetime(*args, tzinfo=UTC)


def test_daily_on_spring_forward_day_is_23_hours():
    start, end = period_bounds("daily", utc(2024, 3, 10, 12), NY)
    assert (start, end) == (utc(2024, 3, 10, 5), utc(2024, 3, 11, 4))
    assert end - start == timedelta(hours=23)


def test_daily_on_fall_back_day_is_25_hours():
    start, end = period_bounds("daily", utc(2024, 11, 3, 12), NY)
    assert (start, end) == (utc(2024, 11, 3, 4), utc(2024, 11, 4, 5))
    assert end - start == timedelta(hours=25)


def test_hourly_repeated_hour_is_two_periods():
    assert period_bounds("hourly", utc(2024, 11, 3, 5, 30), NY) == (utc(2024, 11, 3, 5),
                                                                     utc(2024, 11, 3, 6))
    assert period_bounds("hourly", utc(2024, 11, 3, 6, 30), NY) == (utc(2024, 11, 3, 6),
                                                                     utc(2024, 11, 3, 7))


def test_hourly_half_hour_zone():
    start, end = period_bounds("hourly", utc(2024, 6, 15, 5, 10), ZoneInfo("Asia/Kolkata"))
    assert (start, end) == (utc(2024, 6, 15, 4, 30), utc(2024, 6, 15, 5, 30))


def test_weekly_starts_monday_across_dst():
    start, end = period_bounds("weekly", utc(2024, 3, 10, 12), NY)  # a Sunday
    assert (start, end) == (utc(2024, 3, 4, 5), utc(2024, 3, 11, 4))


def test_monthly_and_year_rollover():
    assert period_bounds("monthly", utc(2024, 3, 20), NY) == (utc(2024, 3, 1, 5),
                                                              utc(2024, 4, 1, 4))
    assert period_bounds("monthly", utc(2024, 12, 31, 12), NY) == (utc(2024, 12, 1, 5),
                                                                   utc(2025, 1, 1, 5))


def test_midnight_in_non_utc_zone():
    # 15:00 UTC is midnight in Tokyo: the day turns there, not at UTC midnight.
    assert period_bounds("daily", utc(2024, 6, 14, 14, 59), TOKYO) == (utc(2024, 6, 13, 15),
                                                                       utc(2024, 6, 14, 15))
    assert period_bounds("daily", utc(2024, 6, 14, 15, 0), TOKYO) == (utc(2024, 6, 14, 15),
                                                                      utc(2024, 6, 15, 15))


def test_lifetime_and_unknown():
    assert period_bounds("lifetime", utc(2024, 1, 1), NY) == (None, None)
    with pytest.raises(ValueError):
        period_bounds("fortnightly", utc(2024, 1, 1), NY)


def test_naive_now_is_utc():
    assert period_bounds("daily", datetime(2024, 6, 14, 15), TOKYO)[0] == utc(2024, 6, 14, 15)


def test_local_to_utc_gap_and_repeat():
    assert local_to_utc(datetime(2024, 3, 10, 2, 30), NY) == utc(2024, 3, 10, 7)
    assert local_to_utc(datetime(2024, 3, 10, 3, 0), NY) == utc(2024, 3, 10, 7)
    assert local_to_utc(datetime(2024, 11, 3, 1, 30), NY) == utc(2024, 11, 3, 5, 30)


def test_zone_falls_back_to_utc():
    assert zone("Not/AZone") == ZoneInfo("UTC")
    assert zone(None) == ZoneInfo("UTC")
    assert zone("Asia/Tokyo") == TOKYO


def test_cap_applies_active_and_date_range():
    cap = SourceCap(cap=10, start_date="2024-06-15", end_date="2024-06-15")
    assert not cap_applies(cap, utc(2024, 6, 15, 3, 59), NY)  # 23:59 on the 14th in New York
    assert cap_applies(cap, utc(2024, 6, 15, 4), NY)
    assert cap_applies(cap, utc(2024, 6, 16, 3, 59), NY)  # end date is inclusive
    assert not cap_applies(cap, utc(2024, 6, 16, 4), NY)
    cap.active = False
    assert not cap_applies(cap, utc(2024, 6, 15, 12), NY)


def test_cap_applies_with_timestamps():
    # A naive start is New York wall-clock time; an end timestamp is inclusive.
    limit = DeliveryLimit(cap=1, start_date="2024-06-15T09:00:00",
                          end_date="2024-06-15T18:00:00Z")
    assert not cap_applies(limit, utc(2024, 6, 15, 12, 59), NY)
    assert cap_applies(limit, utc(2024, 6, 15, 13), NY)
    assert cap_applies(limit, utc(2024, 6, 15, 18), NY)
    assert not cap_applies(limit, utc(2024, 6, 15, 18, 0, 1), NY)


def test_cap_applies_without_range():
    assert cap_applies(SourceCap(cap=1), utc(2024, 1, 1), NY)


def test_cap_reached():
    assert cap_reached(5, SourceCap(cap=5))
    assert not cap_reached(4, SourceCap(cap=5))
    assert cap_reached(0, DeliveryLimit(cap=0))


def test_hourly_period_contains_now_across_a_half_hour_dst_shift():
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo

    from appliance.domain.caps import period_bounds

    now = datetime(2028, 4, 1, 15, 0, tzinfo=UTC)  # Lord Howe leaves its 30-minute daylight time
    start, end = period_bounds("hourly", now, ZoneInfo("Australia/Lord_Howe"))
    assert start <= now < end
