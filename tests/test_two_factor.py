"""Two-factor sign-in in the console: TOTP enrolment with a QR code and an otpauth:// URI, the
10 recovery codes, the code step of a sign-in (a code works once, a recovery code once, guesses
throttled), the tenant setting that requires it, and turning it off. The test plays the
authenticator app with pyotp and the service's clock."""

from __future__ import annotations

import asyncio
import json
import re
from urllib.parse import parse_qs, unquote, urlsplit

import pyotp

from appliance.services import tenancy, users
from tests.engine import engine
from tests.people import PASSWORD, add_person, csrf_of, sign_in_as
from tests.submit_support import api, clock  # noqa: F401 (fixtures)

_URI = re.compile(r"otpauth://totp/[^<\s\"]+")


def _enrol(client, clock) -> tuple[pyotp.TOTP, list[str]]:  # noqa: F811
    """Turns two-factor on for the signed-in person: (the app's TOTP, the recovery codes)."""
    page = client.get("/admin/account/two-factor")
    assert page.status_code == 200 and "<svg" in page.text and 'autocomplete="one-time-code"' in page.text
    uri = unquote(_URI.search(page.text).group(0).replace("&amp;", "&"))
    query = parse_qs(urlsplit(uri).query)
    assert query["issuer"] == ["Lead appliance"] and uri.startswith("otpauth://totp/Lead appliance:")
    totp = pyotp.TOTP(query["secret"][0])
    wrong = client.post("/admin/account/two-factor", data={"csrf": csrf_of(page.text), "code": "000000"})
    assert wrong.status_code == 400 and "code: not the current code" in wrong.text
    done = client.post("/admin/account/two-factor",
                       data={"csrf": csrf_of(page.text), "code": totp.at(clock.moment.timestamp())})
    assert done.status_code == 200, done.text[-500:]
    codes = re.findall(r"<li><code>([a-z2-9]{5}-[a-z2-9]{5}-[a-z2-9]{5})</code></li>", done.text)
    assert len(codes) == 10 and len(set(codes)) == 10
    return totp, codes


