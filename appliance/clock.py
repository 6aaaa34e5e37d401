"""Time as the service sees it. Code that needs "now" takes a Clock so tests can move time."""

from __future__ import annotations

import time
from datetime import datetime, timezone


class Clock:
    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def monotonic(self) -> float:
        """Seconds that only go forward (for intervals: the wall clock may be set back)."""
        return time.monotonic()


_UTC = timezone.utc
_EPOCH_SECOND = ((719163, 0, 0, 0), "1970-01-01T00:00:00")
# The two latest (whole UTC second, its "YYYY-MM-DDTHH:MM:SS"): a submit formats several
# timestamps within the same second, and formatting only the milliseconds halves the cost. Two,
# because a submit also formats its dedupe window's start (days earlier) between them: with one,
# each replaced the other. One tuple, swapped whole, so threads never see a second with another
# second's text.
_recent: tuple[tuple[tuple[int, int, int, int], str], ...] = (_EPOCH_SECOND, _EPOCH_SECOND)
# ".000Z" to ".999Z": looked up, a quarter of the cost of formatting them.
_MILLIS = tuple(f".{ms:03d}Z" for ms in range(1000))


def iso(moment: datetime) -> str:
    """The interface's timestamp form: ISO 8601, UTC, milliseconds, `Z`."""
    global _recent
    if moment.tzinfo is not _UTC:
        moment = moment.astimezone(_UTC)
    second = (moment.toordinal(), moment.hour, moment.minute, moment.second)  # exact, unlike a float timestamp
    recent = _recent
    if recent[0][0] == second:
        text = recent[0][1]
    elif recent[1][0] == second:
        text = recent[1][1]
    else:
        text = moment.isoformat(timespec="seconds")[:-6]  # without "+00:00"
        _recent = ((second, text), recent[0])
    return text + _MILLIS[moment.microsecond // 1000]


def now_iso(clock: Clock | None = None) -> str:
    return iso((clock or Clock()).now())
