from datetime import UTC, datetime

from appliance.domain.campaign import DeliverySchedule, ScheduleDay
from appliance.domain.schedule import is_open, next_open


def utc(*args):
    return datetime(*args, tzinfo=UTC)


def schedule(*days, tz="America/New_York"):
    return DeliverySchedule(timezone=tz, specific_days=[
        ScheduleDay(day=d, start_time=s, end_time=e, active=a) for d, s, e, a in days])


def test_no_days_is_always_open():
    s = DeliverySchedule()
    assert is_open(s, utc(2024, 6, 15, 3))
    assert next_open(s, utc(2024, 6, 15, 3)) == utc(2024, 6, 15, 3)


def test_window_start_inclusive_end_exclusive():
    s = schedule(("Monday", "09:00", "17:00", True))  # 2024-06-17 is a Monday, EDT
    assert not is_open(s, utc(2024, 6, 17, 12, 59))
    assert is_open(s, utc(2024, 6, 17, 13))
    assert is_open(s, utc(2024, 6, 17, 20, 59))
    assert not is_open(s, utc(2024, 6, 17, 21))
    assert next_open(s, utc(2024, 6, 17, 13, 30)) == utc(2024, 6, 17, 13, 30)
    assert next_open(s, utc(2024, 6, 17, 21)) == utc(2024, 6, 24, 13)


def test_window_across_midnight():
    s = schedule(("Friday", "22:00", "02:00", True))  # 2024-06-21 is a Friday
    assert is_open(s, utc(2024, 6, 22, 2))  # 22:00 Friday local
    assert is_open(s, utc(2024, 6, 22, 5, 59))  # 01:59 Saturday local
    assert not is_open(s, utc(2024, 6, 22, 6))
    assert not is_open(s, utc(2024, 6, 23, 5))  # 01:00 Sunday local: Saturday has no window
    assert next_open(s, utc(2024, 6, 22, 6)) == utc(2024, 6, 29, 2)


def test_end_of_day_and_full_day_windows():
    s = schedule(("Saturday", "20:00", "24:00", True), ("Sunday", "00:00", "00:00", True),
                 tz="UTC")
    assert is_open(s, utc(2024, 6, 15, 23, 59))
    assert is_open(s, utc(2024, 6, 16, 0))
    assert is_open(s, utc(2024, 6, 16, 23, 59))
    assert not is_open(s, utc(2024, 6, 17, 0))


def test_inactive_days_and_no_active_day():
    s = schedule(("Monday", "09:00", "17:00", False))
    assert not is_open(s, utc(2024, 6, 17, 14))
    assert next_open(s, utc(2024, 6, 17, 14)) is None


def test_non_utc_zone_day_boundary():
    s = schedule(("Saturday", "00:00", "01:00", True), tz="Asia/Tokyo")
    assert is_open(s, utc(2024, 6, 14, 15, 30))  # Saturday 00:30 in Tokyo, Friday in UTC
    assert next_open(s, utc(2024, 6, 14, 12)) == utc(2024, 6, 14, 15)


def test_spring_forward_gap_opens_at_first_existing_instant():
    s = schedule(("Sunday", "02:30", "05:00", True))  # 2024-03-10, 02:00 -> 03:00
    assert not is_open(s, utc(2024, 3, 10, 6, 59))
    assert is_open(s, utc(2024, 3, 10, 7))  # 03:00 EDT
    assert not is_open(s, utc(2024, 3, 10, 9))  # 05:00 EDT
    assert next_open(s, utc(2024, 3, 10, 0)) == utc(2024, 3, 10, 7)


def test_fall_back_repeated_hour_is_in_window():
    s = schedule(("Sunday", "01:00", "02:00", True))  # 2024-11-03, 02:00 -> 01:00
    assert is_open(s, utc(2024, 11, 3, 5))  # 01:00 EDT
    assert is_open(s, utc(2024, 11, 3, 6, 30))  # 01:30 EST, the repeat
    assert not is_open(s, utc(2024, 11, 3, 7))  # 02:00 EST


def test_next_open_follows_the_offset_change():
    s = schedule(("Monday", "09:00", "17:00", True))
    # Friday before the change (EST); the next Monday is in EDT.
    assert next_open(s, utc(2024, 3, 8, 22)) == utc(2024, 3, 11, 13)
    assert next_open(s, utc(2024, 3, 1, 22)) == utc(2024, 3, 4, 14)


def test_overnight_window_across_fall_back():
    s = schedule(("Saturday", "23:00", "03:00", True))  # night of 2024-11-02 is 5 hours long
    assert is_open(s, utc(2024, 11, 3, 3))  # 23:00 EDT
    assert is_open(s, utc(2024, 11, 3, 7, 59))  # 02:59 EST
    assert not is_open(s, utc(2024, 11, 3, 8))
