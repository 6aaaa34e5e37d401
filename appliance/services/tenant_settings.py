"""A tenant's configuration decoded once and kept in memory for the submit path; reloaded when
the tenant's config_rev (read with the API key on every request) moves, e.g. after an import
made by the CLI in another process."""

from __future__ import annotations

from dataclasses import dataclass, field

from appliance.domain.campaign import Campaign
from appliance.domain.catalog import FieldLibraryEntry
from appliance.domain.client import ClientRecord
from appliance.domain.pipeline import usable
from appliance.domain.rules import prepare_value_sets
from appliance.domain.webhooks import ALL_EVENTS, PLUGIN_SUBSCRIBER
from appliance.errors import ValidationFailed
from appliance.storage import CLIENTS, DELIVERY_ENDPOINTS, FIELD_LIBRARY, VALUE_SETS, WEBHOOKS, Store


@dataclass(frozen=True)
class TenantSettings:
    rev: int
    campaigns: dict[str, Campaign]
    value_sets: dict
    labels: dict[str, str]  # questionnaire key -> question text (field library)
    checked_fields: list[FieldLibraryEntry] = field(default_factory=list)  # entries with rules to enforce
    # (webhookId, event names) of each active subscription, the plugins' hook included when a
    # plugin implements it: who gets an outbox row when a lead's status changes.
    subscribers: tuple[tuple[str, frozenset[str]], ...] = ()
    clients: dict[str, ClientRecord] = field(default_factory=dict)  # the client records, by id
    endpoint_clients: dict[str, str] = field(default_factory=dict)  # endpoint -> its own `clientId`

    def client_of(self, endpoint_id: str | None, campaign: Campaign | None) -> str | None:
        """Who a sale through `endpoint_id` is charged to: the endpoint's client, else the campaign's."""
        return self.endpoint_clients.get(endpoint_id or "") or (
            campaign.client.client_id if campaign is not None and campaign.client else None)

    def billed(self, endpoint_id: str | None, campaign: Campaign | None) -> ClientRecord | None:
        """The client record a sale through `endpoint_id` is checked against, when its billing
        limits what it buys (`prepaid` or `credit`); None: nothing to check."""
        if not self.clients:
            return None
        client = self.clients.get(self.client_of(endpoint_id, campaign) or "")
        return client if client is not None and client.billing.mode != "none" else None

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


def load_settings(store: Store, tenant_id: str, rev: int, *, plugins_listen: bool = False) -> TenantSettings:
    """`plugins_listen`: a plugin implements on_lead_event, so every event goes to the plugins too."""
    tx = store.reader()
    entries: list[FieldLibraryEntry] = tx.catalog.load_docs(FIELD_LIBRARY, tenant_id)
    value_sets = {vs.value_set_id: vs.values for vs in tx.catalog.load_docs(VALUE_SETS, tenant_id)}
    return TenantSettings(
        rev=rev,
        campaigns={c.campaign_id: c for c in tx.catalog.all_campaigns(tenant_id)},
        value_sets=prepare_value_sets(value_sets),
        labels={e.key: e.question or e.label for e in entries if e.active},
        checked_fields=[e for e in entries if _has_rules(e)],
        subscribers=tuple((w.webhook_id, frozenset(w.events)) for w in tx.catalog.load_docs(WEBHOOKS, tenant_id)
                          if w.active) + (((PLUGIN_SUBSCRIBER, frozenset({ALL_EVENTS})),) if plugins_listen else ()),
        clients={c.client_id: c for c in tx.catalog.load_docs(CLIENTS, tenant_id)},
        endpoint_clients={e.delivery_endpoint_id: e.client_id for e in tx.catalog.load_docs(DELIVERY_ENDPOINTS, tenant_id)
                          if e.client_id},
    )


class SettingsCache:
    def __init__(self, store: Store, *, plugins_listen: bool = False) -> None:
        self._store = store
        self._plugins_listen = plugins_listen
        self._by_tenant: dict[str, TenantSettings] = {}

    def get(self, tenant_id: str, rev: int) -> TenantSettings:
        cached = self._by_tenant.get(tenant_id)
        if cached is None or cached.rev != rev:
            cached = self._by_tenant[tenant_id] = load_settings(
                self._store, tenant_id, rev, plugins_listen=self._plugins_listen)
        return cached
