"""Suppression keys: a contact value made into the digest a suppression list stores. An email
is normalized as a lead's is (`normalize_email`), a phone made E.164 in the install's region as a
lead's is (`to_e164`); the digest is SHA-256 of the kind and the normalized value
(b"email:ann@example.com"), so a list holds no value and an email never matches a phone."""

from __future__ import annotations

import hashlib
from typing import Final

from appliance.domain.normalize import is_valid_email, normalize_email, to_e164


# Every tenant's list of the phones that answered STOP to its texts (kept by the SMS webhooks): a
# campaign may name it in `qualification.suppressionListIds` like a list of its own.
SMS_OPT_OUTS: Final = "sms-opt-outs"


def email_hash(email: str) -> bytes:
    """The digest of an email already normalized (a lead's `email`)."""
    return hashlib.sha256(b"email:" + email.encode()).digest()


def phone_hash(phone_e164: str) -> bytes:
    """The digest of a phone already in E.164 (a lead's `phoneE164`)."""
    return hashlib.sha256(b"phone:" + phone_e164.encode()).digest()


def suppression_key(value: str, region: str | None) -> tuple[str, str] | None:
    """(kind, normalized value) of an email or a phone, or None when it is neither."""
    text = value.strip()
    if "@" in text:
        email = normalize_email(text)
        return ("email", email) if is_valid_email(email) else None
    phone = to_e164(text, region)
    return ("phone", phone) if phone is not None else None


def suppression_hash(value: str, region: str | None) -> bytes | None:
    """The digest a list stores for `value`, or None when it is neither an email nor a phone."""
    key = suppression_key(value, region)
    if key is None:
        return None
    kind, normalized = key
    return email_hash(normalized) if kind == "email" else phone_hash(normalized)


def lead_hashes(email: str | None, phone_e164: str | None) -> list[bytes]:
    """The digests a lead is checked with: its normalized email and its E.164 phone."""
    found = []
    if email:
        found.append(email_hash(email))
    if phone_e164:
        found.append(phone_hash(phone_e164))
    return found
