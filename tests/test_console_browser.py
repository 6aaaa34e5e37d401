"""The admin console in a real browser: the system's Chromium driven by Playwright against a real
server (uvicorn, the background loops running, the scripted delivery adapter in the plugin
folder). Screenshots of each page go to test-artifacts/console/ (git-ignored).

Without /usr/bin/chromium the test is skipped, except in CI (CI=true), where it fails."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.bundles import campaign, standard_bundle
from tests.conftest import make_tenant
from tests.servers import live_server
from tests.worker_helpers import SCRIPTED, endpoint

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "console"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


@pytest.fixture
def chromium() -> Path:
    if not CHROMIUM.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CHROMIUM} is missing in CI: .ci/run installs it with apt-get")
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium); CI runs this test")
    return CHROMIUM


@pytest.fixture
def server(runtime, tmp_path: Path) -> Iterator[str]:
    (tmp_path / "plugins").mkdir(exist_ok=True)
    (tmp_path / "plugins" / "scripted.py").write_text(SCRIPTED)
    with live_server(runtime) as base:
        yield base


def wait_until(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_console_in_chromium(chromium, server, runtime, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    bundle = standard_bundle()
    bundle["deliveryEndpoints"].append(endpoint("ep"))
    bundle["campaigns"] += [
        campaign("BRW", "Browser West", delivery={"deliveryEndpointId": "ep"}),
        campaign("HOLD", "Held for review", firstIntakeAction={"enabled": True, "action": "human_review"},
                 delivery={"deliveryEndpointId": "ep"}),
    ]
    tenant = make_tenant(runtime, "Acme Leads", bundle)
    other = make_tenant(runtime, "Other Agency", standard_bundle(prefix="O"))
    api = httpx.Client(base_url=server, headers=tenant.headers, timeout=10)

    def submit(code: str, n: int, script: str = "success", **fields) -> str:
        body = {"campaignId": code, "firstName": "Ann", "lastName": f"Lee{n}", "email": f"ann{n}@example.com",
                "phone": f"+1415555{n:04d}", "customFields": {"script": script}, **fields}
        answer = api.post("/api/v1/leads/submit", json=body, headers=tenant.headers if code != "OC01" else other.headers)
        assert answer.status_code == 201, answer.text
        return answer.json()["data"]["leadId"]

    def status_of(lead_id: str) -> str:
        return api.get(f"/api/v1/leads/{lead_id}").json()["data"]["status"]

    found = submit("BRW", 1, email="find.me@example.com")
    scripted = submit("BRW", 2, firstName="<script>alert(1)</script>")
    held = submit("HOLD", 3)
    failing = submit("BRW", 4, script="failure")
    theirs = submit("OC01", 5)
    wait_until(lambda: status_of(failing) == "failed", "the failing lead to fail")
    csv_file = tmp_path / "leads.csv"
    csv_file.write_text("firstName,lastName,email,phone\nCsv,One,csv1@example.com,+14155559001\n"
                        "Csv,Two,not-an-email,+14155559002\nCsv,Three,csv3@example.com,+14155559003\n")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=str(chromium), headless=True, args=ARGS,
            viewport={"width": 1280, "height": 900})
        dialogs: list[str] = []
        page = context.new_page()
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))

        def shot(name: str) -> None:
            page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

        # A new person chooses a password at the setup link an admin made; a wrong password is refused.
        made = api.post("/api/v1/users", json={"email": "desk@example.com", "name": "Desk", "role": "admin"})
        assert made.status_code == 201, made.text
        page.goto(server + urlsplit(made.json()["data"]["setupUrl"]).path)  # the link names the configured port
        page.get_by_label("New password").fill("a long browser passphrase")
        page.get_by_label("The same password again").fill("a long browser passphrase")
        page.get_by_role("button", name="Set password").click()
        expect(page).to_have_url(f"{server}/admin/sign-in?notice=password_set")
        shot("setup-done")
        page.goto(f"{server}/admin/")
        expect(page).to_have_url(f"{server}/admin/sign-in")
        page.get_by_label("Email").fill("desk@example.com")
        page.get_by_label("Password").fill("not the passphrase at all")
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("alert")).to_contain_text("do not match an active account")
        shot("sign-in-refused")
        page.get_by_label("Email").fill("desk@example.com")
        page.get_by_label("Password").fill("a long browser passphrase")
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name="Overview", exact=True)).to_be_visible()
        assert page.locator("svg[role=img]").count() == 1
        shot("overview")

        # On a phone's width nothing runs off the side of the page (wide tables scroll inside it).
        page.set_viewport_size({"width": 390, "height": 844})
        for path, name in (("/admin/", "phone-overview"), ("/admin/leads", "phone-leads"),
                           ("/admin/endpoints", "phone-endpoints")):
            page.goto(f"{server}{path}")
            assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"), name
            shot(name)
        page.set_viewport_size({"width": 1280, "height": 900})
        page.goto(f"{server}/admin/")

        # Find a lead by its email and open it.
        page.get_by_role("link", name="Leads", exact=True).click()
        page.get_by_label("Search").fill("Find.Me@example.com")
        page.get_by_role("button", name="Show leads").click()
        expect(page.locator("tbody tr")).to_have_count(1)
        shot("leads-search")
        page.get_by_role("link", name=found).click()
        expect(page.get_by_role("heading", level=1)).to_contain_text(found)
        wait_until(lambda: status_of(found) == "delivered", "the found lead's delivery")
        page.reload()
        expect(page.locator("table").first).to_contain_text("delivered")
        shot("lead")

        # A lead named <script>alert(1)</script> is text: no dialog.
        page.goto(f"{server}/admin/leads/{scripted}")
        expect(page.get_by_role("heading", level=1)).to_contain_text("<script>alert(1)</script>")
        page.goto(f"{server}/admin/leads?search=Lee2")
        expect(page.locator("tbody")).to_contain_text("<script>alert(1)</script>")
        assert dialogs == []

        # Approve the held lead from the review queue.
        page.get_by_role("link", name="Review queue").click()
        shot("review")
        page.get_by_role("button", name=f"Approve {held}").click()
        expect(page.get_by_role("status")).to_contain_text("approved")
        wait_until(lambda: status_of(held) == "delivered", "the approved lead's delivery")

        # Send the failed lead again (the buyer takes it this time).
        assert api.patch(f"/api/v1/leads/{failing}", json={"customFields": {"script": "success"}}).status_code == 200
        page.get_by_role("link", name="Failures").click()
        expect(page.locator("tbody")).to_contain_text(failing)
        shot("failures")
        page.get_by_role("button", name=f"Send {failing} again").click()
        expect(page.get_by_role("status")).to_contain_text("sent again")
        wait_until(lambda: status_of(failing) == "delivered", "the reposted lead's delivery")
        page.goto(f"{server}/admin/leads/{failing}")
        expect(page.get_by_role("heading", name="Submission 2")).to_be_visible()

        # Pause and resume an endpoint.
        page.get_by_role("link", name="Endpoints").click()
        page.get_by_label("Reason for pausing ep (optional)", exact=True).fill("buyer closed for the day")
        page.get_by_role("button", name="Pause ep", exact=True).click()
        expect(page.get_by_role("status")).to_contain_text("paused")
        assert [e for e in api.get("/api/v1/endpoints").json()["data"]["items"]
                if e["deliveryEndpointId"] == "ep"][0]["pausedReason"] == "buyer closed for the day"
        shot("endpoints-paused")
        page.get_by_role("button", name="Resume ep", exact=True).click()
        expect(page.get_by_role("button", name="Pause ep", exact=True)).to_be_visible()

        # Import a CSV file and watch the progress page until it is done.
        page.get_by_role("link", name="Import CSV").click()
        page.get_by_label("Campaign").select_option("BRW")
        page.get_by_label("CSV file").set_input_files(str(csv_file))
        shot("import")
        page.get_by_role("button", name="Start the import").click()
        expect(page.locator("#import-state")).to_have_text("Done.", timeout=20_000)
        expect(page.locator("#import-created")).to_have_text("2")
        expect(page.locator("tbody")).to_contain_text("email: must be a valid email address")
        shot("import-done")

        for name in ("webhooks", "reports"):
            page.get_by_role("link", name=name.capitalize()).click()
            expect(page.get_by_role("heading", level=1)).to_have_text(name.capitalize())
            shot(name)

        # Refusals: a form without its token, another tenant's lead.
        refused = context.request.post(f"{server}/admin/endpoints/ep/pause", form={"reason": "forged"})
        assert refused.status == 403 and "This form was refused" in refused.text()
        answer = page.goto(f"{server}/admin/leads/{theirs}")
        assert answer is not None and answer.status == 404
        expect(page.get_by_role("heading", level=1)).to_have_text("Not found")
        shot("not-found")

        # Sign out: the old cookie no longer opens a page.
        old = [c for c in context.cookies() if c["name"] == "console_session"]
        assert old and "a long browser passphrase" not in json.dumps(context.cookies())
        page.get_by_role("button", name="Sign out").click()
        expect(page).to_have_url(f"{server}/admin/sign-in")
        context.add_cookies(old)
        page.goto(f"{server}/admin/leads")
        expect(page).to_have_url(f"{server}/admin/sign-in")
        assert dialogs == []
        context.close()
    stale = httpx.get(f"{server}/admin/", cookies={"console_session": old[0]["value"]}, follow_redirects=False)
    assert stale.status_code == 303 and stale.headers["location"] == "/admin/sign-in"
    assert [e["state"] for e in api.get("/api/v1/endpoints").json()["data"]["items"]
            if e["deliveryEndpointId"] == "ep"] == ["active"]
