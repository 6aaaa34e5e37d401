"""A small HTTP/1.1 keep-alive client on an `asyncio.Protocol`, for the built-in http delivery
adapter only (plugins, SMS providers and pixel platforms keep using httpx).

Why it exists: with httpx the delivery worker spent most of its time in httpx/httpcore, about
500 us CPU per request at concurrency 1 and 1,500 us at 64 (httpcore walks its whole pool on
every request and release, encode/httpcore#1035). A delivery needs little: one request and its
response at a time per connection, keep-alive reuse, TLS verified against a given server name
while connected to a pinned address, a cap on the body read, and errors it can tell apart.

- Pools: one per event loop (a connection is only ever used by the loop that opened it), keyed
  by `Origin` (scheme, connect address, port, TLS server name), so a kept-alive TLS connection is
  reused only for the name its certificate was verified for. Connections idle for IDLE_SECONDS
  are closed, at most MAX_IDLE_PER_ORIGIN are kept per origin, most recently used first. When
  the loop shuts down (asyncio.run cancels every task) the pool's sweeper task closes it.
- A response is reused only when it was read completely, it was HTTP/1.1 (or 1.0 with
  keep-alive) and neither side said `Connection: close`. A truncated, failed or cancelled
  exchange closes its connection.
- A kept-alive connection the server closed before any byte of the response arrived (it timed
  the connection out while the request was on its way) is retried once on a new connection.
  That resends a request the server may have seen, which is safe only because every delivery
  carries an `Idempotency-Key` (Go's net/http replays such requests by the same rule). A new
  connection, or one that received any byte of the response, is never retried.
- No timeouts of its own: the caller runs the whole exchange under one deadline.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections import deque
from collections.abc import Iterable
from typing import Final, NamedTuple

import certifi

IDLE_SECONDS: Final = 4.0  # below the 5 s keep-alive timeout of Node.js and Apache, to rarely race one
SWEEP_SECONDS: Final = 1.0
MAX_IDLE_PER_ORIGIN: Final = 64
MAX_HEAD_BYTES: Final = 64 * 1024
MAX_LINE_BYTES: Final = 8 * 1024  # a chunk-size or trailer line

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_TOKEN_BYTES = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_NOT_IN_VALUE = re.compile(r"[\r\n\x00]")
_NOT_IN_TARGET = re.compile(r"[\x00-\x20\x7f]")
_FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding"})
_HEAD_END = re.compile(rb"\n\r?\n")  # bare LF line ends are tolerated, as h11 does
_LINE_END = re.compile(rb"\n")
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?:[ \t].*)?", re.DOTALL)
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*(?:;.*)?", re.DOTALL)


class HttpError(Exception):
    """A request that could not be sent or answered."""


class InvalidRequest(HttpError):
    """The request cannot be sent as given; nothing was sent."""


class ConnectFailed(HttpError):
    """No connection: refused, unreachable, or the TLS handshake or certificate check failed."""


class ProtocolError(HttpError):
    """The response is not valid HTTP/1.1."""


class IncompleteResponse(ProtocolError):
    """The server closed the connection before the response was complete."""


class TransportError(HttpError):
    """Reading or writing failed (for example the connection was reset)."""


class _StaleConnection(Exception):
    """A kept-alive connection turned out closed before the response began."""


class Origin(NamedTuple):
    scheme: str                 # "http" or "https"
    address: str                # where to connect: the checked IP address, or a host name
    port: int
    server_name: str | None     # https: the name sent as SNI and the certificate is verified for


class Request(NamedTuple):
    method: str
    data: bytes                 # head and body, as sent
    close: bool                 # the request asks the server to close the connection


class Response(NamedTuple):
    status: int
    headers: dict[str, str]     # names lower-cased; repeated fields joined with ", "
    body: bytes
    truncated: bool             # the body was longer than max_body: this is its beginning

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


def build_request(method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes | None = None) -> Request:
    """The request as bytes. `target` is the path and query; the caller sends `Host` among
    `headers`; Content-Length is ours. Raises InvalidRequest for what would change the meaning
    of the request on the wire (a line break in a value would let a value add headers)."""
    if not _TOKEN.fullmatch(method):
        raise InvalidRequest("invalid method")
    if not target.startswith("/") or _NOT_IN_TARGET.search(target):
        raise InvalidRequest("invalid request target")
    lines = [f"{method} {target} HTTP/1.1"]
    close = False
    for name, value in headers:
        if not _TOKEN.fullmatch(name):
            raise InvalidRequest("invalid header name")
        if _NOT_IN_VALUE.search(value):
            raise InvalidRequest(f"the value of header {name} contains a line break")
        lowered = name.lower()
        if lowered in _FRAMING_HEADERS:
            raise InvalidRequest(f"header {name} is set by the client")
        if lowered == "connection" and "close" in value.lower():
            close = True
        lines.append(f"{name}: {value}")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    lines += ["", ""]
    try:
        head = "\r\n".join(lines).encode("ascii")
    except UnicodeEncodeError:
        raise InvalidRequest("header values must be ASCII") from None
    return Request(method, head + body if body else head, close)


def _describe(exc: BaseException) -> str:
    return str(exc).strip() or type(exc).__name__


def _parse_head(head: bytes) -> tuple[int, int, dict[str, str]]:
    """(HTTP/1.x minor version, status, headers) of a response head."""
    status_line, *lines = head.split(b"\n")
    match = _STATUS_LINE.fullmatch(status_line.rstrip(b"\r"))
    if match is None:
        raise ProtocolError("invalid status line")
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.rstrip(b"\r").partition(b":")
        if not colon or not _TOKEN_BYTES.fullmatch(name):  # also refuses obsolete line folding
            raise ProtocolError("invalid header line")
        key = name.decode("ascii").lower()
        text = value.strip(b" \t").decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return int(match[1]), int(match[2]), headers


def _content_length(text: str) -> int:
    values = {v.strip() for v in text.split(",")}  # "5, 5" from a repeated header is one length
    value = values.pop() if len(values) == 1 else ""
    if not (value.isascii() and value.isdigit()) or len(value) > 18:
        raise ProtocolError("invalid Content-Length")
    return int(value)


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection; the request's coroutine reads what `data_received` buffers."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()       # mutated in place, never replaced: readers hold it
        self.ended = False              # end of stream or connection lost
        self.error: BaseException | None = None
        self.answered = False           # a byte of the current response arrived
        self.idle = False               # in the pool
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None

    # ---- protocol callbacks -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.idle:
            self.close()  # a server talking out of turn is not trusted with the next request
            return
        self.buffer += data
        self.answered = True
        self._wake()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.error = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # ---- use ----------------------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        """Open, and no bytes beyond the last response."""
        return not self.ended and not self.buffer

    def close(self) -> None:
        """At once: whatever is unsent is not wanted, and a TLS close_notify exchange would keep
        the socket open after the loop may have ended (HTTP/1.1 delimits responses itself)."""
        self.ended = True
        if self.transport is not None:
            self.transport.abort()

    async def _wait(self) -> None:
        """Until more bytes arrive or the connection ends."""
        if not self.ended:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter

    async def _more(self) -> None:
        """Until more bytes arrive; raises when the connection ended first."""
        if self.ended:
            if self.error is not None:
                raise TransportError(_describe(self.error))
            raise IncompleteResponse("the server closed the connection mid-response" if self.answered
                                     else "the server closed the connection without answering")
        await self._wait()

    async def _read_exact(self, size: int) -> bytes:
        buffer = self.buffer
        while len(buffer) < size:
            await self._more()
        data = bytes(buffer[:size])
        del buffer[:size]
        return data

    async def _read_until(self, pattern: re.Pattern[bytes], limit: int, what: str) -> bytes:
        """The bytes before the first match of `pattern`, which is consumed too."""
        buffer = self.buffer
        start = 0
        while (match := pattern.search(buffer, start)) is None:
            if len(buffer) > limit:
                raise ProtocolError(f"{what} too long")
            start = max(len(buffer) - 2, 0)  # a terminator may straddle what arrives next
            await self._more()
        data = bytes(buffer[:match.start()])
        del buffer[:match.end()]
        return data

    async def _read_line(self) -> bytes:
        return (await self._read_until(_LINE_END, MAX_LINE_BYTES, "line")).rstrip(b"\r")

    async def _read_to_end(self, max_body: int) -> tuple[bytes, bool]:
        buffer = self.buffer
        while not self.ended and len(buffer) <= max_body:
            await self._wait()
        if len(buffer) <= max_body and self.error is not None:
            raise TransportError(_describe(self.error))  # a reset: the end of the body is unknown
        body = bytes(buffer[:max_body])
        truncated = len(buffer) > max_body
        buffer.clear()
        return body, truncated

    async def _read_chunked(self, max_body: int) -> tuple[bytes, bool]:
        parts: list[bytes] = []
        size = 0
        while True:
            match = _CHUNK_SIZE.fullmatch(await self._read_line())
            if match is None:
                raise ProtocolError("invalid chunk size")
            chunk_size = int(match[1], 16)
            if chunk_size == 0:
                break
            room = max_body - size
            if chunk_size > room:
                parts.append(await self._read_exact(room))
                return b"".join(parts), True
            parts.append(await self._read_exact(chunk_size))
            size += chunk_size
            if await self._read_line():
                raise ProtocolError("chunk data longer than its size")
        while await self._read_line():
            pass  # trailer fields: not needed
        return b"".join(parts), False

    async def read_response(self, method: str, max_body: int) -> tuple[Response, bool]:
        """(the response, whether the connection may carry another request)."""
        while True:
            minor, status, headers = _parse_head(await self._read_until(_HEAD_END, MAX_HEAD_BYTES,
                                                                          "response head"))
            if status >= 200 or status == 101:
                break  # other 1xx are interim (100 Continue, 103 Early Hints): the answer follows
        connection = headers.get("connection", "").lower()
        keep = "close" not in connection if minor == 1 else "keep-alive" in connection
        if method == "HEAD" or status in (204, 304) or status < 200:
            return Response(status, headers, b"", False), keep and status != 101
        transfer_encoding = headers.get("transfer-encoding")
        length = headers.get("content-length")
        if transfer_encoding is not None:
            if transfer_encoding.lower().rsplit(",", 1)[-1].strip() != "chunked":
                body, truncated = await self._read_to_end(max_body)
                return Response(status, headers, body, truncated), False
            body, truncated = await self._read_chunked(max_body)
            # Both framings in one response (RFC 9112 6.3): chunked wins, and the connection goes.
            return Response(status, headers, body, truncated), keep and not truncated and length is None
        if length is None:
            body, truncated = await self._read_to_end(max_body)
            return Response(status, headers, body, truncated), False
        size = _content_length(length)
        body = await self._read_exact(min(size, max_body))
        truncated = size > max_body
        return Response(status, headers, body, truncated), keep and not truncated


class _Pool:
    """The idle connections of one event loop, per origin, most recently used last."""

    def __init__(self) -> None:
        self._idle: dict[Origin, deque[_Connection]] = {}
        self.closed = False
        self._sweeper: asyncio.Task[None] | None = None

    def take(self, origin: Origin) -> _Connection | None:
        stack = self._idle.get(origin)
        if not stack:
            return None
        fresh_since = time.monotonic() - IDLE_SECONDS
        while stack:
            connection = stack.pop()
            if connection.usable and connection.idle_since > fresh_since:
                connection.idle = False
                return connection
            connection.close()  # and every one below it is older still
        return None

    def put(self, origin: Origin, connection: _Connection) -> None:
        if self.closed:
            connection.close()
            return
        connection.idle = True
        connection.idle_since = time.monotonic()
        stack = self._idle.get(origin)
        if stack is None:
            stack = self._idle[origin] = deque()
        stack.append(connection)
        if len(stack) > MAX_IDLE_PER_ORIGIN:
            stack.popleft().close()
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
            self._sweeper.add_done_callback(self._sweeper_done)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            fresh_since = time.monotonic() - IDLE_SECONDS
            for origin, stack in list(self._idle.items()):
                kept: deque[_Connection] = deque()
                for connection in stack:
                    if connection.usable and connection.idle_since > fresh_since:
                        kept.append(connection)
                    else:
                        connection.close()
                if kept:
                    self._idle[origin] = kept
                else:
                    del self._idle[origin]
            if not self._idle:
                self._sweeper = None  # now, not in a done callback: a put() may follow at once
                return

    def _sweeper_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            self.close()  # the loop is shutting down: close while it still runs

    def close(self) -> None:
        self.closed = True
        for stack in self._idle.values():
            for connection in stack:
                connection.close()
        self._idle.clear()
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.cancel()


class Client:
    """Sends requests over pooled connections (see the module docstring). Each event loop that
    uses an instance gets a pool of its own."""

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl_context = ssl_context
        self._pools: dict[asyncio.AbstractEventLoop, _Pool] = {}

    def _tls(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            # certifi's CAs: what httpx trusted for these deliveries, and bundled in the binary with it.
            context = ssl.create_default_context(cafile=certifi.where())
            context.set_alpn_protocols(["http/1.1"])
            self._ssl_context = context
        return self._ssl_context

    def _pool(self) -> _Pool:
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None or pool.closed:
            # Forget pools of loops that are gone (their connections are never touched again).
            for other in [other for other, p in self._pools.items() if p.closed or other.is_closed()]:
                del self._pools[other]
            pool = self._pools[loop] = _Pool()
        return pool

    async def send(self, origin: Origin, request: Request, *, max_body: int) -> Response:
        """Send `request` to `origin` and read the response, its body up to `max_body` bytes."""
        pool = self._pool()
        connection = pool.take(origin)
        if connection is not None:
            try:
                return await self._exchange(pool, origin, connection, request, max_body, reused=True)
            except _StaleConnection:
                pass  # once more on a new connection (see the module docstring)
        return await self._exchange(pool, origin, await self._connect(origin), request, max_body, reused=False)

    async def _connect(self, origin: Origin) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = self._tls() if origin.scheme == "https" else None
        try:
            _, connection = await loop.create_connection(
                _Connection, origin.address, origin.port, ssl=tls,
                server_hostname=origin.server_name if tls is not None else None)
        except OSError as exc:  # includes TLS handshake and certificate errors
            raise ConnectFailed(_describe(exc)) from exc
        return connection

    @staticmethod
    async def _exchange(pool: _Pool, origin: Origin, connection: _Connection, request: Request, max_body: int, *,
                        reused: bool) -> Response:
        try:
            connection.answered = False
            assert connection.transport is not None
            connection.transport.write(request.data)
            response, reusable = await connection.read_response(request.method, max_body)
        except (IncompleteResponse, TransportError) as exc:
            connection.close()
            if reused and not connection.answered:
                raise _StaleConnection from exc
            raise
        except BaseException:  # a protocol error, or the caller's deadline cancelled us
            connection.close()
            raise
        if reusable and not request.close and connection.usable:
            pool.put(origin, connection)
        else:
            connection.close()
        return response

    async def aclose(self) -> None:
        """Close the idle connections of the running loop's pool; connections in use close when
        their exchange ends."""
        pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            pool.close()
