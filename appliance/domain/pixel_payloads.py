"""Pure building of server-side conversion events: the Meta
Conversions API payload (`social`) and the TikTok Events API 2.0 payload (`video`), with each
platform's normalization of the lead's contact data and its SHA-256 hashing.

Meta (customer information parameters), each value normalized, then SHA-256 hex, sent as a
one-element list:
- em: trimmed, lowercased.
- ph: digits only, with the country code, no `+` and no leading zeros: the lead's phoneE164 (or
  its phone read in the lead's country / the install region) without the `+`.
- fn, ln: lowercased, punctuation and symbols removed, whitespace collapsed (letters of any
  script kept, UTF-8).
- db: YYYYMMDD (from YYYY-MM-DD, YYYYMMDD or US MM/DD/YYYY).
- ct: lowercased letters only (no spaces, digits or punctuation).
- st: the two-letter code, lowercased; US state and Canadian province names are mapped to it;
  elsewhere lowercased letters only.
- zp: lowercased, no spaces or dashes; US: the first five digits; GB: area, district and sector
  (the outward code and the first character of the inward code).
- country: the ISO 3166-1 alpha-2 code, lowercased (the lead's country, else the country of its
  phone number).
- external_id: the leadId, trimmed and lowercased.
Sent raw: client_ip_address, client_user_agent, fbc (the stored one, else built as
`fb.1.<lead createdAt in ms>.<fbclid>`), fbp.

TikTok: email (trimmed, lowercased), phone (E.164 with `+`), external_id (as Meta's) SHA-256
hex; ttclid, ttp, ip and user_agent raw.

`event_id` is stable per lead and event name (SHA-256 of `<leadId>:<eventName>`), so a repeated
fire of the same conversion is deduplicated by the platform.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from datetime import date, datetime, timezone
from typing import Any

import phonenumbers

from appliance.domain.normalize import to_e164

# ---- hashing and normalization ------------------------------------------------------------------


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def event_id(lead_id: str, event_name: str) -> str:
    return sha256_hex(f"{lead_id}:{event_name}")


_SPACES = re.compile(r"\s+")
_UK_POSTCODE = re.compile(r"^([a-z]{1,2}[0-9][a-z0-9]?)([0-9][a-z]{2})$")
_US_ZIP = re.compile(r"^([0-9]{5})")
_DATE_FORMS = (
    (re.compile(r"^([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})$"), ("y", "m", "d")),
    (re.compile(r"^([0-9]{4})([0-9]{2})([0-9]{2})$"), ("y", "m", "d")),
    (re.compile(r"^([0-9]{1,2})/([0-9]{1,2})/([0-9]{4})$"), ("m", "d", "y")),
)


def _text(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    text = unicodedata.normalize("NFC", value).strip()
    return text or None


def _without_punctuation(text: str) -> str:
    # Unicode categories P* (punctuation) and S* (symbols): apostrophes, hyphens, dots, emoji...
    return "".join(ch for ch in text if not unicodedata.category(ch).startswith(("P", "S")))


def norm_email(value: Any) -> str | None:
    text = _text(value)
    return text.lower() if text and "@" in text else None


def norm_name(value: Any) -> str | None:
    text = _text(value)
    if text is None:
        return None
    return _SPACES.sub(" ", _without_punctuation(text.lower())).strip() or None


def norm_city(value: Any) -> str | None:
    text = _text(value)
    if text is None:
        return None
    return "".join(ch for ch in text.lower() if ch.isalpha()) or None


US_STATES = {
    "alabama": "al", "alaska": "ak", "arizona": "az", "arkansas": "ar", "california": "ca", "colorado": "co",
    "connecticut": "ct", "delaware": "de", "district of columbia": "dc", "washington dc": "dc", "florida": "fl",
    "georgia": "ga", "hawaii": "hi", "idaho": "id", "illinois": "il", "indiana": "in", "iowa": "ia",
    "kansas": "ks", "kentucky": "ky", "louisiana": "la", "maine": "me", "maryland": "md",
    "massachusetts": "ma", "michigan": "mi", "minnesota": "mn", "mississippi": "ms", "missouri": "mo",
    "montana": "mt", "nebraska": "ne", "nevada": "nv", "new hampshire": "nh", "new jersey": "nj",
    "new mexico": "nm", "new york": "ny", "north carolina": "nc", "north dakota": "nd", "ohio": "oh",
    "oklahoma": "ok", "oregon": "or", "pennsylvania": "pa", "rhode island": "ri", "south carolina": "sc",
    "south dakota": "sd", "tennessee": "tn", "texas": "tx", "utah": "ut", "vermont": "vt", "virginia": "va",
    "washington": "wa", "west virginia": "wv", "wisconsin": "wi", "wyoming": "wy",
    "american samoa": "as", "guam": "gu", "northern mariana islands": "mp", "puerto rico": "pr",
    "us virgin islands": "vi", "virgin islands": "vi", "united states virgin islands": "vi",
}
CA_PROVINCES = {
    "alberta": "ab", "british columbia": "bc", "manitoba": "mb", "new brunswick": "nb",
    "newfoundland and labrador": "nl", "newfoundland": "nl", "nova scotia": "ns", "northwest territories": "nt",
    "nunavut": "nu", "ontario": "on", "prince edward island": "pe", "quebec": "qc", "québec": "qc",
    "saskatchewan": "sk", "yukon": "yt",
}
_STATE_NAMES = {"US": US_STATES, "CA": CA_PROVINCES}


def norm_state(value: Any, country: str | None = "US") -> str | None:
    text = _text(value)
    if text is None:
        return None
    lowered = _SPACES.sub(" ", _without_punctuation(text.lower())).strip()
    names = _STATE_NAMES.get((country or "").upper())
    if names is not None:
        codes = set(names.values())
        if lowered in codes:
            return lowered
        if lowered in names:
            return names[lowered]
        if lowered.replace(" ", "") in codes:  # "N.Y." -> "ny"
            return lowered.replace(" ", "")
    return "".join(ch for ch in lowered if ch.isalpha()) or None


def norm_zip(value: Any, country: str | None = "US") -> str | None:
    text = _text(value)
    if text is None:
        return None
    compact = re.sub(r"[\s\-]", "", text.lower())
    code = (country or "").upper()
    if code == "US":
        found = _US_ZIP.match(compact)
        return found.group(1) if found else (compact or None)
    if code == "GB":
        found = _UK_POSTCODE.match(compact)
        return found.group(1) + found.group(2)[0] if found else (compact or None)
    return compact or None


def norm_country(value: Any) -> str | None:
    text = _text(value)
    if text is None or not re.fullmatch(r"[A-Za-z]{2}", text):
        return None
    return text.lower()


def norm_dob(value: Any) -> str | None:
    text = _text(value)
    if text is None:
        return None
    for pattern, order in _DATE_FORMS:
        found = pattern.match(text)
        if found:
            parts = dict(zip(order, (int(g) for g in found.groups())))
            try:
                return date(parts["y"], parts["m"], parts["d"]).strftime("%Y%m%d")
            except ValueError:
                return None
    return None


def norm_external_id(value: Any) -> str | None:
    text = _text(value)
    return text.lower() if text else None


def phone_e164(lead: dict[str, Any], region: str | None) -> str | None:
    """The lead's phone in E.164 (`+` and digits): the stored phoneE164, else its phone read in
    the lead's country or `region`."""
    stored = lead.get("phoneE164")
    if isinstance(stored, str) and stored.startswith("+"):
        return stored
    phone = lead.get("phone")
    if not isinstance(phone, str):
        return None
    return to_e164(phone, lead.get("country") or region)


