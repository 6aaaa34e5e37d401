"""CSV lead import: POST /api/v1/leads/import (a task on the server's event loop) and
`appliance import-leads` (in the CLI's own process, on the data folder).

Decisions:
- The whole file is checked before anything is imported: UTF-8 text (a BOM is allowed), CSV
  that parses to its end, a header row, at least one column that fills a submit field
  (appliance/domain/lead_import.py), a mapping that names real columns and fields, and at least
  one data row. Any of those wrong is a VALIDATION_ERROR and nothing is imported.
- Rows are independent: each bad row is counted as failed with the details a submit's
  VALIDATION_ERROR would give (the first MAX_IMPORT_ERRORS kept, by data row number, 1 = the
  first row after the header; blank lines are not rows); the others are imported.
- `process: true`: each row goes through the submit pipeline (appliance/services/intake.py:
  routing, qualification, dedupe, caps, suppression, milestones, events, delivery jobs), PROCESS_CHUNK
  rows at a time so that group commit takes them in a few transactions. `process: false`: each row is
  normalized and checked as a submit is, then stored with status `new` (one submission, status `new`,
  with an `imported` journey event): no dedupe, caps, milestones, events or delivery, BATCH_ROWS
  leads per transaction.
- Counts are written in the transaction of the leads they count (the lead's own with
  `process: true`), so `created` is always what is stored. A stop or crash ends a running import
  `failed` (reason `interrupted`): it does not resume, since the uploaded file is not kept; every
  lead it created is counted in `created`, and no row outside `processed` left a lead behind.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import csv
import io
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, BinaryIO

import msgspec

from appliance.clock import iso
from appliance.domain.campaign import Campaign
from appliance.domain.lead import LeadRecord, Submission
from appliance.domain.lead_import import resolve_columns, row_body
from appliance.domain.pipeline import event, snapshot
from appliance.domain.submission import SubmitLead, build_lead, facts_of, with_field_library_problems
from appliance.errors import ApiError, InvalidState, ValidationFailed
from appliance.ids import new_id
from appliance.model import Model, all_problems, describe_validation_error
from appliance.plugins import Registry
from appliance.runtime import Runtime
from appliance.services import intake
from appliance.services.tenant_settings import TenantSettings, load_settings
from appliance.storage import MAX_IMPORT_ERRORS, ImportRecord, Principal, Session

log = logging.getLogger("appliance.imports")

BATCH_ROWS = 5_000  # rows normalized and stored per transaction with process: false
PROCESS_CHUNK = 64  # rows submitted at once with process: true
MAX_RUNNING = 4  # imports one tenant may run at once
INTERRUPTED = "interrupted: the appliance stopped before the import finished"
_READ_CHUNK = 1 << 20


class ImportStarted(Model):
    import_id: str


class ImportRowError(Model):
    row: int
    details: list[str]


class ImportStatus(Model):
    import_id: str
    campaign_id: str
    file_name: str | None
    process: bool
    columns: dict[str, str]  # CSV column -> the submit field it fills
    state: str  # running, done, failed
    total: int
    processed: int
    created: int
    failed: int
    errors: list[ImportRowError]
    reason: str | None  # why a failed import stopped
    created_at: str
    updated_at: str
    finished_at: str | None


def status_of(record: ImportRecord) -> ImportStatus:
    return ImportStatus(
        import_id=record.import_id, campaign_id=record.campaign_id, file_name=record.file_name,
        process=record.process, columns=record.columns, state=record.state, total=record.total,
        processed=record.processed, created=record.created, failed=record.failed,
        errors=[ImportRowError(row=e["row"], details=e["details"]) for e in record.errors], reason=record.reason,
        created_at=record.created_at, updated_at=record.updated_at, finished_at=record.finished_at)


# ---- the file ---------------------------------------------------------------------------------

def parse_mapping(text: str | None) -> dict[str, str | None]:
    """The `mapping` form field: a JSON object of CSV column -> submit field (null: leave the column out)."""
    if text is None or not text.strip():
        return {}
    try:
        mapping = msgspec.json.decode(text)
    except msgspec.DecodeError:
        raise ValidationFailed(["mapping: must be a JSON object of CSV column -> submit field"]) from None
    if not isinstance(mapping, dict) or not all(isinstance(v, str) or v is None for v in mapping.values()):
        raise ValidationFailed(["mapping: must be a JSON object of CSV column -> submit field (a string, or null)"])
    return mapping


@dataclass
class CheckedFile:
    """A CSV file that passed `check_file`: its columns and how many data rows it holds."""

    handle: BinaryIO
    header: list[str]
    columns: list[tuple[int, str]]  # (column index, target)
    names: dict[str, str]  # CSV column name -> target
    total: int

    def rows(self) -> Iterator[tuple[int, list[str]]]:
        """(data row number, cells) of every data row (blank lines are not rows)."""
        with _text(self.handle) as text:
            reader = csv.reader(text, strict=True)
            next(reader, None)
            number = 0
            for cells in reader:
                if any(cell.strip() for cell in cells):
                    number += 1
                    yield number, cells


@contextlib.contextmanager
def _text(handle: BinaryIO) -> Iterator[io.TextIOWrapper]:
    """The file from its start as CSV text; the file stays open afterwards (a wrapper that is
    collected would close it)."""
    handle.seek(0)
    text = io.TextIOWrapper(handle, encoding="utf-8-sig", newline="")
    try:
        yield text
    finally:
        text.detach()


def check_file(handle: BinaryIO, mapping: dict[str, str | None]) -> CheckedFile:
    """The whole file read once (UTF-8, CSV, header, columns, rows counted), or a
    VALIDATION_ERROR naming `file` or `mapping`. Reads in chunks: memory stays small."""
    handle.seek(0)
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    offset = 0
    while chunk := handle.read(_READ_CHUNK):  # UTF-8 first: csv would report bad bytes as a decode error anyway
        try:
            decoder.decode(chunk)
        except UnicodeDecodeError as exc:
            raise ValidationFailed([f"file: not UTF-8 text (byte {offset + exc.start}); save the CSV as UTF-8"]) from None
        offset += len(chunk)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise ValidationFailed(["file: not UTF-8 text (it ends inside a character); save the CSV as UTF-8"]) from None
    with _text(handle) as text:
        reader = csv.reader(text, strict=True)
        try:
            header = next(reader, None)
            if header is None or not any(cell.strip() for cell in header):
                raise ValidationFailed(["file: empty; the first row must name the columns"])
            columns, problems = resolve_columns(header, mapping)
            if problems:
                raise ValidationFailed(problems)
            total = sum(1 for cells in reader if any(cell.strip() for cell in cells))
        except csv.Error as exc:
            raise ValidationFailed([f"file: not CSV (line {reader.line_num}: {exc})"]) from None
    if total == 0:
        raise ValidationFailed(["file: no data rows after the header"])
    names = {header[index].strip(): target for index, target in columns}
    return CheckedFile(handle=handle, header=header, columns=columns, names=names, total=total)


# ---- rows -------------------------------------------------------------------------------------

@dataclass
class Tally:
    """What an import did: counts and the first failed rows."""

    created: int = 0
    failed: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)

    @property
    def processed(self) -> int:
        return self.created + self.failed

    def fail(self, row: int, details: list[str]) -> dict[str, Any]:
        self.failed += 1
        error = {"row": row, "details": details}
        if len(self.errors) < MAX_IMPORT_ERRORS:
            self.errors.append(error)
        return error


def _submit_body(cells: list[str], checked: CheckedFile, campaign_id: str) -> SubmitLead | list[str]:
    """The row as a submit body, or its problems. CSV cells are text: numbers and booleans are
    read from it as a submit body's JSON would give them."""
    document, problems = row_body(cells, checked.columns, campaign_id, checked.header)
    if problems:
        return problems
    try:
        return msgspec.convert(document, SubmitLead, strict=False)
    except msgspec.ValidationError as exc:
        return all_problems(document, SubmitLead) or [describe_validation_error(exc)]


