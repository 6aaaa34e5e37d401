"""People (CONTRACT 9.3): users made through the API and the CLI with one-time setup links,
passwords kept as argon2id, console sign-in by email and password with its throttle, sessions
that end on sign-out, disable, password reset and "sign out everywhere", roles in the console,
the rules about owners, and tenant isolation."""

from __future__ import annotations

import asyncio
import json

from appliance.services import users
from appliance.services.users import NewUser
from tests.engine import engine
from tests.people import PASSWORD, Person, add_person, choose_password, csrf_of, setup_path, sign_in_as
from tests.submit_support import api, clock  # noqa: F401 (fixtures)


def _signed_out(answer) -> bool:
    return answer.status_code == 303 and answer.headers["location"] == "/admin/sign-in"


def _try_sign_in(client, email: str, password: str):
    token = csrf_of(client.get("/admin/sign-in").text)
    return client.post("/admin/sign-in", data={"csrf": token, "email": email, "password": password},
                       follow_redirects=False)


def _owner(runtime, tenant, email: str = "owner@example.com") -> tuple[str, str]:
    """An owner (only the CLI or an owner makes one): (userId, setupUrl)."""
    made = asyncio.run(users.create(runtime, tenant.tenant_id, "cli", None, NewUser(email=email, role="owner")))
    return made.user_id, made.setup_url


# ---- creating people -----------------------------------------------------------------------------

def test_the_api_creates_a_user_with_a_one_time_setup_link(client, runtime, tenant):
    made = client.post("/api/v1/users", json={"email": "Desk.Person@Example.com", "name": "Dee", "role": "reviewer"},
                       headers=tenant.headers)
    assert made.status_code == 201, made.text
    user = made.json()["data"]
    assert user["userId"].startswith("usr_") and user["email"] == "desk.person@example.com"
    assert user["role"] == "reviewer" and user["active"] is True and user["twoFactor"] is False
    assert user["setupUrl"].startswith("http://127.0.0.1:8080/admin/setup/")
    listed = client.get("/api/v1/users", headers=tenant.headers).json()["data"]
    assert [u["userId"] for u in listed["items"]] == [user["userId"]] and "setupUrl" not in listed["items"][0]
    fetched = client.get(f"/api/v1/users/{user['userId']}", headers=tenant.headers).json()["data"]
    assert fetched["email"] == "desk.person@example.com" and "passwordHash" not in fetched
    # The link: a form naming the person, used once.
    page = client.get(setup_path(user["setupUrl"]))
    assert page.status_code == 200 and "desk.person@example.com" in page.text
    assert 'autocomplete="new-password"' in page.text
    choose_password(client, user["setupUrl"])
    used = client.get(setup_path(user["setupUrl"]))
    assert used.status_code == 404 and "unknown, already used or expired" in used.text
    # The password is stored as argon2id, never as itself.
    stored = engine(runtime.store).reader().execute("SELECT password_hash FROM users").fetchone()[0]
    assert stored.startswith("$argon2id$v=19$m=65536,t=2,p=1$") and PASSWORD not in stored


def test_bad_users_are_validation_errors_naming_the_field(client, tenant):
    cases = [
        ({"email": "not-an-email", "role": "viewer"}, "email: must be an email address"),
        ({"email": "a@example.com", "role": "superuser"}, "role"),
        ({"email": "a@example.com", "role": "buyer"}, "clientId: a buyer user needs"),
        ({"email": "a@example.com", "role": "supplier"}, "supplierId: a supplier user needs"),
        ({"email": "a@example.com", "role": "viewer", "clientId": "cli-1"}, "clientId: only a buyer user has one"),
        ({"email": "a@example.com", "role": "viewer", "password": "x" * 20}, "password"),
        ({"role": "viewer"}, "email"),
    ]
    for body, expected in cases:
        answer = client.post("/api/v1/users", json=body, headers=tenant.headers)
        assert answer.status_code == 400, (body, answer.text)
        error = answer.json()["error"]
        assert error["code"] == "VALIDATION_ERROR" and any(expected in d for d in error["details"]), (body, error)
    first = client.post("/api/v1/users", json={"email": "a@example.com", "role": "viewer"}, headers=tenant.headers)
    assert first.status_code == 201
    again = client.post("/api/v1/users", json={"email": "A@example.com", "role": "viewer"}, headers=tenant.headers)
    assert again.status_code == 400 and "email: a user of this tenant already has" in again.text
    buyer = client.post("/api/v1/users", json={"email": "b@example.com", "role": "buyer", "clientId": "cli-1"},
                        headers=tenant.headers)
    assert buyer.status_code == 201 and buyer.json()["data"]["clientId"] == "cli-1"
    for body, detail in (({"role": "buyer", "clientId": "cli-9"}, "clientId: the tenant has no client record or campaign"),
                         ({"role": "supplier", "supplierId": "O-src"}, "supplierId: no campaign of this tenant")):
        answer = client.post("/api/v1/users", json={"email": "p@example.com", **body}, headers=tenant.headers)
        assert answer.status_code == 400 and detail in answer.text, answer.text
    supplier = client.post("/api/v1/users", json={"email": "s@example.com", "role": "supplier", "supplierId": "A-src"},
                           headers=tenant.headers)
    assert supplier.status_code == 201


