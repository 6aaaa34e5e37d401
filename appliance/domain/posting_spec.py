"""A source's posting spec (CONTRACT 9.4): the fields a supplier posts to one campaign, worked out
from the submit body, the tenant's field library, the campaign's questionnaire, its consent
policy and its qualification rules (with the value sets they name), and a body and a curl line
built from the fields' examples.

What the rules add: a qualification rule set describes a lead the campaign does not want, so
only a condition that refuses a lead on its own (its rule set matches whenever it holds, at
`disqualify` severity, or `review` at ingestion: a `flag` only records) is a demand on every lead. Such a `not_in_value_set` or `not_equals` admits only its values
(`allowedValues`); it, `not_contains` and `not_exists` also hold when the field is missing, so
they make the field required; an `in_value_set` or `equals` rules values out, which only steers
the example away from them."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from appliance.domain.campaign import Campaign, Condition, IngestionSource, RuleSet, sells_at_auction
from appliance.domain.catalog import DataType, FieldLibraryEntry, Questionnaire
from appliance.domain.lead import Address
from appliance.domain.pipeline import usable
from appliance.domain.rules import as_number
from appliance.domain.standard_fields import STANDARD_FIELDS
from appliance.domain.submission import SubmitLead
from appliance.model import Model

FieldType = Literal["string", "number", "integer", "boolean", "date", "email", "phone", "object"]
Value = str | int | float | bool


class PostingSpecRules(Model, omit_defaults=True):
    """The field library's validation rules of the field, those set."""

    pattern: str | None = None
    min_length: int | None = None
    max_length: int | None = None
    min: int | float | None = None
    max: int | float | None = None


class PostingSpecField(Model, omit_defaults=True):
    path: str  # dotted, as a submit body nests it: `address.state`, `questionnaire.injured`
    type: FieldType
    required: bool
    example: Any
    allowed_values: list[Value] | None = None
    label: str | None = None
    rules: PostingSpecRules | None = None


class PostingSpecExamples(Model):
    body: dict[str, Any]
    curl: str


class PostingSpec(Model, omit_defaults=True):
    source_id: str
    campaign_id: str
    active: bool  # whether the campaign takes this source's leads now
    submit_url: str
    ping_url: str | None = None
    fields: list[PostingSpecField]
    examples: PostingSpecExamples


def source_on(campaign: Campaign, source_id: str) -> IngestionSource | None:
    return next((s for s in campaign.ingestion.sources if s.source_id == source_id), None)


def takes_from(campaign: Campaign, source_id: str) -> bool:
    """Whether the source's key may submit to the campaign (what submit checks for a source key)."""
    source = source_on(campaign, source_id)
    return source is not None and source.active and usable(campaign)


# ---- what a submit body can carry -------------------------------------------------------------

_BODY = frozenset(f.encode_name for f in msgspec.structs.fields(SubmitLead))
_ADDRESS = frozenset(f.encode_name for f in msgspec.structs.fields(Address))
_OPEN_OBJECTS = frozenset(("questionnaire", "attribution", "compliance", "customFields"))  # any key inside
_NOT_POSTED = frozenset(("leadId", "files"))  # a resubmission's; file references are managed apart
_QUESTIONNAIRE = "questionnaire."
_CONTACT_REQUIRED = frozenset(("firstName", "lastName", "email", "phone"))  # for a new lead


def _postable(path: str) -> bool:
    head, _, rest = path.partition(".")
    if head not in _BODY or head in _NOT_POSTED:
        return False
    if head == "address":
        return rest in _ADDRESS
    if head == "compliance" and rest.partition(".")[0] == "trustedForm":  # written by the appliance
        return False
    return bool(rest) == (head in _OPEN_OBJECTS)


# ---- fields -----------------------------------------------------------------------------------

@dataclass
class _Draft:
    kind: DataType
    required: bool = False
    label: str | None = None
    rules: PostingSpecRules | None = None
    allowed: list[Value] | None = None  # None: any value
    excluded: list[Any] = field(default_factory=list)

    def allow(self, values: Iterable[Any]) -> None:
        offered = [v for v in values if v is not None]
        if self.allowed is None:
            self.allowed = offered
        else:
            kept = {_fold(v) for v in offered}
            self.allowed = [v for v in self.allowed if _fold(v) in kept]


def _fold(value: Any) -> Any:
    """A value as conditions compare it: numbers as numbers, text trimmed and case-insensitive."""
    number = as_number(value)
    if number is not None:
        return number
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).strip().casefold()


def _draft(entry: FieldLibraryEntry, *, label: str | None = None, required: bool = False) -> _Draft:
    rules = entry.validation_rules
    shown = PostingSpecRules(pattern=rules.pattern, min_length=rules.min_length, max_length=rules.max_length,
                             min=rules.min, max=rules.max)
    return _Draft(kind=entry.data_type, required=required or rules.required,
                  label=label or entry.question or entry.label,
                  rules=shown if shown != PostingSpecRules() else None)


