"""GET /api/v1/leads (filters, search, dates, cursor paging) and GET /api/v1/leads/{leadId},
through HTTP with leads made by the real submit endpoint."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from urllib.parse import quote

import pytest

from appliance.clock import iso
from tests.api_helpers import data, validation_error
from tests.bundles import standard_bundle
from tests.conftest import make_tenant
from tests.engine import engine

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"




def submit(client, tenant, n: int, *, first: str = "Jan", last: str | None = None, campaign: str = "AC01",
           email: str | None = None, **extra) -> dict:
    body = {"campaignId": campaign, "firstName": first, "lastName": last or f"Doe{n}",
            "email": email or f"lead{n}@example.com", "phone": f"+1415555{n:04d}", **extra}
    response = client.post("/api/v1/leads/submit", headers=tenant.headers, json=body)
    assert response.status_code == 201, response.text
    return response.json()["data"]


def listing(client, tenant, query: str = "") -> dict:
    return data(client.get(f"/api/v1/leads?{query}", headers=tenant.headers))


def ids(page: dict) -> list[str]:
    return [lead["leadId"] for lead in page["leads"]]


def id_ms(lead_id: str) -> int:
    value = 0
    for char in lead_id[5:15]:
        value = value * 32 + _ALPHABET.index(char)
    return value


@pytest.fixture
def wide_tenant(runtime):
    """The standard bundle with AC02 (client cli-2, offer off-2) active, and a field library entry."""
    bundle = standard_bundle()
    bundle["campaigns"][1]["active"] = True
    return make_tenant(runtime, "Wide", bundle)


# ---- listing, paging ---------------------------------------------------------------------------

def test_empty_listing(client, tenant):
    assert listing(client, tenant) == {"leads": [], "nextCursor": None, "hasMore": False}


def test_cursor_paging_over_30_leads_has_no_gaps_or_overlaps(client, tenant):
    made = [submit(client, tenant, n)["leadId"] for n in range(30)]
    first = listing(client, tenant)
    assert len(first["leads"]) == 25 and first["hasMore"] is True  # default limit
    assert first["nextCursor"] == first["leads"][-1]["leadId"]

    seen, cursor, pages = [], None, 0
    while True:
        page = listing(client, tenant, "limit=7" + (f"&cursor={cursor}" if cursor else ""))
        pages += 1
        seen += ids(page)
        if not page["hasMore"]:
            assert page["nextCursor"] is None
            break
        cursor = page["nextCursor"]
    assert pages == 5
    assert seen == list(reversed(made))  # newest first, each lead exactly once
    exact = listing(client, tenant, "limit=10&cursor=" + made[10])
    assert ids(exact) == list(reversed(made[:10])) and exact["hasMore"] is False


def test_list_items_are_lead_records(client, tenant):
    made = submit(client, tenant, 1, first="  ada ", last="LOVELACE", email="Ada@Example.com")
    (lead,) = listing(client, tenant)["leads"]
    assert lead["leadId"] == made["leadId"] and lead["status"] == made["status"]
    assert (lead["firstName"], lead["lastName"], lead["email"]) == ("Ada", "Lovelace", "ada@example.com")
    assert lead["phoneE164"] == "+14155550001" and lead["submissionCount"] == 1
    assert "submissions" not in lead
    assert {"campaignId", "clientId", "offerId", "approval", "createdAt", "updatedAt"} <= lead.keys()


def test_limit_is_clamped_to_100(client, tenant, runtime):
    for n in range(3):
        submit(client, tenant, n)
    page = listing(client, tenant, "limit=1000")
    assert len(page["leads"]) == 3 and page["hasMore"] is False
    assert len(listing(client, tenant, "limit=2")["leads"]) == 2


# ---- filters -----------------------------------------------------------------------------------

def test_campaign_client_offer_and_status_filters(client, wide_tenant):
    a1 = submit(client, wide_tenant, 1)["leadId"]
    b1 = submit(client, wide_tenant, 2, campaign="AC02")["leadId"]
    dup = submit(client, wide_tenant, 3, email="lead1@example.com")  # same email on AC01: duplicate
    assert dup["status"] == "duplicate"

    def only(query: str) -> set[str]:
        return set(ids(listing(client, wide_tenant, query)))

    everything = {a1, b1, dup["leadId"]}
    assert only("") == everything
    assert only("campaignIds=AC02") == {b1}
    assert only("campaignIds=AC01") == {a1, dup["leadId"]}
    assert only("campaignIds=AC02,%20AC01,") == everything
    assert only("campaignIds=NOPE") == set()
    assert only("clientIds=cli-2") == {b1}
    assert only("clientIds=cli-1,cli-2") == everything
    assert only("offerIds=off-1") == {a1, dup["leadId"]}
    assert only("offerIds=off-2,off-9") == {b1}
    assert only("status=duplicate") == {dup["leadId"]}
    assert only("status=qualified&campaignIds=AC02") == {b1}
    assert only("status=delivered") == set()
    assert only("campaignIds=") == everything  # empty means no filter


def test_several_ids_page_in_one_order(client, wide_tenant):
    made = [submit(client, wide_tenant, n, campaign=("AC01", "AC02")[n % 3 == 0])["leadId"] for n in range(9)]
    for query in ("campaignIds=AC02,AC01", "clientIds=cli-2,cli-1", "offerIds=off-1,off-2,off-3"):
        seen, cursor = [], None
        while True:
            page = listing(client, wide_tenant, f"{query}&limit=2" + (f"&cursor={cursor}" if cursor else ""))
            seen += ids(page)
            if not page["hasMore"]:
                break
            cursor = page["nextCursor"]
        assert seen == list(reversed(made)), query
    only_b = [m for n, m in enumerate(made) if n % 3 == 0]
    assert ids(listing(client, wide_tenant, "campaignIds=AC02,NOPE&clientIds=cli-2,cli-1")) == only_b[::-1]
    assert ids(listing(client, wide_tenant, "clientIds=cli-2,cli-9&status=qualified")) == only_b[::-1]


class _Plans:
    """A connection wrapper that records the query plan of every statement run through it."""

    def __init__(self, conn) -> None:
        self.conn, self.plans = conn, []

    def execute(self, sql, params=()):
        self.plans.append(" / ".join(row[3] for row in self.conn.execute("EXPLAIN QUERY PLAN " + sql, params)))
        return self.conn.execute(sql, params)


@pytest.mark.sqlite_only
@pytest.mark.parametrize(
    ("where", "expected"),
    [
        (dict(email="a@example.com"), "USING INDEX leads_by_email_hash"),
        (dict(phone_e164="+14155550001"), "USING INDEX leads_by_phone_hash"),
        (dict(email="a@example.com", status="failed"), "USING INDEX leads_by_email_hash"),
        (dict(lead_id="lead_x"), "sqlite_autoindex_leads_1"),
        (dict(campaign_ids=("A", "B")), "USING INDEX leads_by_campaign (tenant_id=? AND campaign_id=?)"),
        (dict(client_ids=("A", "B")), "USING INDEX leads_by_client (tenant_id=? AND client_id=?)"),
        (dict(offer_ids=("A",)), "USING INDEX leads_by_offer (tenant_id=? AND offer_id=?)"),
        (dict(), "USING INDEX leads_by_tenant (tenant_id=?)"),
        (dict(before_id="lead_x"), "USING INDEX leads_by_tenant (tenant_id=? AND lead_id<?)"),
    ],
)
def test_list_query_plans_need_no_statistics(runtime, tenant, where, expected):
    """A new database has no ANALYZE statistics: the hot list queries must still use their index."""
    from appliance.storage import LeadFilter
    from appliance.storage.leads import Leads

    conn = engine(runtime.store).reader()
    assert conn.execute("SELECT count(*) FROM sqlite_stat1 WHERE tbl = 'leads'").fetchone()[0] == 0
    spy = _Plans(conn)
    Leads(spy).lead_page(tenant.tenant_id, LeadFilter(**where), 26)
    assert expected in spy.plans[0] and "SCAN l" not in spy.plans[0], spy.plans


# ---- search ------------------------------------------------------------------------------------

@pytest.fixture
def people(client, tenant) -> dict[str, str]:
    made = {
        "jan": submit(client, tenant, 1, first="Jan", last="Kowalski", email="jan.k@example.com"),
        "janet": submit(client, tenant, 2, first="Janet", last="Doe", email="janet@example.org"),
        "jose": submit(client, tenant, 3, first="José", last="Núñez", email="jose@example.net"),
        "mary": submit(client, tenant, 4, first="Mary-Ann", last="O'Neil", email="mary@example.com"),
    }
    return {name: lead["leadId"] for name, lead in made.items()}


SEARCHES = [
        ("JANET@EXAMPLE.ORG", {"janet"}),       # email: exact after lowercasing
        (" janet@example.org ", {"janet"}),
        ("janet@example", set()),               # not a prefix match
        ("(415) 555-0003", {"jose"}),           # phone in national form, tenant default region US
        ("+1 415 555 0003", {"jose"}),
        ("4155550004", {"mary"}),
        ("415.555.0001", {"jan"}),
        ("555-0001", set()),                    # 7 digits: a phone search, matches no full number
        ("0000000000", set()),                  # not a possible number: matches nothing
        ("jan", {"jan", "janet"}),              # names: every word prefix-matched
        ("JAN", {"jan", "janet"}),
        ("jan kow", {"jan"}),
        ("kowalski jan", {"jan"}),
        ("doe", {"janet"}),
        ("jose", {"jose"}),                     # diacritics folded both ways
        ("Núñez", {"jose"}),
        ("mary ann", {"mary"}),
        ("o'neil", {"mary"}),
        ("smith", set()),
        ("12345", set()),                       # too few digits for a phone: a name search
]


def test_search_kinds(client, tenant, people):
    # One tenant for every case (a loop rather than parameters keeps the file fast).
    for search, expected in SEARCHES:
        found = set(ids(listing(client, tenant, "search=" + quote(search))))
        assert found == {people[name] for name in expected}, search


def test_search_by_lead_id(client, tenant, people):
    lead_id = people["mary"]
    assert ids(listing(client, tenant, f"search={lead_id}")) == [lead_id]
    assert ids(listing(client, tenant, f"search={lead_id.lower()}")) == [lead_id]
    assert ids(listing(client, tenant, f"search={lead_id[:-1]}")) == []


def test_search_text_is_never_fts_syntax(client, tenant, people):
    jan = {people["jan"], people["janet"]}
    for search, expected in [('jan" OR "doe', set()), ("NEAR(jan doe)", set()), ("jan*", jan), ("-jan", jan),
                             ("^jan", jan), ("jan AND", set()), ("jan OR mary", set()), ("kowalski:jan", {people["jan"]}),
                             ("{first} : jan", set()), ("jan)", jan)]:
        assert set(ids(listing(client, tenant, "search=" + quote(search)))) == expected, search
    for nothing in ("*", "(", '"', "%", "_", "!!!", "   ", "-"):  # no words: matches nothing, never an error
        assert ids(listing(client, tenant, "search=" + quote(nothing))) == (list(ids(listing(client, tenant)))
                                                                            if not nothing.strip() else []), nothing


def test_common_names_walk_the_leads_with_the_same_answers(client, tenant, people, monkeypatch):
    """Past NAME_JOIN_MAX matches the search walks the tenant's leads newest first instead of
    sorting every match: same leads, same order, same paging."""
    from appliance.storage import leads as lead_store

    queries = ["search=jan", "search=jan&limit=1", f"search=jan&limit=1&cursor={people['janet']}", "search=o",
               "search=do&status=qualified", "search=nobody"]
    joined = [listing(client, tenant, q) for q in queries]
    monkeypatch.setattr(lead_store, "NAME_JOIN_MAX", 1)
    assert [listing(client, tenant, q) for q in queries] == joined
    assert ids(joined[0]) == [people["janet"], people["jan"]] and ids(joined[2]) == [people["jan"]]


def test_search_combines_with_filters_and_paging(client, tenant, people):
    page = listing(client, tenant, "search=jan&limit=1")
    assert ids(page) == [people["janet"]] and page["hasMore"] is True
    rest = listing(client, tenant, f"search=jan&limit=1&cursor={page['nextCursor']}")
    assert ids(rest) == [people["jan"]] and rest["hasMore"] is False
    assert ids(listing(client, tenant, "search=jan&status=delivered")) == []


# ---- dates -------------------------------------------------------------------------------------

def test_date_bounds(client, tenant):
    early = [submit(client, tenant, n)["leadId"] for n in range(3)]
    time.sleep(0.005)
    late = [submit(client, tenant, n)["leadId"] for n in range(3, 6)]
    assert id_ms(early[-1]) < id_ms(late[0])

    def at(lead_id: str) -> str:
        return iso(datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=id_ms(lead_id)))

    def between(query: str) -> list[str]:
        return ids(listing(client, tenant, query))

    today = datetime.fromtimestamp(id_ms(early[0]) / 1000, timezone.utc).date()
    everything = list(reversed(early + late))
    assert between(f"startDate={today}") == everything
    assert between(f"endDate={today}") == everything  # a date runs through the end of its UTC day
    assert between(f"startDate={today}&endDate={today}") == everything
    assert between(f"startDate={today + timedelta(days=1)}") == []
    assert between(f"endDate={today - timedelta(days=1)}") == []
    assert between(f"endDate={quote(at(early[-1]))}") == list(reversed(early))   # inclusive to the ms
    assert between(f"startDate={quote(at(late[0]))}") == list(reversed(late))    # inclusive
    assert between(f"startDate={quote(at(late[0]))}&endDate={quote(at(late[0]))}")[-1] == late[0]
    # offsets and bare timestamps (UTC) are understood
    stamp = datetime.fromtimestamp(id_ms(late[0]) / 1000, timezone(timedelta(hours=-5)))
    assert between("startDate=" + quote(stamp.isoformat(timespec="milliseconds"))) == list(reversed(late))
    naive = datetime.fromtimestamp(id_ms(late[0]) / 1000, timezone.utc).replace(tzinfo=None)
    assert between("startDate=" + naive.isoformat(timespec="milliseconds")) == list(reversed(late))
    # with a cursor too
    assert between(f"startDate={today}&limit=2&cursor={late[1]}") == [late[0], early[2]]


# ---- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("limit=abc", "limit"),
        ("limit=0", "limit"),
        ("limit=-5", "limit"),
        ("limit=1.5", "limit"),
        ("status=bogus", "status"),
        ("status=QUALIFIED", "status"),
        ("startDate=yesterday", "startDate"),
        ("startDate=2026-02-30", "startDate"),
        ("startDate=2026-13-01", "startDate"),
        ("endDate=01/02/2026", "endDate"),
        ("endDate=2026-01-01T25:00:00Z", "endDate"),
        ("startDate=2026-02-01&endDate=2026-01-31", "endDate"),
        ("cursor=lead_01JD0000000000000000000000", "cursor"),
        ("cursor=garbage", "cursor"),
        ("search=" + "a" * 201, "search"),
        ("campaignIds=" + ",".join(f"C{i}" for i in range(101)), "campaignIds"),
    ],
)
def test_bad_query_is_validation_error(client, tenant, query, field):
    submit(client, tenant, 1)
    validation_error(client.get(f"/api/v1/leads?{query}", headers=tenant.headers), field)


def test_requires_a_key(client, tenant):
    for path in ("/api/v1/leads", "/api/v1/leads/lead_x"):
        response = client.get(path)
        assert response.status_code == 401 and response.json()["error"]["code"] == "UNAUTHORIZED"
        assert client.get(path, headers={"X-API-Key": "lsk_" + "x" * 40}).status_code == 401


# ---- tenant isolation --------------------------------------------------------------------------

def test_tenants_see_only_their_leads(client, tenant, other_tenant):
    mine = submit(client, tenant, 1, first="Shared", last="Name", email="same@example.com")
    theirs = submit(client, other_tenant, 1, first="Shared", last="Name", email="same@example.com",
                    campaign="OC01")
    assert theirs["status"] != "duplicate"  # dedupe is per tenant campaign
    for query in ("", "search=shared", "search=same@example.com", "search=4155550001",
                  f"search={theirs['leadId']}", "clientIds=cli-1"):
        assert theirs["leadId"] not in ids(listing(client, tenant, query)), query
    assert ids(listing(client, tenant, "search=shared")) == [mine["leadId"]]
    # the other tenant's lead id is no cursor here
    validation_error(client.get(f"/api/v1/leads?cursor={theirs['leadId']}", headers=tenant.headers), "cursor")
    # nor a lead to read
    response = client.get(f"/api/v1/leads/{theirs['leadId']}", headers=tenant.headers)
    assert response.status_code == 404
    assert response.json()["error"] == {"code": "NOT_FOUND", "message": "Resource not found"}


# ---- GET one -----------------------------------------------------------------------------------

def test_get_lead_with_submissions_in_order(client, tenant):
    made = submit(client, tenant, 1, notes="first")
    again = client.post("/api/v1/leads/submit", headers=tenant.headers,
                        json={"campaignId": "AC01", "leadId": made["leadId"], "notes": "second"})
    assert again.status_code == 201, again.text
    lead = data(client.get(f"/api/v1/leads/{made['leadId']}", headers=tenant.headers))
    assert lead["leadId"] == made["leadId"] and lead["notes"] == "second" and lead["submissionCount"] == 2
    assert [s["submissionId"] for s in lead["submissions"]] == [made["submissionId"],
                                                                again.json()["data"]["submissionId"]]
    assert [s["submissionNumber"] for s in lead["submissions"]] == [1, 2]
    first = lead["submissions"][0]
    assert first["leadId"] == made["leadId"] and first["campaign"]["campaignId"] == "AC01"
    assert first["journeyEvents"][0]["type"] == "received"
    # the list item is the same record without submissions
    (item,) = listing(client, tenant)["leads"]
    assert item == {k: v for k, v in lead.items() if k != "submissions"}


def test_get_unknown_lead_is_404(client, tenant):
    for lead_id in ("lead_01JD0000000000000000000000", "nope", "bulk2"):
        response = client.get(f"/api/v1/leads/{lead_id}", headers=tenant.headers)
        assert response.status_code == 404 and response.json()["error"]["code"] == "NOT_FOUND"


def test_openapi_lists_the_read_operations(client):
    doc = client.get("/schema/openapi.json").json()
    listing_op = doc["paths"]["/api/v1/leads"]["get"]
    assert listing_op["operationId"] == "listLeads"
    assert {p["name"] for p in listing_op["parameters"]} == {
        "cursor", "limit", "campaignIds", "clientIds", "offerIds", "status", "search", "startDate", "endDate"}
    page = listing_op["responses"]["200"]["content"]["application/json"]["schema"]["properties"]["data"]
    assert page == {"$ref": "#/components/schemas/LeadPage"}
    assert doc["paths"]["/api/v1/leads/{leadId}"]["get"]["operationId"] == "getLead"
    assert "404" in doc["paths"]["/api/v1/leads/{leadId}"]["get"]["responses"]
