"""GET /api/v1/sources/{sourceId}/spec behind the HTTP layer: which campaign's spec is meant, and
the catalog it is built from (domain/posting_spec.py builds it)."""

from __future__ import annotations

from collections.abc import Mapping

from appliance.domain.campaign import Campaign
from appliance.domain.posting_spec import PostingSpec, build_spec, source_on, takes_from
from appliance.errors import NotFound, ValidationFailed
from appliance.runtime import Runtime
from appliance.services.tenant_settings import TenantSettings
from appliance.services.users import base_url
from appliance.storage import FIELD_LIBRARY, QUESTIONNAIRES, VALUE_SETS


def choose_campaign(campaigns: Mapping[str, Campaign], source_id: str, campaign_id: str | None) -> Campaign:
    """The campaign named (it must list the source), else the only one that lists the source,
    preferring those that take its leads now (active, unarchived, the source active on it)."""
    listing = [c for c in campaigns.values() if source_on(c, source_id) is not None]
    if not listing:
        raise NotFound()
    if campaign_id is not None:
        named = next((c for c in listing if c.campaign_id == campaign_id), None)
        if named is None:
            raise ValidationFailed(["campaignId: not a campaign that lists this source"])
        return named
    candidates = [c for c in listing if takes_from(c, source_id)] or listing
    if len(candidates) > 1:
        codes = ", ".join(sorted(c.campaign_id for c in candidates))
        raise ValidationFailed([f"campaignId: required, as the source feeds several campaigns ({codes})"])
    return candidates[0]


def source_spec(runtime: Runtime, settings: TenantSettings, tenant_id: str, source_id: str,
                campaign_id: str | None, *, submit_path: str, ping_path: str) -> PostingSpec:
    campaign = choose_campaign(settings.campaigns, source_id, campaign_id)
    tx = runtime.store.reader()
    with tx:  # one read: the catalog as of one commit
        entries = tx.catalog.load_docs(FIELD_LIBRARY, tenant_id)
        questionnaire = tx.catalog.get_doc(QUESTIONNAIRES, tenant_id, campaign.questionnaire_id) \
            if campaign.questionnaire_id else None
        # As imported: the settings' value sets are folded for comparison, not for showing.
        value_sets = {vs.value_set_id: vs.values for vs in tx.catalog.load_docs(VALUE_SETS, tenant_id)}
    own = base_url(runtime)
    return build_spec(campaign, source_id, entries=entries, questionnaire=questionnaire, value_sets=value_sets,
                      submit_url=own + submit_path, ping_url=own + ping_path)
