"""Delivery endpoint configuration: where and how a lead is sent to a buyer,
and how the buyer's answer is read."""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import unquote_plus, urlsplit, urlunsplit

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


def check_headers(field: str, headers: dict[str, str], *, credentials: str | None = None) -> None:
    """Names that are HTTP tokens, values without line breaks (never echoed: a value may be a
    credential); with `credentials` (where a credential goes instead), no credential-looking name."""
    for name, value in headers.items():
        if not _HEADER_NAME.match(name):
            invalid(field, "header names must be HTTP tokens")
        if "\r" in value or "\n" in value:
            invalid(field, "header values must not contain line breaks")
        if credentials is not None and looks_like_credential(name):
            invalid(field, f"{name} looks like a credential: {credentials}")


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


class PingResponseRules(Model):
    """How a ping's answer is read: `accepted` says it is a bid (default: a 2xx with a number at
    `bidPath`); `bidPath` finds the bid, `pingTokenPath` the token the post carries back."""

    accepted: ResponseMatcher | None = None
    bid_path: str | None = None
    ping_token_path: str | None = None
    message_path: str | None = None

    def __post_init__(self) -> None:
        if not (self.bid_path or "").strip():
            invalid("bidPath", "required: the JSON path of the bid in the buyer's answer")


class EndpointPing(Model):
    """The request that asks a buyer for a bid before the lead is posted (an auction). It sends
    the endpoint's own auth and sealed headers; its own headers and URL carry no credential."""

    url: str
    method: Literal["POST", "GET"] = "POST"
    body_format: Literal["json", "form", "xml"] = "json"
    headers: dict[str, str] = {}
    field_mapping: list[FieldMapping] = []
    timeout_ms: int = 1000
    response_rules: PingResponseRules | None = None

    def __post_init__(self) -> None:
        check_http_url("url", self.url)
        if carries_credentials(self.url):
            invalid("url", "must carry no credential: the ping sends the endpoint's auth and sealed headers")
        check_headers("headers", self.headers,
                      credentials="put it in the endpoint's headers or auth, which the ping sends too")
        if not 50 <= self.timeout_ms <= 10_000:
            invalid("timeoutMs", "must be between 50 and 10000")
        if self.response_rules is None:
            invalid("responseRules.bidPath", "required: the JSON path of the bid in the buyer's answer")


DEFAULT_BACKOFF_SECONDS: tuple[int, ...] = (10, 60, 300, 1800, 7200)  # deliveries' and webhooks'


def _default_backoff() -> list[int | float]:
    return list(DEFAULT_BACKOFF_SECONDS)


class RetryPolicy(Model):
    max_attempts: int = 5
    backoff_seconds: list[int | float] = msgspec.field(default_factory=_default_backoff)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            invalid("maxAttempts", "must be at least 1")
        if any(delay < 0 for delay in self.backoff_seconds):
            invalid("backoffSeconds", "delays must be at least 0")


class HealthPolicy(Model):
    """When the appliance pauses a buyer by itself: after this many `error` answers in a row
    (timeouts, 5xx, refused connections), or `failure` answers in a row; 0 never pauses."""

    pause_after_consecutive_errors: int = 20
    pause_after_consecutive_failures: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.pause_after_consecutive_errors <= 1_000_000:
            invalid("pauseAfterConsecutiveErrors", "must be between 0 (never) and 1000000")
        if not 0 <= self.pause_after_consecutive_failures <= 1_000_000:
            invalid("pauseAfterConsecutiveFailures", "must be between 0 (never) and 1000000")


