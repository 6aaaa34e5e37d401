"""The portal at /portal (CONTRACT 9.4, issue 36 item 4): buyer and supplier users sign in at the
console's form and land here; a buyer sees the leads sold to its client (list, search, detail, CSV,
return requests, statement), a supplier the leads of its sources (status and reason, payouts,
caps, acceptance by day, posting specs) and never a buyer or a price. Anyone else's lead is
missing (404); staff are refused here as buyers and suppliers are in the console (403)."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from types import SimpleNamespace
from urllib.parse import parse_qs, unquote, urlsplit

import pyotp
import pytest
from litestar.testing import TestClient

from appliance.runtime import Runtime
from tests.bundles import campaign
from tests.conftest import make_tenant
from tests.people import add_person, csrf_of, sign_in_as
from tests.submit_support import FakeClock, clock, source_key  # noqa: F401 (the clock fixture)
from tests.worker_helpers import (
    endpoint,
    lead_body,
    live_app,
    status_is,
    submit,
    wait_for,
)

SMITH, JONES = ("cli-smith", "Smith Law"), ("cli-jones", "Jones Injury")
PRICE = 37.25  # a buyer's price: never on a supplier's page


@pytest.fixture
def live(runtime: Runtime, clock: FakeClock, tmp_path) -> Iterator[TestClient]:  # noqa: F811
    with live_app(runtime, tmp_path) as client:
        yield client


def agency_bundle() -> dict:
    """Smith Law buys campaign SL1's leads (source `web` of supplier SUP-A, `feed` of SUP-B);
    Jones Injury buys JI1's (source `jweb` of SUP-B)."""
    web = {"sourceId": "web", "name": "Web form", "supplierId": "SUP-A",
           "caps": [{"cap": 500, "type": "daily"}], "pingLimits": [{"type": "hourly", "cap": 60}],
           "costMilestones": [{"leadStatus": "delivered", "amount": 2.5, "currency": "USD"}]}
    return {
        "deliveryEndpoints": [endpoint("smith-ep", url="https://smith.example.com/in"),
                              endpoint("jones-ep", url="https://jones.example.com/in")],
        "clients": [{"clientId": SMITH[0], "name": SMITH[1], "returnPolicy": {"maxPercent": 100}},
                    {"clientId": JONES[0], "name": JONES[1], "returnPolicy": {"maxPercent": 100}}],
        "campaigns": [
            campaign("SL1", "Smith Law leads", client=SMITH, ingestion={"sources": [web, {"sourceId": "feed"}]},
                     delivery={"deliveryEndpointId": "smith-ep", "revenueMilestones": [
                         {"leadStatus": "delivered", "amount": PRICE, "currency": "USD"}]}),
            campaign("JI1", "Jones Injury leads", client=JONES,
                     ingestion={"sources": [{"sourceId": "jweb", "supplierId": "SUP-B"}]},
                     delivery={"deliveryEndpointId": "jones-ep", "revenueMilestones": [
                         {"leadStatus": "delivered", "amount": 55.5, "currency": "USD"}]}),
        ]}


def by_source(runtime, tenant, source_id: str) -> SimpleNamespace:
    return SimpleNamespace(headers={"X-API-Key": source_key(runtime, tenant, source_id)})


@pytest.fixture
def agency(live, runtime):
    """The tenant, its leads (Smith's sold and failed ones from `web`, Jones's from `jweb`), and a
    buyer user of each client and a supplier user of each supplier."""
    tenant = make_tenant(runtime, "Acme Leads", agency_bundle())
    web = by_source(runtime, tenant, "web")
    sold = submit(live, web, lead_body("SL1", email="sold.one@example.com", firstName="=1+2"))["leadId"]
    failed = submit(live, web, lead_body("SL1", "failure"))["leadId"]
    theirs = submit(live, by_source(runtime, tenant, "jweb"), lead_body("JI1", email="jones.lead@example.com"))["leadId"]
    for lead_id, status in ((sold, "delivered"), (failed, "failed"), (theirs, "delivered")):
        wait_for(live, tenant, lead_id, status_is(status))
    people = SimpleNamespace(
        smith=add_person(live, tenant, "buyer", "buyer@smith.example.com", clientId=SMITH[0]),
        jones=add_person(live, tenant, "buyer", "buyer@jones.example.com", clientId=JONES[0]),
        sup_a=add_person(live, tenant, "supplier", "sup@a.example.com", supplierId="SUP-A"),
        sup_b=add_person(live, tenant, "supplier", "sup@b.example.com", supplierId="SUP-B"),
        admin=add_person(live, tenant, "admin"))
    return SimpleNamespace(tenant=tenant, sold=sold, failed=failed, theirs=theirs, people=people)


