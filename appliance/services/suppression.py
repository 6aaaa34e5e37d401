"""Suppression lists: create and list a tenant's lists, add and remove entries (through the API
in small sets, from a CSV file through `appliance suppress` in batches). Values are normalized as
a lead's email and phone are and stored as SHA-256 digests only (appliance/domain/suppression);
intake and the delivery worker check a campaign's `qualification.suppressionListIds`."""

from __future__ import annotations

import csv
import io
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Annotated

import msgspec
from msgspec import UNSET, Meta, UnsetType

from appliance.clock import iso
from appliance.domain.suppression import suppression_hash
from appliance.errors import NotFound, ValidationFailed
from appliance.ids import new_id
from appliance.model import Model
from appliance.runtime import Runtime
from appliance.services import audit
from appliance.storage import Session

MAX_VALUES = 1_000  # per field of one request (both fit in the 1 MiB body); larger sets: `appliance suppress`
BATCH_ROWS = 10_000  # rows of a CSV file per write
Value = Annotated[str, Meta(max_length=254)]


class SuppressionListCreate(Model):
    name: Annotated[str, Meta(min_length=1, max_length=200, pattern=r"^[^\x00]*[^\s\x00][^\x00]*$")]  # not blank, no NUL


class SuppressionList(Model):
    list_id: str
    name: str
    count: int
    created_at: str


class SuppressionListPage(Model):
    items: list[SuppressionList]
    next_cursor: str | None
    has_more: bool


class EntryChange(Model):
    # An empty list changes nothing (a client sending whatever its form holds may send none).
    add: Annotated[list[Value], Meta(max_length=MAX_VALUES)] | UnsetType = UNSET
    remove: Annotated[list[Value], Meta(max_length=MAX_VALUES)] | UnsetType = UNSET


class EntryChangeResult(Model):
    added: int
    removed: int
    count: int


def _listed(row: tuple) -> SuppressionList:
    list_id, name, created_at, count = row
    return SuppressionList(list_id=list_id, name=name, count=count, created_at=created_at)


async def create(runtime: Runtime, tenant_id: str, actor: str, body: SuppressionListCreate) -> SuppressionList:
    list_id, now = new_id("sup"), iso(runtime.clock.now())
    name = body.name.strip()

    def unit(tx: Session) -> None:
        tx.suppression.create_list(tenant_id, list_id, name, now)
        audit.record(tx, tenant_id, actor, "suppression.list_create", list_id, now, after={"name": name})

    await runtime.store.write(unit)
    return SuppressionList(list_id=list_id, name=name, count=0, created_at=now)


def page(runtime: Runtime, tenant_id: str, after: str | None, limit: int) -> SuppressionListPage:
    rows = runtime.store.reader().suppression.list_lists(tenant_id, after, limit + 1)
    items = [_listed(row) for row in rows[:limit]]
    more = len(rows) > limit
    return SuppressionListPage(items=items, next_cursor=items[-1].list_id if more else None, has_more=more)


def get(runtime: Runtime, tenant_id: str, list_id: str) -> SuppressionList:
    found = runtime.store.reader().suppression.get_list(tenant_id, list_id)
    if found is None:
        raise NotFound()
    return _listed(found)


def _hashes(region: str, name: str, values: list[str], problems: list[str]) -> list[bytes]:
    """The digests of `values`; each value that is neither an email nor a phone is a problem
    naming its place (never the value)."""
    found = []
    for i, value in enumerate(values):
        digest = suppression_hash(value, region)
        if digest is None:
            problems.append(f"{name}[{i}]: must be an email address or a phone number")
        else:
            found.append(digest)
    return found


async def change_entries(runtime: Runtime, tenant_id: str, actor: str, list_id: str,
                         body: EntryChange) -> EntryChangeResult:
    """The audit log keeps how many entries changed, never the values."""
    problems: list[str] = []
    if body.add is UNSET and body.remove is UNSET:
        problems.append("add: give values to add, remove or both")
    region = runtime.config.defaults.region
    adding = _hashes(region, "add", body.add, problems) if body.add is not UNSET else []
    removing = _hashes(region, "remove", body.remove, problems) if body.remove is not UNSET else []
    if set(adding) & set(removing):
        problems.append("remove: a value may not be both added and removed")
    if problems:
        raise ValidationFailed(problems)

    now = iso(runtime.clock.now())

    def unit(tx: Session) -> EntryChangeResult:
        found = tx.suppression.get_list(tenant_id, list_id)
        if found is None:
            raise NotFound()
        added = tx.suppression.add_many(list_id, adding)
        removed = tx.suppression.remove_many(list_id, removing)
        result = EntryChangeResult(added=added, removed=removed, count=tx.suppression.count(list_id))
        if added or removed:
            audit.record(tx, tenant_id, actor, "suppression.entries_change", list_id, now,
                         before={"count": _listed(found).count}, after=msgspec.to_builtins(result))
        return result

    return await runtime.store.write(unit, may_refuse=True)


