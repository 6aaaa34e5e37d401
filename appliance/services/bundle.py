"""Tenant bundles: the JSON or TOML file `appliance import` reads and `export` writes.

Decoding reports every problem it finds as a `"<path>: <what is wrong>"` string, item by item, and
then checks what one item cannot: unique ids and references between items. Plaintext secrets are
split off (`split_secrets`) before anything is stored; the refs name their owner, never the value.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import date, datetime, time
from pathlib import PurePath
from typing import Any, Literal, TypeVar

import msgspec
from msgspec.structs import replace

from appliance import sdk
from appliance.domain.documents import adapter_of, file_key_of, placeholders
from appliance.domain.campaign import Campaign, Condition, RuleSet, SubRule
from appliance.domain.catalog import FieldLibraryEntry, Questionnaire, ValueSet
from appliance.domain.endpoint import SEALED, DeliveryEndpoint, split_credentials
from appliance.domain.messaging import Pixel, SmsConfig
from appliance.domain.suppression import SMS_OPT_OUTS
from appliance.domain.secret_refs import (
    endpoint_secret_ref, pixel_token_ref, sms_secret_ref, source_key_ref, webhook_secret_ref,
)
from appliance.domain.client import ClientRecord
from appliance.domain.tenant_options import TenantOptions
from appliance.domain.webhooks import BundleWebhook
from appliance.model import Model, all_problems, describe_validation_error, join_path

BundleFormat = Literal["json", "toml"]
T = TypeVar("T")


class TenantBundle(Model):
    campaigns: list[Campaign] = []
    questionnaires: list[Questionnaire] = []
    field_library: list[FieldLibraryEntry] = []
    value_sets: list[ValueSet] = []
    delivery_endpoints: list[DeliveryEndpoint] = []
    sms: SmsConfig | None = None
    pixels: list[Pixel] = []
    webhooks: list[BundleWebhook] = []
    settings: TenantOptions | None = None  # the tenant's own: `requireTwoFactor`
    clients: list[ClientRecord] = []


class BundleError(Exception):
    """A bundle that cannot be imported; `problems` are path strings and never carry values."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def format_from_filename(name: str) -> BundleFormat:
    suffix = PurePath(name).suffix.lower()
    if suffix == ".json":
        return "json"
    if suffix == ".toml":
        return "toml"
    raise BundleError([f"bundle: cannot tell the format of {PurePath(name).name!r}; use .json or .toml"])


