"""Duplicate detection policy and decision.

The storage layer fetches the campaign's earlier leads inside the window (`window_start`); the
decision over those rows is made here. Emails compare trimmed and case-insensitively, phones as
exact E.164 strings. AND needs every configured field present on both leads and equal; OR needs
one configured field present on both and equal. A policy matching on no field never matches.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, Literal

import msgspec

from appliance.domain.campaign import DedupeOverride


class DedupePolicy(msgspec.Struct, frozen=True, kw_only=True):
    enabled: bool
    window_days: int | float
    match_email: bool = True
    match_phone: bool = True
    match_logic: Literal["AND", "OR"] = "OR"


def effective_policy(tenant_default_days: int | float,
                     override: DedupeOverride | None) -> DedupePolicy:
    """The campaign's `dedupeOverride` wins whole; else the tenant default (email OR phone,
    enabled when its window is positive). A window of 0 days or less disables dedupe."""
    if override is None:
        return DedupePolicy(enabled=tenant_default_days > 0, window_days=tenant_default_days)
    fields = override.match_fields
    return DedupePolicy(enabled=override.enabled and override.window > 0,
                        window_days=override.window, match_email=fields.email,
                        match_phone=fields.phone,
                        match_logic="AND" if fields.match_logic.upper() == "AND" else "OR")


def window_start(policy: DedupePolicy, now_utc: datetime) -> datetime:
    """The earliest createdAt still inside the window."""
    return now_utc - timedelta(days=policy.window_days)


def _present(value: str | None) -> str | None:
    return (value.strip() or None) if isinstance(value, str) else None


def find_duplicate(policy: DedupePolicy, email: str | None, phone_e164: str | None,
                   earlier: Iterable[tuple[str, str | None, str | None, Any]]) -> str | None:
    """The leadId of the first row of `earlier` (leadId, email, phoneE164, createdAt) that
    duplicates the candidate, else None. Rows are taken as already inside the window."""
    if not policy.enabled:
        return None
    email = _present(email)
    email = email.lower() if email else None
    phone = _present(phone_e164)
    for lead_id, other_email, other_phone, _created_at in earlier:
        other_email = _present(other_email)
        checks = []
        if policy.match_email:
            checks.append(email is not None and other_email is not None
                          and email == other_email.lower())
        if policy.match_phone:
            checks.append(phone is not None and phone == _present(other_phone))
        if checks and (all(checks) if policy.match_logic == "AND" else any(checks)):
            return lead_id
    return None
