"""The admin console through HTTP (Litestar's test client, no browser): signing in and out,
sessions that expire or end with their key, CSRF tokens, tenancy, escaping, headers, and each
page answering. tests/test_console_browser.py drives the same pages in Chromium."""

from __future__ import annotations

import html
import json
import re

from appliance.services import tenancy
from tests.api_helpers import SUBMIT
from tests.bundles import campaign
from tests.buyer_server import wait_until
from tests.conftest import make_tenant
from tests.submit_support import api, clock  # noqa: F401 (fixtures)
from tests.people import add_person, csrf_of, sign_in, sign_in_as
from tests.servers import person
from tests.worker_helpers import endpoint, lead_body, live_app, status_is, wait_for

PAGES = ("/admin/", "/admin/leads", "/admin/review", "/admin/failures", "/admin/endpoints", "/admin/webhooks",
         "/admin/reports", "/admin/import", "/admin/account", "/admin/users", "/admin/audit")


def submit(client, tenant, **fields) -> str:
    answer = client.post(SUBMIT, json={"campaignId": "AC01", **person(7), **fields}, headers=tenant.headers)
    assert answer.status_code == 201, answer.text
    return answer.json()["data"]["leadId"]


def signed_out(answer) -> bool:
    return answer.status_code == 303 and answer.headers["location"] == "/admin/sign-in"


def test_pages_need_a_session(client):
    for path in (*PAGES, "/admin/leads/lead_X"):
        assert signed_out(client.get(path, follow_redirects=False)), path
    assert signed_out(client.post("/admin/sign-out", data={"csrf": "x"}, follow_redirects=False))


def test_sign_in_sets_a_strict_http_only_cookie_and_every_page_answers(client, tenant):
    someone = add_person(client, tenant, "admin")
    token = csrf_of(client.get("/admin/sign-in").text)
    answer = client.post("/admin/sign-in", data={"csrf": token, "email": someone.email, "password": someone.password},
                         follow_redirects=False)
    cookie = next(v for k, v in answer.headers.multi_items() if k == "set-cookie" and v.startswith("console_session="))
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict") and "Path=/admin" in cookie
    assert "Max-Age=43200" in cookie and "Secure" not in cookie  # plain HTTP here: no Secure
    assert someone.password not in cookie
    for path in PAGES:
        page = client.get(path)
        assert page.status_code == 200, (path, page.text[:300])
        assert page.headers["content-type"].startswith("text/html")
        assert page.headers["x-frame-options"] == "DENY" and page.headers["cache-control"] == "no-store"
        assert "default-src 'none'" in page.headers["content-security-policy"]
        assert tenant.key not in page.text and someone.password not in page.text
    css = client.get("/admin/static/console.css")
    assert css.status_code == 200 and "text/css" in css.headers["content-type"]


def test_api_keys_no_longer_open_the_console(client, runtime, tenant):
    token = csrf_of(client.get("/admin/sign-in").text)
    for key in (tenant.key, tenancy.create_key(runtime, tenant.tenant_id, source_id="A-src").key):
        refused = client.post("/admin/sign-in", data={"csrf": token, "apiKey": key})
        assert refused.status_code == 400 and "email address and your password" in refused.text
        token = csrf_of(refused.text)
        assert key not in refused.text
    assert signed_out(client.get("/admin/", follow_redirects=False))


def test_sign_in_without_its_form_token_is_refused(client, tenant):
    someone = add_person(client, tenant, "viewer")
    client.get("/admin/sign-in")
    for data in ({}, {"csrf": "forged"}):
        answer = client.post("/admin/sign-in", data={**data, "email": someone.email, "password": someone.password})
        assert answer.status_code == 403 and "refused" in answer.text
    assert signed_out(client.get("/admin/", follow_redirects=False))


def test_forms_without_the_sessions_token_are_refused(client, tenant):
    sign_in(client, tenant)
    lead_id = submit(client, tenant)
    for path in ("/admin/sign-out", f"/admin/leads/{lead_id}/repost", f"/admin/leads/{lead_id}/decision",
                 "/admin/endpoints/A-ep/pause", "/admin/failures/repost"):
        for data in ({}, {"csrf": "forged-token"}):
            answer = client.post(path, data={**data, "decision": "approved", "status": "failed", "leadId": lead_id})
            assert answer.status_code == 403, (path, answer.status_code)
            assert "This form was refused" in answer.text and answer.headers["x-frame-options"] == "DENY"
    assert client.get("/api/v1/endpoints", headers=tenant.headers).json()["data"]["items"][0]["state"] == "active"
    assert client.get("/admin/").status_code == 200  # still signed in: a refused sign-out ended nothing