@dataclass
class _Batch:
    leads: list[LeadRecord] = field(default_factory=list)
    submissions: list[Submission] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)


def _new_leads(rows: list[tuple[int, list[str]]], checked: CheckedFile, campaign: Campaign,
               settings: TenantSettings, region: str, now_dt: datetime, import_id: str | None) -> _Batch:
    """process: false. Each row normalized and checked as a submit is, as a lead at `new`."""
    now, today = iso(now_dt), now_dt.date()
    client, offer = campaign.client, campaign.offer
    imported = event(now, "imported", "imported from a CSV file, not processed", campaign,
                     {"importId": import_id} if import_id else None)
    batch = _Batch()
    for number, cells in rows:
        body = _submit_body(cells, checked, campaign.campaign_id)
        if isinstance(body, list):
            batch.failed.append({"row": number, "details": body})
            continue
        lead, problems = build_lead(body, lead_id=new_id("lead"), existing=None, labels=settings.labels,
                                    region=region, now=now)
        problems = with_field_library_problems(problems, facts_of(lead), settings.checked_fields, today)
        if problems:
            batch.failed.append({"row": number, "details": problems})
            continue
        lead = msgspec.structs.replace(lead, status="new", campaign_id=campaign.campaign_id,
                                       client_id=client.client_id if client else None,
                                       offer_id=offer.offer_id if offer else None, submission_count=1)
        batch.leads.append(lead)
        batch.submissions.append(Submission(
            submission_id=new_id("sub"), lead_id=lead.lead_id, submission_number=1, campaign=snapshot(campaign),
            status="new", journey_events=[imported], submitted_at=now, created_at=now, updated_at=now))
    return batch


