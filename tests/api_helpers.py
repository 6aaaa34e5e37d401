"""What the API tests share (this module holds no tests): assertions on the response envelope,
the documented routes, a submitted lead to work on, and the samples of a /metrics answer."""

from __future__ import annotations

from litestar.routes import HTTPRoute
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import person

SUBMIT = "/api/v1/leads/submit"


def data(response) -> dict:
    body = response.json()
    assert response.status_code == 200 and body["success"] is True, body
    return body["data"]


def validation_error(response, field: str) -> list[str]:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "VALIDATION_ERROR" and error["message"] == "Invalid input data"
    assert any(d.startswith(f"{field}: ") for d in error["details"]), error["details"]
    return error["details"]


def routes_of(app) -> list[tuple[str, str]]:
    """(method, path format) of every documented route that needs a key."""
    found = []
    for route in app.routes:
        # The admin console (/admin) is not the API: it signs in with a session cookie, not a key
        # (tests/test_console.py covers its refusals).
        if not isinstance(route, HTTPRoute) or route.path_format.startswith("/admin"):
            continue
        for handler in route.route_handlers:
            if handler.opt.get("public") or not handler.resolve_include_in_schema():
                continue
            found += [(method, route.path_format) for method in handler.http_methods]
    return sorted(found)


def fill(path: str, **ids: str) -> str:
    for name, value in ids.items():
        path = path.replace("{" + name + "}", value)
    return path.replace("{", "").replace("}", "")  # any other parameter: its own name as a value


def submit(client, tenant, code: str, n: int) -> str:
    answer = client.post(SUBMIT, json={"campaignId": code, **person(n)}, headers=tenant.headers)
    assert answer.status_code == 201, answer.text
    return answer.json()["data"]["leadId"]


def submission_of(client, tenant, lead_id: str) -> str:
    return client.get(f"/api/v1/leads/{lead_id}", headers=tenant.headers).json()["data"]["submissions"][0][
        "submissionId"]


FILE = {"fileKey": "license", "fileName": "license.pdf", "fileType": "pdf",
        "documentUrl": "https://files.example.com/license.pdf"}


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """A /metrics answer as {(sample name, sorted labels): value}."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}