TEST_ADAPTERS = ("http", "demo")  # the adapters that post a test lead to `testUrl`, never elsewhere


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
    # Header names whose values are credentials although their names do not say so; such values
    # and those of credential-looking names are kept in the secret store (see split_credentials).
    secret_headers: list[str] = []
    # Days after a delivery during which the buyer may return the lead (POST .../return); 0: none.
    return_window_days: int = 30
    health_policy: HealthPolicy = msgspec.field(default_factory=HealthPolicy)
    ping: EndpointPing | None = None  # asked for a bid first when the campaign sells at auction
    client_id: str | None = None  # the client (buyer) its sales are charged to; none: the campaign's
    # Where a test lead (`isTest`) is posted instead of `url`, with the same auth and headers; an
    # endpoint without one is never sent a test lead.
    test_url: str | None = None

    def __post_init__(self) -> None:
        if not self.delivery_endpoint_id.strip():
            invalid("deliveryEndpointId", "must not be empty")
        if not self.adapter:
            invalid("adapter", "must not be empty")
        if self.url is None and self.adapter == "http":
            invalid("url", "required for the http adapter")
        check_http_url("url", self.url)
        check_http_url("testUrl", self.test_url)
        if self.test_url and self.adapter not in TEST_ADAPTERS:
            # A plugin adapter may post where its own settings say: a test lead would reach the buyer.
            invalid("testUrl", f"only the built-in {' and '.join(TEST_ADAPTERS)} adapters post to a test address")
        if self.test_url and carries_credentials(self.test_url):
            invalid("testUrl", "must not carry credentials (a test post is sent with the endpoint's auth and headers)")
        check_headers("headers", self.headers)
        if not 0 < self.timeout_seconds <= 120:
            invalid("timeoutSeconds", "must be greater than 0 and at most 120")
        for name in self.secret_headers:
            if not _HEADER_NAME.match(name):
                invalid("secretHeaders", "header names must be HTTP tokens")
        if not 0 <= self.return_window_days <= 3650:
            invalid("returnWindowDays", "must be between 0 and 3650 days")

    def __repr__(self) -> str:
        return redacted_repr(self, ("url", "test_url", "headers", "auth"))


def retries_left(endpoint: DeliveryEndpoint | None, attempts: int) -> bool:
    """Whether an `error` after `attempts` attempts is tried again (the endpoint's retry policy)."""
    max_attempts = endpoint.retry.max_attempts if endpoint is not None else len(DEFAULT_BACKOFF_SECONDS) + 1
    return attempts < max_attempts


def retry_delay(endpoint: DeliveryEndpoint | None, attempts: int) -> int | float:
    """Seconds from an `error` after `attempts` attempts to the next (the backoff's last delay repeats)."""
    backoff = list(endpoint.retry.backoff_seconds) if endpoint is not None and endpoint.retry.backoff_seconds \
        else list(DEFAULT_BACKOFF_SECONDS)
    return backoff[min(attempts - 1, len(backoff) - 1)]


# ---- credentials ---------------------------------------------------------------------------------
# Every credential of an endpoint lives in the secret store, never in the stored endpoint: the
# auth secrets, header values that are credentials, and credentials inside the URL (user info,
# query parameters with credential-looking names). The stored endpoint keeps SEALED where each one
# was, so an export shows where a credential goes without showing it, and importing SEALED back
# keeps the stored credential. `fill_credentials` puts them back just before sending.

SEALED = "***"
AUTH_FIELDS = ("auth.password", "auth.token")
USERINFO_FIELD = "url.userinfo"
# A name's words (split at punctuation and camelCase) that say it carries a credential; a word
# inside another word does not count (`keyword`, `author`, `design`, `passenger` are not).
_CREDENTIAL_WORDS = frozenset({
    "auth", "authorization", "authentication", "token", "key", "apikey", "secret", "password", "passwd",
    "pass", "pwd", "credential", "credentials", "signature", "sig", "session", "sessionid", "cookie", "bearer"})
_CREDENTIAL_ENDINGS = ("token", "secret", "password", "apikey")
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def looks_like_credential(name: str) -> bool:
    """Whether a header or query parameter of this name carries a credential: `X-Api-Key`,
    `apiKey`, `access_token`, `Authorization`, `client_secret`, `X-Signature`..."""
    words = [word.lower() for word in _WORDS.findall(name)]
    return any(word in _CREDENTIAL_WORDS or word.endswith(_CREDENTIAL_ENDINGS) for word in words) \
        or "".join(words).endswith(_CREDENTIAL_ENDINGS)


