"""Report summaries (GET /api/v1/reports/summary, `appliance report`): the range a query covers,
as quarter-hour buckets, and the rows and totals folded from the rollups' lead counts and money.

Pure: storage/reports.py reads the rollups for a bucket range, services/reports.py labels the
keys from the catalog. Buckets are quarter hours since the epoch (`unixepoch(createdAt) / 900`);
every UTC offset in use is a whole number of quarter hours, so a zone's midnights are bucket
edges and a day in any zone is a run of whole buckets. A timestamp bound that falls inside a
quarter hour takes in the whole quarter hour (the start rounds down, the end up)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from appliance.domain.caps import local_to_utc
from appliance.model import Model

GROUP_BY: tuple[str, ...] = ("campaign", "client", "source", "endpoint", "day")
GroupBy = Literal["campaign", "client", "source", "endpoint", "day"]
# `leads` counts every lead; each other counter the leads whose current status has its name.
COUNTERS: tuple[str, ...] = ("leads", "qualified", "delivered", "failed", "duplicate", "disqualified", "returned")
_STATUS_COUNTERS = frozenset(COUNTERS[1:])
QUARTER_SECONDS = 900
DAY_BUCKETS = 96  # quarter hours in a UTC day
DEFAULT_DAYS = 30
_CHECKED_DAYS = 1000  # groupBy=day: longer ranges read quarter hours only (see ReportRange.utc_days)
NONE_LABEL = "(none)"
_MS_PER_BUCKET = QUARTER_SECONDS * 1000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NAIVE_EPOCH = datetime(1970, 1, 1)


class ReportQueryError(ValueError):
    """The query's problems, each `field: problem`."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class ReportRange:
    """What a summary covers: quarter-hour buckets [first, end), grouped by `group_by`."""

    group_by: str
    zone: ZoneInfo
    first: int
    end: int
    utc_days: bool = True  # whole UTC days may be read as one bucket (see storage/reports.py)
    _days: dict[int, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def timezone(self) -> str:
        return self.zone.key

    def day_of(self, bucket: int) -> str:
        """The local date ("YYYY-MM-DD", the groupBy=day key) a bucket starts on."""
        day = self._days.get(bucket)
        if day is None:
            try:
                day = (_EPOCH + timedelta(seconds=bucket * QUARTER_SECONDS)).astimezone(self.zone).date().isoformat()
            except (OverflowError, ValueError):
                day = _iso(bucket)[:10]
            self._days[bucket] = day
        return day

    @property
    def start_iso(self) -> str:
        return _iso(self.first)

    @property
    def end_iso(self) -> str:
        return _iso(self.end)


def _iso(bucket: int) -> str:
    """The bucket's start as an interface timestamp (clamped to the years 1-9999)."""
    try:
        moment = _EPOCH + timedelta(seconds=bucket * QUARTER_SECONDS)
    except OverflowError:
        return "0001-01-01T00:00:00.000Z" if bucket < 0 else "9999-12-31T23:59:59.999Z"
    return f"{moment.year:04d}-{moment:%m-%dT%H:%M:%S}.000Z"


@lru_cache(maxsize=1)
def zone_names() -> frozenset[str]:
    """The zone names a report takes: those this install knows (tzdata and the system's)."""
    return frozenset(available_timezones())


def report_zone(name: str | None) -> ZoneInfo | None:
    """The IANA zone `name` (UTC when not given), or None when there is no such zone."""
    if name and name not in zone_names():
        return None
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a folder of zones, e.g. "America"
        return None


def _epoch_ms(moment: datetime) -> int:
    """Epoch milliseconds of an aware datetime (also when its UTC time is outside years 1-9999)."""
    offset = moment.utcoffset() or timedelta()
    return (moment.replace(tzinfo=None) - _NAIVE_EPOCH - offset) // timedelta(milliseconds=1)


def _local_ms(local: datetime, tz: ZoneInfo) -> int:
    """Epoch milliseconds of the naive wall-clock time `local` in `tz` (caps.local_to_utc)."""
    try:
        return _epoch_ms(local_to_utc(local, tz))
    except OverflowError:  # its UTC time is outside years 1-9999 (no DST there)
        return _epoch_ms(local.replace(tzinfo=tz))


def _midnight_ms(day: date, tz: ZoneInfo, *, after: bool = False) -> int:
    """Epoch milliseconds of the first instant of `day` (with `after`, of the day after it) in
    `tz`. Defined for every date (the day after 9999-12-31 too)."""
    if after:
        if day == date.max:
            return _midnight_ms(day, tz) + 86_400_000
        day += timedelta(days=1)
    return _local_ms(datetime.combine(day, time()), tz)


def _local_date(ms: int, tz: ZoneInfo) -> date:
    try:
        return (_EPOCH + timedelta(milliseconds=ms)).astimezone(tz).date()
    except OverflowError:
        return date.min if ms < 0 else date.max


def _bound(field_name: str, text: str, tz: ZoneInfo, *, end: bool, problems: list[str]) -> tuple[int, date] | None:
    """(epoch ms: the start, or the exclusive end; the local date it falls on) of a date or a
    timestamp. A date is a whole day in `tz`; a timestamp without an offset is read in `tz`; an
    end timestamp counts through its millisecond."""
    text = text.strip()
    try:
        if len(text) == 10 and text[4:5] == "-":
            day = date.fromisoformat(text)
            return _midnight_ms(day, tz, after=end), day
        if len(text) > 64:
            raise ValueError
        moment = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text)
        ms = _local_ms(moment, tz) if moment.tzinfo is None else _epoch_ms(moment)
        return (ms + 1 if end else ms), _local_date(ms, tz)
    except ValueError:
        problems.append(f"{field_name}: must be a date (YYYY-MM-DD) or an ISO 8601 timestamp")
    except OverflowError:
        problems.append(f"{field_name}: out of range")
    return None