def test_the_setup_link_refuses_weak_and_mismatched_passwords(client, tenant):
    made = client.post("/api/v1/users", json={"email": "p@example.com", "role": "viewer"}, headers=tenant.headers)
    path = setup_path(made.json()["data"]["setupUrl"])
    for password, repeat, problem in (("short pass", "short pass", "must be at least 12 characters"),
                                      ("long enough one", "long enough two", "the two entries differ")):
        form = client.get(path)
        answer = client.post(path, data={"csrf": csrf_of(form.text), "password": password, "repeat": repeat})
        assert answer.status_code == 400 and f"password: {problem}" in answer.text
    assert client.get(path).status_code == 200  # refused tries leave the link usable
    forged = "/admin/setup/" + "A" * 43
    assert client.get(forged).status_code == 404
    form = client.get(path)
    refused = client.post(forged, data={"csrf": csrf_of(form.text), "password": PASSWORD, "repeat": PASSWORD})
    assert refused.status_code == 404 and "unknown, already used or expired" in refused.text


def test_a_setup_link_expires_after_24_hours_and_a_new_one_replaces_it(api, runtime, tenant, clock):  # noqa: F811
    made = api.post("/api/v1/users", json={"email": "late@example.com", "role": "viewer"}, headers=tenant.headers)
    user = made.json()["data"]
    clock.advance(hours=24, seconds=1)
    assert api.get(setup_path(user["setupUrl"])).status_code == 404
    first = asyncio.run(users.reset_password(runtime, tenant.tenant_id, "cli", None, user_id=user["userId"]))
    second = asyncio.run(users.reset_password(runtime, tenant.tenant_id, "cli", None, user_id=user["userId"]))
    assert api.get(setup_path(first.setup_url)).status_code == 404  # only the newest link works
    choose_password(api, second.setup_url)


def test_the_cli_adds_lists_resets_and_disables_users(cli, client, tenant):
    made = cli.json("user", "add", "--tenant", tenant.tenant_id, "--email", "boss@example.com", "--role", "owner",
                    "--name", "Boss")
    assert set(made) == {"userId", "email", "name", "role", "setupUrl"}
    assert made["role"] == "owner" and made["setupUrl"].startswith("http://127.0.0.1:8080/admin/setup/")
    choose_password(client, made["setupUrl"])
    boss = Person(made["userId"], "boss@example.com")
    sign_in_as(client, boss)
    listed = cli.json("user", "list", "--tenant", tenant.tenant_id)
    assert [u["email"] for u in listed] == ["boss@example.com"] and "setupUrl" not in listed[0]
    reset = cli.json("user", "reset-password", "--tenant", tenant.tenant_id, "--email", "boss@example.com")
    assert set(reset) == {"userId", "email", "setupUrl"} and reset["setupUrl"] != made["setupUrl"]
    assert _signed_out(client.get("/admin/", follow_redirects=False))  # a reset ends the sessions
    assert _try_sign_in(client, boss.email, boss.password).status_code == 401  # and the old password
    choose_password(client, reset["setupUrl"], "another long passphrase")
    assert _try_sign_in(client, boss.email, "another long passphrase").status_code == 303
    assert cli("user", "add", "--tenant", tenant.tenant_id, "--email", "x", "--role", "viewer", expect=1) \
        .stderr.startswith("error: email: must be an email address")
    assert "no user with the email" in cli("user", "disable", "--tenant", tenant.tenant_id, "--email",
                                           "nobody@example.com", expect=1).stderr
    # The last owner cannot be disabled, even by the CLI.
    assert "last active owner" in cli("user", "disable", "--tenant", tenant.tenant_id, "--email", "boss@example.com",
                                      expect=1).stderr
    viewer = cli.json("user", "add", "--tenant", tenant.tenant_id, "--email", "v@example.com", "--role", "viewer")
    assert cli.json("user", "disable", "--tenant", tenant.tenant_id, "--email", "v@example.com")["active"] is False
    assert viewer["setupUrl"] not in cli("user", "list", "--tenant", tenant.tenant_id).stdout


