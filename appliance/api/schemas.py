"""Request and response shapes of the HTTP API (the `data` member of the envelope)."""

from __future__ import annotations

from appliance.domain.campaign import Campaign
from appliance.domain.catalog import FieldLibraryEntry, Questionnaire
from appliance.model import Model


class Pagination(Model):
    total: int
    page: int
    limit: int


class CampaignPage(Model):
    campaigns: list[Campaign]
    pagination: Pagination


class QuestionnairePage(Model):
    questionnaires: list[Questionnaire]
    pagination: Pagination


class FieldList(Model):
    fields: list[FieldLibraryEntry]


class Health(Model):
    status: str
    version: str