def _chunks(rows: Iterator[tuple[int, list[str]]], size: int) -> Iterator[list[tuple[int, list[str]]]]:
    chunk = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


async def import_rows(runtime: Runtime, settings: TenantSettings, who: Principal, registry: Registry | None,
                      checked: CheckedFile, campaign: Campaign, *, process: bool, import_id: str | None = None,
                      progress: Callable[[int], None] | None = None) -> Tally:
    """Every data row of `checked` into `campaign`; with `import_id`, the import's record counts
    them in the same transactions. `progress(n)` after every n rows done. `registry`: the
    plugins, for process only."""
    tally = Tally()
    region = runtime.config.defaults.region
    tenant_id = who.tenant_id
    for rows in _chunks(checked.rows(), PROCESS_CHUNK if process else BATCH_ROWS):
        if process and registry is not None:
            failed = await _submit_rows(runtime, settings, who, registry, checked, campaign, rows, import_id, tally)
            if failed and import_id is not None:
                await runtime.store.write(lambda tx, f=failed: tx.imports.advance(
                    import_id, created=0, failed=f, now=iso(runtime.clock.now())))
        else:
            batch = await asyncio.to_thread(_new_leads, rows, checked, campaign, settings, region,
                                            runtime.clock.now(), import_id)
            await runtime.store.write_off_loop(_store_unit(tenant_id, campaign.campaign_id, batch, import_id,
                                                           iso(runtime.clock.now())))
            tally.created += len(batch.leads)
            for error in batch.failed:
                tally.fail(error["row"], error["details"])
        if progress is not None:
            progress(len(rows))
    return tally


def _store_unit(tenant_id: str, campaign_id: str, batch: _Batch, import_id: str | None,
                now: str) -> Callable[[Session], None]:
    def unit(tx: Session) -> None:
        tx.leads.insert_leads(tenant_id, batch.leads, campaign_id)
        tx.leads.insert_submissions(tenant_id, batch.submissions)
        if import_id is not None:
            tx.imports.advance(import_id, created=len(batch.leads), failed=batch.failed, now=now)
    return unit


async def _submit_rows(runtime: Runtime, settings: TenantSettings, who: Principal, registry: Registry,
                       checked: CheckedFile, campaign: Campaign, rows: list[tuple[int, list[str]]],
                       import_id: str | None, tally: Tally) -> list[dict[str, Any]]:
    """process: true. The rows submitted together (group commit takes them in a few
    transactions); answers the rows that failed."""
    def counted(tx: Session) -> None:
        tx.imports.advance(import_id, created=1, failed=[], now=iso(runtime.clock.now()))

    async def one(number: int, cells: list[str]) -> dict[str, Any] | None:
        body = _submit_body(cells, checked, campaign.campaign_id)
        if isinstance(body, list):
            return tally.fail(number, body)
        try:
            await intake.submit(runtime, settings, who, body, registry,
                                also=counted if import_id is not None else None)
        except ApiError as exc:
            return tally.fail(number, exc.details or [exc.message])
        except Exception:  # a bug met by one row: that row fails, the others go on
            log.exception("import %s: row %d", import_id, number)
            return tally.fail(number, ["internal error (see the log)"])
        tally.created += 1
        return None

    outcomes = await asyncio.gather(*(one(number, cells) for number, cells in rows))
    return [outcome for outcome in outcomes if outcome is not None]