def carries_credentials(url: str) -> bool:
    """User info, or a query parameter whose name says it is a credential."""
    parts = urlsplit(url)
    return "@" in parts.netloc or any(
        looks_like_credential(unquote_plus(pair.partition("=")[0])) for pair in parts.query.split("&") if pair)


def header_field(name: str) -> str:
    return f"headers.{name.lower()}"


def query_field(name: str) -> str:
    return f"url.query.{name}"


def split_credentials(endpoint: DeliveryEndpoint) -> tuple[DeliveryEndpoint, dict[str, str]]:
    """The endpoint as stored (credentials replaced by SEALED, auth secrets by None) and the
    credentials by field. A SEALED value given stands for the credential stored before."""
    found: dict[str, str] = {}
    auth = endpoint.auth
    if auth is not None:
        for field, value in zip(AUTH_FIELDS, (auth.password, auth.token)):
            if value is not None and value != SEALED:
                found[field] = value
        auth = msgspec.structs.replace(auth, password=None, token=None)
    marked = {name.lower() for name in endpoint.secret_headers}
    headers = {}
    for name, value in endpoint.headers.items():
        if value != SEALED and (name.lower() in marked or looks_like_credential(name)):
            found[header_field(name)] = value
            value = SEALED
        headers[name] = value
    url = endpoint.url
    if url:
        url = _split_url(url, found)
    return msgspec.structs.replace(endpoint, auth=auth, headers=headers, url=url), found


def _split_url(url: str, found: dict[str, str]) -> str:
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    netloc = parts.netloc
    if at:
        if userinfo != SEALED:
            found[USERINFO_FIELD] = userinfo
        netloc = f"{SEALED}@{hostport}"
    pairs = []
    for pair in parts.query.split("&") if parts.query else []:
        name, equals, value = pair.partition("=")
        if equals and value != SEALED and looks_like_credential(unquote_plus(name)):
            found[query_field(unquote_plus(name))] = value  # as written, still percent-encoded
            pair = f"{name}={SEALED}"
        pairs.append(pair)
    return urlunsplit((parts.scheme, netloc, parts.path, "&".join(pairs), parts.fragment))


def sealed_fields(endpoint: DeliveryEndpoint) -> list[str]:
    """The credential fields a stored endpoint is sent with (auth secrets whenever it has auth)."""
    fields = list(AUTH_FIELDS) if endpoint.auth is not None else []
    fields += [header_field(name) for name, value in endpoint.headers.items() if value == SEALED]
    if endpoint.url:
        parts = urlsplit(endpoint.url)
        if parts.netloc.rpartition("@")[0] == SEALED:
            fields.append(USERINFO_FIELD)
        for pair in parts.query.split("&") if parts.query else []:
            name, _, value = pair.partition("=")
            if value == SEALED:
                fields.append(query_field(unquote_plus(name)))
    return fields


def fill_credentials(endpoint: DeliveryEndpoint, opened: dict[str, str]) -> tuple[DeliveryEndpoint, list[str]]:
    """The endpoint to send: each SEALED part replaced by its opened credential; and the fields
    that stand SEALED with nothing stored for them (such an endpoint must not be sent)."""
    missing: list[str] = []

    def opened_or_missing(field: str) -> str:
        if field not in opened:
            missing.append(field)
            return SEALED
        return opened[field]

    headers = {name: opened_or_missing(header_field(name)) if value == SEALED else value
               for name, value in endpoint.headers.items()}
    url = endpoint.url
    if url and SEALED in url:
        parts = urlsplit(url)
        userinfo, at, hostport = parts.netloc.rpartition("@")
        netloc = f"{opened_or_missing(USERINFO_FIELD)}@{hostport}" if at and userinfo == SEALED else parts.netloc
        pairs = []
        for pair in parts.query.split("&") if parts.query else []:
            name, equals, value = pair.partition("=")
            if equals and value == SEALED:
                pair = f"{name}={opened_or_missing(query_field(unquote_plus(name)))}"
            pairs.append(pair)
        url = urlunsplit((parts.scheme, netloc, parts.path, "&".join(pairs), parts.fragment))
    return msgspec.structs.replace(endpoint, headers=headers, url=url), missing
