"""Cap periods for source caps and delivery limits.

Periods are calendar periods in the campaign's zone (weeks start on Monday) and are returned as
UTC instants, so a DST day is 23 or 25 hours long. A local boundary that falls in a DST gap
starts at the first instant that exists after it; one that falls in a repeated hour starts at
its first occurrence. Naive datetimes passed as `now_utc` are taken as UTC.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from appliance.domain.campaign import DeliveryLimit, SourceCap

_UTC_ZONE = ZoneInfo("UTC")


@lru_cache(maxsize=256)
def zone(name: str | None) -> ZoneInfo:
    """The IANA zone `name`; UTC when it is empty or unknown, so bad config cannot fail a lead."""
    if not name:
        return _UTC_ZONE
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return _UTC_ZONE


def as_utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def local_to_utc(local: datetime, tz: ZoneInfo) -> datetime:
    """The first UTC instant whose wall-clock time in `tz` is at or after the naive `local`.

    A repeated (fall-back) time gives its first occurrence; a skipped (spring-forward) time
    gives the transition instant, the first one that exists after it.
    """
    first = local.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if first.astimezone(tz).replace(tzinfo=None) == local:
        return first
    # In a gap: fold=1 maps before the transition, fold=0 after it. Bisect to the second.
    before = local.replace(tzinfo=tz, fold=1).astimezone(UTC)
    after = first
    offset = after.astimezone(tz).utcoffset()
    while after - before > timedelta(seconds=1):
        middle = before + (after - before) / 2
        if middle.astimezone(tz).utcoffset() == offset:
            after = middle
        else:
            before = middle
    return after.replace(microsecond=0) if after.microsecond else after


def _start_of_day(day: date, tz: ZoneInfo) -> datetime:
    return local_to_utc(datetime.combine(day, time()), tz)


def period_bounds(cap_type: str, now_utc: datetime,
                  tz: ZoneInfo) -> tuple[datetime | None, datetime | None]:
    """UTC [start, end) of the hourly/daily/weekly/monthly period containing `now_utc`."""
    if cap_type == "lifetime":
        return None, None
    now = as_utc(now_utc)
    local = now.astimezone(tz)
    if cap_type == "hourly":
        # Whole local hours; during a repeated hour each occurrence is its own period.
        start = local.replace(minute=0, second=0, microsecond=0).astimezone(UTC)
        # Around a DST change that is not a whole hour (Lord Howe shifts by 30 minutes) the local
        # hour's start can land on either side of `now`: keep the period that contains it.
        if start > now:
            start -= timedelta(hours=1)
        elif start + timedelta(hours=1) <= now:
            start += timedelta(hours=1)
        return start, start + timedelta(hours=1)
    today = local.date()
    if cap_type == "daily":
        first, following = today, today + timedelta(days=1)
    elif cap_type == "weekly":
        first = today - timedelta(days=today.weekday())
        following = first + timedelta(days=7)
    elif cap_type == "monthly":
        first = today.replace(day=1)
        following = (first + timedelta(days=32)).replace(day=1)
    else:
        raise ValueError(f"unknown cap type {cap_type!r}")
    return _start_of_day(first, tz), _start_of_day(following, tz)


def _iso_date(text: str) -> date | None:
    try:
        return date.fromisoformat(text)
    except ValueError:
        return None


def _bound(text: str | None, tz: ZoneInfo, *, end: bool) -> datetime | None:
    """A range bound as a UTC instant; an end bound is exclusive.

    A date covers its whole local day, so a date end is the next local midnight; a timestamp end
    is inclusive, so it is moved past its own instant. Unparseable bounds are ignored, so a typo
    never switches a cap off.
    """
    if not text:
        return None
    text = text.strip()
    try:
        # The same ISO 8601 readings the campaign validation accepts.
        day = _iso_date(text)
        if day is not None:
            return _start_of_day(day + timedelta(days=1) if end else day, tz)
        moment = datetime.fromisoformat(text)
        # A naive timestamp is wall-clock time in the zone.
        instant = local_to_utc(moment, tz) if moment.tzinfo is None else moment.astimezone(UTC)
        return instant + timedelta(microseconds=1) if end else instant
    except (ValueError, OverflowError):  # unparseable, or beyond the datetime range
        return None


def cap_applies(cap: SourceCap | DeliveryLimit, now_utc: datetime, tz: ZoneInfo) -> bool:
    """Active and within [startDate, endDate]; date bounds are whole days in `tz`."""
    if not cap.active:
        return False
    now = as_utc(now_utc)
    start = _bound(cap.start_date, tz, end=False)
    if start is not None and now < start:
        return False
    end = _bound(cap.end_date, tz, end=True)
    return end is None or now < end


def cap_reached(count: int, cap: SourceCap | DeliveryLimit) -> bool:
    """Whether `count` leads already in the period use the cap up (a cap of 0 blocks all)."""
    return count >= cap.cap