# ---- imports in the server --------------------------------------------------------------------

async def start(runtime: Runtime, who: Principal, campaign_id: str, file_name: str | None, checked: CheckedFile,
                process: bool) -> str:
    """Records a running import of a checked file; answers its id. A tenant runs at most
    MAX_RUNNING imports at once (each holds its file on disk and shares the one writer): 409."""
    import_id = new_id("imp")
    now = iso(runtime.clock.now())

    def unit(tx: Session) -> None:
        if tx.imports.running_count(who.tenant_id) >= MAX_RUNNING:
            raise InvalidState([f"file: {MAX_RUNNING} imports of this tenant are still running; start this one when"
                                " one of them is done"])
        tx.imports.create(who.tenant_id, import_id, campaign_id, file_name, process, checked.names, checked.total, now)

    await runtime.store.write(unit, may_refuse=True)
    return import_id


async def run(runtime: Runtime, settings: TenantSettings, who: Principal, registry: Registry, import_id: str,
              checked: CheckedFile, campaign: Campaign, process: bool, wake: Callable[[], None]) -> None:
    """The background task of one import: its rows, then its end (`done`, or `failed` on an
    unexpected error, which is logged). Closes the file."""
    try:
        await import_rows(runtime, settings, who, registry, checked, campaign, process=process, import_id=import_id,
                          progress=(lambda _: wake()) if process else None)
        state, reason = "done", None
    except asyncio.CancelledError:
        raise  # the server stops: end_interrupted records it
    except Exception:
        log.exception("import %s stopped by an unexpected error", import_id)
        state, reason = "failed", "internal error: the rest of the file was not imported (see the server's log)"
    finally:
        checked.handle.close()
    await runtime.store.write(lambda tx: tx.imports.finish(import_id, state, reason, iso(runtime.clock.now())))


async def end_interrupted(runtime: Runtime) -> int:
    """Imports left `running` by a process that stopped end `failed`: the file is gone with it."""
    now = iso(runtime.clock.now())
    return await runtime.store.write(lambda tx: tx.imports.fail_running(INTERRUPTED, now))


def get(runtime: Runtime, tenant_id: str, import_id: str) -> ImportStatus | None:
    found = runtime.store.reader().imports.get(tenant_id, import_id)
    return status_of(found) if found is not None else None


# ---- imports from the CLI ---------------------------------------------------------------------

@dataclass
class FileImport:
    """A checked file, and what importing it into a campaign of a tenant needs, for the CLI."""

    settings: TenantSettings
    who: Principal
    campaign: Campaign
    checked: CheckedFile


def open_for_cli(runtime: Runtime, tenant_id: str, campaign_id: str, handle: BinaryIO,
                 mapping: dict[str, str | None], *, plugins_listen: bool) -> FileImport:
    """The campaign and the file checked as the API checks them (ValidationFailed), before any
    row is imported. The CLI acts as a tenant key of the tenant."""
    rev = runtime.store.reader().tenants.config_rev(tenant_id)
    settings = load_settings(runtime.store, tenant_id, rev, plugins_listen=plugins_listen)
    campaign = settings.usable_campaign(campaign_id)
    who = Principal(id="cli", tenant_id=tenant_id, kind="cli", source_id=None, config_rev=rev)
    return FileImport(settings=settings, who=who, campaign=campaign, checked=check_file(handle, mapping))


def run_for_cli(runtime: Runtime, job: FileImport, registry: Registry | None, *, process: bool,
                progress: Callable[[int], None]) -> Tally:
    return asyncio.run(import_rows(runtime, job.settings, job.who, registry, job.checked, job.campaign,
                                   process=process, progress=progress))