def load_bundle(
    raw: bytes,
    fmt: str,
    *,
    known_value_sets: frozenset[str] = frozenset(),
    known_endpoints: frozenset[str] = frozenset(),
    known_campaigns: frozenset[str] = frozenset(),
    known_questionnaires: frozenset[str] | None = None,
    known_suppression_lists: frozenset[str] | None = None,
    known_pinging_endpoints: frozenset[str] = frozenset(),
    known_clients: frozenset[str] = frozenset(),
    stored_campaigns: Sequence[Campaign] = (),
    known_field_keys: frozenset[str] | None = None,
    known_esign_adapters: frozenset[str] | None = None,
    verifiers: Mapping[str, sdk.Verifier] | None = None,
) -> TenantBundle:
    """Decode and check a bundle. `known_*` are the tenant's stored ids that references may name.
    With `known_questionnaires` None, questionnaireIds are checked only against a bundle that
    carries questionnaires. `known_pinging_endpoints`: stored endpoints that have a `ping` (an
    endpoint in the bundle counts as the bundle has it); `stored_campaigns`: the tenant's campaigns,
    whose auctions must still find a ping or a bid for each buyer once the bundle is in.
    `known_field_keys`: the tenant's field library keys (the bundle's are added), which a
    document's `field_library` mapping must name; `known_esign_adapters`: the e-signature adapters
    loaded, which a document's `type` must name (None: not checked); `verifiers`: the verifiers
    loaded, which a campaign's verification steps must name and whose config each checks (None:
    not checked)."""
    bundle = _decode(_parse(raw, fmt))
    problems = _cross_check(
        bundle,
        value_sets=known_value_sets | {v.value_set_id for v in bundle.value_sets},
        endpoints=known_endpoints | {e.delivery_endpoint_id for e in bundle.delivery_endpoints},
        pinging=(known_pinging_endpoints - {e.delivery_endpoint_id for e in bundle.delivery_endpoints})
        | {e.delivery_endpoint_id for e in bundle.delivery_endpoints if e.ping is not None},
        campaigns=known_campaigns | {c.campaign_id for c in bundle.campaigns},
        clients=known_clients | {c.client_id for c in bundle.clients},
        questionnaires=(
            None if known_questionnaires is None and not bundle.questionnaires
            else (known_questionnaires or frozenset()) | {q.questionnaire_id for q in bundle.questionnaires}
        ),
    )
    problems += _document_problems(
        bundle, None if known_field_keys is None else known_field_keys | {f.key for f in bundle.field_library},
        known_esign_adapters)
    if verifiers is not None:
        problems += _verification_problems(bundle, verifiers)
    replaced = {c.campaign_id for c in bundle.campaigns}
    for i, e in enumerate(bundle.delivery_endpoints):
        if e.ping is not None:
            continue
        needing = sorted(c.campaign_id for c in stored_campaigns if c.campaign_id not in replaced
                         and _auction_needs_ping(c, e.delivery_endpoint_id))
        if needing:
            problems.append(f"deliveryEndpoints[{i}].ping: required: campaign {', '.join(needing)} sells to this"
                            " buyer at auction without a fixed bid")
    # Lists live in the database only, never in a bundle; `sms-opt-outs` is every tenant's own.
    if known_suppression_lists is not None:
        problems += [
            f"campaigns[{i}].qualification.suppressionListIds[{j}]: unknown suppression list"
            for i, c in enumerate(bundle.campaigns)
            for j, list_id in enumerate(c.qualification.suppression_list_ids)
            if list_id not in known_suppression_lists and list_id != SMS_OPT_OUTS
        ]
    if problems:
        raise BundleError(problems)
    return bundle


def _auction_needs_ping(campaign: Campaign, endpoint_id: str) -> bool:
    distribution = campaign.delivery.distribution
    return distribution is not None and distribution.method == "auction" and any(
        e.delivery_endpoint_id == endpoint_id and e.bid is None for e in distribution.endpoints)


def _parse(raw: bytes, fmt: str) -> Any:
    if fmt == "json":
        try:
            return msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            raise BundleError([f"bundle: malformed JSON: {_json_position(str(exc), raw)}"]) from None
        except UnicodeDecodeError as exc:  # msgspec's answer to bad UTF-8 inside a string
            raise BundleError([f"bundle: not UTF-8 text (byte {exc.start})"]) from None
    if fmt == "toml":
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BundleError([f"bundle: not UTF-8 text (byte {exc.start})"]) from None
        try:
            return _plain(tomllib.loads(text))
        except tomllib.TOMLDecodeError as exc:
            raise BundleError([f"bundle: malformed TOML: {_lower_first(str(exc))}"]) from None
    raise BundleError([f"bundle: unknown format {fmt!r}; use json or toml"])


