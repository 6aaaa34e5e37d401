"""Assertions on the response envelope shared by the API tests (this module holds no tests)."""

from __future__ import annotations


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
