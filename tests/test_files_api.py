"""File references through HTTP: upsert by (leadId, fileKey) with
201 on insert and 200 on update keeping the fileId, every field rule, reads and tenants."""

from __future__ import annotations

import pytest

URL = "https://files.example.com/docs/retainer.pdf"


def submit(client, tenant, n: int = 1, campaign: str = "AC01") -> str:
    response = client.post("/api/v1/leads/submit", headers=tenant.headers, json={
        "campaignId": campaign, "firstName": "Jan", "lastName": "Doe", "email": f"jan{n}@example.com",
        "phone": f"+1415555{n:04d}"})
    assert response.status_code == 201, response.text
    return response.json()["data"]["leadId"]


def file_body(lead_id: str, **extra) -> dict:
    return {"leadId": lead_id, "fileKey": "retainer_agreement", "fileName": "Retainer.pdf", "fileType": "pdf",
            "documentUrl": URL, **extra}


def post_file(client, tenant, body):
    return client.post("/api/v1/files", headers=tenant.headers, json=body)


def validation_details(response) -> list[str]:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "VALIDATION_ERROR" and error["message"] == "Invalid input data"
    return error["details"]


@pytest.fixture
def lead_id(client, tenant) -> str:
    return submit(client, tenant)


def test_insert_then_update_keeps_the_file_id(client, tenant, lead_id):
    created = post_file(client, tenant, file_body(lead_id, provider="esign_vendor", providerDocumentId="env-1",
                                                  signingUrl="https://sign.example.com/s/abc",
                                                  metadata={"envelope": {"id": "env-1"}}))
    assert created.status_code == 201, created.text
    first = created.json()["data"]
    assert first["fileId"].startswith("file_") and first["leadId"] == lead_id
    assert first["status"] == "pending"  # the default at creation
    assert first["provider"] == "esign_vendor" and first["providerDocumentId"] == "env-1"
    assert first["metadata"] == {"envelope": {"id": "env-1"}} and first["createdAt"] == first["updatedAt"]
    assert first["createdAt"].endswith("Z")

    updated = post_file(client, tenant, file_body(lead_id, fileName="Retainer (signed).pdf", status="signed",
                                                  signedAt="2026-03-10T15:04:05+01:00"))
    assert updated.status_code == 200, updated.text
    second = updated.json()["data"]
    assert second["fileId"] == first["fileId"] and second["createdAt"] == first["createdAt"]
    assert second["fileName"] == "Retainer (signed).pdf" and second["status"] == "signed"
    assert second["signedAt"] == "2026-03-10T14:04:05.000Z"
    # optional fields left out keep their stored values
    assert second["provider"] == "esign_vendor" and second["metadata"] == {"envelope": {"id": "env-1"}}

    # an update without status keeps the status (pending is the default at creation only)
    again = post_file(client, tenant, file_body(lead_id)).json()["data"]
    assert again["status"] == "signed" and again["fileId"] == first["fileId"]

    one = client.get(f"/api/v1/files/{lead_id}/retainer_agreement", headers=tenant.headers)
    assert one.status_code == 200 and one.json() == {"success": True, "data": again}


def test_list_files_of_a_lead(client, tenant, lead_id):
    empty = client.get(f"/api/v1/files/{lead_id}", headers=tenant.headers)
    assert empty.status_code == 200 and empty.json()["data"] == {"leadId": lead_id, "files": [], "count": 0}
    for key in ("id_front", "id_back", "w2_2025"):
        assert post_file(client, tenant, file_body(lead_id, fileKey=key, fileType=".PNG")).status_code == 201
    post_file(client, tenant, file_body(lead_id, fileKey="id_front", fileType="png", status="verified"))
    listed = client.get(f"/api/v1/files/{lead_id}", headers=tenant.headers).json()["data"]
    assert listed["leadId"] == lead_id and listed["count"] == 3
    assert [f["fileKey"] for f in listed["files"]] == ["id_front", "id_back", "w2_2025"]  # oldest first
    assert listed["files"][0]["status"] == "verified" and listed["files"][0]["fileType"] == "png"


def test_file_key_is_unique_per_lead(client, tenant, lead_id):
    other_lead = submit(client, tenant, 2)
    a = post_file(client, tenant, file_body(lead_id)).json()["data"]
    b = post_file(client, tenant, file_body(other_lead)).json()["data"]
    assert a["fileId"] != b["fileId"]


