"""TrustedForm certificate claims, for campaigns with
`qualification.tcpaPolicy.ingestionPolicy.verifyCertificate` (the job loop's `evaluate` job calls
`claim` before it qualifies the lead).

Settings: `[plugins.trustedform]` `base_url` (default https://cert.trustedform.com),
`api_key` (sent as HTTP basic `API:<key>`; never logged, stored or put in a journey event),
`timeout_seconds` (default 10, one deadline over connect, send and read).

The request: the certificate URL's path on the base URL, e.g. cert
`https://cert.trustedform.com/0123abcd` -> `POST <base_url>/0123abcd`, body
`{"reference": "<leadId>"}` (JSON), `Authorization: Basic base64("API:<api_key>")` when a key is set.
The base URL is checked by the SSRF guard (netguard) unless `[delivery] allow_private_addresses`.

The answer expected (JSON, 2xx):

    {"outcome": "success", "expires_at": "2026-06-08T15:00:00Z"}   # verified
    {"outcome": "failure", "reason": "..."}                          # not verified

(`expiresAt` is read too.) What the answers come to:

- 2xx with outcome `success`: verified; 2xx with outcome `failure`, 404 or 410: not verified
  (the lead is disqualified: "TrustedForm certificate could not be verified ...").
- A timeout, a connection error, a refused destination, 5xx, 408, 429, 401/403 (the account's
  credentials) or any other answer: `retry` (the lead waits at `pending`, the job is tried again
  with backoff): never a silent pass.

Nothing the service answers is stored but `outcome` (success / failure), `expiresAt` (a
timestamp-looking string, masked for the key and capped) and the status code.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any, Literal, NamedTuple
from urllib.parse import urlsplit

import httpx

from appliance.adapters import netguard
from appliance.adapters.outbound import Scrubber, outage_reason, post_capped
from appliance.config import TrustedFormSettings

NAME = "TrustedForm"
_PATH = re.compile(r"^(/[A-Za-z0-9._~-]+)+$")
_STAMP = re.compile(r"^[0-9T:.+\-Z ]{1,40}$")


class Claim(NamedTuple):
    kind: Literal["verified", "failed", "retry"]
    reason: str | None = None  # our words, never the service's
    outcome: str | None = None  # "success" / "failure" as answered
    expires_at: str | None = None
    status_code: int | None = None

    def stored(self) -> dict[str, Any]:
        """`compliance.trustedForm` on the lead."""
        return {"verified": self.kind == "verified", "expiresAt": self.expires_at,
                "outcome": self.outcome or ("success" if self.kind == "verified" else "failure")}


def claim_url(base_url: str, cert_url: str) -> str | None:
    """The certificate URL's path on the base URL; None when `cert_url` is not a certificate URL."""
    parts = urlsplit(cert_url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or not _PATH.match(parts.path):
        return None
    if any(segment in (".", "..") for segment in parts.path.split("/")):
        return None
    return base_url.rstrip("/") + parts.path


def _basic(api_key: str) -> str:
    return "Basic " + base64.b64encode(f"API:{api_key}".encode()).decode()


async def claim(http: httpx.AsyncClient, settings: TrustedFormSettings, cert_url: str, *, lead_id: str,
                allow_private: bool) -> Claim:
    url = claim_url(settings.base_url, cert_url)
    if url is None:
        return Claim("failed", "TrustedForm certificate could not be verified: "
                               "compliance.trustedFormCertUrl is not a certificate URL")
    timeout = settings.timeout_seconds
    destination = await netguard.resolve_destination(
        url, allow_private, timeout=min(timeout, netguard.RESOLVE_TIMEOUT_SECONDS))
    if destination.reason:
        return Claim("retry", f"{NAME} refused: {destination.reason}")
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if settings.api_key:
        headers["Authorization"] = _basic(settings.api_key)
    try:
        answer = await post_capped(http, url, headers=headers, content=json.dumps({"reference": lead_id}).encode(),
                                   timeout=timeout)
    except (TimeoutError, httpx.HTTPError) as exc:
        return Claim("retry", outage_reason(NAME, exc, timeout))
    status = answer.status
    if status in (404, 410):
        return Claim("failed", f"TrustedForm certificate could not be verified: {NAME} answered {status}",
                     "failure", status_code=status)
    if not 200 <= status < 300:
        return Claim("retry", f"{NAME} answered {status}", status_code=status)
    body = answer.json()
    outcome = body.get("outcome") if isinstance(body, dict) else None
    if outcome not in ("success", "failure"):
        return Claim("retry", f"{NAME} answered {status} without an outcome", status_code=status)
    expires = body.get("expires_at", body.get("expiresAt"))
    scrub = Scrubber([settings.api_key] if settings.api_key else [], [("API", settings.api_key or None)])
    expires = scrub(expires) if isinstance(expires, str) and _STAMP.match(expires) else None
    if outcome == "failure":
        return Claim("failed", "TrustedForm certificate could not be verified: the claim's outcome is failure",
                     outcome, expires, status)
    return Claim("verified", None, outcome, expires, status)
