"""The field library entries every new tenant starts with: the submit body's own fields, so
conditions, questionnaires and posting specs can name them (keys are submit body paths)."""

from __future__ import annotations

from appliance.domain.catalog import DataType, FieldCategory, FieldLibraryEntry, ValidationRules


def _entry(
    category: FieldCategory, key: str, label: str, data_type: DataType = "string",
    rules: ValidationRules | None = None,
) -> FieldLibraryEntry:
    return FieldLibraryEntry(
        key=key, label=label, category=category, data_type=data_type,
        validation_rules=rules or ValidationRules(), is_standard=True,
    )


_CONTACT = [
    _entry("contact", "firstName", "First name"),
    _entry("contact", "lastName", "Last name"),
    _entry("contact", "email", "Email", "email"),
    _entry("contact", "phone", "Phone", "phone", ValidationRules(min_length=10)),
    _entry("contact", "phoneE164", "Phone (E.164)", "phone"),
    _entry("contact", "dateOfBirth", "Date of birth", "date"),
    _entry("contact", "country", "Country", rules=ValidationRules(pattern="^[A-Z]{2}(?!\\n)$")),
    _entry("contact", "address.street", "Street address"),
    _entry("contact", "address.city", "City"),
    _entry("contact", "address.state", "State"),
    _entry("contact", "address.zip", "ZIP code"),
    _entry("contact", "timezone", "Time zone"),
]

_ATTRIBUTION = [
    _entry("attribution", "attribution.params", "Tracking parameters", "json"),
    _entry("attribution", "attribution.captureUrl", "Capture URL", "url"),
    _entry("attribution", "attribution.referrer", "Referrer", "url"),
    _entry("attribution", "attribution.ipAddress", "IP address"),
    _entry("attribution", "attribution.userAgent", "User agent"),
    _entry("attribution", "attribution.gclid", "Google click ID (gclid)"),
    _entry("attribution", "attribution.gbraid", "Google app click ID (gbraid)"),
    _entry("attribution", "attribution.wbraid", "Google web-to-app click ID (wbraid)"),
    _entry("attribution", "attribution.fbclid", "Facebook click ID (fbclid)"),
    _entry("attribution", "attribution.fbc", "Facebook click cookie (fbc)"),
    _entry("attribution", "attribution.fbp", "Facebook browser cookie (fbp)"),
    _entry("attribution", "attribution.ttclid", "TikTok click ID (ttclid)"),
    _entry("attribution", "attribution.ttp", "TikTok browser cookie (ttp)"),
    _entry("attribution", "attribution.msclkid", "Microsoft click ID (msclkid)"),
]

_COMPLIANCE = [
    _entry("compliance", "compliance.tcpaConsent", "TCPA consent", "boolean"),
    _entry("compliance", "compliance.consentTimestamp", "Consent timestamp", "date"),
    _entry("compliance", "compliance.consentText", "Consent text"),
    _entry("compliance", "compliance.trustedFormCertUrl", "TrustedForm certificate URL", "url"),
    _entry("compliance", "compliance.jornayaLeadId", "Jornaya LeadiD"),
    _entry("compliance", "compliance.ipAddress", "Consent IP address"),
    _entry("compliance", "compliance.userAgent", "Consent user agent"),
]

_SYSTEM = [
    _entry("system", "leadId", "Lead ID"),
    _entry("system", "campaignId", "Campaign"),
    _entry("system", "sourceId", "Ingestion source"),
    _entry("system", "status", "Lead status"),
    _entry("system", "isTest", "Test lead", "boolean"),
    _entry("system", "createdAt", "Created at", "date"),
    _entry("system", "notes", "Notes"),
    _entry("system", "age", "Age (from date of birth)", "integer", ValidationRules(min=0)),
]

STANDARD_FIELDS: list[FieldLibraryEntry] = [*_CONTACT, *_ATTRIBUTION, *_COMPLIANCE, *_SYSTEM]
