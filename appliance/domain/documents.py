"""Campaign documents for e-signature, as plain decisions: which documents a lead is sent, the
template field values, how a provider's status moves a document, and what the lead's documents
come to. No I/O: services/esign.py reads and writes around these."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime, timedelta
from typing import Any, Literal, NamedTuple

from appliance.domain.campaign import Campaign, CampaignDocument, MappingOverride
from appliance.domain.rules import is_absent, matches, resolve

DEFAULT_ADAPTER = "documenso"
ESIGN_JOB = "esign"
FINAL = frozenset({"signed", "declined", "expired", "failed"})
# A provider's statuses in the order a document goes through them; a final one never changes.
_RANK = {"pending": 0, "viewed": 1, "in_progress": 2, "signed": 3, "declined": 3, "expired": 3, "failed": 3}
_KEY_UNSAFE = re.compile(r"[^a-z0-9_]+")
_PLACEHOLDER = re.compile(r"\{\{\s*([^{}]+?)\s*\}\}")


def adapter_of(document: CampaignDocument) -> str:
    """The e-signature adapter a document goes through: its `type`, or the built-in one."""
    return document.type or DEFAULT_ADAPTER


def sent_automatically(document: CampaignDocument) -> bool:
    return document.is_active and document.auto_send and document.kind == "esign"


def first_job(campaign: Campaign | None) -> str:
    """The job a qualified lead of `campaign` gets: its documents first when it sends any."""
    if campaign is not None and any(sent_automatically(d) for d in campaign.documents):
        return ESIGN_JOB
    return "deliver"


def applicable(campaign: Campaign, facts: Mapping[str, Any], *, value_sets: Mapping, today: date
               ) -> list[CampaignDocument]:
    """The documents sent to this lead, in `order` (then as listed): active, `autoSend`, and
    whose `conditions` match (none: every lead). A document that does not apply is neither sent
    nor waited for."""
    chosen = [d for d in campaign.documents if sent_automatically(d)
              and (d.conditions is None or not d.conditions.sub_rules
                   or matches(d.conditions.logical_operator, d.conditions.sub_rules, facts,
                              value_sets=value_sets, today=today))]
    return sorted(chosen, key=lambda d: d.order)  # sorted() is stable: ties keep the listed order


# A lead whose documents are being settled (`queued`: a person may set it by hand meanwhile).
WAITING = frozenset({"qualified", "pending", "document_sent", "queued"})


def file_key_of(document: CampaignDocument) -> str:
    """The file key of a document's file reference (lowercase letters, digits, underscores)."""
    return "esign_" + (_KEY_UNSAFE.sub("_", document.document_id.lower()).strip("_") or "document")


def field_values(overrides: Sequence[MappingOverride], facts: Mapping[str, Any], today: date) -> dict[str, str]:
    """Template field name -> value. `field_library`: the lead's value of `sourceValue`;
    `static`: `sourceValue` itself; `template`: `sourceValue` with `{{key}}` replaced by the
    lead's values. When the lead has no value, `fallbackTemplate` (its `{{key}}`s filled the same
    way); with neither the field is left for the signer. `autoFill: false` leaves it too."""
    values: dict[str, str] = {}
    for o in overrides:
        name = o.provider_field_name or o.provider_field_label or o.provider_field_id
        if not name or not o.auto_fill:
            continue
        value: str | None
        if o.source_type == "static":
            value = o.source_value
        elif o.source_type == "template":
            value = _fill(o.source_value or "", facts, today)
        else:
            value = _value_of(facts, o.source_value, today) if o.source_value else None
        if not value and o.fallback_template:
            value = _fill(o.fallback_template, facts, today)
        if value:
            values[name] = value
    return values


def placeholders(template: str) -> list[str]:
    """The field keys a `{{key}}` template reads."""
    return _PLACEHOLDER.findall(template)


def _value_of(facts: Mapping[str, Any], key: str, today: date) -> str | None:
    """A field library key's value: a submit body path, or a questionnaire answer's key."""
    value = resolve(facts, key, today)
    if is_absent(value) and not key.startswith("questionnaire."):
        value = resolve(facts, "questionnaire." + key, today)
    return _text(value)


def _text(value: Any) -> str | None:
    if is_absent(value) or isinstance(value, (dict, list)):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value).strip()
    return text or None


def _fill(template: str, facts: Mapping[str, Any], today: date) -> str:
    return _PLACEHOLDER.sub(lambda m: _value_of(facts, m.group(1), today) or "", template).strip()


def moves(current: str, new: str) -> bool:
    """Whether a provider's `new` status changes a document now at `current`: only forwards, and
    a final status (signed, declined, expired, failed) is kept."""
    return current not in FINAL and _RANK.get(new, -1) > _RANK.get(current, 0)


def expires_at(document: CampaignDocument, sent_at: datetime) -> datetime | None:
    if document.expires_in_days is None:
        return None
    return sent_at + timedelta(days=float(document.expires_in_days))


class Sent(NamedTuple):
    """A lead's document as its file reference records it."""
    document_id: str
    name: str
    required: bool
    status: str
    expires_at: str | None       # ISO 8601, when the document has expiresInDays
    problem: str | None          # why it cannot go on ("could not be sent: ...", "was signed but ...")
    reason: str | None           # a provider's reason for a failure
    fetched: bool                # the signed file is kept


class Verdict(NamedTuple):
    outcome: Literal["fetch", "signed", "waiting", "failed", "held", "deliver"]
    reason: str | None = None
    expired: tuple[str, ...] = ()     # documentIds that run out now
    wake_at: str | None = None        # waiting: when the earliest unsigned document runs out


def verdict(sent: Iterable[Sent], now: str) -> Verdict:
    """What the lead's documents come to, once every applicable one is sent:
    - a required one could not be sent: `held` (a person looks at it);
    - a required one declined, failed or run out unsigned: `failed`, naming it;
    - a signed one whose file is not kept yet: `fetch`;
    - every required one signed: `signed`; none required: `deliver`;
    - else `waiting`, until `wake_at` (the earliest run-out)."""
    documents = list(sent)
    required = [d for d in documents if d.required]
    for d in required:
        if d.problem is not None:
            return Verdict("held", f"document {d.name} {d.problem}")
    expired = tuple(d.document_id for d in documents
                    if d.status not in FINAL and d.expires_at is not None and d.expires_at <= now)
    for d in required:
        status = "expired" if d.document_id in expired else d.status
        if status == "declined":
            return Verdict("failed", f"document {d.name} was declined", expired)
        if status == "expired":
            return Verdict("failed", f"document {d.name} expired unsigned", expired)
        if status == "failed":
            return Verdict("failed", f"document {d.name} failed" + (f": {d.reason}" if d.reason else ""), expired)
    # A file that could not be fetched (`problem`) is not fetched again: its document is noted.
    if any(d.status == "signed" and not d.fetched and d.problem is None for d in documents):
        return Verdict("fetch", None, expired)
    if not required:
        return Verdict("deliver", None, expired)
    if all(d.status == "signed" for d in required):
        return Verdict("signed", "every required document is signed", expired)
    waits = [d.expires_at for d in documents if d.status not in FINAL and d.expires_at is not None
             and d.document_id not in expired]
    return Verdict("waiting", "waiting for " + ", ".join(d.name for d in required if d.status != "signed")
                   + " to be signed", expired, min(waits) if waits else None)
