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
  no outcome of the three at `outcomePath`, data at `dataPath` of more than 16 KiB or nesting
  more than 32 levels. The answer is read up to 1 MiB; redirects are not followed. As the
  delivery client does, the request goes to the very address the guard checked (the URL's name
  stays in the Host header and the TLS check), so a second DNS answer cannot redirect it.
- The campaign's config is shown by GET /api/v1/campaigns, so it carries no credential (a URL
  with user info or a credential-looking query parameter, or a credential-looking header, is
  refused at import). Credentials go in the config file, by origin, and are sent only there:

      [plugins.http_lookup.credentials."https://lookup.example.com"]
      X-Api-Key = "..."

  Their values are masked in whatever the service answers (reasons, data).
- Results may be cached per request sent (`cache_key`: the mapped values)."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

import httpx
import msgspec
from msgspec import Meta

from appliance import sdk
from appliance.adapters import http1, netguard
from appliance.adapters.http_delivery import parse_target
from appliance.adapters.outbound import MAX_RESPONSE_BYTES, USER_AGENT, Scrubber, outage_reason
from appliance.domain.delivery_mapping import form_pairs, json_path, mapped_payload, parse_json
from appliance.domain.verification import MAX_DATA_BYTES, MAX_DATA_DEPTH, nested_deeper
from appliance.domain.endpoint import FieldMapping, carries_credentials, check_headers, check_http_url
from appliance.domain.rules import MISSING
from appliance.config import HttpLookupSettings
from appliance.model import Model, all_problems, describe_validation_error, invalid

NAME = "http_lookup"
WHO = "the lookup service"
MAX_REASON_CHARS = 300
_OUTCOMES = ("pass", "fail", "unknown")
_CREDENTIALS_GO = f"put it in [plugins.{NAME}] credentials (the config file), by origin"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


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
        # The delivery client's: it connects to the address the SSRF guard checked (keeping the
        # name for Host and TLS), so a second DNS answer cannot send the lookup elsewhere.
        self._http = http1.Client()

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
        target = parse_target(url)
        if target is None:
            return _unknown("not sent: the url is not an http or https URL with a host")
        destination = await netguard.resolve_destination(
            url, request.allow_private_addresses, timeout=min(request.timeout_seconds, netguard.RESOLVE_TIMEOUT_SECONDS))
        if destination.reason:
            return _unknown(f"not sent: {destination.reason}")
        address = destination.ip or target.host
        server_name = (address if target.host_is_address else target.host) if target.scheme == "https" else None
        headers = {"user-agent": ("User-Agent", USER_AGENT), "accept": ("Accept", "application/json"),
                   "accept-encoding": ("Accept-Encoding", "identity")}
        body = None
        if config.method == "POST":
            headers["content-type"] = ("Content-Type", "application/json")
            body = msgspec.json.encode(payload)
        for name, value in (*config.headers.items(), *self._credentials.get(_origin(url), {}).items()):
            headers[name.lower()] = (name, value)
        headers["host"] = ("Host", target.authority)
        try:
            sent = http1.build_request(config.method, target.raw_path, headers.values(), body)
        except http1.InvalidRequest as exc:
            return _unknown(f"not sent: {exc}")
        try:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            async with asyncio.timeout(left):
                answer = await self._http.send(http1.Origin(target.scheme, address, target.port, server_name), sent,
                                               max_body=MAX_RESPONSE_BYTES)
        except TimeoutError as exc:
            return _unknown(outage_reason(WHO, exc, request.timeout_seconds))
        except http1.ConnectFailed:
            return _unknown(f"{WHO} could not be reached (connection failed)")
        except http1.ProtocolError:
            return _unknown(f"{WHO} closed the connection without a complete answer")
        except http1.HttpError:
            return _unknown(f"{WHO} connection error")
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
        said = " ".join(_CONTROL.sub(" ", said).split()) if isinstance(said, str) else None
        reason = self._scrub(said[:MAX_REASON_CHARS]) if said else None
        data = json_path(document, config.data_path) if config.data_path else MISSING
        data = {} if data is MISSING or data is None else data if isinstance(data, dict) else {"value": data}
        # Kept on the lead as a plugin's data would be: at most MAX_DATA_BYTES, MAX_DATA_DEPTH deep.
        if nested_deeper(data):
            return _unknown(f"{WHO}'s data at {config.data_path} nests deeper than {MAX_DATA_DEPTH} levels")
        size = len(msgspec.json.encode(data))
        if size > MAX_DATA_BYTES:
            return _unknown(f"{WHO}'s data at {config.data_path} is {size} bytes, more than {MAX_DATA_BYTES}")
        return sdk.VerificationResult(outcome=outcome, reason=reason, data=self._scrub.value(data))


def _unknown(reason: str) -> sdk.VerificationResult:
    return sdk.VerificationResult(outcome="unknown", reason=reason)


@sdk.hookimpl
def appliance_verifiers(settings: dict[str, Any]) -> list[sdk.Verifier]:
    """The built-in lookup verifier; a bad `[plugins.http_lookup]` table fails the load (reported)."""
    return [HttpLookup(msgspec.convert(settings, HttpLookupSettings))]
