"""The http adapter's own HTTP/1.1 client (appliance/adapters/http1), through HttpDelivery,
against a real local server that keeps connections open: reuse and when it must not happen, the
one retry of a request a stale kept-alive connection lost, response framings (chunked, until
close, interim 1xx, no body), the 1 MiB cap, malformed and cut responses, TLS connections kept
apart by server name, and idle connections expiring and being closed."""

from __future__ import annotations

import asyncio
import re
import ssl
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any, Self

import httpx
import pytest

from appliance.adapters import http1, netguard
from appliance.adapters.http_delivery import MAX_RESPONSE_BYTES, HttpDelivery
from appliance.domain.endpoint import DeliveryEndpoint
from appliance.sdk import DeliveryRequest, DeliveryResult
from tests.buyer_server import wait_until
from tests.http_helpers import LEAD, fake_dns, make_endpoint, self_signed

Step = bytes | Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def answer(status: int = 200, body: bytes = b'{"id": "B-1"}', *, version: str = "1.1",
           headers: dict[str, str] | None = None, length: bool = True) -> bytes:
    """A raw response; with Content-Length unless `length` is False."""
    fields = {"Content-Type": "application/json", **(headers or {})}
    if length:
        fields["Content-Length"] = str(len(body))
    lines = [f"HTTP/{version} {status} {HTTPStatus(status).phrase}", *(f"{k}: {v}" for k, v in fields.items())]
    return "\r\n".join([*lines, "", ""]).encode() + body


async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Close the connection without answering."""
    writer.close()


def then_hang_up(data: bytes) -> Step:
    """Send `data` (a response, or part of one), then close the connection."""
    async def step(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(data)
        await writer.drain()
        writer.close()
    return step


def then_stall(data: bytes) -> Step:
    """Send `data`, then nothing more until the client goes away."""
    async def step(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(data)
        await writer.drain()
        await reader.read()
        writer.close()
    return step


def later(data: bytes, seconds: float) -> Step:
    async def step(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(seconds)
        writer.write(data)
        await writer.drain()
    return step


@dataclass
class Seen:
    connection: int              # 1 for the first connection the server accepted
    method: str
    target: str
    headers: dict[str, str]      # names lower-cased
    body: bytes


class KeepAliveServer:
    """HTTP/1.1 on 127.0.0.1 (https with `tls`) that keeps connections open, in a thread with an
    event loop of its own. Each request gets the next scripted step, or `answer()` when none is
    left: raw response bytes, or a coroutine given the connection's streams."""

    def __init__(self, *, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.steps: deque[Step] = deque()
        self.seen: list[Seen] = []
        self.accepted = 0
        self.ended = 0                            # connections closed, by either side
        self.server_names: list[str | None] = []  # the TLS server name of each handshake
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="keep-alive-server", daemon=True)
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    def script(self, *steps: Step) -> None:
        self.steps.extend(steps)

    def connections(self) -> list[int]:
        """The connection each request arrived on."""
        return [seen.connection for seen in self.seen]

    def __enter__(self) -> Self:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(5)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    async def _start(self) -> None:
        if self.tls is not None:
            self.tls.sni_callback = lambda _ssl, name, _context: self.server_names.append(name)
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._handlers:
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.accepted += 1
        number = self.accepted
        try:
            while not writer.is_closing():
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                request_line, *lines = head.split("\r\n")
                method, target, _ = request_line.split(" ", 2)
                headers = {name.strip().lower(): value.strip()
                           for name, _, value in (line.partition(":") for line in lines if line)}
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                self.seen.append(Seen(number, method, target, headers, body))
                step = self.steps.popleft() if self.steps else answer()
                if isinstance(step, bytes):
                    writer.write(step)
                    await writer.drain()
                else:
                    await step(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed the connection
        finally:
            writer.close()
            self.ended += 1
            self._handlers.discard(task)


@pytest.fixture
def server() -> Iterator[KeepAliveServer]:
    with KeepAliveServer() as running:
        yield running


def endpoint(server: KeepAliveServer, **fields: Any) -> DeliveryEndpoint:
    # A short deadline: a client that misreads the framing waits for bytes that never come.
    return make_endpoint(f"http://127.0.0.1:{server.port}/leads", **{"timeoutSeconds": 3, **fields})


def request(endpoint: DeliveryEndpoint, number: int, *, allow_private: bool = True) -> DeliveryRequest:
    return DeliveryRequest(lead=LEAD, submission_id=f"sub_{number}", attempt=1, endpoint=endpoint, secrets={},
                           settings={}, allow_private_addresses=allow_private)


def deliveries(adapter: HttpDelivery, *endpoints: DeliveryEndpoint, pause: float = 0.0,
               allow_private: bool = True) -> list[DeliveryResult]:
    """Deliver to each endpoint in turn (submissions sub_1, sub_2, ...) in one event loop, so
    the adapter's pool carries over from one delivery to the next."""
    async def run() -> list[DeliveryResult]:
        results: list[DeliveryResult] = []
        async with httpx.AsyncClient() as http:
            for number, each in enumerate(endpoints, 1):
                if results and pause:
                    await asyncio.sleep(pause)
                results.append(await adapter.deliver(request(each, number, allow_private=allow_private), http))
        return results

    return asyncio.run(run())


# ---- reuse --------------------------------------------------------------------------------------


CHUNKED_AND_LENGTH = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 99\r\n\r\n"
                      b"2\r\n{}\r\n0\r\n\r\n")


