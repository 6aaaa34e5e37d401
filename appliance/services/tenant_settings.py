"""A tenant's configuration decoded once and kept in memory for the submit path; reloaded when
the tenant's config_rev (read with the API key on every request) moves, e.g. after an import
made by the CLI in another process."""

from __future__ import annotations

from dataclasses import dataclass, field

from appliance.domain.campaign import Campaign
from appliance.domain.catalog import FieldLibraryEntry
from appliance.domain.pipeline import usable
from appliance.domain.rules import prepare_value_sets
from appliance.errors import ValidationFailed
from appliance.storage import FIELD_LIBRARY, VALUE_SETS, Store


@dataclass(frozen=True)
class TenantSettings:
    rev: int
    campaigns: dict[str, Campaign]
    value_sets: dict
    labels: dict[str, str]  # questionnaire key -> question text (field library)
    checked_fields: list[FieldLibraryEntry] = field(default_factory=list)  # entries with rules to enforce

    def usable_campaign(self, campaign_id: str) -> Campaign:
        """The active, unarchived campaign a body names, else a VALIDATION_ERROR on campaignId."""
        campaign = self.campaigns.get(campaign_id)
        if campaign is None:
            raise ValidationFailed(["campaignId: unknown campaign"])
        if not usable(campaign):
            raise ValidationFailed(["campaignId: campaign is inactive or archived"])
        return campaign


def _has_rules(entry: FieldLibraryEntry) -> bool:
    rules = entry.validation_rules
    enforced = (rules.required, rules.pattern, rules.min_length, rules.max_length, rules.min, rules.max)
    return entry.active and (any(v not in (None, False) for v in enforced)
                             or (entry.category in ("question", "custom") and entry.data_type != "string"))


def load_settings(store: Store, tenant_id: str, rev: int) -> TenantSettings:
    tx = store.reader()
    entries: list[FieldLibraryEntry] = tx.catalog.load_docs(FIELD_LIBRARY, tenant_id)
    value_sets = {vs.value_set_id: vs.values for vs in tx.catalog.load_docs(VALUE_SETS, tenant_id)}
    return TenantSettings(
        rev=rev,
        campaigns={c.campaign_id: c for c in tx.catalog.all_campaigns(tenant_id)},
        value_sets=prepare_value_sets(value_sets),
        labels={e.key: e.question or e.label for e in entries if e.active},
        checked_fields=[e for e in entries if _has_rules(e)],
    )


class SettingsCache:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._by_tenant: dict[str, TenantSettings] = {}

    def get(self, tenant_id: str, rev: int) -> TenantSettings:
        cached = self._by_tenant.get(tenant_id)
        if cached is None or cached.rev != rev:
            cached = self._by_tenant[tenant_id] = load_settings(self._store, tenant_id, rev)
        return cached