def test_import_form_without_the_token_is_refused(client, tenant):
    sign_in(client, tenant)
    answer = client.post("/admin/import", data={"campaignId": "AC01"},
                         files={"file": ("leads.csv", b"email\nx@example.com\n", "text/csv")})
    assert answer.status_code == 403
    assert client.get("/api/v1/leads", headers=tenant.headers).json()["data"]["leads"] == []


def test_sign_out_ends_the_session_on_the_server(client, tenant):
    token = sign_in(client, tenant)
    old = client.cookies.get("console_session")
    answer = client.post("/admin/sign-out", data={"csrf": token}, follow_redirects=False)
    assert signed_out(answer)
    client.cookies.set("console_session", old, path="/admin")  # the old cookie, sent again
    assert signed_out(client.get("/admin/", follow_redirects=False))


def test_a_revoked_key_leaves_sessions_alone_and_a_disabled_user_ends_them(client, runtime, tenant):
    someone = add_person(client, tenant, "reviewer")
    sign_in_as(client, someone)
    other_key = tenancy.create_key(runtime, tenant.tenant_id, name="spare")
    tenancy.revoke_key(runtime, tenant.key_id)  # people's sessions do not hang on any key
    assert client.get("/admin/leads").status_code == 200
    disabled = client.delete(f"/api/v1/users/{someone.user_id}", headers={"X-API-Key": other_key.key})
    assert disabled.status_code == 200 and disabled.json()["data"]["active"] is False
    assert signed_out(client.get("/admin/leads", follow_redirects=False))


def test_a_session_expires_after_12_hours(api, runtime, tenant, clock):  # noqa: F811 (the fixtures)
    sign_in(api, tenant)
    clock.advance(hours=11, minutes=59)
    assert api.get("/admin/").status_code == 200
    clock.advance(minutes=2)
    assert signed_out(api.get("/admin/", follow_redirects=False))


def test_another_tenants_lead_is_answered_as_a_missing_one(client, runtime, tenant, other_tenant):
    theirs = submit(client, other_tenant, campaignId="OC01")
    sign_in(client, tenant)
    missing = client.get("/admin/leads/lead_01ZZZZZZZZZZZZZZZZZZZZZZZZ")
    foreign = client.get(f"/admin/leads/{theirs}")
    assert missing.status_code == foreign.status_code == 404
    assert foreign.text.replace(theirs, "ID") == missing.text.replace("lead_01ZZZZZZZZZZZZZZZZZZZZZZZZ", "ID")
    token = csrf_of(client.get("/admin/").text)
    assert client.post(f"/admin/leads/{theirs}/repost", data={"csrf": token}).status_code == 404
    assert client.post(f"/admin/leads/{theirs}/decision", data={"csrf": token, "decision": "approved"}).status_code == 404
    listed = client.get("/admin/leads", params={"search": "jane7@example.com"}).text
    assert theirs not in listed


def test_lead_search_and_a_script_named_lead_shown_as_text(client, tenant):
    lead_id = submit(client, tenant, firstName="<script>alert(1)</script>", email="findme@example.com")
    other = submit(client, tenant, email="someone@example.com", phone="+14155550199")
    sign_in(client, tenant)
    found = client.get("/admin/leads", params={"search": "FindMe@example.com"}).text
    assert lead_id in found and other not in found
    page = client.get(f"/admin/leads/{lead_id}").text
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    bad = client.get("/admin/leads", params={"startDate": "not a date"})
    assert bad.status_code == 400 and "startDate" in bad.text


