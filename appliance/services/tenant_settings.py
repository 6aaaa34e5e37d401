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
from appliance.storage import catalog
from appliance.storage.db import Database


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


def load_settings(db: Database, tenant_id: str, rev: int) -> TenantSettings:
    conn = db.reader()
    entries: list[FieldLibraryEntry] = catalog.load_docs(conn, catalog.FIELD_LIBRARY, tenant_id)
    value_sets = {vs.value_set_id: vs.values for vs in catalog.load_docs(conn, catalog.VALUE_SETS, tenant_id)}
    return TenantSettings(
        rev=rev,
        campaigns={c.campaign_id: c for c in catalog.all_campaigns(conn, tenant_id)},
        value_sets=prepare_value_sets(value_sets),
        labels={e.key: e.question or e.label for e in entries if e.active},
        checked_fields=[e for e in entries if _has_rules(e)],
    )


class SettingsCache:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._by_tenant: dict[str, TenantSettings] = {}

    def get(self, tenant_id: str, rev: int) -> TenantSettings:
        cached = self._by_tenant.get(tenant_id)
        if cached is None or cached.rev != rev:
            cached = self._by_tenant[tenant_id] = load_settings(self._db, tenant_id, rev)
        return cached
