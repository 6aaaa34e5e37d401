"""What one delivery attempt came to, as an adapter reports it (plugins import it from
appliance.sdk). A pure record, so the response rules (domain/delivery_mapping) can build it
without the plugin machinery."""

from __future__ import annotations

from typing import Literal

import msgspec

Outcome = Literal["success", "failure", "duplicate", "error"]


class DeliveryResult(msgspec.Struct, kw_only=True):
    """`success`: delivered. `failure` / `duplicate`: the buyer said no; never retried.
    `error`: timeout, connection, 5xx, 408, 429 or a bug; retried with backoff."""

    outcome: Outcome
    reason: str | None = None
    status_code: int | None = None
    client_lead_id: str | None = None
    message: str | None = None
    response_fields: dict[str, str] = {}
    price: float | None = None
    url: str | None = None
    method: str | None = None
    body_format: str | None = None
