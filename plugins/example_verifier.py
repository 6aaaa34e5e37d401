"""Example verifier plugin: a do-not-contact list kept in a file. A lead whose phone or email is
on the list fails the step; a lead with neither is `unknown`.

Copy this file into a plugin folder (`[plugins] dirs`, or `plugins/` next to the binary) and
point it at the list, one E.164 phone (`+14155550123`) or email per line, `#` for comments:

    [plugins.example_verifier]
    list_file = "/etc/appliance/do-not-contact.txt"

The file is read once, when the appliance starts (restart it after changing the list). Then
name the verifier in a campaign:

    "qualification": {"verifications": [
        {"verifier": "example_verifier", "config": {"fields": ["phoneE164"]}, "onFail": "disqualify"}]}

`config.fields` says which of the lead's values are looked up: `phoneE164`, `email` or both (the
default). The campaign's import refuses another field (`validate`).

Looking a value up in a set takes microseconds and no I/O, so the check says it is not
`blocking` and runs on the appliance's event loop. A verifier that waits on anything (a file
read per lead, a socket, a library without async) keeps the default `blocking = True` and runs
in a worker thread, or makes `verify` an `async def` and awaits its I/O.

It imports only modules the one-file binary promises to plugins (see plugins/README.md).
"""

from __future__ import annotations

from typing import Any

import msgspec

from appliance.sdk import VerificationRequest, VerificationResult, Verifier, hookimpl

FIELDS = ("phoneE164", "email")


class ListSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The `[plugins.example_verifier]` table; a wrong key makes the plugin fail to load."""

    list_file: str


class DoNotContact(Verifier):
    name = "example_verifier"
    blocking = False  # a set lookup: runs inline

    def __init__(self, listed: frozenset[str]) -> None:
        self.listed = listed

    def validate(self, config: dict[str, Any]) -> list[str]:
        """Problems of a campaign's config, each as `"<field>: <problem>"` (the import adds where
        the step is)."""
        problems = [f"config.{key}: unknown field" for key in config if key != "fields"]
        fields = config.get("fields", list(FIELDS))
        if not isinstance(fields, list) or not fields:
            return [*problems, "config.fields: must be a list of phoneE164, email"]
        return problems + [f"config.fields[{i}]: must be phoneE164 or email" for i, field in enumerate(fields)
                           if field not in FIELDS]

    def _values(self, request: VerificationRequest) -> list[str]:
        fields = request.config.get("fields", FIELDS)
        return [value.lower() for value in (request.lead.get(field) for field in fields)
                if isinstance(value, str) and value]

    def cache_key(self, request: VerificationRequest) -> str | None:
        """Results may be kept per value looked up (a campaign's `cacheSeconds`)."""
        values = self._values(request)
        return " ".join(values) if values else None

    def verify(self, request: VerificationRequest, http: Any) -> VerificationResult:
        values = self._values(request)
        if not values:
            return VerificationResult(outcome="unknown", reason="the lead has no value to look up")
        listed = [value for value in values if value in self.listed]
        # The data is kept on the lead and rules read it: `verification.example_verifier.data.listed`.
        data = {"listed": bool(listed), "checked": len(values)}
        if listed:
            return VerificationResult(outcome="fail", data=data, reason="on the do-not-contact list")
        return VerificationResult(outcome="pass", data=data)


def read_list(path: str) -> frozenset[str]:
    with open(path, encoding="utf-8") as listed:
        lines = (line.split("#", 1)[0].strip().lower() for line in listed)
        return frozenset(line for line in lines if line)


@hookimpl
def appliance_verifiers(settings):
    """`settings` is the [plugins.example_verifier] table (a dict). No table: nothing to check
    against, so the plugin offers nothing (and still loads)."""
    if not settings:
        return []
    return [DoNotContact(read_list(msgspec.convert(settings, ListSettings).list_file))]
