"""Outbound events: which events there are, who is subscribed to what, how an event is signed,
which lane it waits in and when a failed send is tried again.

Events of one lead go through one lane of each subscription, and a lane sends its events one at
a time, oldest first: the next waits until the one before is delivered or given up. So a receiver
sees a lead's events in the order they happened, even after being down for hours, while other
leads' events go out beside them in the other lanes."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import zlib
from collections.abc import Iterable

import msgspec

from appliance.domain.endpoint import DEFAULT_BACKOFF_SECONDS, SEALED, check_http_url
from appliance.model import Model, invalid

LEAD_STATUS_EVENTS: dict[str, str] = {
    status: f"lead.{status}" for status in (
        "qualified", "disqualified", "duplicate", "pending_action", "queued", "delivered", "failed", "returned",
        "document_sent", "signed")
}
EVENT_TYPES: tuple[str, ...] = ("lead.processed", *LEAD_STATUS_EVENTS.values(), "endpoint.paused", "endpoint.resumed",
                                  "client.low_balance")
ALL_EVENTS = "*"
SECRET_PREFIX = "whsec_"
MIN_SECRET_BYTES = 24
LANES = 16  # per subscription: how many leads' events may be in flight to one receiver at once
PLUGIN_SUBSCRIBER = "~plugins"  # the outbox's name for the plugins' on_lead_event hook

# Retries wait as deliveries' do (10 s, 1 min, 5 min, 30 min, 2 h), the last step repeated. A
# delivery gives up after 5 attempts (36 minutes); an event keeps trying for a day and a half, so
# a receiver down for hours, or over a night, still gets every event.
RETRY_SCHEDULE: tuple[int, ...] = DEFAULT_BACKOFF_SECONDS + (DEFAULT_BACKOFF_SECONDS[-1],) * 17

_WEBHOOK_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")


class Webhook(Model):
    """A subscription as stored and shown (its secret lives in the secret store)."""

    webhook_id: str
    url: str
    events: list[str] = msgspec.field(default_factory=lambda: [ALL_EVENTS])
    active: bool = True
    description: str | None = None
    created_at: str | None = None
    updated_at: str | None = None

    def __post_init__(self) -> None:
        if not _WEBHOOK_ID.match(self.webhook_id):
            invalid("webhookId", "1 to 100 letters, digits, '_', '.', ':' or '-'")
        check_webhook_url("url", self.url)
        check_event_names("events", self.events)
        if self.description is not None and len(self.description) > 500:
            invalid("description", "at most 500 characters")


class BundleWebhook(Webhook):
    """A subscription in a tenant bundle: its secret in clear, sealed at import."""

    secret: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.secret is not None and self.secret != SEALED:  # SEALED keeps the stored secret
            check_secret("secret", self.secret)


def check_webhook_url(field: str, url: str) -> None:
    check_http_url(field, url)
    if "@" in url.split("?", 1)[0].split("#", 1)[0].partition("//")[2].split("/", 1)[0]:
        invalid(field, "must not carry user info (a receiver checks the signature instead)")


def check_event_names(field: str, events: list[str]) -> None:
    if not events:
        invalid(field, 'name at least one event, or "*" for all')
    unknown = [name for name in events if name != ALL_EVENTS and name not in EVENT_TYPES]
    if unknown:
        invalid(field, f"unknown event {unknown[0]!r}; known: {', '.join(EVENT_TYPES)} or \"*\"")


def check_secret(field: str, secret: str) -> None:
    if secret_key(secret) is None:
        invalid(field, f"must be {SECRET_PREFIX} followed by the base64 of at least {MIN_SECRET_BYTES} bytes")


def secret_key(secret: str) -> bytes | None:
    """The HMAC key a `whsec_` secret stands for; None when it is not one."""
    if not secret.startswith(SECRET_PREFIX):
        return None
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        return None
    return key if len(key) >= MIN_SECRET_BYTES else None


def new_secret(random_bytes: bytes) -> str:
    return SECRET_PREFIX + base64.b64encode(random_bytes).decode("ascii")


def subscribed(events: Iterable[str], event_type: str) -> bool:
    return any(name == ALL_EVENTS or name == event_type for name in events)


def lead_event_types(statuses: Iterable[str], *, processed: bool) -> list[str]:
    """The lead events of reaching `statuses`; `lead.processed` first when intake just ended."""
    types = ["lead.processed"] if processed else []
    return types + [LEAD_STATUS_EVENTS[s] for s in statuses if s in LEAD_STATUS_EVENTS]


def lane_of(key: str) -> int:
    return zlib.crc32(key.encode()) % LANES


def retry_delay(attempts: int) -> int | None:
    """Seconds before the next try after `attempts` failed ones; None: give up."""
    return RETRY_SCHEDULE[attempts - 1] if attempts <= len(RETRY_SCHEDULE) else None


def event_body(event_type: str, timestamp: str, data: bytes) -> bytes:
    """`{type, timestamp, data}`; `data` comes encoded, shared by every event of one change."""
    return b'{"type":"%s","timestamp":"%s","data":%s}' % (event_type.encode(), timestamp.encode(), data)


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header of Standard Webhooks: HMAC-SHA256 of `id.timestamp.body`."""
    key = secret_key(secret)
    if key is None:
        raise ValueError("not a webhook secret")
    signed = b"%s.%d.%s" % (message_id.encode(), timestamp, body)
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode("ascii")
