"""Limits against a real server (uvicorn on a free loopback port): the per-key rate limit, the
1 MiB body limit (with and without Content-Length), caps on array sizes, and hostile JSON (deep
nesting, huge documents) that must end in a bounded 400 or 413, never a 500 or a dead server."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import httpx
import msgspec
import pytest

from appliance.services import tenancy
from appliance.config import load_config
from appliance.runtime import Runtime, create_runtime
from tests.bundles import standard_bundle
from tests.conftest import make_tenant
from tests.servers import live_server, person, write_config
from tests.engine import engine

MIB = 1024 * 1024
SUBMIT = "/api/v1/leads/submit"


@pytest.fixture(scope="module")
def served(tmp_path_factory, module_backend_toml) -> Iterator[tuple[str, Runtime, object]]:
    tmp = tmp_path_factory.mktemp("limits")
    runtime = create_runtime(load_config(write_config(tmp, rate_limit=0, backend=module_backend_toml())))
    tenant = make_tenant(runtime, "Limits", standard_bundle())
    try:
        with live_server(runtime, background=False) as base:
            yield base, runtime, tenant
    finally:
        runtime.close()


def _post_raw(base: str, path: str, headers: dict[str, str], chunks, *, chunked: bool) -> tuple[int, dict, bytes]:
    """POST through a raw socket, so nothing in a client library shapes the framing. With
    `chunked`, no Content-Length is sent; the server may answer (and close) before the end."""
    host, port = base.removeprefix("http://").split(":")
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close",
             *(f"{k}: {v}" for k, v in headers.items())]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    else:
        lines.append(f"Content-Length: {sum(len(c) for c in chunks)}")
    sock = socket.create_connection((host, int(port)), timeout=20)
    try:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        with contextlib.suppress(OSError):  # the server may stop reading once it has refused
            for chunk in chunks:
                sock.sendall((f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n") if chunked else chunk)
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        received = b""
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            received += data
    finally:
        sock.close()
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parsed = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    if parsed.get("transfer-encoding") == "chunked":
        out, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            out, rest = out + rest[:size], rest[size + 2:]
        body = out
    return int(status_line.split()[1]), parsed, body


# ---- rate limit ---------------------------------------------------------------------------------

def test_rate_limit_is_per_key_with_retry_after_on_a_real_server(tmp_path, backend_toml):
    runtime = create_runtime(load_config(write_config(tmp_path, rate_limit=5, backend=backend_toml)))
    try:
        tenant_id = tenancy.create_tenant(runtime, "Limited")
        first = tenancy.create_key(runtime, tenant_id).key
        second = tenancy.create_key(runtime, tenant_id).key
        with live_server(runtime, background=False) as base, httpx.Client(base_url=base, timeout=10) as http:
            statuses = [http.get("/api/v1/campaigns", headers={"X-API-Key": first}).status_code for _ in range(7)]
            assert statuses == [200] * 5 + [429] * 2
            limited = http.post(SUBMIT, json={"campaignId": "x"}, headers={"X-API-Key": first})
            assert limited.status_code == 429
            assert limited.json() == {"success": False, "error": {
                "code": "RATE_LIMITED", "message": "Too many requests for this API key"}}
            assert 1 <= int(limited.headers["retry-after"]) <= 61
            assert limited.headers["x-request-id"]
            assert http.get("/api/v1/campaigns", headers={"X-API-Key": second}).status_code == 200
            # unauthenticated requests are refused before they count against anyone
            assert http.get("/api/v1/campaigns").status_code == 401
            assert http.get("/healthz").status_code == 200
    finally:
        runtime.close()


# ---- body size ----------------------------------------------------------------------------------

def _too_large(status: int, body: bytes) -> None:
    assert status == 413, (status, body[:300])
    assert body.startswith(b'{"success":false,"error":{"code":"PAYLOAD_TOO_LARGE"'), body[:300]


def test_body_over_one_mib_with_content_length_is_413(served):
    base, _, tenant = served
    body = b'{"campaignId":"AC01","notes":"' + b"x" * MIB + b'"}'
    status, headers, answer = _post_raw(base, SUBMIT, {**tenant.headers, "Content-Type": "application/json"},
                                        [body], chunked=False)
    _too_large(status, answer)
    assert headers.get("x-request-id")


def test_chunked_body_over_one_mib_without_content_length_is_413(served):
    base, runtime, tenant = served
    before = engine(runtime.store).reader().execute("SELECT count(*) FROM leads").fetchone()[0]
    chunks = [b'{"campaignId":"AC01","notes":"'] + [b"y" * 65536] * 20 + [b'"}']  # 1.25 MiB
    status, _, answer = _post_raw(base, SUBMIT, {**tenant.headers, "Content-Type": "application/json"},
                                  chunks, chunked=True)
    _too_large(status, answer)
    assert engine(runtime.store).reader().execute("SELECT count(*) FROM leads").fetchone()[0] == before


def test_large_body_of_another_type_is_415_not_413(served):
    base, _, tenant = served
    status, _, answer = _post_raw(base, SUBMIT, {**tenant.headers, "Content-Type": "text/plain"},
                                  [b"x" * (MIB + 10)], chunked=False)
    assert status == 415, answer[:300]
    assert answer.startswith(b'{"success":false,"error":{"code":"UNSUPPORTED_MEDIA_TYPE"')


def test_chunked_body_under_the_limit_is_accepted(served):
    base, _, tenant = served
    body = msgspec.json.encode({"campaignId": "AC01", **person(1), "notes": "z" * 9000})
    chunks = [body[i:i + 1000] for i in range(0, len(body), 1000)]
    status, _, answer = _post_raw(base, SUBMIT, {**tenant.headers, "Content-Type": "application/json"},
                                  chunks, chunked=True)
    assert status == 201, answer[:300]


def test_streamed_body_over_the_limit_through_httpx_is_413(served):
    base, _, tenant = served

    def stream():
        yield b'{"campaignId":"AC01","notes":"'
        for _ in range(40):
            yield b"w" * 32768
        yield b'"}'

    with httpx.Client(base_url=base, timeout=20) as http:
        response = http.post(SUBMIT, content=stream(), headers={**tenant.headers, "Content-Type": "application/json"})
    assert "content-length" not in response.request.headers
    _too_large(response.status_code, response.content)


# ---- array caps ---------------------------------------------------------------------------------

def _details(response: httpx.Response) -> list[str]:
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == "VALIDATION_ERROR"
    return error["details"]


def test_array_caps_are_validation_errors(served):
    base, _, tenant = served
    with httpx.Client(base_url=base, timeout=20, headers=tenant.headers) as http:
        ids = [f"lead_{n:026d}" for n in range(1001)]
        details = _details(http.patch("/api/v1/leads/bulk", json={"leadIds": ids, "updates": {"notes": "x"}}))
        assert any(d.startswith("leadIds") for d in details), details
        # exactly at the cap is allowed (unknown ids simply count as not found)
        ok = http.patch("/api/v1/leads/bulk", json={"leadIds": ids[:1000], "updates": {"notes": "x"}})
        assert ok.status_code == 200, ok.text[:300]
        assert ok.json()["data"]["modifiedCount"] == 0

        files = [{"name": f"f{n}.pdf"} for n in range(51)]
        details = _details(http.post(SUBMIT, json={"campaignId": "AC01", **person(2), "files": files}))
        assert any(d.startswith("files") for d in details), details

        entries = [{"key": f"k{n}", "question": f"q{n}?", "answer": "a"} for n in range(201)]
        details = _details(http.post(SUBMIT, json={"campaignId": "AC01", **person(3), "questionnaire": entries}))
        assert any(d.startswith("questionnaire") for d in details), details
        as_object = {f"k{n}": "a" for n in range(201)}
        details = _details(http.post(SUBMIT, json={"campaignId": "AC01", **person(4), "questionnaire": as_object}))
        assert any(d.startswith("questionnaire") for d in details), details

        events = [{"type": "note"} for _ in range(201)]
        details = _details(http.patch("/api/v1/submissions/sub_0", json={"journeyEvents": events}))
        assert any(d.startswith("journeyEvents") for d in details), details


# ---- hostile JSON -------------------------------------------------------------------------------

def _bounded(response: httpx.Response) -> None:
    assert response.status_code in (400, 413), (response.status_code, response.text[:300])
    assert response.json()["success"] is False


@pytest.mark.parametrize("depth", [1_000, 10_000, 400_000])
def test_deeply_nested_json_is_refused_not_crashing(served, depth):
    base, _, tenant = served
    with httpx.Client(base_url=base, timeout=30, headers={**tenant.headers, "Content-Type": "application/json"}) as http:
        for doc in (b"[" * depth + b"]" * depth,
                    b'{"campaignId":"AC01","customFields":{"a":' + b"[" * depth + b"]" * depth + b"}}",
                    b'{"campaignId":"AC01","questionnaire":' + b'{"a":' * depth + b"1" + b"}" * depth + b"}"):
            if len(doc) > MIB:
                doc = doc[:MIB + 10]
            _bounded(http.post(SUBMIT, content=doc))
            _bounded(http.patch("/api/v1/leads/bulk", content=doc))
        assert http.get("/healthz").status_code == 200


def test_huge_but_legal_sized_json_is_bounded(served):
    """Just under 1 MiB of many small values: decoded, refused by the type (or accepted), never
    a 500; the server stays up."""
    base, _, tenant = served
    many_numbers = b'{"campaignId":"AC01","customFields":{"n":[' + b",".join([b"1"] * 300_000) + b"]}}"
    many_keys = b'{"campaignId":"AC01","attribution":{' + b",".join(
        b'"k%d":1' % n for n in range(90_000)) + b"}}"
    long_string = b'{"campaignId":"' + b"c" * (MIB - 100) + b'"}'
    escapes = b'{"campaignId":"AC01","notes":"' + b"\\u00e9" * 170_000 + b'"}'
    with httpx.Client(base_url=base, timeout=30, headers={**tenant.headers, "Content-Type": "application/json"}) as http:
        for doc in (many_numbers, many_keys, long_string, escapes):
            assert len(doc) <= MIB
            response = http.post(SUBMIT, content=doc)
            assert response.status_code in (400, 413), (response.status_code, response.text[:300])
        assert http.get("/healthz").status_code == 200


@pytest.mark.parametrize("doc", [b"", b"   ", b"null", b"[]", b"1", b'"x"', b"{", b'{"campaignId":', b"\xff\xfe",
                                 b'{"campaignId":"AC01"}garbage', b'{"campaignId":NaN}', b"\x00"])
def test_malformed_bodies_are_validation_errors(served, doc):
    base, _, tenant = served
    with httpx.Client(base_url=base, timeout=10, headers={**tenant.headers, "Content-Type": "application/json"}) as http:
        response = http.post(SUBMIT, content=doc)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "VALIDATION_ERROR"


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x"])
def test_wrong_media_type_is_415(served, content_type):
    base, _, tenant = served
    headers = {**tenant.headers, **({"Content-Type": content_type} if content_type else {})}
    with httpx.Client(base_url=base, timeout=10) as http:
        response = http.post(SUBMIT, content=b'{"campaignId":"AC01"}', headers=headers)
    assert response.status_code == 415, response.text
    assert response.json()["error"]["code"] == "UNSUPPORTED_MEDIA_TYPE"


@pytest.mark.parametrize("query", ["page=99999999999999999999999", "page=9223372036854775807", "page=%D9%A5",
                                   "page=1_0", "page=%201", "limit=0", "limit=abc", "active=maybe"])
def test_query_numbers_are_bounded_and_ascii(served, query):
    base, _, tenant = served
    with httpx.Client(base_url=base, timeout=10, headers=tenant.headers) as http:
        response = http.get(f"/api/v1/campaigns?{query}")
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "VALIDATION_ERROR"


def test_limit_above_maximum_is_clamped(served):
    base, _, tenant = served
    with httpx.Client(base_url=base, timeout=10, headers=tenant.headers) as http:
        response = http.get("/api/v1/campaigns?limit=99999999999999999999999")
    assert response.status_code == 200
    assert response.json()["data"]["pagination"]["limit"] == 100


# ---- the submit route at the edge -----------------------------------------------------------------

def test_submit_with_a_trailing_slash_is_the_same_route(served):
    base, runtime, tenant = served
    body = msgspec.json.encode({"campaignId": "AC01", **person(2)})
    status, headers, answer = _post_raw(base, SUBMIT + "/", {**tenant.headers, "Content-Type": "application/json"},
                                        [body], chunked=False)
    assert status == 201, answer[:300]
    lead_id = msgspec.json.decode(answer)["data"]["leadId"]
    assert engine(runtime.store).reader().execute("SELECT count(*) FROM leads WHERE lead_id = ?", (lead_id,)).fetchone()[0] == 1
    assert headers["content-type"] == "application/json" and headers["x-request-id"]


def test_client_gone_before_the_whole_body_stores_nothing(served):
    base, runtime, tenant = served
    before = engine(runtime.store).reader().execute("SELECT count(*) FROM leads").fetchone()[0]
    host, port = base.removeprefix("http://").split(":")
    body = msgspec.json.encode({"campaignId": "AC01", **person(3)})
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall((f"POST {SUBMIT} HTTP/1.1\r\nHost: {host}\r\nX-API-Key: {tenant.key}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
                     + body[: len(body) // 2])
    # The server is still up and answers the next request; the half-sent lead was never stored.
    with httpx.Client(base_url=base, timeout=10) as http:
        assert http.get("/healthz").status_code == 200
    assert engine(runtime.store).reader().execute("SELECT count(*) FROM leads").fetchone()[0] == before
