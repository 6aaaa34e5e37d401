"""The built-in `http_lookup` verifier: asks a lookup service over HTTP and reads its verdict.

Config (a campaign's `qualification.verifications[].config`):

    {"url": "https://lookup.example.com/v1/check", "method": "POST",
     "fieldMapping": [{"clientKey": "phone", "leadField": "phoneE164", "required": true}],
     "outcomePath": "result.status", "reasonPath": "result.message", "dataPath": "result",
     "headers": {"Accept-Language": "en"}}

- The request carries the values `fieldMapping` takes from the lead (a delivery endpoint's
  fieldMapping: `clientKey`, `leadField` or a fixed `value`, `type`, `required`): a POST sends
  them as a JSON object, a GET as query parameters. A required value missing: `unknown`, nothing sent.
- The answer (2xx, JSON) gives the outcome at `outcomePath` (`pass`, `fail` or `unknown`, read
  trimmed and case-insensitively), the reason at `reasonPath` (text) and the data kept on the
  lead at `dataPath` (an object as it is; another value as `{"value": ...}`). Paths are dotted
  with `[n]` indexes (`items[0].line`), as a delivery endpoint's response rules read them.
- `unknown`, with the reason: the destination refused by the SSRF guard (`[delivery]
  allow_private_addresses` lets private addresses through), no answer within the step's
  `timeoutMs`, a connection error, a status other than 2xx, an answer that is not JSON or has
  no outcome of the three at `outcomePath`. The answer is read up to 1 MiB; redirects are not followed.
- The campaign's config is shown by GET /api/v1/campaigns, so it carries no credential (a URL
  with user info or a credential-looking query parameter, or a credential-looking header, is
  refused at import). Credentials go in the config file, by origin, and are sent only there:

      [plugins.http_lookup.credentials."https://lookup.example.com"]
      X-Api-Key = "..."

  Their values are masked in whatever the service answers (reasons, data).
- Results may be cached per request sent (`cache_key`: the mapped values)."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

import httpx
import msgspec
from msgspec import Meta

from appliance import sdk
from appliance.adapters import netguard
from appliance.adapters.outbound import Scrubber, get_capped, outage_reason, post_capped
from appliance.domain.delivery_mapping import form_pairs, json_path, mapped_payload, parse_json
from appliance.domain.endpoint import FieldMapping, carries_credentials, check_headers, check_http_url
from appliance.domain.rules import MISSING
from appliance.config import HttpLookupSettings
from appliance.model import Model, all_problems, describe_validation_error, invalid

NAME = "http_lookup"
WHO = "the lookup service"
MAX_REASON_CHARS = 300
_OUTCOMES = ("pass", "fail", "unknown")
_CREDENTIALS_GO = f"put it in [plugins.{NAME}] credentials (the config file), by origin"


class HttpLookupConfig(Model):
    url: str
    method: Literal["POST", "GET"] = "POST"
    field_mapping: Annotated[list[FieldMapping], Meta(min_length=1)]
    outcome_path: Annotated[str, Meta(min_length=1)]
    reason_path: str | None = None
    data_path: str | None = None
    headers: dict[str, str] = {}

    def __post_init__(self) -> None:
        check_http_url("url", self.url)
        unsendable = netguard.unsendable_reason(self.url)
        if unsendable:
            invalid("url", unsendable)
        if carries_credentials(self.url):
            invalid("url", f"must carry no credential: {_CREDENTIALS_GO}")
        check_headers("headers", self.headers, credentials=_CREDENTIALS_GO)


def _origin(url: str) -> tuple[str, str, int | None]:
    parsed = httpx.URL(url)
    return parsed.scheme, parsed.host, parsed.port


class HttpLookup(sdk.Verifier):
    name = NAME

    def __init__(self, settings: HttpLookupSettings) -> None:
        self._credentials = {_origin(origin): headers for origin, headers in settings.credentials.items()}
        self._scrub = Scrubber([value for headers in settings.credentials.values() for value in headers.values()])

    def validate(self, config: dict[str, Any]) -> list[str]:
        return all_problems(config, HttpLookupConfig, "config")

    def cache_key(self, request: sdk.VerificationRequest) -> str | None:
        try:
            config = msgspec.convert(request.config, HttpLookupConfig)
        except msgspec.ValidationError:
            return None
        payload, problems = mapped_payload(config.field_mapping, request.lead, request.now.date())
        return None if problems else msgspec.json.encode(payload, order="sorted").decode()

    async def verify(self, request: sdk.VerificationRequest, http: httpx.AsyncClient) -> sdk.VerificationResult:
        deadline = time.monotonic() + request.timeout_seconds
        try:
            config = msgspec.convert(request.config, HttpLookupConfig)
        except msgspec.ValidationError as exc:
            return _unknown(f"the config is not valid: {describe_validation_error(exc, 'config')}")
        payload, problems = mapped_payload(config.field_mapping, request.lead, request.now.date())
        if problems:
            return _unknown(f"not sent: {'; '.join(problems)}")
        url = config.url if config.method == "POST" or not payload else \
            f"{config.url}{'&' if '?' in config.url else '?'}{urlencode(form_pairs(payload))}"
        destination = await netguard.resolve_destination(
            url, request.allow_private_addresses, timeout=min(request.timeout_seconds, netguard.RESOLVE_TIMEOUT_SECONDS))
        if destination.reason:
            return _unknown(f"not sent: {destination.reason}")
        headers = {"Accept": "application/json", **config.headers, **self._credentials.get(_origin(url), {})}
        try:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if config.method == "POST":
                answer = await post_capped(http, url, headers={**headers, "Content-Type": "application/json"},
                                           content=msgspec.json.encode(payload), timeout=left)
            else:
                answer = await get_capped(http, url, headers=headers, timeout=left)
        except (TimeoutError, httpx.HTTPError) as exc:
            return _unknown(outage_reason(WHO, exc, request.timeout_seconds))
        if not 200 <= answer.status < 300:
            return _unknown(f"{WHO} answered HTTP {answer.status}")
        document = parse_json(answer.body)
        if document is MISSING:
            return _unknown(f"{WHO} answered something other than JSON")
        found = json_path(document, config.outcome_path)
        outcome = found.strip().lower() if isinstance(found, str) else None
        if outcome not in _OUTCOMES:
            return _unknown(f"{WHO}'s answer has no pass, fail or unknown at {config.outcome_path}")
        said = json_path(document, config.reason_path) if config.reason_path else None
        reason = self._scrub(said.strip()[:MAX_REASON_CHARS]) if isinstance(said, str) and said.strip() else None
        data = json_path(document, config.data_path) if config.data_path else MISSING
        data = {} if data is MISSING or data is None else data if isinstance(data, dict) else {"value": data}
        return sdk.VerificationResult(outcome=outcome, reason=reason, data=self._scrub.value(data))


def _unknown(reason: str) -> sdk.VerificationResult:
    return sdk.VerificationResult(outcome="unknown", reason=reason)


@sdk.hookimpl
def appliance_verifiers(settings: dict[str, Any]) -> list[sdk.Verifier]:
    """The built-in lookup verifier; a bad `[plugins.http_lookup]` table fails the load (reported)."""
    return [HttpLookup(msgspec.convert(settings, HttpLookupSettings))]
