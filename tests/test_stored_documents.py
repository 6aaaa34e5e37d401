"""Leads and submissions read back exactly as submitted and decided, whatever form their rows
hold: the compact form written now (storage/packed.py), the whole-record JSON that earlier
versions wrote (an upgraded install), and JSON for records MessagePack cannot carry."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.domain.lead import (
    AlternativeCampaign, JourneyEvent, LeadRecord, QualificationOutcome, QuestionAnswer, RoutingOutcome, Submission,
)
from appliance.model import Model
from appliance.storage.leads import _LEADS, _SUBMISSIONS
from appliance.storage.packed import PackedDocs
from tests.api_helpers import data
from tests.engine import engine

FULL_LEAD = {
    "campaignId": "AC01", "firstName": "Ada", "lastName": "Lovelace", "email": "ada@example.com",
    "phone": "(415) 555-0101", "address": {"street": "1 Analytical Way", "city": "London", "state": "CA",
                                            "zip": "94105"},
    "dateOfBirth": "1980-12-10", "country": "US", "timezone": "America/Los_Angeles",
    "questionnaire": {"injured": "yes"}, "attribution": {"utm_source": "google", "gclid": "abc"},
    "compliance": {"tcpaConsent": True, "ip_address": "203.0.113.9"}, "isTest": True, "notes": "call after 5",
    "customFields": {"score": 7.25, "tags": ["a", "b"], "nested": {"on": False, "none": None}, "count": 0},
}


def submit(client, tenant, body: dict) -> dict:
    response = client.post("/api/v1/leads/submit", headers=tenant.headers, json=body)
    assert response.status_code == 201, response.text
    return response.json()["data"]


def read(client, tenant, lead_id: str) -> dict:
    return data(client.get(f"/api/v1/leads/{lead_id}", headers=tenant.headers))


def listed(client, tenant) -> list[dict]:
    return data(client.get("/api/v1/leads", headers=tenant.headers))["leads"]


def test_every_field_reads_back_as_submitted(client, tenant):
    made = submit(client, tenant, FULL_LEAD)
    lead = read(client, tenant, made["leadId"])
    for name, value in FULL_LEAD.items():
        if name not in ("phone", "questionnaire", "campaignId"):
            assert lead[name] == value, name
    assert lead["isTest"] is True  # a boolean, not the column's 1
    assert lead["phone"] == "(415) 555-0101" and lead["phoneE164"] == "+14155550101"
    assert lead["questionnaire"] == [{"key": "injured", "question": "Were you injured?", "answer": "yes"}]
    assert (lead["leadId"], lead["status"], lead["campaignId"]) == (made["leadId"], made["status"], "AC01")
    assert lead["clientId"] == "cli-1" and lead["sourceId"] is None and lead["approval"] is None
    assert lead["submissionCount"] == 1 and lead["createdAt"] == lead["updatedAt"]
    assert lead["files"] == []
    (submission,) = lead.pop("submissions")
    assert submission == data(client.get(f"/api/v1/submissions/{made['submissionId']}", headers=tenant.headers))
    assert (submission["submissionId"], submission["leadId"], submission["submissionNumber"]) == \
        (made["submissionId"], made["leadId"], 1)
    assert submission["status"] == made["status"] and submission["flowType"] == "standard"
    assert submission["campaign"]["campaignId"] == "AC01" and submission["qualification"]["passed"] is True
    # fields left at their defaults come back too, as null or empty
    assert submission["posting"] is None and submission["responseFields"] == {}
    assert [event["type"] for event in submission["journeyEvents"]][0] == "received"
    assert listed(client, tenant) == [lead]


def test_integers_beyond_64_bits_are_kept(client, tenant):
    huge = 123456789012345678901234567890
    made = submit(client, tenant, {**FULL_LEAD, "customFields": {"account": huge, "small": -(2 ** 70)}})
    lead = read(client, tenant, made["leadId"])
    assert lead["customFields"] == {"account": huge, "small": -(2 ** 70)}
    assert listed(client, tenant)[0]["customFields"]["account"] == huge
    again = submit(client, tenant, {"campaignId": "AC01", "leadId": made["leadId"], "notes": "resent"})
    lead = read(client, tenant, again["leadId"])
    assert lead["customFields"]["account"] == huge and lead["notes"] == "resent"


def test_rows_written_by_earlier_versions_read_the_same(client, tenant, runtime):
    made = submit(client, tenant, FULL_LEAD)
    before = read(client, tenant, made["leadId"])
    submissions = before.pop("submissions")

    def as_earlier_versions_stored(conn):  # the whole record as JSON, as the API returns it
        conn.execute("UPDATE leads SET doc = ? WHERE lead_id = ?", (msgspec.json.encode(before), made["leadId"]))
        for submission in submissions:
            conn.execute("UPDATE submissions SET doc = ? WHERE submission_id = ?",
                         (msgspec.json.encode(submission), submission["submissionId"]))

    engine(runtime.store).write_sync(as_earlier_versions_stored)
    assert read(client, tenant, made["leadId"]) == {**before, "submissions": submissions}
    assert listed(client, tenant) == [before]
    # and such a lead is updated like any other: a resubmission merges into what was stored
    again = submit(client, tenant, {"campaignId": "AC01", "leadId": made["leadId"], "notes": "second"})
    after = read(client, tenant, again["leadId"])
    assert after["notes"] == "second" and after["submissionCount"] == 2
    assert after["customFields"] == FULL_LEAD["customFields"] and after["isTest"] is True
    assert after["submissions"][0] == submissions[0]


class _Thing(Model):
    """Keyword-only like every record: a required field may follow one with a default."""

    thing_id: str
    note: str | None = None
    tags: list[str] = []
    made_at: str
    done: bool = False


def test_a_record_type_with_required_fields_after_defaults_packs_and_unpacks():
    docs = PackedDocs(_Thing, ("thing_id", "done"))
    thing = _Thing(thing_id="t1", note=None, tags=["a"], made_at="2026-11-21T00:00:00.000Z", done=True)
    packed = docs.pack(thing)
    assert b"t1" not in packed and b"note" not in packed  # columns and defaults stay out
    assert docs.unpack(("t1", 1, packed)) == thing
    assert docs.json_of(("t1", 1, packed)) == msgspec.json.encode(thing)
    assert docs.unpack(("t1", 1, msgspec.json.encode(thing))) == thing  # a row of an earlier version


# ---- any record reads back as it was written (property tests of the stored form) --------------

_JSON_SCALARS = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                 | st.text(max_size=12))
_JSON = st.recursive(_JSON_SCALARS, lambda children: st.lists(children, max_size=3)
                     | st.dictionaries(st.text(max_size=6), children, max_size=3), max_leaves=8)
_OBJECT = st.dictionaries(st.text(max_size=6), _JSON, max_size=4)
_NUMBER = st.none() | st.integers(-2 ** 63, 2 ** 63) | st.floats(allow_nan=False, allow_infinity=False)


def _record(record_type, **given):
    """Every field drawn (from its type unless given), not only the required ones."""
    fields = {field.name: given.get(field.name, ...) for field in msgspec.structs.fields(record_type)}
    return st.builds(record_type, **fields)


_LEADS_DRAWN = _record(
    LeadRecord, files=st.lists(_OBJECT, max_size=2), attribution=_OBJECT, compliance=_OBJECT, custom_fields=_OBJECT,
    verification=_OBJECT, questionnaire=st.lists(_record(QuestionAnswer, answer=_JSON), max_size=3))
_SUBMISSIONS_DRAWN = _record(
    Submission, first_submission_actions=st.lists(_JSON, max_size=2),
    journey_events=st.lists(_record(JourneyEvent, type=_JSON, details=st.none() | _OBJECT), max_size=3),
    qualification=st.none() | _record(QualificationOutcome, score=_NUMBER),
    routing=st.none() | _record(RoutingOutcome, alternative_campaigns=st.lists(
        _record(AlternativeCampaign, priority=_NUMBER), max_size=2)))


def _row(docs: PackedDocs, record) -> tuple:
    """The row SQLite gives back: the columns (booleans as 0 or 1), then the document."""
    values = [getattr(record, name) for name in docs.columns]
    return (*[int(v) if isinstance(v, bool) else v for v in values], docs.pack(record))


@settings(max_examples=150, deadline=None)
@given(lead=_LEADS_DRAWN, submission=_SUBMISSIONS_DRAWN)
def test_any_lead_and_submission_read_back_exactly(lead, submission):
    for docs, record in ((_LEADS, lead), (_SUBMISSIONS, submission)):
        row = _row(docs, record)
        assert docs.unpack(row) == record
        assert docs.json_of(row) == msgspec.json.encode(record)  # what the API served before packing