def norm_phone_meta(lead: dict[str, Any], region: str | None) -> str | None:
    e164 = phone_e164(lead, region)
    return e164[1:] if e164 else None


def lead_country(lead: dict[str, Any], region: str | None) -> str | None:
    """ISO alpha-2 (upper case) of the lead: its country, else its phone's, else `region`."""
    country = lead.get("country")
    if isinstance(country, str) and re.fullmatch(r"[A-Za-z]{2}", country):
        return country.upper()
    e164 = phone_e164(lead, region)
    if e164:
        try:
            found = phonenumbers.region_code_for_number(phonenumbers.parse(e164, None))
        except phonenumbers.NumberParseException:
            found = None
        if found and found != "ZZ":
            return found
    return region.upper() if region else None


# ---- values the lead record carries ---------------------------------------------------------


def _attribution(lead: dict[str, Any], key: str) -> str | None:
    for section in ("attribution", "compliance"):
        value = (lead.get(section) or {}).get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _created_ms(lead: dict[str, Any]) -> int | None:
    created = lead.get("createdAt")
    if not isinstance(created, str):
        return None
    try:
        moment = datetime.fromisoformat(created[:-1] + "+00:00" if created.endswith("Z") else created)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


def fbc_of(lead: dict[str, Any]) -> str | None:
    """The stored `fbc`, else one built from `fbclid` and the time it was captured (the lead's
    createdAt in milliseconds): `fb.1.<ms>.<fbclid>`."""
    stored = _attribution(lead, "fbc")
    if stored:
        return stored
    fbclid = _attribution(lead, "fbclid")
    created = _created_ms(lead)
    if fbclid and created is not None:
        return f"fb.1.{created}.{fbclid}"
    return None


