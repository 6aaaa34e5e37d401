"""What the server answers by itself (appliance/api/server_protocol.py), through raw sockets
against a real uvicorn on loopback: malformed HTTP gets the envelope, request headers have a
deadline that spares bodies and responses, and stalled connections cannot crowd out new ones."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from appliance.api.server_protocol import MAX_HEAD_BYTES, server_protocol
from appliance.app import create_app
from appliance.config import ServerConfig, load_config
from appliance.runtime import create_runtime
from tests.bundles import standard_bundle
from tests.conftest import Cli, make_tenant
from tests.processes import free_port, stop_process
from tests.servers import person, write_config

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 1.0  # [server] header_timeout_seconds of the servers here
CAP = 5        # [server] max_incomplete_requests


@contextlib.contextmanager
def protocol_server(app, header_timeout: float = TIMEOUT, cap: int = CAP, lifespan: str = "on") -> Iterator[int]:
    """`app` under uvicorn with the protocol `appliance serve` uses, in a thread; yields the port."""
    port = free_port()
    protocol = server_protocol(ServerConfig(header_timeout_seconds=header_timeout, max_incomplete_requests=cap))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical",
                                           lifespan=lifespan, access_log=False, http=protocol))
    server.install_signal_handlers = lambda: None  # not the main thread
    thread = threading.Thread(target=server.run, name="test-uvicorn-protocol", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        assert not thread.is_alive(), "uvicorn did not stop within 15 s"


@pytest.fixture(scope="module")
def served(tmp_path_factory, module_backend_toml):
    """The real app: (port, tenant)."""
    tmp = tmp_path_factory.mktemp("protocol")
    runtime = create_runtime(load_config(write_config(tmp, backend=module_backend_toml())))
    try:
        tenant = make_tenant(runtime, "Protocol", standard_bundle())
        with protocol_server(create_app(runtime, background=False)) as port:
            yield port, tenant
    finally:
        runtime.close()


def connect(port: int, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes (the socket's timeout bounds each wait)."""
    received = b""
    while data := sock.recv(65536):
        received += data
    return received


def exchange(port: int, request: bytes) -> bytes:
    with connect(port) as sock:
        with contextlib.suppress(OSError):  # the server may answer and close before reading it all
            sock.sendall(request)
        return read_all(sock)


def parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    length = int(headers.get("content-length", len(body)))
    assert len(body) >= length, raw
    return int(status_line.split()[1]), headers, body[:length]


def envelope(raw: bytes, status: int, code: str) -> str:
    """Checks a server-made refusal; returns its one detail."""
    got, headers, body = parse(raw)
    assert got == status, raw
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert re.fullmatch(r"req_[0-9a-f]{16}", headers["x-request-id"])
    document = json.loads(body)
    assert document["success"] is False and document["error"]["code"] == code
    [detail] = document["error"]["details"]
    assert detail.startswith("request: ")
    return detail


