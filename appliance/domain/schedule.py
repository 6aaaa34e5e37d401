"""Delivery schedule windows.

A schedule without `specificDays` is always open. Each active day gives a window of local
HH:MM times in the schedule's zone: start inclusive, end exclusive, "24:00" is the end of the
day, an end earlier than the start runs past midnight into the next day, and an end equal to
the start spans 24 hours. Days with unreadable times are ignored. Local times map to UTC as in
`caps.local_to_utc`: a time skipped by a DST change opens at the first instant after the gap,
a repeated time at its first occurrence. An unknown zone is read as UTC.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import date, datetime, time, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from appliance.domain.campaign import DeliverySchedule
from appliance.domain.caps import as_utc, local_to_utc, zone

_WEEKDAYS = {
    "Monday": 0, "Tuesday": 1, "Wednesday": 2, "Thursday": 3,
    "Friday": 4, "Saturday": 5, "Sunday": 6,
}
_DAY_MINUTES = 24 * 60
_HHMM = re.compile(r"(\d{1,2}):(\d{2})", re.ASCII)
_SEARCH_DAYS = 8

Window = tuple[int, int, int]  # weekday, start and end in minutes after that day's midnight


@lru_cache(maxsize=512)
def _minutes(text: str) -> int | None:
    m = _HHMM.fullmatch(text.strip())
    if not m:
        return None
    hours, minutes = int(m[1]), int(m[2])
    if minutes > 59 or hours > 24 or (hours == 24 and minutes):
        return None
    return hours * 60 + minutes


def _windows(schedule: DeliverySchedule) -> list[Window]:
    windows = []
    for day in schedule.specific_days:
        weekday = _WEEKDAYS.get(day.day)
        start, end = _minutes(day.start_time), _minutes(day.end_time)
        if (not day.active or weekday is None or start is None or end is None
                or start == _DAY_MINUTES):
            continue
        if end <= start:
            end += _DAY_MINUTES
        windows.append((weekday, start, end))
    return windows


def _instances(windows: list[Window], first: date, days: int,
               tz: ZoneInfo) -> Iterator[tuple[datetime, datetime]]:
    """UTC [open, close) of each window on the local dates first .. first + days - 1."""
    for offset in range(days):
        day = first + timedelta(days=offset)
        midnight = datetime.combine(day, time())
        for weekday, start, end in windows:
            if weekday == day.weekday():
                yield (local_to_utc(midnight + timedelta(minutes=start), tz),
                       local_to_utc(midnight + timedelta(minutes=end), tz))


def is_open(schedule: DeliverySchedule, now_utc: datetime) -> bool:
    if not schedule.specific_days:
        return True
    tz = zone(schedule.timezone)
    now = as_utc(now_utc)
    # A window lasts at most a day, so only yesterday's and today's can contain now.
    yesterday = now.astimezone(tz).date() - timedelta(days=1)
    return any(start <= now < end
               for start, end in _instances(_windows(schedule), yesterday, 2, tz))


def next_open(schedule: DeliverySchedule, now_utc: datetime) -> datetime | None:
    """The UTC instant delivery may next happen: now when open, else the next window's opening
    within 8 days, None when no day is active."""
    now = as_utc(now_utc)
    if not schedule.specific_days:
        return now
    windows = _windows(schedule)
    if not windows:
        return None
    tz = zone(schedule.timezone)
    yesterday = now.astimezone(tz).date() - timedelta(days=1)
    upcoming = None
    for start, end in _instances(windows, yesterday, _SEARCH_DAYS + 2, tz):
        if start >= end or end <= now:
            continue
        if start <= now:
            return now
        if upcoming is None or start < upcoming:
            upcoming = start
    return upcoming
