"""Time as the service sees it. Code that needs "now" takes a Clock so tests can move time."""

from __future__ import annotations

from datetime import datetime, timezone


class Clock:
    def now(self) -> datetime:
        return datetime.now(timezone.utc)


def iso(moment: datetime) -> str:
    """The interface's timestamp form: ISO 8601, UTC, milliseconds, `Z`."""
    m = moment.astimezone(timezone.utc)
    return f"{m.year:04d}-{m.month:02d}-{m.day:02d}T{m.hour:02d}:{m.minute:02d}:{m.second:02d}.{m.microsecond // 1000:03d}Z"


def now_iso(clock: Clock | None = None) -> str:
    return iso((clock or Clock()).now())
