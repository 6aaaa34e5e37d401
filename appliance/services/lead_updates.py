"""Changes made to stored leads and submissions by callers: PATCH /api/v1/submissions/{id},
PATCH /api/v1/leads/bulk and PATCH /api/v1/leads/{leadId}.
Each request is one write unit on the writer thread; everything that needs no stored data
(shapes, timestamps, zones, field library rules) is checked before it is queued.

Decisions (the interface leaves them open):

- PATCH submission is a merge patch. `qualification`, `routing`, `posting`, `delivery` and
  `responseFields` are merged key by key into the stored objects (a key given as null clears a
  nullable value); `journeyEvents` and `firstSubmissionActions` are appended, never replacing
  history (an event without `timestamp` gets the time of the request). Every timestamp accepts
  an ISO 8601 string or epoch milliseconds and is stored as `2026-11-21T09:30:00.123Z`.
  An empty body changes nothing (not even `updatedAt`).
- A status change follows through: when the patched submission is the lead's latest, the lead
  takes its status; a bulk status change sets the lead's status and its latest submission's
  (with a `status_changed` journey event naming the key that made it).
- Open delivery/evaluation jobs of the submission are cancelled when its status moves to one
  the job loop does not work on (anything but `pending`, `qualified` and `queued`): a lead
  marked delivered, failed, rejected, error... by hand must not be sent by a job still
  queued for it. A change to `qualified` (or any other) never creates a job: re-sending a lead
  is what repost and deliver are for.
- Bulk update: `modifiedCount` counts the distinct leads of the caller's tenant that were found
  and updated (`updatedAt` moves on each); unknown ids and other tenants' ids are not counted
  and nothing of theirs changes. `questionnaire` takes the object form `{key: answer}` merged by
  key into the stored array (a new key's question is its field library label); `customFields`
  is merged; `notes` and `timezone` may be null to clear them. Milestone ledger entries are
  not written by these edits (they belong to the pipeline's own transitions).
- PATCH of one lead takes the bulk-update keys (same merges, same status follow-through) and the
  lead's contact fields (`firstName`, `lastName`, `email`, `phone`, `address`, `dateOfBirth`,
  `country`), normalized and checked exactly as a submit does (appliance/domain/submission.build_lead);
  `address` is replaced as a whole. An empty body changes nothing. It answers the lead record.
- None of them sets `returned`: only POST /api/v1/leads/{leadId}/return does (appliance/services/returns),
  since a return also writes the entries reversing the delivery's revenue.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, UnsetType

from appliance.clock import iso
from appliance.domain.catalog import FieldLibraryEntry
from appliance.domain.lead import (
    Address, AlternativeCampaign, DeliveryOutcome, FlowType, JourneyEvent, LeadRecord, PostingOutcome,
    QualificationOutcome, QuestionAnswer, RoutingMethod, RoutingOutcome, SettableStatus, Submission,
)
from appliance.domain.pipeline import event
from appliance.domain.submission import SubmitLead, build_lead, facts_of, field_library_problems, valid_zone
from appliance.errors import NotFound, ValidationFailed
from appliance.model import Model
from appliance.runtime import Runtime
from appliance.services import audit
from appliance.services.lead_events import record_lead_events
from appliance.services.ledger import earn
from appliance.services.tenant_settings import TenantSettings
from appliance.storage import Session

# Statuses whose work the job loop still does: their open jobs stay; any other status cancels them.
JOB_STATUSES = frozenset({"pending", "qualified", "queued"})
MAX_BULK_IDS = 1000
MAX_EVENTS_PER_PATCH = 200
_MAX_EPOCH_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z

Text = Annotated[str, Meta(max_length=2000)]
Stamp = str | int | float  # ISO 8601 string or epoch milliseconds


# ---- timestamps -----------------------------------------------------------------------------

def parse_iso(text: str) -> tuple[datetime, bool] | None:
    """(moment in UTC, written as a bare date) for an ISO 8601 date or timestamp, else None.
    A timestamp without an offset is UTC."""
    text = text.strip()
    if not text or len(text) > 64:
        return None
    try:
        if len(text) == 10 and text[4] == "-":
            day = date.fromisoformat(text)
            return datetime(day.year, day.month, day.day, tzinfo=timezone.utc), True
        moment = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    try:
        return moment.astimezone(timezone.utc), False
    except (OverflowError, ValueError):
        return None


def stamp_to_iso(value: Stamp, path: str, problems: list[str]) -> str | None:
    """The stored form of a timestamp given as ISO 8601 text or epoch milliseconds."""
    if isinstance(value, str):
        parsed = parse_iso(value)
        if parsed is None:
            problems.append(f"{path}: must be an ISO 8601 timestamp or epoch milliseconds")
            return None
        return iso(parsed[0])
    if not 0 <= value <= _MAX_EPOCH_MS:
        problems.append(f"{path}: epoch milliseconds out of range")
        return None
    return iso(datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=int(value)))


# ---- PATCH /api/v1/submissions/{submissionId} -------------------------------------------------

class QualificationPatch(Model):
    passed: bool | None | UnsetType = UNSET
    original_campaign_qualified: bool | None | UnsetType = UNSET
    score: int | float | None | UnsetType = UNSET
    method: Text | None | UnsetType = UNSET
    reason: Text | None | UnsetType = UNSET
    qualified_at: Stamp | None | UnsetType = UNSET


class RoutingPatch(Model):
    was_routed: bool | None | UnsetType = UNSET
    original_campaign_id: Text | None | UnsetType = UNSET
    routed_to_campaign_id: Text | None | UnsetType = UNSET
    routing_reason: Text | None | UnsetType = UNSET
    routing_method: RoutingMethod | None | UnsetType = UNSET
    routing_rule_name: Text | None | UnsetType = UNSET
    alternative_campaigns: Annotated[list[AlternativeCampaign], Meta(max_length=100)] | UnsetType = UNSET
    routing_evaluated_at: Stamp | None | UnsetType = UNSET


class PostingPatch(Model):
    success: bool | None | UnsetType = UNSET
    client_lead_id: Text | None | UnsetType = UNSET
    status_code: int | None | UnsetType = UNSET
    posted_at: Stamp | None | UnsetType = UNSET


class DeliveryPatch(Model):
    success: bool | None | UnsetType = UNSET
    client_lead_id: Text | None | UnsetType = UNSET
    status_code: int | None | UnsetType = UNSET
    response_message: Annotated[str, Meta(max_length=10_000)] | None | UnsetType = UNSET
    url: Text | None | UnsetType = UNSET
    method: Annotated[str, Meta(max_length=16)] | None | UnsetType = UNSET
    body_format: Annotated[str, Meta(max_length=32)] | None | UnsetType = UNSET
    delivered_at: Stamp | None | UnsetType = UNSET


class SubmissionPatch(Model):
    """PATCH /api/v1/submissions/{submissionId}: every field optional."""

    status: SettableStatus | UnsetType = UNSET
    qualification: QualificationPatch | UnsetType = UNSET
    routing: RoutingPatch | UnsetType = UNSET
    posting: PostingPatch | UnsetType = UNSET
    delivery: DeliveryPatch | UnsetType = UNSET
    result: Annotated[str, Meta(max_length=10_000)] | None | UnsetType = UNSET
    client_lead_id: Text | None | UnsetType = UNSET
    response_fields: Annotated[dict[str, Annotated[str, Meta(max_length=10_000)]], Meta(max_length=200)] | UnsetType = UNSET
    journey_events: Annotated[list[JourneyEvent], Meta(max_length=MAX_EVENTS_PER_PATCH)] | UnsetType = UNSET
    first_submission_actions: Annotated[list[Any], Meta(max_length=100)] | UnsetType = UNSET
    flow_type: FlowType | UnsetType = UNSET
    qualified_at: Stamp | None | UnsetType = UNSET
    posted_at: Stamp | None | UnsetType = UNSET


_STAMP_FIELDS = frozenset({"qualified_at", "posted_at", "routing_evaluated_at", "delivered_at"})


def _given(patch: msgspec.Struct) -> dict[str, Any]:
    return {name: value for name in patch.__struct_fields__ if (value := getattr(patch, name)) is not UNSET}


def _normalized(patch: msgspec.Struct, path: str, problems: list[str]) -> dict[str, Any]:
    """The fields given in `patch`, timestamps in their stored form."""
    fields = _given(patch)
    wire = dict(zip(patch.__struct_fields__, patch.__struct_encode_fields__))
    for name in _STAMP_FIELDS.intersection(fields):
        if fields[name] is not None:
            fields[name] = stamp_to_iso(fields[name], f"{path}{wire[name]}", problems)
    return fields


def _events(given: list[JourneyEvent], now: str, problems: list[str]) -> list[JourneyEvent]:
    out = []
    for index, item in enumerate(given):
        stamp = now if item.timestamp is None else stamp_to_iso(item.timestamp, f"journeyEvents[{index}].timestamp",
                                                                 problems)
        out.append(msgspec.structs.replace(item, timestamp=stamp))
    return out


_APPENDED = ("journeyEvents", "firstSubmissionActions")  # a patch adds to these: the audit counts what it added


async def patch_submission(runtime: Runtime, settings: TenantSettings, tenant_id: str, submission_id: str,
                           body: SubmissionPatch, actor: str) -> Submission:
    now_dt = runtime.clock.now()
    now = iso(now_dt)
    problems: list[str] = []
    changes = _normalized(body, "", problems)
    nested: dict[str, dict[str, Any]] = {}
    for name in ("qualification", "routing", "posting", "delivery"):
        if name in changes:
            nested[name] = _normalized(changes.pop(name), f"{name}.", problems)
    events = _events(changes.pop("journey_events", []), now, problems)
    actions = changes.pop("first_submission_actions", [])
    fields = changes.pop("response_fields", None)
    if problems:
        raise ValidationFailed(problems)
    empty = not (changes or nested or events or actions or fields is not None)
    kinds = {"qualification": QualificationOutcome, "routing": RoutingOutcome, "posting": PostingOutcome,
             "delivery": DeliveryOutcome}

    def unit(tx: Session) -> Submission:
        stored = tx.leads.get_submission(tenant_id, submission_id)
        if stored is None:
            raise NotFound()
        if empty:
            return stored
        merged = dict(changes)
        for name, given in nested.items():
            merged[name] = msgspec.structs.replace(getattr(stored, name) or kinds[name](), **given)
        if fields is not None:
            merged["response_fields"] = {**stored.response_fields, **fields}
        if events:
            merged["journey_events"] = [*stored.journey_events, *events]
        if actions:
            merged["first_submission_actions"] = [*stored.first_submission_actions, *actions]
        submission = msgspec.structs.replace(stored, **merged, updated_at=now)
        tx.leads.update_submission(tenant_id, submission)
        old, new = msgspec.to_builtins(stored), msgspec.to_builtins(submission)
        changed = [k for k in new if old.get(k) != new[k] and k not in _APPENDED and k != "updatedAt"]
        audit.record(tx, tenant_id, actor, "submission.update", submission_id, now,
                     before={k: old.get(k) for k in changed},
                     after={**{k: new[k] for k in changed},
                            **{f"{k}Added": len(new.get(k) or ()) - len(old.get(k) or ()) for k in _APPENDED
                               if len(new.get(k) or ()) != len(old.get(k) or ())}})
        if submission.status != stored.status:
            if submission.status not in JOB_STATUSES:
                tx.jobs.cancel_open_jobs(submission_id, now)
            latest = tx.leads.latest_submission_number(tenant_id, submission.lead_id)
            lead = tx.leads.get_lead(tenant_id, submission.lead_id)
            if lead is not None and latest == submission.submission_number and lead.status != submission.status:
                lead = msgspec.structs.replace(lead, status=submission.status, updated_at=now)
                tx.leads.update_lead(tenant_id, lead)
            if lead is not None:
                earn(tx, settings, tenant_id, lead, submission_id, (submission.status,), now_dt)
                if latest == submission.submission_number:
                    record_lead_events(tx, settings, tenant_id, lead, submission, (submission.status,), now)
        return submission

    return await runtime.store.write(unit, may_refuse=True)


# ---- PATCH /api/v1/leads/bulk ---------------------------------------------------------------

class BulkUpdates(Model):
    """The keys a bulk update may set; any other key is a VALIDATION_ERROR."""

    status: SettableStatus | UnsetType = UNSET
    notes: Annotated[str, Meta(max_length=10_000)] | None | UnsetType = UNSET
    timezone: Annotated[str, Meta(max_length=64)] | None | UnsetType = UNSET
    is_test: bool | UnsetType = UNSET
    custom_fields: Annotated[dict[str, Any], Meta(max_length=200)] | UnsetType = UNSET
    questionnaire: Annotated[dict[str, Any], Meta(max_length=200)] | UnsetType = UNSET


BULK_KEYS = ("status", "notes", "timezone", "isTest", "customFields", "questionnaire")


class BulkUpdateBody(Model):
    lead_ids: Annotated[list[Annotated[str, Meta(min_length=1, max_length=64)]],
                        Meta(min_length=1, max_length=MAX_BULK_IDS)]
    updates: BulkUpdates


class BulkUpdateResult(Model):
    modified_count: int


def check_bulk(body: BulkUpdateBody, checked_fields: list[FieldLibraryEntry], today: date) -> None:
    """Everything about a bulk update that needs no stored data."""
    if not _given(body.updates):
        raise ValidationFailed([f"updates: give at least one of {', '.join(BULK_KEYS)}"])
    problems = _update_problems(body.updates, checked_fields, today, "updates.")
    if problems:
        raise ValidationFailed(problems)


def _update_problems(updates: BulkUpdates, checked_fields: list[FieldLibraryEntry], today: date,
                     prefix: str) -> list[str]:
    """The problems of the bulk-update keys that need no stored data, each path under `prefix`."""
    problems = []
    if isinstance(updates.timezone, str) and not valid_zone(updates.timezone):
        problems.append(f"{prefix}timezone: unknown IANA time zone")
    if updates.questionnaire is not UNSET:
        keys = set(updates.questionnaire)
        entries = [e for e in checked_fields if e.category == "question" and e.key in keys]
        problems += [f"{prefix}{p}" for p in field_library_problems(
            {"questionnaire": updates.questionnaire}, entries, today)]
    return problems


def _merge_answers(stored: list[QuestionAnswer], answers: dict[str, Any], labels: dict[str, str]) -> list[QuestionAnswer]:
    merged = list(stored)
    position = {entry.key: i for i, entry in enumerate(merged) if entry.key}
    for key, answer in answers.items():
        if key in position:
            merged[position[key]] = msgspec.structs.replace(merged[position[key]], answer=answer)
        else:
            position[key] = len(merged)
            merged.append(QuestionAnswer(key=key, question=labels.get(key) or key, answer=answer))
    return merged


def _with_updates(lead: LeadRecord, updates: BulkUpdates, labels: dict[str, str]) -> dict[str, Any]:
    """The lead's fields a bulk-update body changes, merged with what is stored."""
    changes: dict[str, Any] = {name: value for name, value in _given(updates).items()
                               if name in ("notes", "timezone", "is_test", "status")}
    if updates.custom_fields is not UNSET:
        changes["custom_fields"] = {**lead.custom_fields, **updates.custom_fields}
    if updates.questionnaire is not UNSET:
        changes["questionnaire"] = _merge_answers(lead.questionnaire, updates.questionnaire, labels)
    return changes