def _hashed(value: str | None) -> list[str] | None:
    return [sha256_hex(value)] if value else None


def meta_user_data(lead: dict[str, Any], region: str | None) -> dict[str, Any]:
    address = lead.get("address") or {}
    country = lead_country(lead, region)
    hashed = {
        "em": norm_email(lead.get("email")),
        "ph": norm_phone_meta(lead, region),
        "fn": norm_name(lead.get("firstName")),
        "ln": norm_name(lead.get("lastName")),
        "db": norm_dob(lead.get("dateOfBirth")),
        "ct": norm_city(address.get("city")),
        "st": norm_state(address.get("state"), country),
        "zp": norm_zip(address.get("zip"), country),
        "country": norm_country(country),
        "external_id": norm_external_id(lead.get("leadId")),
    }
    user: dict[str, Any] = {key: _hashed(value) for key, value in hashed.items() if value}
    raw = {
        "client_ip_address": _attribution(lead, "ipAddress"),
        "client_user_agent": _attribution(lead, "userAgent"),
        "fbc": fbc_of(lead),
        "fbp": _attribution(lead, "fbp"),
    }
    user.update({key: value for key, value in raw.items() if value})
    return user


def _money(value: float | None, currency: str | None) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if value is not None:
        found["value"] = value
    if currency:
        found["currency"] = currency
    return found


def meta_payload(*, lead: dict[str, Any], event_name: str, event_id: str, event_time: int, action_source: str,
                 value: float | None, currency: str | None, test_event_code: str | None,
                 region: str | None) -> dict[str, Any]:
    """The JSON body of POST /{api_version}/{pixelId}/events, without the access token."""
    event: dict[str, Any] = {
        "event_name": event_name,
        "event_time": event_time,
        "event_id": event_id,
        "action_source": action_source,
        "user_data": meta_user_data(lead, region),
    }
    source_url = _attribution(lead, "captureUrl")
    if source_url:
        event["event_source_url"] = source_url
    custom = _money(value, currency)
    if custom:
        event["custom_data"] = custom
    payload: dict[str, Any] = {"data": [event]}
    if test_event_code:
        payload["test_event_code"] = test_event_code
    return payload


def tiktok_user(lead: dict[str, Any], region: str | None) -> dict[str, Any]:
    hashed = {
        "email": norm_email(lead.get("email")),
        "phone": phone_e164(lead, region),
        "external_id": norm_external_id(lead.get("leadId")),
    }
    user: dict[str, Any] = {key: sha256_hex(value) for key, value in hashed.items() if value}
    raw = {
        "ttclid": _attribution(lead, "ttclid"),
        "ttp": _attribution(lead, "ttp"),
        "ip": _attribution(lead, "ipAddress"),
        "user_agent": _attribution(lead, "userAgent"),
    }
    user.update({key: value for key, value in raw.items() if value})
    return user


def tiktok_payload(*, lead: dict[str, Any], pixel_code: str, event_name: str, event_id: str, event_time: int,
                   value: float | None, currency: str | None, test_event_code: str | None,
                   region: str | None) -> dict[str, Any]:
    """The JSON body of POST /open_api/v1.3/event/track/ (Events API 2.0); the access token goes
    in the `Access-Token` header."""
    event: dict[str, Any] = {
        "event": event_name,
        "event_time": event_time,
        "event_id": event_id,
        "user": tiktok_user(lead, region),
    }
    properties = _money(value, currency)
    if properties:
        event["properties"] = properties
    page = {"url": _attribution(lead, "captureUrl"), "referrer": _attribution(lead, "referrer")}
    page = {key: value for key, value in page.items() if value}
    if page:
        event["page"] = page
    payload: dict[str, Any] = {"event_source": "web", "event_source_id": pixel_code, "data": [event]}
    if test_event_code:
        payload["test_event_code"] = test_event_code
    return payload