def _catalog_fields(campaign: Campaign, entries: Sequence[FieldLibraryEntry],
                    questionnaire: Questionnaire | None) -> dict[str, _Draft]:
    """campaignId and the contact fields, the questionnaire's questions, the tenant's own entries,
    then the other standard fields: every field library entry a submit can carry."""
    active = {e.key: e for e in entries if e.active}
    drafts = {"campaignId": _Draft(kind="string", required=True, label="Campaign", allowed=[campaign.campaign_id])}

    def standard(contact: bool) -> None:
        for entry in STANDARD_FIELDS:
            if (entry.category == "contact") == contact and entry.key not in drafts and _postable(entry.key):
                drafts[entry.key] = _draft(active.get(entry.key, entry), required=entry.key in _CONTACT_REQUIRED)

    standard(contact=True)
    asked = questionnaire.questions if questionnaire is not None and questionnaire.active else []
    for question in asked:
        known = active.get(question.key)
        draft = _draft(known, label=question.question) if known is not None and known.category == "question" \
            else _Draft(kind="string", label=question.question)
        if question.options:
            draft.allow(question.options)
        drafts[_QUESTIONNAIRE + question.key] = draft
    standard_keys = {e.key for e in STANDARD_FIELDS}
    for entry in active.values():
        if entry.key in standard_keys:
            continue
        path = _QUESTIONNAIRE + entry.key if entry.category == "question" else entry.key
        # Another questionnaire's question matters here only when every lead must answer it.
        if path not in drafts and _postable(path) and (entry.category != "question" or entry.validation_rules.required):
            drafts[path] = _draft(entry)
    standard(contact=False)
    return drafts


def _decisive(rule_set: RuleSet) -> list[Condition]:
    """The conditions that make the rule set disqualify a lead, or hold it for review, on their own."""
    subs = rule_set.sub_rules
    if not rule_set.is_active or (rule_set.logical_operator == "AND" and len(subs) != 1):
        return []
    # Only disqualifying matters just before sending.
    refusing = ("disqualify", "review") if rule_set.applies_at == "ingestion" else ("disqualify",)
    return [c for sub in subs if sub.logical_operator == "OR" or len(sub.conditions) == 1
            for c in sub.conditions if c.field and not c.prompt and c.max_severity in refusing]


def _kind_of(values: Sequence[Any]) -> DataType:
    if values and all(isinstance(v, bool) for v in values):
        return "boolean"
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "integer"
    if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return "number"
    return "string"


_RULING_OUT = ("equals", "in_value_set")


def _apply_rule(drafts: dict[str, _Draft], cond: Condition, value_sets: Mapping[str, Sequence[Value]]) -> None:
    path, op = cond.field or "", cond.operator
    if not _postable(path):
        return
    if cond.value_set_id and op in ("in_value_set", "not_in_value_set"):
        values = value_sets.get(cond.value_set_id)  # an unknown set rules nothing in or out
    else:
        values = cond.value
    values = [v for v in values or () if v is not None]
    if op in _RULING_OUT:
        if path in drafts:
            drafts[path].excluded += values
        return
    if op not in ("not_equals", "not_in_value_set", "not_contains", "not_exists"):
        return
    draft = drafts.setdefault(path, _Draft(kind=_kind_of(values)))
    draft.required = True
    if op in ("not_equals", "not_in_value_set") and values:
        draft.allow(values)


def _apply_consent(drafts: dict[str, _Draft], campaign: Campaign) -> None:
    policy = campaign.qualification.tcpa_policy
    attested = policy.ingestion_policy.require_source_attestation

    def need(path: str, kind: DataType) -> _Draft:
        draft = drafts.setdefault(path, _Draft(kind=kind))
        draft.required = True
        return draft

    if attested or policy.delivery_policy.required:
        need("compliance.tcpaConsent", "boolean").allow([True])
    if attested:
        need("compliance.consentTimestamp", "date")
    if policy.ingestion_policy.verify_certificate:
        need("compliance.trustedFormCertUrl", "url")


# ---- examples ---------------------------------------------------------------------------------

