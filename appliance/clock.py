"""Time as the service sees it. Code that needs "now" takes a Clock so tests can move time."""

from __future__ import annotations

from datetime import datetime, timezone


class Clock:
    def now(self) -> datetime:
        return datetime.now(timezone.utc)


def iso(moment: datetime) -> str:
    """The interface's timestamp form: ISO 8601, UTC, milliseconds, `Z`."""
    if moment.tzinfo is not timezone.utc:
        moment = moment.astimezone(timezone.utc)
    return moment.isoformat(timespec="milliseconds")[:-6] + "Z"  # "+00:00" -> "Z"


def now_iso(clock: Clock | None = None) -> str:
    return iso((clock or Clock()).now())
