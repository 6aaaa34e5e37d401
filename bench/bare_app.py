"""The framework baseline: a bare Litestar app (the appliance's Litestar, msgspec and uvicorn),
served exactly the way `appliance serve` serves (one uvicorn worker, access log off, no server
header, default loop/http: uvloop and httptools when installed). A benchmark divides the
appliance's req/s by this app's to show what the appliance adds on top of the framework.

Routes:
  GET  /constant          a constant JSON body of --body-size bytes (a campaigns page's size)
  GET  /constant-small    the same with --small-body-size bytes (e.g. a filtered page)
  POST /decode            Litestar decodes the body into `Lead` (its msgspec path), {"ok":true}
  POST /decode-raw        `await request.body()` + msgspec.json.decode(Lead), as appliance.api.io does

    python -m bench.bare_app --port 8090 --body-size 150000

`sample_lead_body(n)` makes a realistic ~1.5 KB lead body that decodes into `Lead`.
"""

from __future__ import annotations

import argparse
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, get, post

JSON = "application/json"
OK = b'{"ok":true}'


class Address(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    street: str
    city: str
    state: str
    zip: str


class Lead(msgspec.Struct, rename="camel", forbid_unknown_fields=True, kw_only=True):
    first_name: str
    last_name: str
    email: str
    phone: str
    address: Address
    date_of_birth: str | None = None
    country: str = "US"
    questionnaire: dict[str, Any] = {}
    attribution: dict[str, Any] = {}
    compliance: dict[str, Any] = {}
    custom_fields: dict[str, Any] = {}
    is_test: bool = False
    notes: str | None = None


_FIRST = ["James", "Maria", "Robert", "Linda", "Michael", "Patricia", "David", "Jennifer", "Carlos", "Aisha"]
_LAST = ["Smith", "Garcia", "Johnson", "Nguyen", "Brown", "Martinez", "Davis", "Lopez", "Wilson", "Okafor"]
_CITIES = [("Los Angeles", "CA", "900"), ("Houston", "TX", "770"), ("Miami", "FL", "331"),
           ("Brooklyn", "NY", "112"), ("Phoenix", "AZ", "850")]


def sample_lead(n: int) -> dict[str, Any]:
    """A realistic lead (about 1.5 KB as JSON), different for each n."""
    first, last = _FIRST[n % len(_FIRST)], _LAST[(n // len(_FIRST)) % len(_LAST)]
    city, state, zip3 = _CITIES[n % len(_CITIES)]
    return {
        "firstName": first,
        "lastName": last,
        "email": f"{first.lower()}.{last.lower()}.{n}@example.com",
        "phone": f"+1555{n % 10_000_000:07d}",
        "address": {"street": f"{100 + n % 9000} Oak Street Apt {n % 40}", "city": city, "state": state,
                    "zip": f"{zip3}{n % 100:02d}"},
        "dateOfBirth": f"{1950 + n % 50}-{1 + n % 12:02d}-{1 + n % 28:02d}",
        "country": "US",
        "questionnaire": {"accident_date": "2024-05-14", "injured": "yes" if n % 3 else "no",
                          "at_fault": "no", "medical_treatment": "emergency room, then physiotherapy",
                          "attorney_retained": "no", "vehicle_type": "sedan", "police_report": "yes",
                          "insurance_carrier": "State Farm"},
        "attribution": {"utm_source": "google", "utm_medium": "cpc", "utm_campaign": f"auto-accident-{state.lower()}",
                        "utm_content": "headline-b", "gclid": f"Cj0KCQjw{n:012d}EAAYASAAEgK",
                        "landing_page": "https://example.com/auto-accident/free-case-review",
                        "referrer": "https://www.google.com/"},
        "compliance": {"tcpa_consent": True, "consent_text": "By clicking Submit I agree to be contacted by "
                       "phone, text and email, including by automated means, about my claim.",
                       "trusted_form_cert_url": f"https://cert.trustedform.com/{n:040x}",
                       "ip_address": f"203.0.113.{n % 250}", "user_agent": "Mozilla/5.0 (iPhone; CPU iPhone "
                       "OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Mobile/15E148"},
        "customFields": {"preferred_contact_time": "evening", "language": "en", "lead_score": n % 100,
                         "campaign_code": "AUTO1", "sub_id": f"sub-{n % 500}"},
        "isTest": False,
        "notes": "Rear-ended at a red light; other driver cited. Back and neck pain since, two weeks off work. "
                 "Wants a call after 5pm; prefers text first.",
    }


def sample_lead_body(n: int) -> bytes:
    return msgspec.json.encode(sample_lead(n))


def constant_body(size: int) -> bytes:
    """A JSON document of exactly `size` bytes (at least 40) shaped like the success envelope."""
    head, tail = b'{"success":true,"data":{"padding":"', b'"}}'
    return head + b"x" * max(0, size - len(head) - len(tail)) + tail


def create_app(body_size: int = 2048, small_body_size: int = 2048) -> Litestar:
    big, small = constant_body(body_size), constant_body(small_body_size)

    @get("/constant", sync_to_thread=False)
    def constant() -> Response:
        return Response(big, media_type=JSON)

    @get("/constant-small", sync_to_thread=False)
    def constant_small() -> Response:
        return Response(small, media_type=JSON)

    @post("/decode", status_code=200, sync_to_thread=False)
    def decode(data: Lead) -> Response:
        return Response(OK, media_type=JSON)

    @post("/decode-raw", status_code=200)
    async def decode_raw(request: Request) -> Response:
        msgspec.json.decode(await request.body(), type=Lead)
        return Response(OK, media_type=JSON)

    return Litestar(route_handlers=[constant, constant_small, decode, decode_raw], debug=False)


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m bench.bare_app")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--body-size", type=int, default=2048, help="bytes of GET /constant")
    parser.add_argument("--small-body-size", type=int, default=2048, help="bytes of GET /constant-small")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args()
    # The same call as appliance.cli._serve.
    uvicorn.run(create_app(args.body_size, args.small_body_size), host=args.host, port=args.port,
                log_level=args.log_level, access_log=False, server_header=False, proxy_headers=False,
                lifespan="on")


if __name__ == "__main__":
    main()