# ---- signing in ----------------------------------------------------------------------------------

def test_a_wrong_password_and_an_unknown_email_get_the_same_answer(client, tenant):
    someone = add_person(client, tenant, "viewer")
    wrong = _try_sign_in(client, someone.email, "not the password at all")
    unknown = _try_sign_in(client, "nobody@example.com", "not the password at all")
    assert wrong.status_code == unknown.status_code == 401
    assert wrong.text.replace(csrf_of(wrong.text), "T") == unknown.text.replace(csrf_of(unknown.text), "T")
    assert wrong.headers["WWW-Authenticate"] == unknown.headers["WWW-Authenticate"]
    right = _try_sign_in(client, someone.email.upper(), someone.password)
    assert right.status_code == 303 and right.headers["location"] == "/admin"


def test_failed_sign_ins_are_throttled_per_address_with_doubling_waits(api, tenant, clock):  # noqa: F811
    someone = add_person(api, tenant, "viewer")
    for _ in range(5):
        assert _try_sign_in(api, someone.email, "wrong password guess").status_code == 401
    blocked = _try_sign_in(api, someone.email, someone.password)  # even the right password waits
    assert blocked.status_code == 429 and blocked.headers["Retry-After"] == "30"
    assert "Try again in 30 seconds" in blocked.text
    clock.advance(seconds=31)
    assert _try_sign_in(api, someone.email, "wrong password guess").status_code == 401  # the 6th failure
    assert _try_sign_in(api, someone.email, someone.password).headers["Retry-After"] == "60"
    clock.advance(seconds=61)
    assert _try_sign_in(api, someone.email, someone.password).status_code == 303  # clears the account's count
    # ... not the client's: a good account does not reopen an address that guessed others.
    assert _try_sign_in(api, someone.email, "wrong password guess").status_code == 401
    assert _try_sign_in(api, someone.email, someone.password).headers["Retry-After"] == "120"


def test_failed_sign_ins_are_throttled_per_client_across_addresses(api, tenant, clock):  # noqa: F811
    someone = add_person(api, tenant, "viewer")
    for n in range(5):
        assert _try_sign_in(api, f"guess{n}@example.com", "wrong password guess").status_code == 401
    assert _try_sign_in(api, someone.email, someone.password).status_code == 429  # the same client
    clock.advance(seconds=31)
    assert _try_sign_in(api, someone.email, someone.password).status_code == 303


def test_sessions_end_on_sign_out_everywhere_and_a_stolen_cookie_is_refused(client, tenant):
    someone = add_person(client, tenant, "viewer")
    token = sign_in_as(client, someone)
    first_cookie = client.cookies.get("console_session")
    client.cookies.clear()
    sign_in_as(client, someone)  # a second device
    page = client.get("/admin/account")
    assert page.status_code == 200 and someone.email in page.text
    done = client.post("/admin/account/sign-out-everywhere", data={"csrf": csrf_of(page.text)},
                       follow_redirects=False)
    assert done.status_code == 303
    for cookie in (first_cookie, client.cookies.get("console_session")):
        client.cookies.set("console_session", cookie or "gone", path="/admin")
        assert _signed_out(client.get("/admin/", follow_redirects=False))
    assert token  # the first device's form token is useless without its session
    client.cookies.set("console_session", first_cookie, path="/admin")
    assert _signed_out(client.post("/admin/sign-out", data={"csrf": token}, follow_redirects=False))


def test_a_password_change_ends_the_sessions(client, runtime, tenant):
    someone = add_person(client, tenant, "viewer")
    sign_in_as(client, someone)
    link = asyncio.run(users.reset_password(runtime, tenant.tenant_id, "cli", None, user_id=someone.user_id))
    assert _signed_out(client.get("/admin/", follow_redirects=False))
    choose_password(client, link.setup_url, "a brand new passphrase")
    assert _try_sign_in(client, someone.email, someone.password).status_code == 401
    assert _try_sign_in(client, someone.email, "a brand new passphrase").status_code == 303


# ---- roles in the console ------------------------------------------------------------------------