@pytest.mark.parametrize(("response", "reused"), [
    (answer(), True),
    (answer(headers={"Connection": "close"}), False),
    (answer(version="1.0"), False),
    (answer(version="1.0", headers={"Connection": "keep-alive"}), True),
    (answer(status=204, body=b"", length=False), True),   # no body, whatever the framing headers say
    (answer(status=304, body=b"", length=False), True),
    (CHUNKED_AND_LENGTH, False),                          # ambiguous framing: read as chunked, then closed
])
def test_when_a_connection_is_reused(server: KeepAliveServer, response: bytes, reused: bool) -> None:
    server.script(response)
    _, second = deliveries(HttpDelivery(), endpoint(server), endpoint(server))
    assert second.outcome == "success", second
    assert server.connections() == [1, 1 if reused else 2]


def test_two_deliveries_share_one_connection(server: KeepAliveServer) -> None:
    results = deliveries(HttpDelivery(), endpoint(server), endpoint(server, method="PUT"))
    assert [r.outcome for r in results] == ["success", "success"]
    assert [(s.connection, s.method, s.headers["idempotency-key"]) for s in server.seen] == \
        [(1, "POST", "sub_1"), (1, "PUT", "sub_2")]
    assert server.accepted == 1


def test_a_request_asking_to_close_is_not_reused(server: KeepAliveServer) -> None:
    closing = endpoint(server, headers={"Connection": "close"})
    deliveries(HttpDelivery(), closing, closing)
    assert server.connections() == [1, 2]


def test_a_connection_the_server_closed_while_idle_is_not_used(server: KeepAliveServer) -> None:
    server.script(then_hang_up(answer()))
    results = deliveries(HttpDelivery(), endpoint(server), endpoint(server), pause=0.2)
    assert [r.outcome for r in results] == ["success", "success"]
    assert server.connections() == [1, 2]  # nothing was sent on the closed one