def test_review_queue_approve_and_reject(client, runtime, tenant):
    import json
    tenancy.import_bundle(runtime, tenant.tenant_id, json.dumps({"campaigns": [{
        "campaignId": "REV", "name": "Reviewed", "firstIntakeAction": {"enabled": True, "action": "human_review"},
        "delivery": {"deliveryEndpointId": "A-ep"}}]}).encode(), "json")
    first, second = submit(client, tenant, campaignId="REV"), submit(client, tenant, campaignId="REV",
                                                                     email="second@example.com", phone="+14155550142")
    token = sign_in(client, tenant)
    queue = client.get("/admin/review").text
    assert first in queue and second in queue
    no_reason = client.post(f"/admin/leads/{second}/decision", data={"csrf": token, "decision": "rejected"})
    assert no_reason.status_code == 400 and "reason" in no_reason.text
    done = client.post(f"/admin/leads/{first}/decision", data={"csrf": token, "decision": "approved", "back": "review"},
                       follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == "/admin/review?notice=approved"
    client.post(f"/admin/leads/{second}/decision", data={"csrf": token, "decision": "rejected", "reason": "fake name"})
    lead = client.get(f"/api/v1/leads/{second}", headers=tenant.headers).json()["data"]
    assert lead["status"] == "rejected" and lead["approval"]["reason"] == "fake name"
    assert client.get(f"/api/v1/leads/{first}", headers=tenant.headers).json()["data"]["approval"]["status"] == "approved"
    again = client.post(f"/admin/leads/{first}/decision", data={"csrf": token, "decision": "approved"})
    assert again.status_code == 409 and "already approved" in again.text


def test_a_decision_that_comes_too_late_is_refused_on_a_page_that_says_why(runtime, tmp_path):
    """The review queue was read while each lead waited; another reviewer approved them since, and
    their deliveries are under way, done or failed: the decision taken from the queue is refused."""
    review = {"enabled": True, "action": "human_review"}
    tenant = make_tenant(runtime, "Desk", {"deliveryEndpoints": [endpoint()], "campaigns": [
        campaign("REV", "Reviewed", firstIntakeAction=review, delivery={"deliveryEndpointId": "ep"})]})
    with live_app(runtime, tmp_path) as client:
        leads = {script: client.post(SUBMIT, json=lead_body("REV", script), headers=tenant.headers).json()["data"]["leadId"]
                 for script in ("sleep:3", "success", "failure")}
        token = sign_in(client, tenant)
        queue = client.get("/admin/review").text
        assert all(lead_id in queue for lead_id in leads.values())
        for lead_id in leads.values():
            assert client.post(f"/api/v1/leads/{lead_id}/approve", json={"status": "approved"},
                               headers=tenant.headers).status_code == 200

        def refusal(lead_id: str) -> str:  # approving again is refused either way, and changes nothing
            return client.post(f"/api/v1/leads/{lead_id}/approve", json={"status": "approved"},
                               headers=tenant.headers).json()["error"]["details"][0]

        def refused_from_the_queue(lead_id: str, decision: str, why: str) -> None:
            page = client.post(f"/admin/leads/{lead_id}/decision",
                               data={"csrf": token, "decision": decision, "reason": "fake name", "back": "review"})
            shown = html.unescape(page.text)
            assert page.status_code == 409 and "That cannot be done now" in shown and why in shown, shown
            assert client.get(f"/api/v1/leads/{lead_id}", headers=tenant.headers).json()["data"]["approval"][
                "status"] == "approved"

        assert wait_until(lambda: "under way" in refusal(leads["sleep:3"]), timeout=10)  # the buyer has it
        refused_from_the_queue(leads["sleep:3"], "rejected", "the lead's delivery is already under way")
        wait_for(client, tenant, leads["success"], status_is("delivered"))
        refused_from_the_queue(leads["success"], "rejected", "the lead is already delivered")
        wait_for(client, tenant, leads["failure"], status_is("failed"))
        refused_from_the_queue(leads["failure"], "approved", "the lead's delivery already failed")
        assert client.get("/admin/review").status_code == 200
        wait_for(client, tenant, leads["sleep:3"], status_is("delivered"))


def test_endpoint_pause_and_resume(client, tenant):
    token = sign_in(client, tenant)
    answer = client.post("/admin/endpoints/A-ep/pause", data={"csrf": token, "reason": "buyer asked"})
    assert answer.status_code == 200 and "buyer asked" in answer.text and "Resume A-ep" in answer.text
    item = client.get("/api/v1/endpoints", headers=tenant.headers).json()["data"]["items"][0]
    assert item["state"] == "paused" and item["pausedReason"] == "buyer asked"
    assert "buyer asked" in client.get("/admin/").text  # the overview lists it
    client.post("/admin/endpoints/A-ep/resume", data={"csrf": token})
    assert client.get("/api/v1/endpoints", headers=tenant.headers).json()["data"]["items"][0]["state"] == "active"
    assert client.post("/admin/endpoints/nope/pause", data={"csrf": token}).status_code == 404


def test_reports_page_and_csv(client, tenant):
    submit(client, tenant)
    sign_in(client, tenant)
    page = client.get("/admin/reports", params={"groupBy": "campaign"})
    assert page.status_code == 200 and "Auto Accident West" in page.text and "<svg" in page.text
    csv = client.get("/admin/reports.csv", params={"groupBy": "campaign"})
    assert csv.status_code == 200 and csv.headers["content-type"].startswith("text/csv")
    assert csv.text.splitlines()[0].startswith("key,label,leads") and "AC01" in csv.text
    assert client.get("/admin/reports", params={"groupBy": "nope"}).status_code == 400


def test_csv_import_with_progress_and_row_errors(client, tenant):
    token = sign_in(client, tenant)
    rows = b"firstName,lastName,email,phone\nAnn,Lee,ann@example.com,+14155550101\nBob,Ray,not-an-email,\n"
    answer = client.post("/admin/import", data={"csrf": token, "campaignId": "AC01", "process": "true"},
                         files={"file": ("leads.csv", rows, "text/csv")}, follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"].startswith("/admin/imports/imp")
    progress = answer.headers["location"]
    for _ in range(100):
        page = client.get(progress)
        if "Done." in page.text:
            break
    assert "Done." in page.text and 'http-equiv="refresh"' not in page.text
    assert re.search(r'id="import-created">1<', page.text) and re.search(r'id="import-failed">1<', page.text)
    assert re.search(r'<td class="num">2</td><td>[^<]*email: must be a valid email address', page.text)
    other = make_tenant(client.app.state.runtime, "Third")
    client.cookies.clear()
    sign_in(client, other)
    assert client.get(progress).status_code == 404


def test_console_routes_stay_out_of_the_api_document(client):
    paths = client.get("/schema/openapi.json").json()["paths"]
    assert paths and not [p for p in paths if p.startswith("/admin")]
    assert "/api/v1/leads/submit" in paths


def test_the_cookie_is_secure_over_tls(runtime, tenant):
    from litestar.testing import TestClient

    from appliance.app import create_app

    with TestClient(create_app(runtime, background=False), base_url="https://console.example") as tls:
        someone = add_person(tls, tenant)
        token = csrf_of(tls.get("/admin/sign-in").text)
        answer = tls.post("/admin/sign-in", data={"csrf": token, "email": someone.email, "password": someone.password},
                          follow_redirects=False)
        cookie = next(v for k, v in answer.headers.multi_items() if k == "set-cookie" and v.startswith("console_session="))
        assert "Secure" in cookie and "HttpOnly" in cookie


def test_refused_actions_answer_pages_that_say_why(client, tenant):
    token = sign_in(client, tenant)
    lead_id = submit(client, tenant)  # qualified, its delivery queued: not a lead to send again
    cases = [
        ("/admin/endpoints/A-ep/explode", {}, 404, "Not found"),
        ("/admin/failures/repost", {"status": "failed"}, 400, "leadId: between 1 and 100 leads"),
        ("/admin/failures/repost", {"status": "delivered", "leadId": lead_id}, 400, "status: must be one of"),
        (f"/admin/leads/{lead_id}/repost", {}, 409, "That cannot be done now"),
        (f"/admin/leads/{lead_id}/decision", {"decision": "maybe"}, 400, "decision: must be approved or rejected"),
    ]
    for path, data, status, text in cases:
        answer = client.post(path, data={"csrf": token, **data})
        assert answer.status_code == status and text in answer.text, (path, answer.status_code, answer.text[-600:])
    bad = client.post("/admin/import", data={"csrf": token, "campaignId": "nope"},
                      files={"file": ("leads.csv", b"email\nx@example.com\n", "text/csv")})
    assert bad.status_code == 400 and "campaignId" in bad.text
    assert client.get("/admin/imports/imp_missing").status_code == 404
    assert client.get("/admin/failures", params={"status": "delivered"}).status_code == 400


def test_the_cookie_is_secure_behind_a_tls_proxy_that_says_so(client, tenant):
    someone = add_person(client, tenant)
    token = csrf_of(client.get("/admin/sign-in").text)
    answer = client.post("/admin/sign-in", data={"csrf": token, "email": someone.email, "password": someone.password},
                         follow_redirects=False, headers={"X-Forwarded-Proto": "https"})
    cookie = next(v for k, v in answer.headers.multi_items() if k == "set-cookie" and v.startswith("console_session="))
    assert "Secure" in cookie


def test_every_answer_under_admin_carries_the_console_headers(client, tenant):
    for method, path in (("GET", "/admin/nope"), ("GET", "/admin/sign-in"), ("DELETE", "/admin/leads"),
                         ("GET", "/admin/static/nothing.css")):
        answer = client.request(method, path, follow_redirects=False)
        assert answer.headers.get("x-frame-options") == "DENY", (method, path, answer.status_code)
        assert "frame-ancestors 'none'" in answer.headers.get("content-security-policy", ""), (method, path)
        assert answer.headers.get("cache-control") == "no-store", (method, path)


def test_signing_in_again_ends_the_session_before(client, tenant):
    sign_in(client, tenant)
    first = client.cookies.get("console_session")
    sign_in(client, tenant)
    assert client.cookies.get("console_session") != first
    client.cookies.clear()
    client.cookies.set("console_session", first)
    stale = client.get("/admin/", follow_redirects=False)
    assert stale.status_code in (302, 303) and stale.headers["location"].endswith("/admin/sign-in")


def test_an_endpoint_whose_id_needs_escaping_can_be_paused_from_its_page(client, runtime, tenant):
    tenancy.import_bundle(runtime, tenant.tenant_id, json.dumps({"deliveryEndpoints": [
        {"deliveryEndpointId": "east #2?", "url": "https://east.example.com/in"}]}).encode(), "json")
    token = sign_in(client, tenant)
    page = client.get("/admin/endpoints").text
    action = re.search(r'action="(/admin/endpoints/east[^"]*/pause)"', page).group(1)
    assert action == "/admin/endpoints/east%20%232%3F/pause"
    assert client.post(action, data={"csrf": token}).status_code == 200
    items = client.get("/api/v1/endpoints", headers=tenant.headers).json()["data"]["items"]
    assert {i["deliveryEndpointId"]: i["state"] for i in items}["east #2?"] == "paused"


def test_sending_many_again_says_how_many_went(client, tenant):
    token = sign_in(client, tenant)
    lead_id = submit(client, tenant)  # qualified, not failed: it cannot be sent again
    answer = client.post("/admin/failures/repost", data={"csrf": token, "status": "failed", "leadId": lead_id})
    assert answer.status_code == 200
    assert "0 of the leads shown were sent again; 1 could not be" in answer.text


def test_secure_cookies_makes_the_cookies_secure_on_plain_http(config_file):
    from litestar.testing import TestClient

    from appliance.app import create_app
    from appliance.config import load_config
    from appliance.runtime import create_runtime

    text = config_file.read_text()
    config_file.write_text(text.replace("[storage]\n", "[server]\nsecure_cookies = true\n\n[storage]\n", 1))
    runtime = create_runtime(load_config(config_file))
    try:
        with TestClient(create_app(runtime, background=False)) as plain:  # http://testserver
            page = plain.get("/admin/sign-in")  # its CSRF cookie is set as the session's would be
            cookie = next(v for k, v in page.headers.multi_items()
                          if k == "set-cookie" and v.startswith("console_sign_in="))
            assert "Secure" in cookie and "HttpOnly" in cookie
    finally:
        runtime.close()


def test_without_tls_the_cookie_is_not_marked_secure(client, tenant):
    someone = add_person(client, tenant)
    token = csrf_of(client.get("/admin/sign-in").text)
    answer = client.post("/admin/sign-in", data={"csrf": token, "email": someone.email, "password": someone.password},
                         follow_redirects=False)
    cookie = next(v for k, v in answer.headers.multi_items() if k == "set-cookie" and v.startswith("console_session="))
    assert "Secure" not in cookie  # a browser on http://127.0.0.1 would drop a Secure cookie


def test_the_lead_page_shows_its_conversation_and_an_opt_out(client, tenant):
    from urllib.parse import urlencode

    from appliance.adapters.twilio import signature

    lead_id = submit(client, tenant, phone="+14155552671")

    def text(sid: str, body: str) -> None:
        form = {"MessageSid": sid, "From": "+14155552671", "To": "+14155552671", "Body": body}
        url = f"http://testserver.local/hooks/sms/twilio/{tenant.tenant_id}"
        answer = client.post(f"/hooks/sms/twilio/{tenant.tenant_id}", content=urlencode(form), headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Twilio-Signature": signature("sms-secret-token-456", url, sorted(form.items()))})
        assert answer.status_code == 200, answer.text

    text("SMa1", "Is this <b>Smith Law</b>?")
    text("SMa2", "stop")
    sign_in(client, tenant)
    page = client.get(f"/admin/leads/{lead_id}").text
    conversation = page[page.index('id="conversation"'):]
    first, second = conversation.index("Smith Law"), conversation.index(">stop<")
    assert first < second  # oldest first: it reads down
    assert "&lt;b&gt;Smith Law&lt;/b&gt;" in conversation and "<b>Smith" not in conversation
    assert conversation.count('class="inbound"') == 2
    assert "This phone opted out of texts on" in conversation
