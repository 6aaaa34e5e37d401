"""Delivery endpoint configuration (CONTRACT 5 and 7): where and how a lead is sent to a buyer,
and how the buyer's answer is read."""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

import msgspec

from appliance.domain.campaign import check_regex, redacted_repr
from appliance.model import Model, invalid

# RFC 9110 token: what a header name may be.
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def check_http_url(field: str, url: str | None) -> None:
    if url is None:
        return
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        invalid(field, "must be an http or https URL with a host")
    if parts.scheme not in ("http", "https") or not host:
        invalid(field, "must be an http or https URL with a host")


class EndpointAuth(Model):
    type: Literal["none", "basic", "bearer", "header"] = "none"
    username: str | None = None
    password: str | None = None
    token: str | None = None
    header_name: str | None = None  # type header: the header that carries token

    # Secrets are not required here: a stored or exported endpoint has them split off
    # (bundle.split_secrets) and must still decode.
    def __post_init__(self) -> None:
        if self.type == "basic" and not self.username:
            invalid("username", "required for basic auth")
        if self.type == "header" and not (self.header_name and _HEADER_NAME.match(self.header_name)):
            invalid("headerName", "required for header auth, as a valid header name")

    def __repr__(self) -> str:
        return redacted_repr(self, ("password", "token"))


class FieldMapping(Model):
    """One key of the body sent to the buyer: a lead field path or a fixed value."""

    client_key: str
    lead_field: str | None = None
    value: str | int | float | bool | None = None
    type: Literal["string", "number", "integer", "boolean"] = "string"
    required: bool = False  # a lead without the value is not sent (delivery fails)

    def __post_init__(self) -> None:
        if not self.client_key:
            invalid("clientKey", "must not be empty")
        if (self.lead_field is None) == (self.value is None):
            invalid("leadField", "exactly one of leadField or value is required")


class ResponseMatcher(Model):
    """Any listed criterion that matches makes the outcome."""

    status_codes: list[int] = []
    json_path: str | None = None  # dotted path into the JSON body, compared with values
    values: list[str | int | float | bool] = []
    body_pattern: str | None = None  # regex searched in the raw body

    def __post_init__(self) -> None:
        for i, code in enumerate(self.status_codes):
            if not 100 <= code <= 599:
                invalid(f"statusCodes[{i}]", "must be an HTTP status code (100-599)")
        check_regex("bodyPattern", self.body_pattern)


class ResponseRules(Model):
    success: ResponseMatcher | None = None
    failure: ResponseMatcher | None = None
    duplicate: ResponseMatcher | None = None
    client_lead_id_path: str | None = None
    message_path: str | None = None


def _default_backoff() -> list[int | float]:
    return [10, 60, 300, 1800, 7200]


class RetryPolicy(Model):
    max_attempts: int = 5
    backoff_seconds: list[int | float] = msgspec.field(default_factory=_default_backoff)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            invalid("maxAttempts", "must be at least 1")
        if any(delay < 0 for delay in self.backoff_seconds):
            invalid("backoffSeconds", "delays must be at least 0")


class DeliveryEndpoint(Model):
    delivery_endpoint_id: str
    adapter: str = "http"  # built-in http, or a plugin adapter's name
    url: str | None = None
    method: Literal["POST", "PUT", "PATCH", "GET"] = "POST"
    body_format: Literal["json", "form", "xml"] = "json"
    headers: dict[str, str] = {}
    auth: EndpointAuth | None = None
    field_mapping: list[FieldMapping] = []
    response_rules: ResponseRules = msgspec.field(default_factory=ResponseRules)
    timeout_seconds: int | float = 10
    retry: RetryPolicy = msgspec.field(default_factory=RetryPolicy)
    config: dict[str, Any] = {}  # plugin adapters' own settings

    def __post_init__(self) -> None:
        if not self.delivery_endpoint_id.strip():
            invalid("deliveryEndpointId", "must not be empty")
        if not self.adapter:
            invalid("adapter", "must not be empty")
        if self.url is None and self.adapter == "http":
            invalid("url", "required for the http adapter")
        check_http_url("url", self.url)
        for name, value in self.headers.items():
            # Values are never echoed: a header may carry a credential.
            if not _HEADER_NAME.match(name):
                invalid("headers", "header names must be HTTP tokens")
            if "\r" in value or "\n" in value:
                invalid("headers", "header values must not contain line breaks")
        if not 0 < self.timeout_seconds <= 120:
            invalid("timeoutSeconds", "must be greater than 0 and at most 120")