def healthz(port: int, sock: socket.socket | None = None) -> tuple[int, dict]:
    """GET /healthz on a new connection, or on the kept-alive `sock` (read to the end of the body)."""
    if sock is None:
        raw = exchange(port, b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    else:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        raw = b""
        while b"\r\n\r\n" not in raw or len(raw.partition(b"\r\n\r\n")[2]) < int(
                re.search(rb"content-length: (\d+)", raw, re.I)[1]):
            data = sock.recv(65536)
            assert data, f"closed mid-answer: {raw!r}"
            raw += data
    status, _, body = parse(raw)
    return status, json.loads(body)


TOO_LONG = f"longer than {MAX_HEAD_BYTES // 1024} KiB"


@pytest.mark.parametrize(("request_bytes", "says"), [
    (b"POST /api/v1/leads/submit HTTP/1.1\r\nHost: t\r\nContent-Length: -1\r\n\r\n", "Content-Length"),
    (b"POST /api/v1/leads/submit HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"0\r\n\r\n", "Transfer-Encoding"),
    (b"GET /api/v1/campaigns?q=" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: t\r\n\r\n", TOO_LONG),
    (b"GET /" + b"b" * 100_000 + b" HTTP/1.1\r\nHost: t\r\n\r\n", TOO_LONG),
    (b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: " + b"c" * 100_000 + b"\r\n\r\n", TOO_LONG),
    (b"GET /heal\xff\xfethz HTTP/1.1\r\nHost: t\r\n\r\n", "url"),
    (b"GET /a\x00b HTTP/1.1\r\nHost: t\r\n\r\n", "url"),
    (b"CONNECT nowhere:1 HTTP/1.1\r\nHost: t\r\n\r\n", "not a valid URL"),
    (b"\x16\x03\x01\x02\x00 not http at all\r\n\r\n", "method"),
    (b"GET / HTTP/1.1 extra\r\n\r\n", "CRLF"),
], ids=["negative-length", "length-and-chunked", "100k-query", "100k-path", "100k-header", "bytes-in-path",
        "nul-in-path", "bad-target", "garbage", "garbage-request-line"])
def test_malformed_request_gets_the_envelope(served, request_bytes, says):
    detail = envelope(exchange(served[0], request_bytes), 400, "VALIDATION_ERROR")
    assert says in detail


def test_head_dribbled_past_the_limit_is_refused_before_it_ends(served):
    with connect(served[0]) as sock:
        sock.sendall(b"GET /healthz?q=")
        time.sleep(0.05)  # its own read: the limit counts the reads that continue a head
        # Far past the limit: the server answers, then reads and drops the rest rather than
        # resetting the connection, which would discard the answer before it is read.
        for _ in range(4 * MAX_HEAD_BYTES // 4096):
            sock.sendall(b"q" * 4096)
        assert TOO_LONG in envelope(read_all(sock), 400, "VALIDATION_ERROR")


def test_stalled_request_line_gets_408_after_the_header_timeout(served):
    port = served[0]
    with connect(port) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /heal")
        detail = envelope(read_all(sock), 408, "REQUEST_TIMEOUT")
        waited = time.monotonic() - started
    assert f"within {TIMEOUT:g} s" in detail
    assert TIMEOUT - 0.1 < waited < TIMEOUT + 1.5
    assert healthz(port)[0] == 200  # the server itself is fine


def test_each_stalled_connection_has_its_own_deadline_from_when_it_opened(served):
    port = served[0]
    first, opened_first = connect(port), time.monotonic()
    first.sendall(b"GET /a")
    time.sleep(TIMEOUT / 2)
    second, opened_second = connect(port), time.monotonic()
    try:
        time.sleep(TIMEOUT * 0.4)
        second.sendall(b"GET /b")  # a first request is timed from the connection's start
        envelope(read_all(first), 408, "REQUEST_TIMEOUT")
        first_after = time.monotonic() - opened_first
        envelope(read_all(second), 408, "REQUEST_TIMEOUT")
        second_after = time.monotonic() - opened_second
    finally:
        first.close()
        second.close()
    assert TIMEOUT - 0.1 < first_after < TIMEOUT + 0.4
    assert TIMEOUT - 0.1 < second_after < TIMEOUT + 0.4


def test_connection_that_sends_nothing_is_closed_quietly(served):
    with connect(served[0]) as sock:
        started = time.monotonic()
        assert read_all(sock) == b""
        assert TIMEOUT - 0.1 < time.monotonic() - started < TIMEOUT + 1.5


def test_kept_alive_connection_times_each_request_from_its_first_byte(served):
    port = served[0]
    with connect(port) as sock:
        assert healthz(port, sock)[0] == 200
        time.sleep(TIMEOUT * 0.8)  # idle between requests is uvicorn's keep-alive (5 s), not this
        assert healthz(port, sock)[0] == 200
        time.sleep(TIMEOUT * 0.8)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHos")
        started = time.monotonic()
        envelope(read_all(sock), 408, "REQUEST_TIMEOUT")
        assert time.monotonic() - started > TIMEOUT - 0.1


def test_slow_body_is_not_cut_by_the_header_timeout(served):
    port, tenant = served
    body = json.dumps({"campaignId": "AC01", **person(1)}).encode()
    pieces = [body[len(body) * i // 8:len(body) * (i + 1) // 8] for i in range(8)]
    with connect(port) as sock:
        sock.sendall(f"POST /api/v1/leads/submit HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                     f"X-API-Key: {tenant.key}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode())
        started = time.monotonic()
        for piece in pieces:
            time.sleep(0.25)  # 2 s in all, twice the header timeout
            sock.sendall(piece)
        status, _, answer = parse(read_all(sock))
    assert time.monotonic() - started >= 2 * TIMEOUT
    assert status == 201, answer
    assert json.loads(answer)["data"]["leadId"].startswith("lead_")


@pytest.fixture(scope="module")
def capped(tmp_path_factory, module_backend_toml):
    """The real app with a header timeout far beyond the test: whatever closes a connection early
    is the cap."""
    tmp = tmp_path_factory.mktemp("capped")
    runtime = create_runtime(load_config(write_config(tmp, backend=module_backend_toml())))
    try:
        with protocol_server(create_app(runtime, background=False), header_timeout=60) as port:
            yield port
    finally:
        runtime.close()


def test_stalled_connections_past_the_cap_make_room_for_new_ones(capped):
    stalled = [connect(capped) for _ in range(20)]
    try:
        for n, sock in enumerate(stalled):
            if n % 2:  # half say nothing at all, half stop inside the request line
                with contextlib.suppress(OSError):  # it may have been closed to make room already
                    sock.sendall(b"GET /api/v1/camp")
        status, document = healthz(capped)
        assert status == 200 and document["data"]["status"] == "ok"
        # 21 connections for 5 slots: the 16 that waited longest were closed to make room, with
        # nothing or (when part of a request had arrived by then) a 408 that says why.
        for sock in stalled[:16]:
            try:
                raw = read_all(sock)
            except ConnectionResetError:  # closed with our bytes unread: a reset instead of a FIN
                raw = b""
            assert raw == b"" or "make room" in envelope(raw, 408, "REQUEST_TIMEOUT")
        for sock in stalled[16:]:  # the newest 4 still wait for their headers
            sock.settimeout(0.2)
            with pytest.raises(TimeoutError):
                sock.recv(1)
    finally:
        for sock in stalled:
            sock.close()


# ---- uvicorn's own 500 and pipelining, with a bare ASGI app --------------------------------------

FAILING_ID = "req_00000000000000aa"


async def bare_app(scope, receive, send):
    if scope["path"] == "/fail":  # as a failure while the app answers an error would surface
        scope["state"]["request_id"] = FAILING_ID
        raise RuntimeError("the app's error answer failed")
    if scope["path"] == "/slow":
        await asyncio.sleep(3 * TIMEOUT / 2)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def bare():
    with protocol_server(bare_app, lifespan="off") as port:
        yield port


def test_app_failing_before_it_responds_gets_the_envelope_500(bare):
    status, headers, body = parse(exchange(bare, b"GET /fail HTTP/1.1\r\nHost: t\r\n\r\n"))
    assert status == 500
    assert headers["content-type"] == "application/json" and headers["x-request-id"] == FAILING_ID
    assert json.loads(body) == {"success": False, "error": {
        "code": "INTERNAL_ERROR", "message": f"Internal server error (request {FAILING_ID})"}}


def test_stall_pipelined_behind_a_slow_response_lets_that_response_finish(bare):
    with connect(bare) as sock:
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\nGET /next HT")
        raw = read_all(sock)  # the deadline passes while /slow is being answered
    status, headers, body = parse(raw)
    assert (status, body) == (200, b"ok") and raw.endswith(b"\r\n\r\nok")
    assert headers["connection"] == "close"


# ---- the config keys, through `appliance serve` ----------------------------------------------------

@pytest.mark.parametrize(("line", "message"), [
    ("header_timeout_seconds = 0", "server.header_timeout_seconds: must be more than 0 and at most 3600"),
    ("header_timeout_seconds = 3601", "server.header_timeout_seconds: must be more than 0 and at most 3600"),
    ("max_incomplete_requests = 0", "server.max_incomplete_requests: must be 1 or more"),
])
def test_serve_refuses_a_bad_server_limit(tmp_path, cli, line, message):
    bad = tmp_path / "bad.toml"
    bad.write_text(f"[server]\n{line}\n")
    cli.config_file = bad
    assert message in cli("serve", expect=1).stderr


def test_serve_applies_the_header_timeout_from_the_config(tmp_path, backend_toml):
    config = write_config(tmp_path, extra='\n[server]\nlog_level = "warning"\nheader_timeout_seconds = 1\n'
                                          'max_incomplete_requests = 2\n', backend=backend_toml)
    Cli(config)("init")
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "appliance", "--config", str(config), "serve",
                                 "--port", str(port)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        # Answering, not only listening: a loaded machine (CI runs two test passes at once) may
        # still be finishing the start when the port opens, and a timer starts only once it is done.
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                with connect(port) as probe:
                    probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                    if read_all(probe).startswith(b"HTTP/1.1 200"):
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "appliance serve did not answer within 20 s"
            time.sleep(0.05)
        with connect(port, timeout=15) as sock:  # the 408 is due after 1 s; a starved machine is slower
            sock.sendall(b"GET /heal")
            assert "within 1 s" in envelope(read_all(sock), 408, "REQUEST_TIMEOUT")
        opened = time.monotonic()
        silent = [connect(port) for _ in range(3)]  # a cap of 2: the third closes the first
        try:
            assert read_all(silent[0]) == b""
            assert time.monotonic() - opened < 0.6  # made room for, not timed out
        finally:
            for extra in silent:
                extra.close()
    finally:
        stop_process(proc)