@pytest.mark.parametrize("change, field", [
    ({"fileKey": "Retainer-Agreement"}, "fileKey"),
    ({"fileKey": "retainer agreement"}, "fileKey"),
    ({"fileKey": ""}, "fileKey"),
    ({"fileName": ""}, "fileName"),
    ({"fileName": "   "}, "fileName"),
    ({"fileType": ""}, "fileType"),
    ({"fileType": "p df"}, "fileType"),
    ({"fileType": "application/pdf"}, "fileType"),
    ({"documentUrl": ""}, "documentUrl"),
    ({"documentUrl": "not a url"}, "documentUrl"),
    ({"documentUrl": "ftp://files.example.com/a.pdf"}, "documentUrl"),
    ({"documentUrl": "/relative/a.pdf"}, "documentUrl"),
    ({"documentUrl": "https://files.example.com:99999/a.pdf"}, "documentUrl"),
    ({"documentUrl": 42}, "documentUrl"),
    ({"signingUrl": "javascript:alert(1)"}, "signingUrl"),
    ({"provider": "dropbox"}, "provider"),
    ({"status": "done"}, "status"),
    ({"status": "PENDING"}, "status"),
    ({"signedAt": "yesterday"}, "signedAt"),
    ({"signedAt": "2026-02-30"}, "signedAt"),
    ({"metadata": "x"}, "metadata"),
    ({"metadata": [1]}, "metadata"),
    ({"providerDocumentId": 7}, "providerDocumentId"),
    ({"leadId": ""}, "leadId"),
    ({"leadId": "lead_01JD0000000000000000000000"}, "leadId"),
    ({"color": "red"}, "color"),
])
def test_every_bad_field_is_named(client, tenant, lead_id, change, field):
    details = validation_details(post_file(client, tenant, {**file_body(lead_id), **change}))
    assert any(d.startswith(f"{field}: ") for d in details), details


@pytest.mark.parametrize("missing", ["leadId", "fileKey", "fileName", "fileType", "documentUrl"])
def test_required_fields(client, tenant, lead_id, missing):
    body = file_body(lead_id)
    del body[missing]
    assert validation_details(post_file(client, tenant, body)) == [f"{missing}: required field missing"]


def test_every_problem_of_the_checked_fields_is_reported_at_once(client, tenant, lead_id):
    details = validation_details(post_file(client, tenant, file_body(
        lead_id, fileType="p df", documentUrl="nope", signingUrl="nope", signedAt="nope")))
    assert [d.split(":")[0] for d in details] == ["fileType", "documentUrl", "signingUrl", "signedAt"]


def test_every_status_and_provider_value_is_accepted(client, tenant, lead_id):
    for status in ("pending", "uploaded", "viewed", "in_progress", "signed", "verified", "expired", "declined",
                   "failed"):
        assert post_file(client, tenant, file_body(lead_id, status=status)).json()["data"]["status"] == status
    for provider in ("esign_vendor", "manual_upload", "system_generated", "csv_import"):
        assert post_file(client, tenant, file_body(lead_id, provider=provider)).json()["data"]["provider"] == provider
    assert post_file(client, tenant, file_body(lead_id, signedAt="2026-03-10")).json()["data"]["signedAt"] == \
        "2026-03-10T00:00:00.000Z"


def test_other_tenants_and_unknown_resources(client, tenant, other_tenant, lead_id):
    assert post_file(client, tenant, file_body(lead_id)).status_code == 201
    # another tenant cannot write, read or list this lead's files
    assert validation_details(post_file(client, other_tenant, file_body(lead_id))) == ["leadId: unknown lead"]
    for path in (f"/api/v1/files/{lead_id}/retainer_agreement", f"/api/v1/files/{lead_id}"):
        response = client.get(path, headers=other_tenant.headers)
        assert response.status_code == 404, response.text
        assert response.json()["error"] == {"code": "NOT_FOUND", "message": "Resource not found"}
    assert client.get(f"/api/v1/files/{lead_id}/no_such_key", headers=tenant.headers).status_code == 404
    assert client.get("/api/v1/files/lead_01JD0000000000000000000000", headers=tenant.headers).status_code == 404
    assert client.get(f"/api/v1/files/{lead_id}").status_code == 401
    assert client.post("/api/v1/files", json=file_body(lead_id)).status_code == 401