def report_range(group_by: str | None, start: str | None, end: str | None, timezone: str | None,
                 now: datetime) -> ReportRange:
    """The range of a summary query; raises ReportQueryError naming each bad field. Without
    dates: the DEFAULT_DAYS days through today in `timezone`. Without `start`: the DEFAULT_DAYS
    days through `end`. Without `end`: through today (or through `start`'s day when later)."""
    problems: list[str] = []
    group = group_by or "campaign"
    if group not in GROUP_BY:
        problems.append(f"groupBy: must be one of {', '.join(GROUP_BY)}")
    tz = report_zone(timezone)
    if tz is None:
        problems.append("timezone: unknown time zone (an IANA name such as America/New_York)")
        raise ReportQueryError(problems)
    start_bound = _bound("startDate", start, tz, end=False, problems=problems) if start else None
    end_bound = _bound("endDate", end, tz, end=True, problems=problems) if end else None
    if problems:
        raise ReportQueryError(problems)
    if end_bound is None:
        last_day = max(now.astimezone(tz).date(), start_bound[1] if start_bound else date.min)
        end_bound = (_midnight_ms(last_day, tz, after=True), last_day)
    if start_bound is None:
        first_day = date.fromordinal(max(end_bound[1].toordinal() - (DEFAULT_DAYS - 1), 1))
        start_bound = (_midnight_ms(first_day, tz), first_day)
    (start_ms, first_day), (end_ms, last_day) = start_bound, end_bound
    if end is None:  # never before the start (a start past the year 9999 in the zone)
        end_ms = max(end_ms, start_ms + 1)
    if end_ms <= start_ms:
        raise ReportQueryError(["endDate: must not be before startDate"])
    first, last = start_ms // _MS_PER_BUCKET, -(-end_ms // _MS_PER_BUCKET)
    utc_days = True
    if group == "day":
        # Whole UTC days are one bucket of the daily rollup: usable when every local midnight
        # inside the range is a UTC midnight (UTC, or a zone at +00:00 all along).
        count = last_day.toordinal() - first_day.toordinal()
        utc_days = count <= _CHECKED_DAYS and all(
            _midnight_ms(first_day + timedelta(days=i), tz) % 86_400_000 == 0 for i in range(1, count + 1))
    return ReportRange(group, tz, first, last, utc_days)


# ---- the answer ---------------------------------------------------------------------------------

class ReportRow(Model):
    """One key in one currency. A key whose money is in several currencies has a row per
    currency, the lead counters on the first of them only; a key without money has one row with
    currency null."""
    key: str | None
    label: str
    leads: int
    qualified: int
    delivered: int
    failed: int
    duplicate: int
    disqualified: int
    returned: int
    cost: float
    revenue: float  # net of return entries
    margin: float   # revenue - cost
    currency: str | None


