"""A real local HTTP server playing a buyer, for delivery tests.

    with BuyerServer() as buyer:
        buyer.route("/leads", status=201, body={"id": "B-1"})
        buyer.route("/slow", delay=0.5)
        buyer.route("/drip", drip=True)          # headers, then one byte every 50 ms, forever
        buyer.route("/huge", size=5 * 1024 * 1024)
        buyer.route("/bye", close=True)          # closes the connection without an answer
        buyer.route("/moved", status=302, headers={"Location": "http://169.254.169.254/"})
        ... deliver to buyer.url("/leads") ...
        assert buyer.requests[0].json() == {...}

Replies are scripted per path (the query string is ignored for matching); a reply may also be
a function of the received request. Every request is recorded (method, path, query, headers,
body) before the reply, so "nothing was recorded" means no request arrived. Each response closes
its connection. Bounded: leaving the `with` block stops dripping and slow handlers at once, shuts
the listener and joins every thread.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit


@dataclass
class Reply:
    status: int = 200
    body: bytes | str | dict | list | None = None  # dict / list are sent as JSON
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0           # seconds before the status line
    drip: bool = False           # send headers, then one byte every drip_interval until stopped
    drip_interval: float = 0.05
    size: int | None = None      # send this many filler bytes as the body (huge bodies)
    close: bool = False          # read the request, then close without any response


@dataclass
class Received:
    method: str
    path: str
    query: str
    headers: dict[str, str]      # names lower-cased
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def form(self) -> dict[str, str]:
        return dict(parse_qsl(self.body.decode(), keep_blank_values=True))

    def form_pairs(self) -> list[tuple[str, str]]:
        return parse_qsl(self.body.decode(), keep_blank_values=True)

    def params(self) -> dict[str, str]:
        return dict(parse_qsl(self.query, keep_blank_values=True))


Script = Reply | Callable[[Received], Reply]


class _Server(ThreadingHTTPServer):
    daemon_threads = False       # server_close() joins the handler threads
    block_on_close = True
    # socketserver's default listen backlog is 5: a burst of connections (an auction's pings, a
    # delivery process taking up its interrupted jobs at once) would lose SYNs to a 1 s retransmit.
    request_queue_size = 128
    owner: BuyerServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hangs up or fails the TLS handshake is part of the tests, not noise


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 5                  # a client that never sends its request does not hold a thread
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    def _handle(self) -> None:
        owner = self.server.owner
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        received = Received(self.command, parts.path, parts.query,
                            {k.lower(): v for k, v in self.headers.items()}, body)
        with owner.lock:
            owner.requests.append(received)
            script = owner.routes.get(parts.path)
        reply = Reply(status=404, body={"error": "no such route"}) if script is None else script
        if callable(reply):
            reply = reply(received)
        self.close_connection = True
        if reply.close:
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if reply.delay and owner.stopping.wait(reply.delay):
            return
        payload = reply.body
        headers = {"Connection": "close", **reply.headers}
        if isinstance(payload, (dict, list)):
            payload = json.dumps(payload).encode()
            headers.setdefault("Content-Type", "application/json")
        elif isinstance(payload, str):
            payload = payload.encode()
        payload = payload or b""
        self.send_response_only(reply.status)
        if reply.drip:
            headers.setdefault("Content-Length", str(10**9))
        elif reply.size is not None:
            headers.setdefault("Content-Length", str(reply.size))
        else:
            headers.setdefault("Content-Length", str(len(payload)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.flush()
        try:
            if reply.drip:
                while not owner.stopping.wait(reply.drip_interval):
                    self.wfile.write(b" ")
                    self.wfile.flush()
            elif reply.size is not None:
                chunk = b"x" * 65536
                left = reply.size
                while left > 0 and not owner.stopping.is_set():
                    n = min(left, len(chunk))
                    self.wfile.write(chunk[:n])
                    left -= n
                    owner.bytes_sent += n
            else:
                self.wfile.write(payload)
        except OSError:
            pass  # the client went away (as a capped or timed-out client does)

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET


class BuyerServer:
    """See the module docstring. `url(path)` is on 127.0.0.1 and a free port."""

    def __init__(self, *, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls               # a server-side context: serve https instead of http
        self.routes: dict[str, Script] = {}
        self.requests: list[Received] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.bytes_sent = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def route(self, path: str, script: Script | None = None, **reply: Any) -> None:
        with self.lock:
            self.routes[path] = script if script is not None else Reply(**reply)

    def url(self, path: str = "/") -> str:
        assert self._server is not None, "start the server first"
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}{path}"

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    def requests_to(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.requests if r.path == path]

    def start(self) -> BuyerServer:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.owner = self
        if self.tls is not None:
            server.socket = self.tls.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="buyer-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()  # joins the handler threads (they watch `stopping`)
        assert self._thread is not None
        self._thread.join(5)
        self._server = None

    def __enter__(self) -> BuyerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port() -> int:
    """A port nothing listens on (for connection-refused tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def serve() -> Iterator[BuyerServer]:
    """For a pytest fixture: `buyer = pytest.fixture(serve)`."""
    with BuyerServer() as server:
        yield server
