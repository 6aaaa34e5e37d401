"""Tenant catalog shapes: field library entries, questionnaires (2.7) and the
value sets that `in_value_set` conditions name."""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from appliance.domain.campaign import check_regex, check_timestamp
from appliance.model import Model, invalid

FieldCategory = Literal[
    "question", "file", "system", "contact", "attribution", "compliance", "flags", "custom",
]
DataType = Literal["string", "number", "integer", "boolean", "date", "email", "phone", "url", "file", "json"]

# Keys are submit body paths (`address.state`, `attribution.gclid`), so dots separate segments.
_FIELD_KEY = re.compile(r"^[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*$")


class ValidationRules(Model):
    required: bool = False
    pattern: str | None = None
    min_length: int | None = None
    max_length: int | None = None
    min: int | float | None = None
    max: int | float | None = None

    def __post_init__(self) -> None:
        check_regex("pattern", self.pattern)
        for name, value in (("minLength", self.min_length), ("maxLength", self.max_length)):
            if value is not None and value < 0:
                invalid(name, "must be at least 0")
        if self.min_length is not None and self.max_length is not None and self.min_length > self.max_length:
            invalid("maxLength", "must not be less than minLength")
        if self.min is not None and self.max is not None and self.min > self.max:
            invalid("max", "must not be less than min")


class FieldLibraryEntry(Model):
    key: str
    label: str
    question: str | None = None
    category: FieldCategory = "custom"
    data_type: DataType = "string"
    validation_rules: ValidationRules = msgspec.field(default_factory=ValidationRules)
    is_standard: bool = False
    active: bool = True
    created_at: str | None = None
    updated_at: str | None = None

    def __post_init__(self) -> None:
        if not _FIELD_KEY.match(self.key):
            invalid("key", "must be dot-separated segments of letters, digits, underscores or hyphens")
        check_timestamp("createdAt", self.created_at)
        check_timestamp("updatedAt", self.updated_at)


class Question(Model):
    key: str
    question: str
    instructions: str | None = None
    options: list[str] = []

    def __post_init__(self) -> None:
        if not self.key.strip():
            invalid("key", "must not be empty")


class Questionnaire(Model):
    questionnaire_id: str
    name: str
    description: str | None = None
    active: bool = True
    questions: list[Question] = []
    created_at: str | None = None
    updated_at: str | None = None

    def __post_init__(self) -> None:
        if not self.questionnaire_id.strip():
            invalid("questionnaireId", "must not be empty")
        check_timestamp("createdAt", self.created_at)
        check_timestamp("updatedAt", self.updated_at)


class ValueSet(Model):
    value_set_id: str
    name: str | None = None
    values: list[str | int | float | bool] = []

    def __post_init__(self) -> None:
        if not self.value_set_id.strip():
            invalid("valueSetId", "must not be empty")