class CurrencyTotal(Model):
    currency: str
    cost: float
    revenue: float
    margin: float


class ReportTotals(Model):
    """The counters of every lead in the range; the money of the report's main currency (the
    one with the most money moved), and of every currency in `byCurrency`."""
    leads: int
    qualified: int
    delivered: int
    failed: int
    duplicate: int
    disqualified: int
    returned: int
    cost: float
    revenue: float
    margin: float
    currency: str | None
    by_currency: list[CurrencyTotal]


class ReportSummary(Model):
    group_by: GroupBy
    timezone: str
    range_start: str  # UTC, inclusive
    range_end: str    # UTC, exclusive
    rows: list[ReportRow]
    totals: ReportTotals


def money(value: float) -> float:
    """Sums of REAL amounts, without float noise (0.1 + 0.2) or a negative zero."""
    return round(value, 6) + 0.0


def summarize(span: ReportRange, counts: Iterable[tuple[str | int, str, int]],
              amounts: Iterable[tuple[str | int, str, float, float, float]],
              labels: Mapping[str, str]) -> ReportSummary:
    """Rows and totals from the rollups' (key, status, leads) and (key, currency, cost, revenue,
    returns) rows; a key may repeat. Keys are dimension values ('' for none) or, for groupBy=day,
    buckets. `labels` names keys (default: the key itself; no key: "(none)")."""
    by_day = span.group_by == "day"
    key_of = span.day_of if by_day else str
    counters: dict[str, dict[str, int]] = {}
    for key, status, leads in counts:
        slot = counters.setdefault(key_of(key), dict.fromkeys(COUNTERS, 0))  # type: ignore[arg-type]
        slot["leads"] += leads
        if status in _STATUS_COUNTERS:
            slot[status] += leads
    sums: dict[str, dict[str, list[float]]] = {}
    for key, currency, cost, revenue, returns in amounts:
        pair = sums.setdefault(key_of(key), {}).setdefault(currency, [0.0, 0.0])  # type: ignore[arg-type]
        pair[0] += cost
        pair[1] += revenue + returns
    per_currency: dict[str, list[float]] = {}
    for pairs in sums.values():
        for currency, (cost, revenue) in pairs.items():
            total = per_currency.setdefault(currency, [0.0, 0.0])
            total[0] += cost
            total[1] += revenue
    order = sorted(per_currency, key=lambda c: (-(abs(per_currency[c][0]) + abs(per_currency[c][1])), c))
    rank = {currency: i for i, currency in enumerate(order)}

    keys = set(counters) | set(sums)
    rows: list[ReportRow] = []
    zero = dict.fromkeys(COUNTERS, 0)
    for key in sorted(keys, key=(lambda k: k) if by_day else (lambda k: (k == "", labels.get(k, k).casefold(), k))):
        label = key if by_day else (labels.get(key, key) if key else NONE_LABEL)
        tally = counters.get(key, zero)
        currencies = sorted(sums.get(key, {}), key=rank.__getitem__) or [None]
        for i, currency in enumerate(currencies):
            cost, revenue = sums[key][currency] if currency is not None else (0.0, 0.0)
            rows.append(ReportRow(key=key or None, label=label, **(tally if i == 0 else zero), cost=money(cost),
                                  revenue=money(revenue), margin=money(revenue - cost), currency=currency))
    grand = dict.fromkeys(COUNTERS, 0)
    for tally in counters.values():
        for name, value in tally.items():
            grand[name] += value
    by_currency = [CurrencyTotal(currency=c, cost=money(per_currency[c][0]), revenue=money(per_currency[c][1]),
                                 margin=money(per_currency[c][1] - per_currency[c][0])) for c in order]
    main = by_currency[0] if by_currency else None
    totals = ReportTotals(**grand, cost=main.cost if main else 0.0, revenue=main.revenue if main else 0.0,
                          margin=main.margin if main else 0.0, currency=main.currency if main else None,
                          by_currency=by_currency)
    return ReportSummary(group_by=span.group_by, timezone=span.timezone,  # type: ignore[arg-type]
                         range_start=span.start_iso, range_end=span.end_iso, rows=rows, totals=totals)