# ---- bulk loading from CSV (the CLI) ------------------------------------------------------------

class CsvProblem(Exception):
    """A CSV file that cannot be loaded at all (the header names no email or phone column)."""


@dataclass
class BulkReport:
    list_id: str
    rows: int = 0  # data rows read
    values: int = 0  # valid values found in them
    changed: int = 0  # added (or removed) entries: values already there (or absent) are skipped
    bad_rows: int = 0
    bad_examples: list[str] = field(default_factory=list)  # the first few, by row number
    count: int = 0  # the list's entries afterwards

    @property
    def skipped(self) -> int:
        return self.values - self.changed

    def as_dict(self, remove: bool) -> dict:
        return {"listId": self.list_id, "rows": self.rows, "removed" if remove else "loaded": self.changed,
                "skipped": self.skipped, "badRows": self.bad_rows, "badRowExamples": self.bad_examples,
                "count": self.count}


MAX_EXAMPLES = 5
_COLUMNS = ("email", "phone")


def csv_rows(text: Iterable[str]) -> Iterator[tuple[int, list[str]]]:
    """(row number, values) of each data row: the values of its `email` and `phone` columns when
    the header names either, else of its single column (a first row that is not a value is a
    header). Row numbers count the file's lines from 1, the header included."""
    reader = csv.reader(text)
    first = next(reader, None)
    if first is None:
        return
    header = [cell.strip().lower() for cell in first]
    columns = [i for i, name in enumerate(header) if name in _COLUMNS]
    if not columns:
        if len(first) > 1:
            raise CsvProblem("the header names neither an email nor a phone column")
        if suppression_hash(first[0], None) is not None or "@" in first[0] or any(c.isdigit() for c in first[0]):
            yield 1, first  # no header: the first row is a value
        columns = [0]
    for number, row in enumerate(reader, start=2):
        if not any(cell.strip() for cell in row):
            continue  # blank lines are not rows
        yield number, [row[i] for i in columns if i < len(row) and row[i].strip()]


def open_csv(runtime: Runtime, tenant_id: str, list_id: str, data: bytes) -> Iterator[tuple[int, list[str]]]:
    """The rows of a CSV file for `load_rows`, once the list, the encoding and the header are
    checked (NotFound, CsvProblem): a refusal comes before any progress is shown."""
    if runtime.store.reader().suppression.get_list(tenant_id, list_id) is None:
        raise NotFound()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CsvProblem(f"the file is not UTF-8 text (byte {exc.start})") from None
    rows = csv_rows(io.StringIO(text, newline=""))
    try:
        first = next(rows, None)
    except csv.Error as exc:
        raise CsvProblem(f"row 1: {exc}") from None
    return itertools.chain([first] if first is not None else [], rows)


def load_rows(runtime: Runtime, tenant_id: str, list_id: str, rows: Iterator[tuple[int, list[str]]], *,
              remove: bool = False, progress: Callable[[int], None] | None = None) -> BulkReport:
    """Add (or remove) every value of `open_csv`'s rows, BATCH_ROWS rows per write (each write
    in the audit log as the command line's, with its count); a row without a valid value is
    counted and reported by number, and the others are loaded."""
    region = runtime.config.defaults.region
    report = BulkReport(list_id=list_id)
    batch: list[bytes] = []

    def flush() -> None:
        digests = list(batch)

        def apply(tx: Session) -> int:
            changed = tx.suppression.remove_many(list_id, digests) if remove else tx.suppression.add_many(list_id, digests)
            audit.record(tx, tenant_id, audit.CLI, "suppression.entries_change", list_id, iso(runtime.clock.now()),
                         after={"removed" if remove else "added": changed, "from": "csv"})
            return changed

        report.changed += runtime.store.write_sync(apply)
        batch.clear()

    rows_in_batch = 0
    try:
        for number, values in rows:
            report.rows += 1
            digests = [suppression_hash(value, region) for value in values]
            rows_in_batch += 1
            if not digests or None in digests:  # a bad row is reported, and none of it loaded
                report.bad_rows += 1
                if len(report.bad_examples) < MAX_EXAMPLES:
                    report.bad_examples.append(
                        f"row {number}: " + ("no email or phone" if not values else "not an email or a phone number"))
            else:
                report.values += len(digests)
                batch.extend(digests)
            if rows_in_batch >= BATCH_ROWS:
                flush()
                if progress is not None:
                    progress(rows_in_batch)
                rows_in_batch = 0
    except csv.Error as exc:
        raise CsvProblem(f"row {report.rows + 2}: {exc}") from None
    if batch:
        flush()
    if progress is not None and rows_in_batch:
        progress(rows_in_batch)
    report.count = runtime.store.reader().suppression.count(list_id)
    return report