_EXAMPLES: dict[str, Any] = {
    "firstName": "Maria", "lastName": "Garcia", "email": "maria.garcia@example.com", "phone": "+14155550142",
    "country": "US", "dateOfBirth": "1988-04-12", "timezone": "America/Los_Angeles",
    "address.street": "1200 Valencia St", "address.city": "San Francisco", "address.state": "CA",
    "address.zip": "94110", "notes": "Prefers a call after 5 pm", "isTest": False,
    "attribution.params": {"utm_source": "google"}, "attribution.captureUrl": "https://www.example.com/landing",
    "attribution.referrer": "https://www.example.com/", "attribution.ipAddress": "203.0.113.7",
    "attribution.userAgent": "Mozilla/5.0", "compliance.tcpaConsent": True,
    "compliance.consentTimestamp": "2026-11-21T09:30:00Z",
    "compliance.consentText": "I agree to be contacted about my request.",
    "compliance.trustedFormCertUrl": "https://cert.trustedform.com/0123456789abcdef0123456789abcdef01234567",
    "compliance.jornayaLeadId": "01234567-89AB-CDEF-0123-456789ABCDEF", "compliance.ipAddress": "203.0.113.7",
    "compliance.userAgent": "Mozilla/5.0", "pingId": "png_01JD3Q0N4K2W8R6T1M5X9PB7CE",
}
# Tried in order after the field's own example, until one no rule rules out.
_BY_KIND: dict[str, tuple[Any, ...]] = {
    "string": ("example", "sample", "other"),
    "number": (1.5, 2.5, 10),
    "integer": (1, 2, 10),
    "boolean": (True, False),
    "date": ("2026-01-15", "2025-06-01"),
    "email": ("maria.garcia@example.com", "sam.lee@example.com"),
    "phone": ("+14155550142", "+12125550199"),
    "url": ("https://www.example.com/", "https://www.example.org/"),
    "file": ({"fileName": "document.pdf"},),
    "json": ({"key": "value"},),
}
_TYPE_OF: dict[str, FieldType] = {"url": "string", "file": "object", "json": "object"}


def _fit(value: Any, rules: PostingSpecRules | None) -> Any:
    """The example brought within the field library's bounds and lengths (a pattern it may miss)."""
    if rules is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        if rules.min is not None and value < rules.min:
            value = rules.min
        if rules.max is not None and value > rules.max:
            value = rules.max
    elif isinstance(value, str):
        if rules.min_length is not None:
            value = value.ljust(rules.min_length, "x")
        if rules.max_length is not None:
            value = value[:rules.max_length]
    return value


def _example(path: str, draft: _Draft) -> Any:
    ruled_out = {_fold(v) for v in draft.excluded}
    if draft.allowed:
        return next((v for v in draft.allowed if _fold(v) not in ruled_out), draft.allowed[0])
    pool = ((_EXAMPLES[path],) if path in _EXAMPLES else ()) + _BY_KIND[draft.kind]
    return _fit(next((v for v in pool if _fold(v) not in ruled_out), pool[0]), draft.rules)


def _body(values: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """Dotted paths nested as a submit body takes them; a question's key is one key, dots and all."""
    body: dict[str, Any] = {}
    for path, value in values:
        parts = ["questionnaire", path[len(_QUESTIONNAIRE):]] if path.startswith(_QUESTIONNAIRE) else path.split(".")
        node = body
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                break
        else:
            node[parts[-1]] = value
    return body


def curl_line(submit_url: str, body: Mapping[str, Any]) -> str:
    """One line to paste in a shell: the key comes from the shell's $KEY."""
    data = msgspec.json.encode(body).decode()
    return (f'curl -s -X POST {shlex.quote(submit_url)} -H "X-API-Key: $KEY" '
            f'-H "Content-Type: application/json" -d {shlex.quote(data)}')


# ---- the spec ---------------------------------------------------------------------------------

def build_spec(campaign: Campaign, source_id: str, *, entries: Sequence[FieldLibraryEntry],
               questionnaire: Questionnaire | None, value_sets: Mapping[str, Sequence[Value]],
               submit_url: str, ping_url: str) -> PostingSpec:
    """The spec of `source_id` (listed by the campaign) posting to `campaign`. `value_sets` as
    imported (not folded); `ping_url` is shown when a ping gets an offer: the campaign sells at
    auction, or the source has a fixed payout."""
    source = source_on(campaign, source_id)
    drafts = _catalog_fields(campaign, entries, questionnaire)
    demands = [cond for rule_set in campaign.qualification.rules for cond in _decisive(rule_set)]
    # Values ruled out last: they steer the examples of every field listed by then.
    for cond in sorted(demands, key=lambda c: c.operator in _RULING_OUT):
        _apply_rule(drafts, cond, value_sets)
    _apply_consent(drafts, campaign)
    offers = sells_at_auction(campaign) or (source is not None and source.payout is not None)
    if offers:
        drafts["pingId"] = _Draft(kind="string", label="The pingId a ping of this lead was answered with")
    # Required fields first; otherwise in the order found.
    ordered = sorted(drafts.items(), key=lambda item: not item[1].required)
    fields = [PostingSpecField(path=path, type=_TYPE_OF.get(d.kind, d.kind), required=d.required,
                               example=_example(path, d), allowed_values=d.allowed, label=d.label, rules=d.rules)
              for path, d in ordered]
    # The body: what every lead must carry, what the rules constrain, and the questionnaire's answers.
    body = _body((f.path, f.example) for f in fields
                 if f.required or f.allowed_values is not None or f.path.startswith(_QUESTIONNAIRE))
    return PostingSpec(source_id=source_id, campaign_id=campaign.campaign_id, active=takes_from(campaign, source_id),
                       submit_url=submit_url, ping_url=ping_url if offers else None, fields=fields,
                       examples=PostingSpecExamples(body=body, curl=curl_line(submit_url, body)))