def _json_position(message: str, raw: bytes) -> str:
    # msgspec names a byte offset; people look for a line and column.
    message = _lower_first(message.removeprefix("JSON is malformed: "))
    found = re.search(r"\(byte (\d+)\)$", message)
    if not found:
        return message
    offset = int(found[1])
    line = raw.count(b"\n", 0, offset) + 1
    column = offset - (raw.rfind(b"\n", 0, offset) + 1) + 1
    return f"{message[:found.start()]}(at line {line}, column {column})"


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def _plain(value: Any) -> Any:
    """TOML's native dates and times as the ISO strings the shapes hold."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, time):
        # A TOML time needs seconds; schedules are HH:MM.
        return value.strftime("%H:%M") if not (value.second or value.microsecond) else value.isoformat()
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return value


_ITEM_SECTIONS: dict[str, type[Model]] = {
    "campaigns": Campaign,
    "questionnaires": Questionnaire,
    "fieldLibrary": FieldLibraryEntry,
    "valueSets": ValueSet,
    "deliveryEndpoints": DeliveryEndpoint,
    "pixels": Pixel,
    "webhooks": BundleWebhook,
    "clients": ClientRecord,
}


def _decode(data: Any) -> TenantBundle:
    # Item by item, so one bad campaign does not hide the problems of the next.
    problems: list[str] = []
    try:
        data = msgspec.convert(data, dict[str, Any])
    except msgspec.ValidationError as exc:
        raise BundleError([_describe(exc, "bundle")]) from None
    problems += [f"{key}: unknown field" for key in data if key not in _ITEM_SECTIONS and key not in ("sms", "settings")]
    sections: dict[str, Any] = {}
    for wire, item_type in _ITEM_SECTIONS.items():
        try:
            items = msgspec.convert(data.get(wire, []), list)
        except msgspec.ValidationError as exc:
            problems.append(_describe(exc, wire))
            continue
        sections[wire] = []
        for i, item in enumerate(items):
            try:
                sections[wire].append(msgspec.convert(item, item_type))
            except msgspec.ValidationError as exc:
                problems += all_problems(item, item_type, f"{wire}[{i}]") or [_describe(exc, f"{wire}[{i}]")]
    if data.get("sms") is not None:
        try:
            sections["sms"] = msgspec.convert(data["sms"], SmsConfig)
        except msgspec.ValidationError as exc:
            problems += all_problems(data["sms"], SmsConfig, "sms") or [_describe(exc, "sms")]
    if data.get("settings") is not None:
        try:
            sections["settings"] = msgspec.convert(data["settings"], TenantOptions)
        except msgspec.ValidationError as exc:
            problems.append(_describe(exc, "settings"))
    if problems:
        raise BundleError(problems)
    return TenantBundle(
        campaigns=sections["campaigns"],
        questionnaires=sections["questionnaires"],
        field_library=sections["fieldLibrary"],
        value_sets=sections["valueSets"],
        delivery_endpoints=sections["deliveryEndpoints"],
        sms=sections.get("sms"),
        pixels=sections["pixels"],
        webhooks=sections["webhooks"],
        settings=sections.get("settings"),
        clients=sections["clients"],
    )


def _describe(exc: msgspec.ValidationError, prefix: str) -> str:
    path, problem = describe_validation_error(exc).split(": ", 1)
    if path == "body":  # describe_validation_error's name for the value itself
        return f"{prefix}: {problem}"
    return f"{join_path(prefix, path)}: {problem}"


def _duplicates(path: str, items: Sequence[T], field: str, key: Callable[[T], str]) -> list[str]:
    """One problem per repeated id, naming where the id first appeared."""
    first: dict[str, str] = {}
    problems = []
    for i, item in enumerate(items):
        owner = f"{path}[{i}]"
        if key(item) in first:
            problems.append(f"{owner}.{field}: duplicate of {first[key(item)]}")
        else:
            first[key(item)] = owner
    return problems


def _rule_set_conditions(path: str, rules: RuleSet | None) -> Iterator[tuple[str, Condition]]:
    if rules is not None:
        yield from _sub_rule_conditions(path, rules.sub_rules)


def _sub_rule_conditions(path: str, sub_rules: list[SubRule]) -> Iterator[tuple[str, Condition]]:
    for j, sub in enumerate(sub_rules):
        for k, condition in enumerate(sub.conditions):
            yield f"{path}.subRules[{j}].conditions[{k}]", condition


def _campaign_conditions(path: str, c: Campaign) -> Iterator[tuple[str, Condition]]:
    q = c.qualification
    for i, rules in enumerate(q.rules):
        yield from _rule_set_conditions(f"{path}.qualification.rules[{i}]", rules)
    for i, route in enumerate(q.routing_rules):
        yield from _sub_rule_conditions(f"{path}.qualification.routingRules[{i}]", route.sub_rules)
    for i, doc in enumerate(c.documents):
        yield from _rule_set_conditions(f"{path}.documents[{i}].conditions", doc.conditions)
    for i, source in enumerate(c.ingestion.sources):
        for m, milestone in enumerate(source.cost_milestones):
            yield from _rule_set_conditions(
                f"{path}.ingestion.sources[{i}].costMilestones[{m}].conditions", milestone.conditions
            )
    for m, milestone in enumerate(c.delivery.revenue_milestones):
        yield from _rule_set_conditions(
            f"{path}.delivery.revenueMilestones[{m}].conditions", milestone.conditions
        )
    for e, entry in enumerate(c.delivery.distribution.endpoints if c.delivery.distribution else []):
        yield from _rule_set_conditions(f"{path}.delivery.distribution.endpoints[{e}].conditions", entry.conditions)


def _campaign_references(path: str, c: Campaign) -> Iterator[tuple[str, str]]:
    """(path, campaignId) of every campaign a campaign sends leads on to."""
    q = c.qualification
    for i, code in enumerate(q.fallback_campaigns):
        yield f"{path}.qualification.fallbackCampaigns[{i}]", code
    for i, route in enumerate(q.routing_rules):
        yield f"{path}.qualification.routingRules[{i}].routeTo.campaignId", route.route_to.campaign_id
    for i, limit in enumerate(c.delivery.delivery_limits):
        if limit.route_to_campaign_id:
            yield f"{path}.delivery.deliveryLimits[{i}].routeToCampaignId", limit.route_to_campaign_id
    schedule = c.delivery.delivery_schedule
    if schedule is not None and schedule.route_to_campaign_id:
        yield f"{path}.delivery.deliverySchedule.routeToCampaignId", schedule.route_to_campaign_id


def _document_problems(bundle: TenantBundle, field_keys: frozenset[str] | None,
                       esign_adapters: frozenset[str] | None) -> list[str]:
    """A campaign document must name a loaded e-signature adapter (its `type`; none: the built-in
    one), a template to send (`signTemplateId`, when it is sent by itself), and field library keys
    its `field_library` mappings read."""
    problems = []
    for i, c in enumerate(bundle.campaigns):
        problems += _duplicates(f"campaigns[{i}].documents", c.documents, "documentId", lambda d: d.document_id)
        keys: dict[str, str] = {}
        for j, d in enumerate(c.documents):
            path = f"campaigns[{i}].documents[{j}]"
            if d.kind != "esign":
                continue
            # A sent document is the lead's file `esign_<documentId>` in lower case, other
            # characters as `_`: two ids that read alike there would be one file.
            twin = keys.setdefault(file_key_of(d), d.document_id)
            if twin != d.document_id:
                problems.append(f"{path}.documentId: {d.document_id!r} makes the same file key as {twin!r}"
                                f" ({file_key_of(d)}); ids must differ in letters or digits")
            if esign_adapters is not None and adapter_of(d) not in esign_adapters:
                known = ", ".join(sorted(esign_adapters)) or "none"
                problems.append(f"{path}.type: unknown e-signature provider {adapter_of(d)!r} (loaded: {known})")
            if d.auto_send and d.is_active and not d.sign_template_id:
                problems.append(f"{path}.signTemplateId: required for a document sent automatically")
            for k, o in enumerate(d.field_mapping_overrides):
                if field_keys is None:
                    continue
                where = f"{path}.fieldMappingOverrides[{k}]"
                for name, text in (("sourceValue", o.source_value if o.source_type == "template" else None),
                                   ("fallbackTemplate", o.fallback_template)):
                    problems += [f"{where}.{name}: unknown field library key {key!r}" for key in
                                 placeholders(text or "") if key not in field_keys
                                 and not key.startswith("questionnaire.")]
                if o.source_type != "field_library":
                    continue
                if not o.source_value:
                    problems.append(f"{path}.fieldMappingOverrides[{k}].sourceValue: required: the field library key"
                                    " to read")
                elif o.source_value not in field_keys and not o.source_value.startswith("questionnaire."):
                    problems.append(f"{path}.fieldMappingOverrides[{k}].sourceValue: unknown field library key"
                                    f" {o.source_value!r}")
    return problems


def _verification_problems(bundle: TenantBundle, verifiers: Mapping[str, sdk.Verifier]) -> list[str]:
    """A verification step must name a loaded verifier, with a config that verifier accepts."""
    problems = []
    for i, c in enumerate(bundle.campaigns):
        for j, step in enumerate(c.qualification.verifications):
            path = f"campaigns[{i}].qualification.verifications[{j}]"
            verifier = verifiers.get(step.verifier)
            if verifier is None:
                known = ", ".join(sorted(verifiers)) or "none"
                problems.append(f"{path}.verifier: unknown verifier {step.verifier!r} (loaded: {known})")
                continue
            try:
                found = verifier.validate(step.config)
            except Exception as exc:  # a plugin's bug: the config cannot be said to be good
                found = [f"config: the {step.verifier} verifier could not check it ({type(exc).__name__})"]
            if not isinstance(found, (list, tuple)):  # a plugin's bug too (None, a lone string)
                found = [f"config: the {step.verifier} verifier could not check it (it answered no list of problems)"]
            problems += [f"{path}.{problem}" for problem in found if isinstance(problem, str)]
    return problems


def _cross_check(
    bundle: TenantBundle,
    *,
    value_sets: frozenset[str],
    endpoints: frozenset[str],
    pinging: frozenset[str],
    campaigns: frozenset[str],
    clients: frozenset[str],
    questionnaires: frozenset[str] | None,
) -> list[str]:
    problems = [
        *_duplicates("campaigns", bundle.campaigns, "campaignId", lambda c: c.campaign_id),
        *_duplicates("questionnaires", bundle.questionnaires, "questionnaireId",
                     lambda q: q.questionnaire_id),
        *_duplicates("fieldLibrary", bundle.field_library, "key", lambda f: f.key),
        *_duplicates("valueSets", bundle.value_sets, "valueSetId", lambda v: v.value_set_id),
        *_duplicates("deliveryEndpoints", bundle.delivery_endpoints, "deliveryEndpointId",
                     lambda e: e.delivery_endpoint_id),
        *_duplicates("pixels", bundle.pixels, "pixelId", lambda p: p.pixel_id),
        *_duplicates("webhooks", bundle.webhooks, "webhookId", lambda w: w.webhook_id),
        *_duplicates("clients", bundle.clients, "clientId", lambda c: c.client_id),
        *[f"deliveryEndpoints[{i}].clientId: unknown client" for i, e in enumerate(bundle.delivery_endpoints)
          if e.client_id is not None and e.client_id not in clients],
    ]
    for i, q in enumerate(bundle.questionnaires):
        problems += _duplicates(f"questionnaires[{i}].questions", q.questions, "key", lambda x: x.key)

    for i, c in enumerate(bundle.campaigns):
        path = f"campaigns[{i}]"
        # A source key is bound to a sourceId and the same source may feed several campaigns,
        # so sourceIds repeat across campaigns but not within one.
        problems += _duplicates(
            f"{path}.ingestion.sources", c.ingestion.sources, "sourceId", lambda s: s.source_id
        )
        questionnaire_id = c.questionnaire_id
        if questionnaires is not None and questionnaire_id is not None and questionnaire_id not in questionnaires:
            problems.append(f"{path}.questionnaireId: unknown questionnaire")
        endpoint_id = c.delivery.delivery_endpoint_id
        if endpoint_id is not None and endpoint_id not in endpoints:
            problems.append(f"{path}.delivery.deliveryEndpointId: unknown delivery endpoint")
        distribution = c.delivery.distribution
        for e, entry in enumerate(distribution.endpoints if distribution is not None else []):
            if entry.delivery_endpoint_id not in endpoints:
                problems.append(f"{path}.delivery.distribution.endpoints[{e}].deliveryEndpointId:"
                                " unknown delivery endpoint")
            elif distribution.method == "auction" and entry.bid is None \
                    and entry.delivery_endpoint_id not in pinging:
                problems.append(f"{path}.delivery.distribution.endpoints[{e}].bid: required in an auction when"
                                " the delivery endpoint has no ping")
        problems += [
            f"{where}: unknown campaign"
            for where, code in _campaign_references(path, c)
            if code not in campaigns
        ]
        problems += [
            f"{where}.valueSetId: unknown value set"
            for where, condition in _campaign_conditions(path, c)
            if condition.value_set_id is not None and condition.value_set_id not in value_sets
        ]

    if bundle.sms is not None:
        sms = bundle.sms
        problems += _duplicates("sms.providers", sms.providers, "providerId", lambda p: p.provider_id)
        problems += _duplicates("sms.numbers", sms.numbers, "number", lambda n: n.number)
        problems += _duplicates("sms.agents", sms.agents, "agentId", lambda a: a.agent_id)
        for i, number in enumerate(sms.numbers):
            problems += [
                f"sms.numbers[{i}].campaignIds[{j}]: unknown campaign"
                for j, code in enumerate(number.campaign_ids)
                if code not in campaigns
            ]
        problems += [
            f"sms.campaignProviders.{code}: unknown campaign"
            for code in sms.campaign_providers
            if code not in campaigns
        ]
    return problems


def split_secrets(bundle: TenantBundle) -> tuple[TenantBundle, dict[str, str]]:
    """A copy with every plaintext secret set to None, and the secrets by ref (see the *_ref helpers)."""
    secrets: dict[str, str] = {}

    def take(ref: str, value: str | None) -> None:
        if value is not None and value != SEALED:  # SEALED keeps the stored secret, as leaving it out does
            secrets[ref] = value

    campaigns = []
    for c in bundle.campaigns:
        sources = []
        for s in c.ingestion.sources:
            take(source_key_ref(c.campaign_id, s.source_id), s.api_key)
            sources.append(replace(s, api_key=None))
        campaigns.append(replace(c, ingestion=replace(c.ingestion, sources=sources)))

    endpoints = []
    for e in bundle.delivery_endpoints:
        e, credentials = split_credentials(e)
        for field, value in credentials.items():
            take(endpoint_secret_ref(e.delivery_endpoint_id, field), value)
        endpoints.append(e)

    sms = bundle.sms
    if sms is not None:
        providers = []
        for p in sms.providers:
            take(sms_secret_ref(p.provider_id, "authToken"), p.auth_token)
            take(sms_secret_ref(p.provider_id, "apiKey"), p.api_key)
            providers.append(replace(p, auth_token=None, api_key=None))
        sms = replace(sms, providers=providers)

    pixels = []
    for p in bundle.pixels:
        take(pixel_token_ref(p.pixel_id), p.access_token)
        pixels.append(replace(p, access_token=None))

    webhooks = []
    for w in bundle.webhooks:
        take(webhook_secret_ref(w.webhook_id), w.secret)
        webhooks.append(replace(w, secret=None))

    return replace(bundle, campaigns=campaigns, delivery_endpoints=endpoints, sms=sms, pixels=pixels,
                   webhooks=webhooks), secrets
