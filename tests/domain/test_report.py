"""domain/report.py: a summary query's range as quarter-hour buckets, in the request's zone,
and the rows and totals folded from rollup rows."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from appliance.domain.report import ReportQueryError, money, report_range, summarize

NOW = datetime(2026, 3, 10, 15, 0, tzinfo=UTC)


def bucket(*args) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp()) // 900


def problems(*args) -> list[str]:
    with pytest.raises(ReportQueryError) as caught:
        report_range(*args, NOW)
    return caught.value.problems


def test_the_default_is_the_last_thirty_days_through_today_in_the_zone():
    span = report_range(None, None, None, None, NOW)
    assert (span.group_by, span.timezone) == ("campaign", "UTC")
    assert (span.first, span.end) == (bucket(2026, 2, 9), bucket(2026, 3, 11))
    tokyo = report_range(None, None, None, "Asia/Tokyo", datetime(2026, 3, 10, 16, 0, tzinfo=UTC))  # 01:00 on the 11th
    assert (tokyo.start_iso, tokyo.end_iso) == ("2026-02-09T15:00:00.000Z", "2026-03-11T15:00:00.000Z")
    only_end = report_range(None, None, "2026-01-31", None, NOW)
    assert (only_end.first, only_end.end) == (bucket(2026, 1, 2), bucket(2026, 2, 1))
    only_start = report_range(None, "2026-03-01", None, None, NOW)
    assert (only_start.first, only_start.end) == (bucket(2026, 3, 1), bucket(2026, 3, 11))
    future = report_range(None, "2027-01-01", None, None, NOW)  # through its own day, not an error
    assert (future.first, future.end) == (bucket(2027, 1, 1), bucket(2027, 1, 2))


def test_dates_are_whole_local_days_and_timestamps_take_whole_quarter_hours():
    kolkata = report_range("day", "2026-03-01", "2026-03-10", "Asia/Kolkata", NOW)
    assert (kolkata.start_iso, kolkata.end_iso) == ("2026-02-28T18:30:00.000Z", "2026-03-10T18:30:00.000Z")
    new_york = report_range("day", "2026-03-08", "2026-03-08", "America/New_York", NOW)  # a 23-hour day
    assert (new_york.start_iso, new_york.end_iso) == ("2026-03-08T05:00:00.000Z", "2026-03-09T04:00:00.000Z")
    stamps = report_range(None, "2026-03-10T10:07:00Z", "2026-03-10T10:59:59.999+00:00", None, NOW)
    assert (stamps.start_iso, stamps.end_iso) == ("2026-03-10T10:00:00.000Z", "2026-03-10T11:00:00.000Z")
    # A timestamp without an offset is a wall-clock time in the zone.
    local = report_range(None, "2026-03-10T10:00:00", "2026-03-10T10:00:00", "Asia/Kolkata", NOW)
    assert (local.start_iso, local.end_iso) == ("2026-03-10T04:30:00.000Z", "2026-03-10T04:45:00.000Z")


def test_day_keys_are_local_dates_and_whole_utc_days_only_where_midnights_agree():
    utc = report_range("day", "2026-03-01", "2026-03-10", None, NOW)
    assert utc.utc_days and utc.day_of(bucket(2026, 3, 10, 23, 45)) == "2026-03-10"
    kolkata = report_range("day", "2026-03-01", "2026-03-10", "Asia/Kolkata", NOW)
    assert not kolkata.utc_days
    assert kolkata.day_of(bucket(2026, 3, 10, 18, 15)) == "2026-03-10"
    assert kolkata.day_of(bucket(2026, 3, 10, 18, 30)) == "2026-03-11"
    assert report_range("day", "2026-01-01", "2026-01-31", "Europe/London", NOW).utc_days  # GMT in winter
    assert not report_range("day", "2026-03-01", "2026-04-30", "Europe/London", NOW).utc_days  # BST from 29 March
    assert report_range("campaign", "2026-03-01", "2026-03-10", "Asia/Kolkata", NOW).utc_days


def test_far_dates_are_answered_not_overflowed():
    first = report_range("day", "0001-01-01", "0001-01-01", "Asia/Kolkata", NOW)
    last = report_range("day", "9999-12-31", "9999-12-31", "Pacific/Kiritimati", NOW)
    assert first.first < first.end and last.first < last.end
    assert first.day_of(first.first) == "0001-01-01" and last.day_of(last.first) == "9999-12-31"
    assert report_range(None, "9999-12-31T23:59:59.999-14:00", None, "Pacific/Kiritimati", NOW).end_iso \
        == "9999-12-31T23:59:59.999Z"


@pytest.mark.parametrize(("args", "says"), [
    (("week", None, None, None), ["groupBy: must be one of campaign, client, source, endpoint, day"]),
    ((None, None, None, "Mars/Base"), ["timezone: unknown time zone (an IANA name such as America/New_York)"]),
    ((None, None, None, "../../etc/passwd"), ["timezone: unknown time zone (an IANA name such as America/New_York)"]),
    ((None, "March", "2026-02-30", None), ["startDate: must be a date (YYYY-MM-DD) or an ISO 8601 timestamp",
                                           "endDate: must be a date (YYYY-MM-DD) or an ISO 8601 timestamp"]),
    ((None, "2026-03-10", "2026-03-09", None), ["endDate: must not be before startDate"]),
    (("hour", "x", None, None), ["groupBy: must be one of campaign, client, source, endpoint, day",
                                 "startDate: must be a date (YYYY-MM-DD) or an ISO 8601 timestamp"]),
])
def test_bad_queries_name_each_field(args, says):
    assert problems(*args) == says


def test_rows_per_key_and_currency_with_totals():
    span = report_range("source", None, None, None, NOW)
    counts = [("web", "delivered", 2), ("web", "failed", 1), ("", "queued", 4), ("web", "delivered", 1),
              ("gone", "returned", 1)]
    amounts = [("web", "USD", 1.0, 0.1, 0.0), ("web", "USD", 0.0, 0.2, -0.1), ("web", "EUR", 0.0, 5.0, 0.0),
               ("", "EUR", 2.0, 0.0, 0.0)]
    data = summarize(span, counts, amounts, {"web": "Web form"})
    # Sorted by label, "(none)" last; within a key the main currency (most money moved: EUR) first,
    # the lead counters on that first row only; a key the catalog lost keeps its id as label.
    assert [(r.key, r.label, r.currency, r.leads, r.delivered, r.cost, r.revenue, r.margin) for r in data.rows] == [
        ("gone", "gone", None, 1, 0, 0.0, 0.0, 0.0),
        ("web", "Web form", "EUR", 4, 3, 0.0, 5.0, 5.0),
        ("web", "Web form", "USD", 0, 0, 1.0, 0.2, -0.8),
        (None, "(none)", "EUR", 4, 0, 2.0, 0.0, -2.0),
    ]
    totals = data.totals
    assert (totals.leads, totals.delivered, totals.failed, totals.returned) == (9, 3, 1, 1)
    assert (totals.currency, totals.cost, totals.revenue, totals.margin) == ("EUR", 2.0, 5.0, 3.0)
    assert [(c.currency, c.cost, c.revenue, c.margin) for c in totals.by_currency] == [
        ("EUR", 2.0, 5.0, 3.0), ("USD", 1.0, 0.2, -0.8)]


def test_day_rows_fold_buckets_into_local_days_in_date_order():
    span = report_range("day", "2026-03-09", "2026-03-11", "Asia/Kolkata", NOW)
    counts = [(bucket(2026, 3, 10, 23, 30), "delivered", 1), (bucket(2026, 3, 10, 12), "qualified", 2),
              (bucket(2026, 3, 10, 18, 30), "delivered", 1)]
    amounts = [(bucket(2026, 3, 10, 23, 30), "USD", 0.0, 10.0, -10.0)]
    data = summarize(span, counts, amounts, {})
    assert [(r.key, r.label, r.leads, r.revenue, r.currency) for r in data.rows] == [
        ("2026-03-10", "2026-03-10", 2, 0.0, None), ("2026-03-11", "2026-03-11", 2, 0.0, "USD")]


def test_money_drops_float_noise_and_negative_zero():
    assert money(0.1 + 0.2) == 0.3 and str(money(-1e-12)) == "0.0" and money(2.0000004) == 2.0