def enter(live, person) -> str:
    """Signs in at the console's form; a buyer or supplier lands on /portal."""
    live.cookies.clear()
    return sign_in_as(live, person, expect_location="/portal")


# ---- signing in -----------------------------------------------------------------------------------

def test_a_buyer_signs_in_at_the_console_form_and_lands_on_the_portal(live, agency):
    live.cookies.clear()
    token = csrf_of(live.get("/admin/sign-in").text)
    answer = live.post("/admin/sign-in", data={"csrf": token, "email": agency.people.smith.email,
                                               "password": agency.people.smith.password}, follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/portal"
    cookie = next(v for k, v in answer.headers.multi_items() if k == "set-cookie" and v.startswith("console_session="))
    assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower() and "Path=/portal" in cookie
    page = live.get("/portal")
    assert page.status_code == 200 and agency.sold in page.text
    assert page.headers["x-frame-options"] == "DENY" and page.headers["cache-control"] == "no-store"
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert '<link rel="stylesheet" href="/admin/static/console.css">' in page.text and "http" not in page.text.split(
        "<body>")[0].replace("http-equiv", "")  # no outside asset
    missing = live.get("/portal/no-such-page")
    assert missing.status_code == 404 and missing.headers["x-frame-options"] == "DENY"


def test_without_a_session_the_portal_sends_to_sign_in(live, agency):
    live.cookies.clear()
    for path in ("/portal", "/portal/leads/lead_X", "/portal/leads.csv", "/portal/statement", "/portal/payouts"):
        answer = live.get(path, follow_redirects=False)
        assert answer.status_code == 303 and answer.headers["location"] == "/admin/sign-in", path
    answer = live.post("/portal/sign-out", data={"csrf": "x"}, follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/admin/sign-in"


def test_staff_are_refused_in_the_portal_and_parties_in_the_console(live, agency):
    sign_in_as(live, agency.people.admin)
    staff_cookie = live.cookies.get("console_session")
    live.cookies.clear()
    live.cookies.set("console_session", staff_cookie, path="/portal")
    refused = live.get("/portal")
    assert refused.status_code == 403 and "buyer or supplier" in refused.text and "yours is" not in refused.text
    assert "your role is admin" in refused.text
    enter(live, agency.people.smith)
    buyer_cookie = live.cookies.get("console_session")
    live.cookies.clear()
    live.cookies.set("console_session", buyer_cookie, path="/admin")
    for path in ("/admin/", "/admin/leads", f"/admin/leads/{agency.sold}", "/admin/account"):
        answer = live.get(path)
        assert answer.status_code == 403 and "yours is buyer" in answer.text, path
    assert agency.sold not in live.get("/admin/leads").text


def test_signing_out_of_the_portal_ends_the_session(live, agency):
    token = enter(live, agency.people.smith)
    old = live.cookies.get("console_session")
    refused = live.post("/portal/sign-out", data={}, follow_redirects=False)
    assert refused.status_code == 403  # no CSRF token: not signed out
    answer = live.post("/portal/sign-out", data={"csrf": token}, follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/admin/sign-in"
    live.cookies.set("console_session", old, path="/portal")
    assert live.get("/portal", follow_redirects=False).status_code == 303


def test_a_party_user_turns_two_factor_on_and_signs_in_with_a_code(live, agency, clock):  # noqa: F811
    enter(live, agency.people.sup_a)
    page = live.get("/portal/account")
    assert page.status_code == 200 and "<svg" in page.text
    uri = unquote(re.search(r"otpauth://totp/[^<\s\"]+", page.text).group(0).replace("&amp;", "&"))
    totp = pyotp.TOTP(parse_qs(urlsplit(uri).query)["secret"][0])
    wrong = live.post("/portal/account/two-factor", data={"csrf": csrf_of(page.text), "code": "000000"})
    assert wrong.status_code == 400 and "code: not the current code" in wrong.text
    done = live.post("/portal/account/two-factor", data={"csrf": csrf_of(page.text),
                                                         "code": totp.at(clock.moment.timestamp())})
    codes = re.findall(r"<li><code>([a-z2-9-]+)</code></li>", done.text)
    assert done.status_code == 200 and len(codes) == 10
    live.cookies.clear()
    token = csrf_of(live.get("/admin/sign-in").text)
    answer = live.post("/admin/sign-in", data={"csrf": token, "email": agency.people.sup_a.email,
                                               "password": agency.people.sup_a.password}, follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/portal/sign-in/code"
    for path in ("/portal", "/portal/sources", f"/portal/leads/{agency.sold}"):  # nothing opens before the code
        early = live.get(path, follow_redirects=False)
        assert early.status_code == 303 and early.headers["location"] == "/portal/sign-in/code", path
    token = csrf_of(live.get("/portal/sign-in/code").text)
    assert live.post("/portal/sign-in/code", data={"code": "123456"}).status_code == 403  # no CSRF token
    refused = live.post("/portal/sign-in/code", data={"csrf": token, "code": "123456"}, follow_redirects=False)
    assert refused.status_code == 401 and "That code is not right" in refused.text
    clock.advance(seconds=30)
    passed = live.post("/portal/sign-in/code", data={"csrf": token, "code": totp.at(clock.moment.timestamp())},
                       follow_redirects=False)
    assert passed.status_code == 303 and passed.headers["location"] == "/portal"
    account = live.get("/portal/account")
    assert account.status_code == 200 and "Two-factor sign-in is on" in account.text
    off = live.post("/portal/account/two-factor/off", data={"csrf": csrf_of(account.text), "code": codes[0]},
                    follow_redirects=False)
    assert off.status_code == 303 and "Two-factor sign-in is off" in live.get(off.headers["location"]).text


# ---- buyers ---------------------------------------------------------------------------------------

def test_a_buyer_sees_only_the_leads_sold_to_its_client(live, agency):
    enter(live, agency.people.smith)
    page = live.get("/portal").text
    assert agency.sold in page and f"{PRICE:.2f} USD" in page
    assert agency.theirs not in page and agency.failed not in page  # another's, and one never sold
    detail = live.get(f"/portal/leads/{agency.sold}")
    assert detail.status_code == 200 and "sold.one@example.com" in detail.text and "Request a return" in detail.text
    assert "smith.example.com/in" not in detail.text  # the delivery's URL is the agency's business
    for lead_id in (agency.theirs, agency.failed, "lead_NOPE"):
        missing = live.get(f"/portal/leads/{lead_id}")
        assert missing.status_code == 404 and "not yours to see" in missing.text, lead_id
    enter(live, agency.people.jones)
    assert agency.theirs in live.get("/portal").text and agency.sold not in live.get("/portal").text
    assert live.get(f"/portal/leads/{agency.sold}").status_code == 404


def test_a_buyers_search_finds_only_its_own_leads(live, agency):
    enter(live, agency.people.smith)
    found = live.get("/portal", params={"search": "sold.one@example.com"}).text
    assert agency.sold in found
    for text in ("jones.lead@example.com", agency.theirs, agency.failed):
        page = live.get("/portal", params={"search": text})
        assert page.status_code == 200 and "No lead sold to you matches" in page.text
        assert "/portal/leads/lead_" not in page.text
    too_long = live.get("/portal", params={"search": "x" * 201})
    assert too_long.status_code == 400 and "search: at most 200 characters" in too_long.text
    bad_cursor = live.get("/portal", params={"cursor": "nonsense"})
    assert bad_cursor.status_code == 400 and "cursor: not a cursor of this list" in bad_cursor.text


def test_a_buyers_list_pages_newest_first(live, runtime, agency):
    web = by_source(runtime, agency.tenant, "web")
    more = [submit(live, web, lead_body("SL1"))["leadId"] for _ in range(26)]
    for lead_id in more:
        wait_for(live, agency.tenant, lead_id, status_is("delivered"))
    enter(live, agency.people.smith)
    first = live.get("/portal").text
    assert more[-1] in first and agency.sold not in first and "Older leads" in first
    older = first.split('class="pager"><a href="')[1].split('"')[0].replace("&amp;", "&")
    second = live.get(older).text
    assert agency.sold in second and more[-1] not in second and "Older leads" not in second


def test_a_buyers_csv_export_has_a_header_and_only_its_leads(live, agency):
    enter(live, agency.people.smith)
    answer = live.get("/portal/leads.csv")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/csv")
    assert answer.headers["content-disposition"] == 'attachment; filename="leads.csv"'
    rows = list(csv.DictReader(io.StringIO(answer.text)))
    assert answer.text.splitlines()[0].startswith("leadId,soldAt,price,currency,status,firstName")
    assert [(r["leadId"], r["price"], r["currency"], r["email"]) for r in rows] == [
        (agency.sold, str(PRICE), "USD", "sold.one@example.com")]
    assert rows[0]["firstName"] == "'=1+2"  # a spreadsheet reads it as text, not a formula
    assert rows[0]["phone"].startswith("+1")  # a phone number is no formula: kept as it is
    enter(live, agency.people.sup_a)
    refused = live.get("/portal/leads.csv")
    assert refused.status_code == 403 and "for buyer users" in refused.text


def test_a_buyer_files_a_return_request_from_the_portal(live, agency):
    token = enter(live, agency.people.smith)
    path = f"/portal/leads/{agency.sold}/return-request"
    forged = live.post(path, data={"reason": "wrong number"}, follow_redirects=False)
    assert forged.status_code == 403 and "security token" in forged.text
    empty = live.post(path, data={"csrf": token, "reason": "  "}, follow_redirects=False)
    assert empty.status_code == 400 and "reason" in empty.text
    assert live.get("/api/v1/return-requests", headers=agency.tenant.headers).json()["data"]["items"] == []
    answer = live.post(path, data={"csrf": token, "reason": "wrong number", "note": "called twice"},
                       follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == f"/portal/leads/{agency.sold}?notice=return_requested"
    page = live.get(answer.headers["location"]).text
    assert "Your return request was sent" in page and "waits for the agency" in page and "Request a return" not in page
    listed = live.get("/api/v1/return-requests", headers=agency.tenant.headers).json()["data"]["items"]
    assert [(r["leadId"], r["clientId"], r["reason"], r["note"], r["requestedBy"]) for r in listed] == [
        (agency.sold, SMITH[0], "wrong number", "called twice", f"user:{agency.people.smith.user_id}")]
    again = live.post(path, data={"csrf": token, "reason": "again"})
    assert again.status_code == 409 and "pending already" in again.text
    for lead_id in (agency.theirs, agency.failed):  # not its leads: missing, nothing filed
        missing = live.post(f"/portal/leads/{lead_id}/return-request", data={"csrf": token, "reason": "x"})
        assert missing.status_code == 404, lead_id
    assert len(live.get("/api/v1/return-requests", headers=agency.tenant.headers).json()["data"]["items"]) == 1


def test_a_lead_sold_again_to_another_buyer_is_returned_only_by_that_buyer(live, agency, clock):  # noqa: F811
    headers = agency.tenant.headers
    assert live.post(f"/api/v1/leads/{agency.sold}/return", json={"reason": "wrong number"},
                     headers=headers).status_code == 200
    clock.advance(minutes=5)
    assert live.post(f"/api/v1/leads/{agency.sold}/repost", json={"campaignId": "JI1"}, headers=headers).status_code == 201
    wait_for(live, agency.tenant, agency.sold, status_is("delivered"))
    token = enter(live, agency.people.smith)
    page = live.get(f"/portal/leads/{agency.sold}").text
    assert f"{PRICE:.2f} USD" in page and "55.50" not in page and "Request a return" not in page
    refused = live.post(f"/portal/leads/{agency.sold}/return-request", data={"csrf": token, "reason": "x"})
    assert refused.status_code == 409 and "sold again since" in refused.text
    token = enter(live, agency.people.jones)
    page = live.get(f"/portal/leads/{agency.sold}").text
    assert "55.50 USD" in page and f"{PRICE:.2f}" not in page and "Request a return" in page
    made = live.post(f"/portal/leads/{agency.sold}/return-request", data={"csrf": token, "reason": "not ours"},
                     follow_redirects=False)
    assert made.status_code == 303, made.text[-800:]
    listed = live.get("/api/v1/return-requests", headers=headers).json()["data"]["items"]
    assert [(r["leadId"], r["clientId"]) for r in listed] == [(agency.sold, JONES[0])]


def test_a_buyer_sees_its_statement(live, agency):
    enter(live, agency.people.smith)
    page = live.get("/portal/statement")
    assert page.status_code == 200 and "Closing balance" in page.text
    assert f"-{PRICE:.2f} USD" in page.text and agency.sold in page.text and agency.theirs not in page.text
    assert "-55.50" not in page.text  # Jones's sale
    empty = live.get("/portal/statement", params={"startDate": "2020-01-01", "endDate": "2020-01-31"})
    assert empty.status_code == 200 and "Nothing happened on your balance" in empty.text
    for query, says in (({"startDate": "March"}, "startDate: must be a date"),
                        ({"startDate": "2026-03-10", "endDate": "2026-03-01"}, "endDate: must not be before")):
        bad = live.get("/portal/statement", params=query)
        assert bad.status_code == 400 and says in bad.text
    enter(live, agency.people.sup_a)
    assert live.get("/portal/statement").status_code == 403


# ---- suppliers ------------------------------------------------------------------------------------

SUPPLIER_PAGES = ("/portal", "/portal/payouts", "/portal/acceptance", "/portal/sources")


def test_a_supplier_sees_its_leads_status_and_reason_and_never_a_buyer_or_a_price(live, agency):
    enter(live, agency.people.sup_a)
    page = live.get("/portal").text
    assert agency.sold in page and agency.failed in page and agency.theirs not in page
    assert "Accepted and sold." in page and "Accepted, but no buyer took it." in page
    texts = [live.get(path).text for path in (*SUPPLIER_PAGES, f"/portal/leads/{agency.sold}",
                                              f"/portal/leads/{agency.failed}")]
    for text in texts:
        for secret in (*SMITH, *JONES, "smith-ep", "jones-ep", "smith.example.com", f"{PRICE:.2f}", str(PRICE), "55.5"):
            assert secret not in text, secret
    detail = texts[4]
    assert "Accepted and sold." in detail and "2.50 USD" in detail  # its payout for the lead
    for lead_id in (agency.theirs, "lead_NOPE"):
        assert live.get(f"/portal/leads/{lead_id}").status_code == 404
    enter(live, agency.people.sup_b)
    page = live.get("/portal").text
    assert agency.theirs in page and agency.sold not in page
    assert live.get(f"/portal/leads/{agency.sold}").status_code == 404


def test_a_suppliers_payouts_acceptance_and_sources(live, agency):
    enter(live, agency.people.sup_a)
    payouts = live.get("/portal/payouts").text
    assert agency.sold in payouts and "2.50 USD" in payouts and agency.failed not in payouts
    acceptance = live.get("/portal/acceptance").text
    today = acceptance.split("<tbody>")[1].split("</tr>")[0]
    cells = [c.split(">")[-1] for c in today.split("</td>")[:-1]]
    assert cells[1:] == ["2", "1", "0", "1", "0", "50 %"]  # received, accepted, refused, unsold, open
    sources = live.get("/portal/sources").text
    assert "Web form" in sources and "500 leads daily" in sources and "60 pings hourly" in sources
    assert "2.5 USD when a lead is delivered" in sources
    assert "/api/v1/leads/submit" in sources and "curl" in sources and "<code>email</code>" in sources
    assert "feed" not in sources.split("<h1>")[1]  # SUP-A's campaign lists it, but for another supplier
    assert live.get("/portal/payouts", params={"cursor": "x"}).status_code == 400
    enter(live, agency.people.smith)
    for path in ("/portal/payouts", "/portal/acceptance", "/portal/sources"):
        refused = live.get(path)
        assert refused.status_code == 403 and "for supplier users" in refused.text, path


def test_a_supplier_user_names_a_sources_supplier_id_or_a_source_id(live, agency):
    for supplier_id, expect in (("SUP-A", 201), ("feed", 201), ("web", 400), ("nobody", 400)):
        made = live.post("/api/v1/users", json={"email": f"{supplier_id.lower()}@x.example.com", "role": "supplier",
                                                "supplierId": supplier_id}, headers=agency.tenant.headers)
        assert made.status_code == expect, (supplier_id, made.text)