def _password_step(client, person) -> str:
    """Email and password accepted, the code still owed: the code page's form token."""
    client.cookies.clear()
    token = csrf_of(client.get("/admin/sign-in").text)
    answer = client.post("/admin/sign-in", data={"csrf": token, "email": person.email, "password": person.password},
                         follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/admin/sign-in/code", answer.text[:300]
    page = client.get("/admin/sign-in/code")
    assert page.status_code == 200 and 'autocomplete="one-time-code"' in page.text
    return csrf_of(page.text)


def _code(client, token: str, code: str):
    return client.post("/admin/sign-in/code", data={"csrf": token, "code": code}, follow_redirects=False)


def test_enrolment_then_every_sign_in_asks_for_a_code_that_works_once(api, runtime, tenant, clock):  # noqa: F811
    person = add_person(api, tenant, "reviewer")
    sign_in_as(api, person)
    totp, _ = _enrol(api, clock)
    assert api.get(f"/api/v1/users/{person.user_id}", headers=tenant.headers).json()["data"]["twoFactor"] is True
    token = _password_step(api, person)
    for path in ("/admin/", "/admin/leads", "/admin/account"):  # nothing opens before the code
        early = api.get(path, follow_redirects=False)
        assert early.status_code == 303 and early.headers["location"] == "/admin/sign-in/code", path
    assert api.post("/admin/leads/lead_x/repost", data={"csrf": token}, follow_redirects=False) \
        .headers["location"] == "/admin/sign-in/code"
    assert _code(api, token, "123456").status_code == 401
    clock.advance(seconds=30)
    now_code = totp.at(clock.moment.timestamp())
    passed = _code(api, token, now_code)
    assert passed.status_code == 303 and passed.headers["location"] == "/admin"
    assert api.get("/admin/leads").status_code == 200
    # The same code again, in another sign-in within its 30 seconds: refused (a replay).
    token = _password_step(api, person)
    assert _code(api, token, now_code).status_code == 401
    clock.advance(seconds=30)
    assert _code(api, token, totp.at(clock.moment.timestamp())).status_code == 303


def test_a_recovery_code_works_once(api, tenant, clock):  # noqa: F811
    person = add_person(api, tenant, "viewer")
    sign_in_as(api, person)
    _, codes = _enrol(api, clock)
    token = _password_step(api, person)
    assert _code(api, token, codes[3].upper()).status_code == 303  # typed in capitals: still the code
    token = _password_step(api, person)
    assert _code(api, token, codes[3]).status_code == 401
    assert _code(api, token, codes[4]).status_code == 303


def test_guessed_codes_are_throttled_like_passwords(api, tenant, clock):  # noqa: F811
    person = add_person(api, tenant, "viewer")
    sign_in_as(api, person)
    totp, _ = _enrol(api, clock)
    token = _password_step(api, person)
    clock.advance(seconds=60)
    for guess in range(5):
        assert _code(api, token, f"{guess:06d}").status_code == 401
    blocked = _code(api, token, totp.at(clock.moment.timestamp()))
    assert blocked.status_code == 429 and blocked.headers["Retry-After"] == "30"


def test_the_secret_is_sealed_and_a_password_reset_turns_two_factor_off(api, runtime, tenant, clock):  # noqa: F811
    person = add_person(api, tenant, "viewer")
    sign_in_as(api, person)
    totp, codes = _enrol(api, clock)
    stored = engine(runtime.store).reader().execute("SELECT totp_secret, recovery_codes FROM users").fetchone()
    assert totp.secret.encode() not in bytes(stored[0]) and not any(c in stored[1] for c in codes)
    link = asyncio.run(users.reset_password(runtime, tenant.tenant_id, "cli", None, user_id=person.user_id))
    assert api.get(f"/api/v1/users/{person.user_id}", headers=tenant.headers).json()["data"]["twoFactor"] is False
    path = urlsplit(link.setup_url).path
    form = api.get(path)
    api.post(path, data={"csrf": csrf_of(form.text), "password": PASSWORD, "repeat": PASSWORD})
    sign_in_as(api, person)  # no code step now


def test_a_tenant_that_requires_two_factor_makes_staff_enrol_at_sign_in(api, runtime, tenant, clock):  # noqa: F811
    person = add_person(api, tenant, "manager")
    tenancy.import_bundle(runtime, tenant.tenant_id, json.dumps({"settings": {"requireTwoFactor": True}}).encode(),
                          "json")
    assert tenancy.export_bundle(runtime, tenant.tenant_id).settings.require_two_factor is True
    token = csrf_of(api.get("/admin/sign-in").text)
    answer = api.post("/admin/sign-in", data={"csrf": token, "email": person.email, "password": person.password},
                      follow_redirects=False)
    assert answer.headers["location"] == "/admin/account/two-factor"
    early = api.get("/admin/leads", follow_redirects=False)
    assert early.status_code == 303 and early.headers["location"] == "/admin/account/two-factor"
    page = api.get("/admin/account/two-factor")
    assert "requires two-factor sign-in" in page.text
    totp, codes = _enrol(api, clock)
    assert api.get("/admin/leads").status_code == 200  # enrolled: the session is live
    account = api.get("/admin/account/two-factor")
    off = api.post("/admin/account/two-factor/off", data={"csrf": csrf_of(account.text), "code": codes[0]})
    assert off.status_code == 409 and "requires two-factor" in off.text


def test_two_factor_is_turned_off_with_a_code(api, tenant, clock):  # noqa: F811
    person = add_person(api, tenant, "viewer")
    sign_in_as(api, person)
    totp, codes = _enrol(api, clock)
    page = api.get("/admin/account/two-factor")
    wrong = api.post("/admin/account/two-factor/off", data={"csrf": csrf_of(page.text), "code": "999999"})
    assert wrong.status_code == 400
    clock.advance(seconds=30)
    off = api.post("/admin/account/two-factor/off", data={"csrf": csrf_of(page.text),
                                                          "code": totp.at(clock.moment.timestamp())},
                   follow_redirects=False)
    assert off.status_code == 303
    assert api.get(f"/api/v1/users/{person.user_id}", headers=tenant.headers).json()["data"]["twoFactor"] is False
    sign_in_as(api, person)


def test_a_bad_settings_object_is_refused_naming_the_field(runtime, tenant):
    import pytest

    from appliance.services.bundle import BundleError

    for settings, field in (({"requireTwoFactor": "yes"}, "settings.requireTwoFactor"),
                            ({"requireTwoFactorr": True}, "settings")):
        with pytest.raises(BundleError) as refused:
            tenancy.import_bundle(runtime, tenant.tenant_id, json.dumps({"settings": settings}).encode(), "json")
        assert any(p.startswith(field) for p in refused.value.problems), refused.value.problems
    assert tenancy.export_bundle(runtime, tenant.tenant_id).settings.require_two_factor is False


def test_a_password_sign_in_does_not_reopen_guessing_codes(api, tenant, clock):  # noqa: F811
    person = add_person(api, tenant, "viewer")
    sign_in_as(api, person)
    totp, _ = _enrol(api, clock)
    clock.advance(seconds=60)
    token = _password_step(api, person)
    for guess in range(4):
        assert _code(api, token, f"{guess:06d}").status_code == 401
    token = _password_step(api, person)  # the right password again: the code count stays
    assert _code(api, token, "999999").status_code == 401
    assert _code(api, token, totp.at(clock.moment.timestamp())).status_code == 429


def test_the_enrolment_page_shows_the_same_secret_until_it_is_confirmed(api, tenant, clock):  # noqa: F811
    sign_in_as(api, add_person(api, tenant, "viewer"))
    first, again = (_URI.search(api.get("/admin/account/two-factor").text).group(0) for _ in range(2))
    assert first == again  # a second tab shows the code the first tab's scan made


def test_requiring_two_factor_reaches_sessions_already_open(api, runtime, tenant, clock):  # noqa: F811
    sign_in_as(api, add_person(api, tenant, "reviewer"))
    tenancy.import_bundle(runtime, tenant.tenant_id, json.dumps({"settings": {"requireTwoFactor": True}}).encode(),
                          "json")
    early = api.get("/admin/leads", follow_redirects=False)
    assert early.status_code == 303 and early.headers["location"] == "/admin/account/two-factor"
    _enrol(api, clock)
    assert api.get("/admin/leads").status_code == 200
