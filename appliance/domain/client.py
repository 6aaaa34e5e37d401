"""Clients: the buyers an agency sells to, as records of their own (CONTRACT 9.4): how each pays
(nothing tracked, prepaid, or on credit up to a limit) and what it may send back."""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from appliance.model import Model, invalid

_CLIENT_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
_CURRENCY = re.compile(r"^[A-Z]{3}$")
MAX_MONEY = 1_000_000_000  # no balance, limit or credit of a lead business comes near it

Money = Annotated[float, Meta(ge=0, le=MAX_MONEY)]


class Billing(Model):
    mode: Literal["none", "prepaid", "credit"] = "none"
    credit_limit: Money = 0       # a credit client may owe this much
    low_balance: Money | None = None  # crossing below it sends `client.low_balance`
    currency: str = "USD"         # of its balance and statement: the revenue of its sales

    def __post_init__(self) -> None:
        if not _CURRENCY.match(self.currency):
            invalid("currency", "must be a three-letter ISO 4217 code in capitals, e.g. USD")
        if self.credit_limit and self.mode != "credit":
            invalid("creditLimit", "only a credit client has one")


class ReturnPolicy(Model):
    max_percent: Annotated[float, Meta(ge=0, le=100)] = 10  # of its deliveries of the last 30 days
    max_age_days: Annotated[int, Meta(ge=0, le=365)] = 7   # 0: every return request is refused
    auto_approve: bool = False


class ClientRecord(Model):
    client_id: str
    name: Annotated[str, Meta(min_length=1, max_length=200)]
    active: bool = True
    billing: Billing = msgspec.field(default_factory=Billing)
    return_policy: ReturnPolicy = msgspec.field(default_factory=ReturnPolicy)
    created_at: str | None = None
    updated_at: str | None = None

    def __post_init__(self) -> None:
        if not _CLIENT_ID.match(self.client_id):
            invalid("clientId", "must be 1-100 letters, digits, _, ., : or -")
