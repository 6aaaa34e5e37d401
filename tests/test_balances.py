"""Clients' balances (CONTRACT 9.4, issue 36 item 2): each sale debits its client and each
approved return and credit credits it, in the transaction of what caused it; a prepaid client
that cannot cover a sale (or a credit client past its limit) is skipped like a paused buyer, with
the reason `balance`, in every distribution method; a credit lets its waiting leads go;
statements carry the running balance; `client.low_balance` goes out once per crossing."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from standardwebhooks.webhooks import Webhook as Verifier

from tests.buyer_server import BuyerServer, wait_until
from tests.bundles import campaign
from tests.conftest import make_tenant
from tests.people import add_person, sign_in_as
from tests.submit_support import FakeClock, clock  # noqa: F401 (the clock fixture)
from tests.test_auctions import auctions, bidder, bundle as auction_bundle, reasons
from tests.test_auctions import config_file, live  # noqa: F401 (fixtures: buyers on loopback, the app running)
from tests.worker_helpers import endpoint, lead_body, lead_of, status_is, submit, wait_for

SALE = [{"leadStatus": "delivered", "amount": 10, "currency": "USD"}]


def client(client_id: str = "cli-1", **billing) -> dict:
    return {"clientId": client_id, "name": f"Client {client_id}", "billing": billing,
            "returnPolicy": {"maxPercent": 100, "autoApprove": True}}


def selling_to(runtime, *clients: dict, buyers: list[dict] | None = None, delivery: dict | None = None):
    """Campaign BL1 sells each lead for 10 USD to client cli-1, through `ep` unless `delivery` says."""
    return make_tenant(runtime, "T", {
        "clients": list(clients), "deliveryEndpoints": buyers or [endpoint("ep")],
        "campaigns": [campaign("BL1", "Billed", delivery={"revenueMilestones": SALE,
                                                           **(delivery or {"deliveryEndpointId": "ep"})})]})


def credit(live, tenant, amount, client_id: str = "cli-1", expect: int = 201, **extra) -> dict:
    answer = live.post(f"/api/v1/clients/{client_id}/credits", json={"amount": amount, **extra},
                       headers=tenant.headers)
    assert answer.status_code == expect, answer.text
    return answer.json()["data"] if expect == 201 else answer.json()["error"]


def statement(live, tenant, client_id: str = "cli-1", **query) -> dict:
    answer = live.get(f"/api/v1/clients/{client_id}/statement", params=query, headers=tenant.headers)
    assert answer.status_code == 200, answer.text
    return answer.json()["data"]


def lines(live, tenant, client_id: str = "cli-1") -> list[tuple[str, float, float]]:
    return [(line["kind"], line["amount"], line["balance"]) for line in statement(live, tenant, client_id)["lines"]]


def last_event(lead: dict) -> dict:
    return lead["submissions"][-1]["journeyEvents"][-1]


def test_a_prepaid_client_without_funds_waits_and_a_credit_lets_its_lead_go(live, runtime):
    tenant = selling_to(runtime, client(mode="prepaid"))
    lead_id = submit(live, tenant, lead_body("BL1"))["leadId"]
    waiting = wait_for(live, tenant, lead_id, status_is("queued"))
    event = last_event(waiting)
    assert event["type"] == "balance" and "cannot cover the sale (balance)" in event["reason"]
    assert lines(live, tenant) == []

    line = credit(live, tenant, 15, note="wire 1042")
    assert (line["kind"], line["amount"], line["balance"], line["currency"], line["note"]) == (
        "credit", 15.0, 15.0, "USD", "wire 1042")
    wait_for(live, tenant, lead_id, status_is("delivered"))
    assert lines(live, tenant) == [("credit", 15.0, 15.0), ("sale", -10.0, 5.0)]
    sold = statement(live, tenant)["lines"][-1]
    assert sold["leadId"] == lead_id

    second = submit(live, tenant, lead_body("BL1"))["leadId"]
    wait_for(live, tenant, second, status_is("queued"))  # 5 USD left does not cover 10
    credit(live, tenant, 5)
    wait_for(live, tenant, second, status_is("delivered"))
    whole = statement(live, tenant)
    assert (whole["openingBalance"], whole["closingBalance"], whole["currency"]) == (0.0, 0.0, "USD")


def test_a_credit_client_buys_down_to_its_limit(live, runtime):
    tenant = selling_to(runtime, client(mode="credit", creditLimit=15))
    first = submit(live, tenant, lead_body("BL1"))["leadId"]
    wait_for(live, tenant, first, status_is("delivered"))
    second = submit(live, tenant, lead_body("BL1"))["leadId"]
    wait_for(live, tenant, second, status_is("queued"))  # -10 + 15 = 5 of room: not 10
    assert lines(live, tenant) == [("sale", -10.0, -10.0)]
    credit(live, tenant, 5)
    wait_for(live, tenant, second, status_is("delivered"))
    assert lines(live, tenant)[-1] == ("sale", -10.0, -15.0)


def test_a_client_with_billing_none_is_never_refused_but_its_sales_are_on_its_statement(live, runtime):
    tenant = selling_to(runtime, client())
    lead_id = submit(live, tenant, lead_body("BL1"))["leadId"]
    wait_for(live, tenant, lead_id, status_is("delivered"))
    assert lines(live, tenant) == [("sale", -10.0, -10.0)]


def test_an_approved_return_credits_the_balance_back(live, runtime):
    tenant = selling_to(runtime, client(mode="prepaid"))
    credit(live, tenant, 10)
    lead_id = submit(live, tenant, lead_body("BL1"))["leadId"]
    wait_for(live, tenant, lead_id, status_is("delivered"))
    answer = live.post(f"/api/v1/leads/{lead_id}/return-requests", json={"reason": "wrong number"},
                       headers=tenant.headers)
    assert answer.status_code == 201 and answer.json()["data"]["state"] == "approved", answer.text
    assert lines(live, tenant) == [("credit", 10.0, 10.0), ("sale", -10.0, 0.0), ("return", 10.0, 10.0)]


def test_the_endpoint_s_client_pays_not_the_campaign_s(live, runtime):
    tenant = selling_to(runtime, client("cli-1"), client("payer", mode="prepaid"),
                        buyers=[endpoint("ep", clientId="payer")])
    lead_id = submit(live, tenant, lead_body("BL1"))["leadId"]
    wait_for(live, tenant, lead_id, status_is("queued"))
    credit(live, tenant, 10, client_id="payer")
    wait_for(live, tenant, lead_id, status_is("delivered"))
    assert lines(live, tenant, "payer") == [("credit", 10.0, 10.0), ("sale", -10.0, 0.0)]
    assert lines(live, tenant, "cli-1") == []
    ledger = live.get("/api/v1/ledger", params={"leadId": lead_id, "kind": "revenue"}, headers=tenant.headers)
    assert [e["clientId"] for e in ledger.json()["data"]["items"]] == ["payer"]


def test_a_waterfall_skips_a_buyer_whose_client_cannot_pay(live, runtime):
    tenant = selling_to(runtime, client("broke", mode="prepaid"), client("flush", mode="prepaid"),
                        buyers=[endpoint("a", clientId="broke"), endpoint("b", clientId="flush")],
                        delivery={"distribution": {"endpoints": [{"deliveryEndpointId": "a"},
                                                                 {"deliveryEndpointId": "b"}]}})
    credit(live, tenant, 100, client_id="flush")
    lead = wait_for(live, tenant, submit(live, tenant, lead_body("BL1"))["leadId"], status_is("delivered"))
    assert lead["submissions"][-1]["responseFields"]["echo"] == "b"
    assert lines(live, tenant, "broke") == [] and lines(live, tenant, "flush")[-1] == ("sale", -10.0, 90.0)


def test_an_auction_does_not_ping_a_buyer_whose_client_cannot_pay_and_a_bid_must_be_covered(live, runtime):
    body = auction_bundle([bidder("poor", "30", clientId="poor"), bidder("rich", "20", clientId="rich"),
                           bidder("thin", "25", clientId="thin")])
    body["clients"] = [client("poor", mode="prepaid"), client("rich", mode="prepaid"), client("thin", mode="prepaid")]
    tenant = make_tenant(runtime, "T", body)
    credit(live, tenant, 50, client_id="rich")
    credit(live, tenant, 5, client_id="thin")  # enough to be pinged, not to pay its bid of 25
    lead_id = submit(live, tenant, lead_body("AU1"))["leadId"]
    lead = wait_for(live, tenant, lead_id, status_is("delivered", "failed"))
    assert lead["status"] == "delivered" and lead["submissions"][-1]["responseFields"]["echo"] == "rich"
    (round_,) = auctions(live, tenant, lead_id)["items"]
    assert reasons(round_)["poor"] == "balance"
    assert {b["deliveryEndpointId"]: b["outcome"] for b in round_["bids"]}["thin"] == "bid"
    assert round_["winners"] == ["rich"]
    assert lines(live, tenant, "rich") == [("credit", 50.0, 50.0), ("sale", -20.0, 30.0)]
    assert lines(live, tenant, "thin") == [("credit", 5.0, 5.0)]


def test_a_burst_of_sales_never_spends_more_than_the_prepaid_balance(live, runtime):
    # Each post takes 0.3 s, so the worker has every lead in flight at once: the holds, not
    # the order of the answers, decide which two the 25 USD pay for.
    tenant = selling_to(runtime, client(mode="prepaid"), buyers=[endpoint("ep", config={"answers": "sleep:0.3"})])
    credit(live, tenant, 25)
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda _: submit(live, tenant, lead_body("BL1"))["leadId"], range(8)))
    for lead_id in ids:
        wait_for(live, tenant, lead_id, status_is("delivered", "queued"))
    assert wait_until(lambda: [lead_of(live, tenant, i)["status"] for i in ids].count("delivered") == 2, 10)
    statuses = [lead_of(live, tenant, i)["status"] for i in ids]
    assert statuses.count("delivered") == 2 and statuses.count("queued") == 6, statuses
    assert [line[2] for line in lines(live, tenant)] == [25.0, 15.0, 5.0]


def test_crossing_the_low_balance_mark_is_sent_once_per_crossing(live, runtime):
    tenant = selling_to(runtime, client(mode="prepaid", lowBalance=15))
    with BuyerServer() as receiver:
        receiver.route("/hooks", status=204)
        hook = live.post("/api/v1/webhooks", json={"url": receiver.url("/hooks"), "events": ["client.low_balance"]},
                         headers=tenant.headers).json()["data"]
        credit(live, tenant, 40)
        for _ in range(3):  # 30 (above), 20 (above), 10 (crosses 15)
            wait_for(live, tenant, submit(live, tenant, lead_body("BL1"))["leadId"], status_is("delivered"))
        credit(live, tenant, 20)  # back up to 30: the next crossing is news again
        for _ in range(2):  # 20, 10 (crosses)
            wait_for(live, tenant, submit(live, tenant, lead_body("BL1"))["leadId"], status_is("delivered"))
        assert wait_until(lambda: len(receiver.requests_to("/hooks")) >= 2, 10)
        events = [Verifier(hook["secret"]).verify(r.body, dict(r.headers)) for r in receiver.requests_to("/hooks")]
    assert [e["type"] for e in events] == ["client.low_balance"] * 2
    data = events[0]["data"]
    assert (data["clientId"], data["balance"], data["billing"]["lowBalance"], data["available"]) == (
        "cli-1", 10.0, 15.0, 10.0)


def test_a_statement_between_dates_opens_and_closes_on_the_balances_around_them(live, runtime, clock):
    tenant = selling_to(runtime, client(mode="prepaid"))
    credit(live, tenant, 10)
    clock.advance(days=3)
    credit(live, tenant, 20)
    clock.advance(days=3)
    credit(live, tenant, 30)
    today = clock.now().date()
    middle = (today.fromordinal(today.toordinal() - 3)).isoformat()
    shown = statement(live, tenant, startDate=middle, endDate=middle)
    assert (shown["openingBalance"], shown["closingBalance"]) == (10.0, 30.0)
    assert [(line["kind"], line["amount"], line["balance"]) for line in shown["lines"]] == [("credit", 20.0, 30.0)]
    assert statement(live, tenant)["closingBalance"] == 60.0


def test_a_shared_sale_returned_gives_each_buyer_back_what_it_paid_and_bids_are_held(live, runtime):
    # b bids 20 and wins a share of every lead; its 25 USD cover one bid, not two.
    body = auction_bundle([bidder("a", "30", clientId="ca"), bidder("b", "20", clientId="cb")],
                          auction={"mode": "shared", "maxWinners": 2})
    body["clients"] = [client("ca", mode="prepaid"), client("cb", mode="prepaid")]
    tenant = make_tenant(runtime, "T", body)
    credit(live, tenant, 100, client_id="ca")
    credit(live, tenant, 25, client_id="cb")
    first = submit(live, tenant, lead_body("AU1"))["leadId"]
    wait_for(live, tenant, first, status_is("delivered"))
    assert wait_until(lambda: lines(live, tenant, "cb")[-1] == ("sale", -20.0, 5.0), 10)
    second = submit(live, tenant, lead_body("AU1"))["leadId"]
    wait_for(live, tenant, second, status_is("delivered"))
    assert wait_until(lambda: lines(live, tenant, "ca")[-1] == ("sale", -30.0, 40.0), 10)
    assert lines(live, tenant, "cb")[-1] == ("sale", -20.0, 5.0)  # never below what it had
    # Each buyer's portal page of a shared lead: no buyer's lead id (the last post's answer may be another's).
    sign_in_as(live, add_person(live, tenant, "buyer", clientId="cb"), expect_location="/portal")
    page = live.get(f"/portal/leads/{first}")
    assert page.status_code == 200 and first in page.text and "buyer-1" not in page.text
    live.cookies.clear()

    returned = live.post(f"/api/v1/leads/{first}/return", json={"reason": "wrong number"}, headers=tenant.headers)
    assert returned.status_code == 200, returned.text
    assert lines(live, tenant, "ca")[-1] == ("return", 30.0, 70.0)
    assert lines(live, tenant, "cb")[-1] == ("return", 20.0, 25.0)


def test_an_auction_whose_bidders_cannot_pay_their_bids_waits_for_money(live, runtime):
    body = auction_bundle([bidder("only", "40", clientId="thin")])
    body["clients"] = [client("thin", mode="prepaid")]
    tenant = make_tenant(runtime, "T", body)
    credit(live, tenant, 10, client_id="thin")  # pinged (it has money), but its bid of 40 is not covered
    lead_id = submit(live, tenant, lead_body("AU1"))["leadId"]
    waiting = wait_for(live, tenant, lead_id, status_is("queued", "failed"))
    event = last_event(waiting)
    assert waiting["status"] == "queued" and event["type"] == "balance", event
    assert "no buyer that bid can pay its bid" in event["reason"] and "thin" in event["reason"]
    credit(live, tenant, 40, client_id="thin")
    wait_for(live, tenant, lead_id, status_is("delivered"))
    assert lines(live, tenant, "thin")[-1] == ("sale", -40.0, 10.0)


def test_an_approved_return_or_a_higher_limit_lets_waiting_leads_go(live, runtime):
    tenant = selling_to(runtime, client(mode="prepaid"))
    credit(live, tenant, 10)
    sold = submit(live, tenant, lead_body("BL1"))["leadId"]
    wait_for(live, tenant, sold, status_is("delivered"))
    waiting = submit(live, tenant, lead_body("BL1"))["leadId"]
    wait_for(live, tenant, waiting, status_is("queued"))
    live.post(f"/api/v1/leads/{sold}/return", json={"reason": "wrong number"}, headers=tenant.headers)
    wait_for(live, tenant, waiting, status_is("delivered"))  # the return's 10 USD paid for it
    third = submit(live, tenant, lead_body("BL1"))["leadId"]
    wait_for(live, tenant, third, status_is("queued"))
    changed = live.patch("/api/v1/clients/cli-1", json={"billing": {"mode": "credit", "creditLimit": 50}},
                         headers=tenant.headers)
    assert changed.status_code == 200, changed.text
    wait_for(live, tenant, third, status_is("delivered"))


@pytest.mark.parametrize("body, field", [
    ({"amount": -5}, "amount"), ({"amount": 0}, "amount"), ({"amount": "ten"}, "amount"), ({}, "amount"),
    ({"amount": 10, "note": "x" * 501}, "note"), ({"amount": 2_000_000_000}, "amount")])
def test_a_bad_credit_is_refused_naming_the_field_and_changes_nothing(live, runtime, body, field):
    tenant = selling_to(runtime, client(mode="prepaid"))
    answer = live.post("/api/v1/clients/cli-1/credits", json=body, headers=tenant.headers)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "VALIDATION_ERROR" and any(d.startswith(field) for d in error["details"]), error
    assert lines(live, tenant) == []


@pytest.mark.parametrize("query", [{"endDate": "0001-01-01"}, {"endDate": "9999-12-31"},
                                   {"startDate": "0001-01-01", "endDate": "9999-12-31"}, {"startDate": "2999-01-01"}])
def test_a_statement_at_the_ends_of_time_answers(live, runtime, query):
    tenant = selling_to(runtime, client(mode="prepaid"))
    credit(live, tenant, 10)
    shown = statement(live, tenant, **query)
    assert shown["closingBalance"] == (0.0 if query.get("endDate") == "0001-01-01" else 10.0)
    if "startDate" in query and "endDate" not in query:  # from a day still to come: nothing yet
        assert shown["lines"] == [] and shown["openingBalance"] == 10.0
    sign_in_as(live, add_person(live, tenant, "buyer", clientId="cli-1"), expect_location="/portal")
    page = live.get("/portal/statement", params=query)
    assert page.status_code == 200, page.text[:300]


def test_an_unknown_client_s_credit_or_statement_is_not_found(live, runtime):
    tenant = selling_to(runtime, client(mode="prepaid"))
    assert credit(live, tenant, 10, client_id="nobody", expect=404)["code"] == "NOT_FOUND"
    assert live.get("/api/v1/clients/nobody/statement", headers=tenant.headers).status_code == 404


@pytest.mark.parametrize("query, says", [
    ({"startDate": "yesterday"}, "startDate"), ({"endDate": "2026-13-01"}, "endDate"),
    ({"startDate": "2026-03-10", "endDate": "2026-03-01"}, "endDate: must not be before startDate")])
def test_a_bad_statement_range_is_refused_naming_the_field(live, runtime, query, says):
    tenant = selling_to(runtime, client(mode="prepaid"))
    answer = live.get("/api/v1/clients/cli-1/statement", params=query, headers=tenant.headers)
    assert answer.status_code == 400 and any(says in d for d in answer.json()["error"]["details"]), answer.text


def test_the_console_shows_balances_and_statements_and_a_manager_adds_funds(live, runtime):
    tenant = selling_to(runtime, client(mode="prepaid", lowBalance=50), client("cli-2", mode="credit", creditLimit=100))
    credit(live, tenant, 40, note="opening wire")
    viewer = sign_in_as(live, add_person(live, tenant, "viewer"))
    listed = live.get("/admin/clients")
    assert listed.status_code == 200
    assert "Client cli-1" in listed.text and "40.00 USD" in listed.text and "no limit" not in listed.text
    assert "100.00 USD" in listed.text  # cli-2 may buy on its credit
    page = live.get("/admin/clients/cli-1")
    assert page.status_code == 200 and "opening wire" in page.text and "Add credit" not in page.text
    assert live.post("/admin/clients/cli-1/credits", data={"csrf": viewer, "amount": "5"}).status_code == 403
    assert live.get("/admin/clients/nobody").status_code == 404

    live.cookies.clear()
    token = sign_in_as(live, add_person(live, tenant, "manager"))
    page = live.get("/admin/clients/cli-1")
    assert "Add credit" in page.text
    refused = live.post("/admin/clients/cli-1/credits", data={"csrf": token, "amount": "-3"}, follow_redirects=False)
    assert refused.status_code == 400 and "amount" in refused.text
    done = live.post("/admin/clients/cli-1/credits", data={"csrf": token, "amount": "12.5", "note": "top-up"},
                     follow_redirects=False)
    assert done.status_code == 303
    assert lines(live, tenant)[-1] == ("credit", 12.5, 52.5)
    shown = live.get(done.headers["location"])
    assert "The credit was added" in shown.text and "top-up" in shown.text and "52.50" in shown.text
    audited = live.get("/api/v1/audit", params={"action": "client.credit"}, headers=tenant.headers).json()
    assert [e["actor"].split(":")[0] for e in audited["data"]["items"]] == ["user", "key"]
