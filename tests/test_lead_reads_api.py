"""GET /api/v1/leads/{leadId}/messages (a lead's SMS messages) and GET /api/v1/activity (the
tenant's request log) through HTTP: shapes, newest first, cursor pages, limits, other tenants."""

from __future__ import annotations

import asyncio

from appliance.jobs.ticker import flush_activity
from appliance.services import tenancy
from tests.api_helpers import data, submit, validation_error


def send_sms(client, tenant, lead_id: str, text: str) -> str:
    # The provider is a closed local port here: 502, and the message is stored with status error.
    answer = client.post("/api/v1/sms/send", json={"leadId": lead_id, "message": text}, headers=tenant.headers)
    assert answer.status_code == 502, answer.text
    return next(d for d in answer.json()["error"]["details"] if "msg_" in d).split("msg_", 1)[1][:26]


def messages(client, tenant, lead_id: str, query: str = ""):
    return client.get(f"/api/v1/leads/{lead_id}/messages{query}", headers=tenant.headers)


def test_a_leads_messages_newest_first_in_pages(client, tenant):
    lead, other = submit(client, tenant, "AC01", 1), submit(client, tenant, "AC01", 2)
    for text in ("first", "second", "third"):
        send_sms(client, tenant, lead, text)
    send_sms(client, tenant, other, "not yours")
    first = data(messages(client, tenant, lead, "?limit=2"))
    assert [m["body"] for m in first["items"]] == ["third", "second"] and first["hasMore"] is True
    assert first["nextCursor"] == first["items"][-1]["messageId"]
    rest = data(messages(client, tenant, lead, f"?limit=2&cursor={first['nextCursor']}"))
    assert [m["body"] for m in rest["items"]] == ["first"]
    assert rest == {"items": rest["items"], "nextCursor": None, "hasMore": False}
    item = rest["items"][0]
    assert set(item) == {"messageId", "interactionId", "direction", "from", "to", "body", "status", "reason",
                         "provider", "providerId", "providerMessageId", "providerStatus", "segments", "encoding",
                         "createdAt", "updatedAt"}
    assert item["messageId"].startswith("msg_") and item["interactionId"].startswith("int_")
    assert (item["direction"], item["to"], item["status"], item["provider"]) == ("outbound", "+14155550001",
                                                                                "error", "twilio")
    assert len(data(messages(client, tenant, lead, "?limit=1000"))["items"]) == 3  # clamped to 100
    assert data(messages(client, tenant, other))["items"][0]["body"] == "not yours"


def test_a_lead_without_messages_has_an_empty_list(client, tenant):
    lead = submit(client, tenant, "AC01", 3)
    assert data(messages(client, tenant, lead)) == {"items": [], "nextCursor": None, "hasMore": False}


def test_messages_of_another_tenants_lead_are_not_found(client, tenant, other_tenant):
    theirs = submit(client, other_tenant, "OC01", 4)
    send_sms(client, other_tenant, theirs, "private")
    for lead_id in (theirs, "lead_NOPE"):
        answer = messages(client, tenant, lead_id)
        assert answer.status_code == 404 and answer.json()["error"]["message"] == "Resource not found"


def test_message_list_bad_queries(client, tenant):
    lead = submit(client, tenant, "AC01", 5)
    validation_error(messages(client, tenant, lead, "?limit=abc"), "limit")
    validation_error(messages(client, tenant, lead, "?limit=0"), "limit")
    validation_error(messages(client, tenant, lead, "?cursor=lead_X"), "cursor")


def activity(client, tenant, query: str = ""):
    return client.get(f"/api/v1/activity{query}", headers=tenant.headers)


def test_activity_is_the_tenants_request_log_newest_first(client, runtime, tenant, other_tenant):
    lead = submit(client, tenant, "AC01", 6)
    client.get(f"/api/v1/leads/{lead}", headers=tenant.headers)
    client.get("/api/v1/leads/lead_NOPE", headers=tenant.headers)
    second = tenancy.create_key(runtime, tenant.tenant_id, name="reporting")
    client.get("/api/v1/campaigns", headers={"X-API-Key": second.key})
    client.get("/api/v1/campaigns", headers=other_tenant.headers)
    asyncio.run(flush_activity(runtime))  # the ticker's job: the log is written in batches

    items = data(activity(client, tenant))["items"]
    assert [(i["keyName"], i["method"], i["route"], i["status"]) for i in items] == [
        ("reporting", "GET", "/api/v1/campaigns", 200),
        ("tests", "GET", "/api/v1/leads/{leadId}", 404),
        ("tests", "GET", "/api/v1/leads/{leadId}", 200),
        ("tests", "POST", "/api/v1/leads/submit", 201),
    ]
    assert set(items[0]) == {"keyName", "actor", "method", "route", "status", "durationMs", "createdAt", "requestId"}
    assert items[0]["actor"] == f"key:{second.key_id}" and items[1]["actor"] == f"key:{tenant.key_id}"
    assert all(i["durationMs"] >= 0 and i["createdAt"].endswith("Z") for i in items)
    theirs = data(activity(client, other_tenant))["items"]
    assert [(i["route"], i["status"]) for i in theirs] == [("/api/v1/campaigns", 200)]


def test_activity_pages_with_a_cursor(client, runtime, tenant):
    for _ in range(5):
        client.get("/api/v1/campaigns", headers=tenant.headers)
    asyncio.run(flush_activity(runtime))
    first = data(activity(client, tenant, "?limit=3"))
    assert len(first["items"]) == 3 and first["hasMore"] is True and first["nextCursor"]
    rest = data(activity(client, tenant, f"?limit=3&cursor={first['nextCursor']}"))
    assert len(rest["items"]) == 2 and rest["hasMore"] is False and rest["nextCursor"] is None
    everything = data(activity(client, tenant, "?limit=500"))["items"]  # clamped to 100
    assert [i["requestId"] for i in first["items"] + rest["items"]] == [i["requestId"] for i in everything[-5:]]


def test_activity_bad_queries(client, tenant):
    validation_error(activity(client, tenant, "?limit=abc"), "limit")
    validation_error(activity(client, tenant, "?cursor=abc"), "cursor")
    validation_error(activity(client, tenant, "?cursor=0"), "cursor")