def _save(tx: Session, settings: TenantSettings, tenant_id: str, actor: str, lead: LeadRecord,
          updated: LeadRecord, now_dt: datetime, by: str, *, names_changed: bool = False) -> None:
    """Write `updated` over the stored `lead`; a status change follows through to the latest
    submission and earns its milestones and queues its events in the same unit."""
    now = updated.updated_at
    submission_id = _follow_status(tx, tenant_id, lead, updated.status, actor, now, by) \
        if updated.status != lead.status else None
    tx.leads.update_lead(tenant_id, updated, names_changed=names_changed)
    if submission_id is not None:
        earn(tx, settings, tenant_id, updated, submission_id, (updated.status,), now_dt)
        record_lead_events(tx, settings, tenant_id, updated, tx.leads.get_submission(tenant_id, submission_id),
                           (updated.status,), now)
    before, after = msgspec.to_builtins(lead), msgspec.to_builtins(updated)
    changed = [name for name in {**before, **after} if name != "updatedAt" and before.get(name) != after.get(name)]
    if changed:  # the fields that changed, as they were and as they are
        audit.record(tx, tenant_id, actor, "lead.update", lead.lead_id, now,
                     before={name: before.get(name) for name in changed},
                     after={name: after.get(name) for name in changed})


async def bulk_update(runtime: Runtime, settings: TenantSettings, tenant_id: str, actor: str,
                      body: BulkUpdateBody) -> BulkUpdateResult:
    """Call `check_bulk` first. One write unit for every lead named."""
    now_dt = runtime.clock.now()
    now = iso(now_dt)
    ids = list(dict.fromkeys(body.lead_ids))

    def unit(tx: Session) -> BulkUpdateResult:
        found = tx.leads.get_leads(tenant_id, ids)
        for lead in found:
            updated = msgspec.structs.replace(lead, **_with_updates(lead, body.updates, settings.labels),
                                              updated_at=now)
            _save(tx, settings, tenant_id, actor, lead, updated, now_dt, "bulk update")
        return BulkUpdateResult(modified_count=len(found))

    # Up to MAX_BULK_IDS leads read and rewritten: tens of milliseconds, off the event loop.
    return await runtime.store.write_off_loop(unit)