def test_a_viewer_reads_and_is_refused_every_action(client, tenant):
    token = sign_in_as(client, add_person(client, tenant, "viewer"))
    assert "Approve" not in client.get("/admin/review").text
    for path in ("/admin/leads/lead_01ZZZZZZZZZZZZZZZZZZZZZZZZ/decision", "/admin/leads/lead_x/repost",
                 "/admin/failures/repost", "/admin/endpoints/A-ep/pause", "/admin/users"):
        answer = client.post(path, data={"csrf": token, "decision": "approved"})
        assert answer.status_code == 403 and "Your role does not allow this" in answer.text, path
    for path in ("/admin/users", "/admin/import"):
        assert client.get(path).status_code == 403
    assert client.get("/api/v1/endpoints", headers=tenant.headers).json()["data"]["items"][0]["state"] == "active"
    nav = client.get("/admin/").text
    assert 'href="/admin/users"' not in nav and 'href="/admin/import"' not in nav


def test_a_manager_pauses_endpoints_but_does_not_manage_people(client, tenant):
    token = sign_in_as(client, add_person(client, tenant, "manager"))
    paused = client.post("/admin/endpoints/A-ep/pause", data={"csrf": token}, follow_redirects=False)
    assert paused.status_code == 303
    assert client.get("/api/v1/endpoints", headers=tenant.headers).json()["data"]["items"][0]["state"] == "paused"
    assert client.get("/admin/users").status_code == 403


def test_an_admin_adds_people_in_the_console_but_not_owners(client, runtime, tenant):
    owner_id, _ = _owner(runtime, tenant)
    token = sign_in_as(client, add_person(client, tenant, "admin"))
    page = client.get("/admin/users")
    assert page.status_code == 200 and "<option>owner</option>" not in page.text
    made = client.post("/admin/users", data={"csrf": token, "email": "new@example.com", "role": "reviewer"})
    assert made.status_code == 201 and "/admin/setup/" in made.text
    refused = client.post("/admin/users", data={"csrf": token, "email": "o2@example.com", "role": "owner"})
    assert refused.status_code == 403
    touched = client.post(f"/admin/users/{owner_id}", data={"csrf": token, "action": "disable"})
    assert touched.status_code == 403 and "needs the owner role" in touched.text


def test_decisions_made_in_the_console_name_the_person(client, runtime, tenant):
    from appliance.services import tenancy
    from tests.test_console import submit

    tenancy.import_bundle(runtime, tenant.tenant_id, json.dumps({"campaigns": [{
        "campaignId": "REV", "name": "Reviewed", "firstIntakeAction": {"enabled": True, "action": "human_review"},
        "delivery": {"deliveryEndpointId": "A-ep"}}]}).encode(), "json")
    lead_id = submit(client, tenant, campaignId="REV")
    someone = add_person(client, tenant, "reviewer")
    token = sign_in_as(client, someone)
    decided = client.post(f"/admin/leads/{lead_id}/decision", data={"csrf": token, "decision": "approved"},
                          follow_redirects=False)
    assert decided.status_code == 303
    lead = client.get(f"/api/v1/leads/{lead_id}", headers=tenant.headers).json()["data"]
    assert lead["approval"]["decidedBy"] == f"user:{someone.user_id}"


# ---- owners and tenants --------------------------------------------------------------------------

def test_admins_cannot_touch_owners_and_the_last_owner_stays(client, runtime, tenant):
    from appliance.services import tenancy

    owner_id, setup = _owner(runtime, tenant)
    admin = {"X-API-Key": tenancy.create_key(runtime, tenant.tenant_id, role="admin").key}
    owner = {"X-API-Key": tenancy.create_key(runtime, tenant.tenant_id, role="owner").key}
    for method, path, body in (("POST", "/api/v1/users", {"email": "o2@example.com", "role": "owner"}),
                               ("PATCH", f"/api/v1/users/{owner_id}", {"name": "Renamed"}),
                               ("DELETE", f"/api/v1/users/{owner_id}", None)):
        refused = client.request(method, path, json=body, headers=admin)
        assert refused.status_code == 403 and "owner" in refused.json()["error"]["message"], (method, path)
    made = client.post("/api/v1/users", json={"email": "a@example.com", "role": "admin"}, headers=admin)
    promote = client.patch(f"/api/v1/users/{made.json()['data']['userId']}", json={"role": "owner"}, headers=admin)
    assert promote.status_code == 403
    last = client.delete(f"/api/v1/users/{owner_id}", headers=owner)
    assert last.status_code == 409 and "last active owner" in last.json()["error"]["message"]
    demoted = client.patch(f"/api/v1/users/{owner_id}", json={"role": "admin"}, headers=owner)
    assert demoted.status_code == 409
    second = client.post("/api/v1/users", json={"email": "o2@example.com", "role": "owner"}, headers=owner)
    assert second.status_code == 201
    assert client.delete(f"/api/v1/users/{owner_id}", headers=owner).json()["data"]["active"] is False
    assert client.get(setup_path(setup)).status_code == 404  # a disabled user's link is dead too