def then_later(data: bytes, more: bytes) -> Step:
    """Send `data`, and `more` a little later, unasked."""
    async def step(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(data)
        await asyncio.sleep(0.05)
        writer.write(more)
        await writer.drain()
    return step


@pytest.mark.parametrize("response", [answer() + b"HTTP/1.1 200 OK\r\n",
                                      then_later(answer(), answer(408, b"", headers={"Connection": "close"}))],
                         ids=["with-the-response", "while-idle"])
def test_a_connection_with_bytes_out_of_turn_is_not_used(server: KeepAliveServer, response: Step) -> None:
    server.script(response)
    results = deliveries(HttpDelivery(), endpoint(server), endpoint(server), pause=0.2)
    assert [r.outcome for r in results] == ["success", "success"]
    assert server.connections() == [1, 2]


# ---- the one retry --------------------------------------------------------------------------------


def test_a_request_lost_by_a_stale_connection_is_sent_again_once(server: KeepAliveServer) -> None:
    # The server closes the kept-alive connection as the second request arrives (its idle
    # timeout raced the request): sent again on a new connection, same Idempotency-Key.
    server.script(answer(), hang_up)
    results = deliveries(HttpDelivery(), endpoint(server), endpoint(server))
    assert [r.outcome for r in results] == ["success", "success"]
    assert [(s.connection, s.headers["idempotency-key"]) for s in server.seen] == \
        [(1, "sub_1"), (1, "sub_2"), (2, "sub_2")]


def test_the_retry_happens_once(server: KeepAliveServer) -> None:
    server.script(answer(), hang_up, hang_up)
    _, second = deliveries(HttpDelivery(), endpoint(server), endpoint(server))
    assert second.outcome == "error"
    assert second.reason == ("connection closed without a complete response: "
                             "the server closed the connection without answering")
    assert server.connections() == [1, 1, 2]


def test_a_new_connection_is_not_retried(server: KeepAliveServer) -> None:
    server.script(hang_up)
    (result,) = deliveries(HttpDelivery(), endpoint(server))
    assert result.outcome == "error" and server.connections() == [1]


@pytest.mark.parametrize("partial", [b"H", b"HTTP/1.1 200 OK\r\n", answer(body=b'{"id": "B-1"}')[:-4]])
def test_no_retry_once_the_answer_began(server: KeepAliveServer, partial: bytes) -> None:
    # The buyer may have taken the lead; the error is retried later with backoff, not at once.
    server.script(answer(), then_hang_up(partial))
    _, second, third = deliveries(HttpDelivery(), endpoint(server), endpoint(server), endpoint(server))
    assert second.outcome == "error" and second.status_code is None
    assert second.reason == ("connection closed without a complete response: "
                             "the server closed the connection mid-response")
    assert third.outcome == "success"
    assert server.connections() == [1, 1, 2]


# ---- framing ------------------------------------------------------------------------------------


def test_chunked_body(server: KeepAliveServer) -> None:
    server.script(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b'4;note=first\r\n{"id\r\n9\r\n": "B-9"}\r\n0\r\nX-Trailer: yes\r\n\r\n')
    first, second = deliveries(HttpDelivery(), endpoint(server, responseRules={"clientLeadIdPath": "id"}),
                               endpoint(server))
    assert (first.outcome, first.client_lead_id) == ("success", "B-9")
    assert second.outcome == "success" and server.connections() == [1, 1]


def test_body_until_close(server: KeepAliveServer) -> None:
    server.script(then_hang_up(answer(body=b'{"id": "B-3"}', length=False)))
    first, second = deliveries(HttpDelivery(), endpoint(server, responseRules={"clientLeadIdPath": "id"}),
                               endpoint(server))
    assert (first.outcome, first.client_lead_id) == ("success", "B-3")
    assert second.outcome == "success" and server.connections() == [1, 2]


def test_interim_responses_are_skipped(server: KeepAliveServer) -> None:
    server.script(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
                  + answer(201, b'{"id": "B-7"}'))
    first, second = deliveries(HttpDelivery(), endpoint(server, responseRules={"clientLeadIdPath": "id"}),
                               endpoint(server))
    assert (first.outcome, first.status_code, first.client_lead_id) == ("success", 201, "B-7")
    assert second.outcome == "success" and server.connections() == [1, 1]


HUGE = b"x" * (MAX_RESPONSE_BYTES + 100_000)


@pytest.mark.parametrize("response", [
    answer(body=HUGE),
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(HUGE) + HUGE + b"\r\n0\r\n\r\n",
    then_hang_up(answer(body=HUGE, length=False)),
], ids=["content-length", "chunked", "until-close"])
def test_a_truncated_body_closes_the_connection(server: KeepAliveServer, response: Step) -> None:
    server.script(response)
    first, second = deliveries(HttpDelivery(), endpoint(server, responseRules={"success": {"bodyPattern": "^x+$"}}),
                               endpoint(server))
    assert first.outcome == "success" and "truncated at 1 MiB" in (first.reason or "")
    assert second.outcome == "success" and server.connections() == [1, 2]


@pytest.mark.parametrize(("response", "problem"), [
    (b"HTTP/1.1 200 OK\r\nNo colon here\r\n\r\n", "invalid header line"),
    (b"HTTP/1.1 200 OK\r\n  folded: line\r\n\r\n", "invalid header line"),
    (b"HTTP/2 200\r\n\r\n", "invalid status line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 3, 4\r\n\r\nabcd", "invalid Content-Length"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "invalid chunk size"),
    (b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (http1.MAX_HEAD_BYTES + 10), "response head too long"),
])
def test_a_malformed_response_is_an_error(server: KeepAliveServer, response: bytes, problem: str) -> None:
    server.script(response)
    first, second = deliveries(HttpDelivery(), endpoint(server), endpoint(server))
    assert first.outcome == "error"
    assert first.reason == f"connection closed without a complete response: {problem}"
    assert second.outcome == "success" and server.connections() == [1, 2]


@pytest.mark.parametrize("stalled", [b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n",
                                     answer(body=b"0123456789")[:-5]], ids=["head", "body"])
def test_a_stalled_answer_ends_at_the_deadline_and_its_connection_closes(server: KeepAliveServer,
                                                                        stalled: bytes) -> None:
    server.script(then_stall(stalled))
    start = time.monotonic()
    first, second = deliveries(HttpDelivery(), endpoint(server, timeoutSeconds=0.5), endpoint(server))
    assert first.outcome == "error" and first.reason == "timed out after 0.5 s"
    assert time.monotonic() - start < 2
    assert second.outcome == "success" and server.connections() == [1, 2]


# ---- pools ----------------------------------------------------------------------------------------


def test_tls_connections_are_kept_apart_by_server_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two names on one address, one certificate valid for both: sharing a connection would even
    # work, but a connection verified for one name must never carry the other's requests.
    server_context, client_context = self_signed(tmp_path, "a.test", "b.test")
    fake_dns(monkeypatch, ["127.0.0.1"])
    monkeypatch.setattr(netguard, "address_problem", lambda ip: None)
    with KeepAliveServer(tls=server_context) as server:
        a, b = (make_endpoint(f"https://{name}:{server.port}/leads") for name in ("a.test", "b.test"))
        results = deliveries(HttpDelivery(ssl_context=client_context), a, b, a, b, allow_private=False)
        assert [r.outcome for r in results] == ["success"] * 4, results
        assert server.connections() == [1, 2, 1, 2]
        assert server.server_names == ["a.test", "b.test"]
        assert [s.headers["host"] for s in server.seen] == [f"{n}.test:{server.port}" for n in "abab"]


def test_one_adapter_in_one_event_loop_after_another(server: KeepAliveServer) -> None:
    adapter = HttpDelivery()
    assert deliveries(adapter, endpoint(server))[0].outcome == "success"
    assert wait_until(lambda: server.ended == 1)  # the loop's end closed its pool
    assert deliveries(adapter, endpoint(server))[0].outcome == "success"
    assert server.connections() == [1, 2]


def test_aclose_closes_idle_connections(server: KeepAliveServer) -> None:
    adapter = HttpDelivery()

    async def run() -> None:
        async with httpx.AsyncClient() as http:
            assert (await adapter.deliver(request(endpoint(server), 1), http)).outcome == "success"
            assert server.ended == 0
            await adapter.aclose()
            assert await asyncio.to_thread(wait_until, lambda: server.ended == 1)
            assert (await adapter.deliver(request(endpoint(server), 2), http)).outcome == "success"

    asyncio.run(run())
    assert server.connections() == [1, 2]


def test_idle_connections_expire(server: KeepAliveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http1, "IDLE_SECONDS", 0.2)
    monkeypatch.setattr(http1, "SWEEP_SECONDS", 0.05)
    adapter = HttpDelivery()

    async def run() -> None:
        async with httpx.AsyncClient() as http:
            assert (await adapter.deliver(request(endpoint(server), 1), http)).outcome == "success"
            assert await asyncio.to_thread(wait_until, lambda: server.ended == 1)
            assert (await adapter.deliver(request(endpoint(server), 2), http)).outcome == "success"

    asyncio.run(run())
    assert server.connections() == [1, 2]


def test_idle_connections_per_origin_are_capped(server: KeepAliveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http1, "MAX_IDLE_PER_ORIGIN", 1)
    server.script(*(later(answer(), 0.2) for _ in range(3)))  # all three in flight at once
    adapter = HttpDelivery()

    async def run() -> None:
        async with httpx.AsyncClient() as http:
            results = await asyncio.gather(*(adapter.deliver(request(endpoint(server), n), http) for n in (1, 2, 3)))
            assert [r.outcome for r in results] == ["success"] * 3
            assert await asyncio.to_thread(wait_until, lambda: server.ended == 2)
            assert (await adapter.deliver(request(endpoint(server), 4), http)).outcome == "success"

    asyncio.run(run())
    assert sorted(server.connections()[:3]) == [1, 2, 3] and wait_until(lambda: server.ended == 3)
    assert server.connections()[3] in (1, 2, 3)


# ---- the request ----------------------------------------------------------------------------------


def test_request_bytes() -> None:
    sent = http1.build_request("POST", "/in?a=1", [("Host", "buyer.example"), ("X-Vendor", "v1")], b"{}")
    assert sent.data == b"POST /in?a=1 HTTP/1.1\r\nHost: buyer.example\r\nX-Vendor: v1\r\nContent-Length: 2\r\n\r\n{}"
    assert not sent.close
    assert http1.build_request("GET", "/", [("Host", "b"), ("Connection", "Close")]) == \
        http1.Request("GET", b"GET / HTTP/1.1\r\nHost: b\r\nConnection: Close\r\n\r\n", True)


@pytest.mark.parametrize(("method", "target", "headers", "problem"), [
    ("POST", "/", [("X-A", "1\r\nX-B: 2")], "the value of header X-A contains a line break"),
    ("POST", "/", [("X-A", "1\n")], "the value of header X-A contains a line break"),
    ("POST", "/", [("X-A", "1\x00")], "the value of header X-A contains a line break"),
    ("POST", "/", [("X A", "1")], "invalid header name"),
    ("POST", "/", [("Content-Length", "5")], "header Content-Length is set by the client"),
    ("POST", "/", [("transfer-encoding", "chunked")], "header transfer-encoding is set by the client"),
    ("POST", "/", [("X-City", "Zürich")], "header values must be ASCII"),
    ("POST", "/a b", [], "invalid request target"),
    ("POST", "http://elsewhere/", [], "invalid request target"),
    ("GET /x HTTP/1.1\r\n", "/", [], "invalid method"),
])
def test_a_request_that_would_change_meaning_on_the_wire_is_refused(method: str, target: str,
                                                                     headers: list[tuple[str, str]],
                                                                     problem: str) -> None:
    with pytest.raises(http1.InvalidRequest, match=f"^{re.escape(problem)}$"):
        http1.build_request(method, target, headers, b"{}")