def _follow_status(tx: Session, tenant_id: str, lead: LeadRecord, status: str, actor: str,
                   now: str, by: str) -> str | None:
    """The lead's latest submission takes the status; answers its id (None when it has none)."""
    submission = tx.leads.latest_submission(tenant_id, lead.lead_id)
    if submission is None:
        return None
    if status not in JOB_STATUSES:
        tx.jobs.cancel_open_jobs(submission.submission_id, now)
    tx.leads.update_submission(tenant_id, msgspec.structs.replace(
        submission, status=status, updated_at=now,
        journey_events=[*submission.journey_events, event(
            now, "status_changed", by, details={"previous": lead.status, "status": status,
                                                "actor": actor})]))
    return submission.submission_id


# ---- PATCH /api/v1/leads/{leadId} -----------------------------------------------------------

class LeadPatch(BulkUpdates):
    """PATCH /api/v1/leads/{leadId}: the bulk-update keys and the lead's contact fields, every
    one optional. Contact fields cannot be null: a lead keeps its name, email and phone."""

    first_name: Annotated[str, Meta(min_length=1, max_length=100)] | UnsetType = UNSET
    last_name: Annotated[str, Meta(min_length=1, max_length=100)] | UnsetType = UNSET
    email: Annotated[str, Meta(min_length=1, max_length=254)] | UnsetType = UNSET
    phone: Annotated[str, Meta(min_length=1, max_length=32)] | UnsetType = UNSET
    address: Address | UnsetType = UNSET
    date_of_birth: Annotated[str, Meta(max_length=10)] | UnsetType = UNSET
    country: Annotated[str, Meta(max_length=64)] | UnsetType = UNSET


