"""The portal in a real browser: the system's Chromium driven by Playwright against a real server
(uvicorn, the background loops running, the scripted delivery adapter in the plugin folder). A
buyer signs in at the form, finds its lead, downloads the CSV export and files a return request;
a supplier signs in and sees its lead's status and its source's posting spec. Screenshots go to
test-artifacts/portal/ (git-ignored).

Without /usr/bin/chromium the test is skipped, except in CI (CI=true), where it fails."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import httpx

from tests.conftest import make_tenant
from tests.submit_support import source_key
from tests.test_console_browser import ARGS, chromium, server, wait_until  # noqa: F401 (fixtures)
from tests.test_portal import JONES, PRICE, SMITH, agency_bundle
from tests.worker_helpers import lead_body

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "portal"
PASSWORD = "a long browser passphrase"


def test_portal_in_chromium(chromium, server, runtime, tmp_path):  # noqa: F811 (fixtures)
    from playwright.sync_api import expect, sync_playwright

    tenant = make_tenant(runtime, "Acme Leads", agency_bundle())
    api = httpx.Client(base_url=server, headers=tenant.headers, timeout=10)
    web = {"X-API-Key": source_key(runtime, tenant, "web")}

    def submit(body: dict) -> str:
        answer = api.post("/api/v1/leads/submit", json=body, headers=web)
        assert answer.status_code == 201, answer.text
        return answer.json()["data"]["leadId"]

    def status_of(lead_id: str) -> str:
        return api.get(f"/api/v1/leads/{lead_id}").json()["data"]["status"]

    sold = submit(lead_body("SL1", email="browser.buyer@example.com"))
    wait_until(lambda: status_of(sold) == "delivered", "the lead's delivery")

    def person(email: str, role: str, **party: str) -> str:
        made = api.post("/api/v1/users", json={"email": email, "name": role, "role": role, **party})
        assert made.status_code == 201, made.text
        return urlsplit(made.json()["data"]["setupUrl"]).path

    buyer_setup = person("buyer@smith.example.com", "buyer", clientId=SMITH[0])
    supplier_setup = person("sup@a.example.com", "supplier", supplierId="SUP-A")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium), headless=True, args=ARGS)
        dialogs: list[str] = []

        def signed_in(setup_path: str, email: str):
            context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
            page = context.new_page()
            page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
            page.goto(server + setup_path)
            page.get_by_label("New password").fill(PASSWORD)
            page.get_by_label("The same password again").fill(PASSWORD)
            page.get_by_role("button", name="Set password").click()
            page.get_by_label("Email").fill(email)
            page.get_by_label("Password").fill(PASSWORD)
            page.get_by_role("button", name="Sign in").click()
            expect(page).to_have_url(f"{server}/portal")
            return context, page

        def shot(page, name: str) -> None:
            page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

        # A buyer: its lead in the list, found by email, opened; the CSV downloaded; a return requested.
        context, page = signed_in(buyer_setup, "buyer@smith.example.com")
        expect(page.get_by_role("heading", name="Your leads")).to_be_visible()
        expect(page.locator("tbody")).to_contain_text(sold)
        expect(page.locator("tbody")).to_contain_text(f"{PRICE:.2f} USD")
        shot(page, "buyer-leads")
        page.get_by_label("Search").fill("browser.buyer@example.com")
        page.get_by_role("button", name="Search").click()
        expect(page.locator("tbody tr")).to_have_count(1)
        with page.expect_download() as download:
            page.get_by_role("link", name="Export all as CSV").click()
        saved = tmp_path / "leads.csv"
        download.value.save_as(saved)
        lines = saved.read_text().splitlines()
        assert lines[0].startswith("leadId,soldAt,price") and len(lines) == 2 and lines[1].startswith(sold)
        page.get_by_role("link", name=sold).click()
        expect(page.get_by_role("heading", level=1)).to_contain_text(sold)
        expect(page.locator("main")).to_contain_text("browser.buyer@example.com")
        shot(page, "buyer-lead")
        page.get_by_label("Why do you return it?").fill("wrong number")
        page.get_by_role("button", name="Request a return").click()
        expect(page.get_by_role("status")).to_contain_text("Your return request was sent")
        expect(page.locator("main")).to_contain_text("waits for the agency")
        shot(page, "buyer-return-requested")
        requests = api.get("/api/v1/return-requests").json()["data"]["items"]
        assert [(r["leadId"], r["clientId"], r["state"]) for r in requests] == [(sold, SMITH[0], "pending")]
        page.get_by_role("link", name="Statement").click()
        expect(page.locator("main")).to_contain_text(f"-{PRICE:.2f} USD")
        shot(page, "buyer-statement")
        page.get_by_role("button", name="Sign out").click()
        expect(page).to_have_url(f"{server}/admin/sign-in")
        context.close()

        # A supplier: its lead's status and reason, never the buyer; its source's posting spec.
        context, page = signed_in(supplier_setup, "sup@a.example.com")
        expect(page.locator("tbody")).to_contain_text(sold)
        expect(page.locator("tbody")).to_contain_text("Accepted and sold.")
        shot(page, "supplier-leads")
        page.get_by_role("link", name=sold).click()
        expect(page.locator("main")).to_contain_text("delivered")
        page.get_by_role("link", name="Sources").click()
        expect(page.get_by_role("heading", level=2)).to_contain_text("Web form")
        expect(page.locator("main")).to_contain_text("/api/v1/leads/submit")
        expect(page.locator("main")).to_contain_text("curl")
        shot(page, "supplier-sources")
        for path in ("/portal", f"/portal/leads/{sold}", "/portal/payouts", "/portal/acceptance", "/portal/sources"):
            page.goto(server + path)
            text = page.locator("body").inner_text()
            for secret in (*SMITH, *JONES, f"{PRICE:.2f}"):
                assert secret not in text, (path, secret)
        refused = page.goto(f"{server}/portal/statement")
        assert refused is not None and refused.status == 403
        context.close()
        browser.close()
    assert dialogs == []