def test_tenants_see_only_their_own_people(client, runtime, tenant, other_tenant):
    mine = add_person(client, tenant, "viewer")
    theirs = add_person(client, other_tenant, "viewer", email=mine.email)  # the same address in another tenant
    assert [u["userId"] for u in client.get("/api/v1/users", headers=other_tenant.headers).json()["data"]["items"]] \
        == [theirs.user_id]
    for method in ("GET", "PATCH", "DELETE"):
        answer = client.request(method, f"/api/v1/users/{mine.user_id}", json={"name": "x"} if method == "PATCH" else None,
                                headers=other_tenant.headers)
        assert answer.status_code == 404, method
    sign_in_as(client, theirs)  # the same password: the first tenant's matching user (in tenant order)
    assert client.get("/admin/account").status_code == 200


def test_the_audit_page_shows_who_changed_what_to_admins_only(client, tenant):
    reviewer = add_person(client, tenant, "reviewer")
    token = sign_in_as(client, add_person(client, tenant, "manager"))
    client.post("/admin/endpoints/A-ep/pause", data={"csrf": token, "reason": "closed <b>today</b>"})
    assert client.get("/admin/audit").status_code == 403
    client.cookies.clear()
    sign_in_as(client, add_person(client, tenant, "admin"))
    page = client.get("/admin/audit")
    assert page.status_code == 200
    assert "endpoint.pause" in page.text and "user.create" in page.text and "user.sign_in" in page.text
    assert "closed &lt;b&gt;today&lt;/b&gt;" in page.text  # shown as text
    only = client.get("/admin/audit", params={"action": "user.create"}).text
    assert reviewer.user_id in only and "endpoint.pause" not in only
    bad = client.get("/admin/audit", params={"startDate": "yesterday"})
    assert bad.status_code == 400 and "startDate" in bad.text
    assert PASSWORD not in page.text


def test_parallel_wrong_passwords_cannot_all_slip_past_the_throttle(runtime, client, tenant):
    from appliance.services import console

    someone = add_person(client, tenant, "viewer")

    async def burst():
        return await asyncio.gather(*(console.sign_in(runtime, someone.email, "wrong password guess", "10.0.0.9")
                                      for _ in range(9)))

    outcomes = asyncio.run(burst())
    assert sum(o.wait is None for o in outcomes) == 5 and all(o.session is None for o in outcomes)


def test_a_failed_sign_in_is_audited_anonymously_where_one_tenant_knows_the_address(client, tenant, other_tenant):
    mine = add_person(client, tenant, "viewer", email="shared@example.com")
    assert _try_sign_in(client, mine.email, "wrong password guess").status_code == 401
    failed = client.get("/api/v1/audit", params={"action": "user.sign_in_failed"}, headers=tenant.headers)
    assert [(e["actor"], e["target"]) for e in failed.json()["data"]["items"]] == [("anonymous", mine.user_id)]
    add_person(client, other_tenant, "viewer", email="shared@example.com")  # now two tenants know it
    assert _try_sign_in(client, mine.email, "wrong password guess").status_code == 401
    for who in (tenant, other_tenant):
        items = client.get("/api/v1/audit", params={"action": "user.sign_in_failed"}, headers=who.headers)
        assert len(items.json()["data"]["items"]) == (1 if who is tenant else 0)


def test_a_party_user_keeps_its_kind_and_a_reviewer_cannot_redeliver(client, tenant):
    buyer = client.post("/api/v1/users", json={"email": "b@example.com", "role": "buyer", "clientId": "cli-1"},
                        headers=tenant.headers).json()["data"]
    for role in ("supplier", "viewer"):
        answer = client.patch(f"/api/v1/users/{buyer['userId']}", json={"role": role}, headers=tenant.headers)
        assert answer.status_code == 400 and "role: a buyer user cannot become" in answer.text
    token = sign_in_as(client, add_person(client, tenant, "reviewer"))
    assert "Send the selected leads again" not in client.get("/admin/failures").text
    refused = client.post("/admin/failures/repost", data={"csrf": token, "status": "failed", "leadId": "lead_x"})
    assert refused.status_code == 403 and "manager" in refused.text


def test_the_audit_log_refuses_to_be_changed(client, runtime, tenant):
    import pytest

    add_person(client, tenant, "viewer")
    with pytest.raises(Exception, match="append-only"):
        engine(runtime.store).write_sync(lambda conn: conn.execute("UPDATE audit_log SET actor = 'someone else'"))