CONTACT_FIELDS = ("first_name", "last_name", "email", "phone", "address", "date_of_birth", "country")
LEAD_PATCH_KEYS = (*BULK_KEYS, "firstName", "lastName", "email", "phone", "address", "dateOfBirth", "country")
# What build_lead derives from the contact fields and a PATCH therefore takes from it.
_CONTACT_RESULT = (*CONTACT_FIELDS, "phone_e164")


def check_lead_patch(body: LeadPatch, checked_fields: list[FieldLibraryEntry], today: date) -> None:
    """Everything about a lead PATCH that needs no stored data."""
    problems = _update_problems(body, checked_fields, today, "")
    if problems:
        raise ValidationFailed(problems)


async def patch_lead(runtime: Runtime, settings: TenantSettings, tenant_id: str, actor: str, lead_id: str,
                     body: LeadPatch) -> None:
    """Call `check_lead_patch` first. NotFound for a lead that is not the tenant's."""
    now_dt = runtime.clock.now()
    now = iso(now_dt)
    given = _given(body)
    contact = {name: given[name] for name in CONTACT_FIELDS if name in given}
    wire = dict(zip(LeadPatch.__struct_fields__, LeadPatch.__struct_encode_fields__))
    # Field library rules on the contact fields given (the questionnaire's were checked already).
    touched = {wire[name] for name in contact}
    entries = [e for e in settings.checked_fields if e.category != "question" and e.key.split(".")[0] in touched]
    region = runtime.config.defaults.region

    def unit(tx: Session) -> None:
        lead = tx.leads.get_lead(tenant_id, lead_id)
        if lead is None:
            raise NotFound()
        if not given:
            return
        changes = _with_updates(lead, body, settings.labels)
        if contact:
            # The submit's own normalization and checks, over the stored lead as a resubmission's.
            built, problems = build_lead(SubmitLead(campaign_id=lead.campaign_id or "", **contact), lead_id=lead_id,
                                         existing=lead, labels=settings.labels, region=region, now=now)
            problems += field_library_problems(facts_of(built), entries, now_dt.date())
            if problems:
                raise ValidationFailed(problems)
            changes.update({name: getattr(built, name) for name in _CONTACT_RESULT})
        updated = msgspec.structs.replace(lead, **changes, updated_at=now)
        _save(tx, settings, tenant_id, actor, lead, updated, now_dt, "lead update",
              names_changed=(updated.first_name, updated.last_name) != (lead.first_name, lead.last_name))

    await runtime.store.write(unit, may_refuse=True)
