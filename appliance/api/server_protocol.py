"""uvicorn's httptools protocol, with what the server answers by itself shaped like the API.

Stock uvicorn answers a request it cannot parse with a plain-text `400 Invalid HTTP request
received.`, has no deadline for request headers (a connection that never finishes them is held
until the client leaves) and no limit on their size: httptools reads a request line and headers
of any length, and refuses only a request target over 65,535 bytes, once all of it has arrived.
This subclass overrides the few methods where those happen. (Only httptools': it is what uvicorn's
"auto" picks and a hard dependency through uvicorn[standard], so uvicorn's h11 protocol never runs.)

- every refusal is the envelope (`error_body`) with `X-Request-Id` and `Connection: close`;
- a request line and headers over MAX_HEAD_BYTES are a 400;
- the headers of a request must be complete `header_timeout_seconds` after the connection opened
  (after the request's first byte, on a kept-alive connection), else a 408 (or, if nothing
  arrived, a plain close); the body and the response are not timed here;
- at most `max_incomplete_requests` connections may owe headers at once: one more closes the
  connection that has waited longest. Refusing the newcomer instead would let whoever holds the
  slots lock every new client out; a real client finishes its headers within a round trip, so it
  outlasts a flood of stalled ones. Connections idle between kept-alive requests do not count:
  uvicorn closes them after `timeout_keep_alive` (5 s), and they belong to clients that finished
  a request.
- a refusal closes lingering: the answer, then FIN, then whatever the client still sends is read
  and dropped for up to LINGER_SECONDS before the socket closes. Closing a socket that holds
  unread bytes makes the kernel send a reset, which discards the answer from the buffer of a
  client still sending (a dribbled head, a pipelined request) before it reads it.
"""

from __future__ import annotations

import asyncio
import sys

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from appliance.config import ServerConfig
from appliance.errors import JSON, ValidationFailed, error_body
from appliance.ids import request_id

# Request target plus header names and values. Twice what Node and h11 (uvicorn's other parser)
# allow, and under httptools' own 65,535-byte target limit, so that one never answers first.
MAX_HEAD_BYTES = 32 * 1024
TOO_LONG = f"the request line and headers are longer than {MAX_HEAD_BYTES // 1024} KiB"
MADE_ROOM = "closed to make room: too many connections were sending headers"
LINGER_SECONDS = 2.0


def server_protocol(config: ServerConfig) -> type[ServerProtocol]:
    """The class for `uvicorn.run(http=...)`: one per server, holding its `[server]` limits and
    its connections that owe headers."""
    waiting = _Waiting(config.header_timeout_seconds, config.max_incomplete_requests)
    return type("ServerProtocol", (ServerProtocol,), {"waiting": waiting})


class _Waiting:
    """One server's connections that owe a request's headers, with their deadlines. The dict's
    order is their start, so the first is the longest waiting and the next to expire: one timer
    serves them all (a timer per request cost ~2 us of CPU under uvloop, this a dict entry)."""

    def __init__(self, timeout: float, cap: int) -> None:
        self.timeout = timeout
        self.cap = cap
        self.deadlines: dict[ServerProtocol, float] = {}
        self.timer: asyncio.TimerHandle | None = None

    def add(self, protocol: ServerProtocol) -> None:
        if len(self.deadlines) >= self.cap:
            next(iter(self.deadlines))._give_up(MADE_ROOM)
        loop = protocol.loop
        self.deadlines[protocol] = loop.time() + self.timeout
        if self.timer is None:  # else it fires by the first deadline, which is earlier
            self.timer = loop.call_later(self.timeout, self._expire, loop)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        self.timer = None
        now = loop.time() + 0.001  # the loop's clock may round a due deadline down by that much
        while self.deadlines:
            protocol, deadline = next(iter(self.deadlines.items()))
            if deadline > now:
                self.timer = loop.call_at(deadline, self._expire, loop)
                return
            protocol._give_up()  # takes it out of the dict


class _HeadTooLarge(Exception):
    """Raised in a parser callback: httptools stops and uvicorn calls send_400_response."""


def _what_is_wrong(exc: BaseException | None) -> str:
    """`exc` is the HttpParserError uvicorn caught; one raised in a callback carries the cause."""
    cause = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) else None
    if isinstance(cause, _HeadTooLarge):
        return TOO_LONG
    if isinstance(cause, httptools.HttpParserInvalidURLError):
        return "the request target is not a valid URL"  # its text would echo the target
    return f"not valid HTTP/1.1 ({exc})"  # llhttp's reason: a fixed text, never request bytes


class _Cycle(RequestResponseCycle):
    async def send_500_response(self) -> None:
        """uvicorn's answer when the app fails before responding (the app answers its own errors;
        this is for a failure in that answering), with the request id the app logged."""
        rid = self.scope["state"].get("request_id") or request_id()
        body = error_body("INTERNAL_ERROR", f"Internal server error (request {rid})")
        await self.send({"type": "http.response.start", "status": 500, "headers": [
            (b"content-type", JSON.encode()), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"), (b"x-request-id", rid.encode())]})
        await self.send({"type": "http.response.body", "body": body})


class ServerProtocol(HttpToolsProtocol):
    waiting: _Waiting  # set by server_protocol()

    _in_head = False  # the connection owes a request's headers (it is in `waiting`)
    _head_bytes = 0   # of those headers, counted in data_received
    _lingering = False  # refused: what arrives now is dropped until the close

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_done()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # Only a read that starts and ends inside the same unfinished head is counted: those bytes
        # are all head. The read that starts a head is not (it may end the previous request), nor
        # the one that ends it (on_headers_complete measures the whole head).
        if self._lingering:
            return
        scope = self.scope if self._in_head else None
        super().data_received(data)
        if scope is not None and self._in_head and self.scope is scope:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._head_done()
                self._refuse(400, ValidationFailed.code, ValidationFailed.message, TOO_LONG)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._in_head:  # else waiting since the connection opened (its first request)
            self._await_head()

    def on_headers_complete(self) -> None:
        self._head_done()
        if len(self.url) + sum(len(name) + len(value) for name, value in self.headers) > MAX_HEAD_BYTES:
            raise _HeadTooLarge
        cycle = self.cycle
        super().on_headers_complete()
        if self.cycle is not cycle:  # uvicorn made this request's cycle (not a websocket upgrade)
            # Its class is named inside uvicorn's on_headers_complete; switching the instance's
            # class is one store, where overriding would copy that method whole.
            self.cycle.__class__ = _Cycle

    def send_400_response(self, msg: str) -> None:
        # uvicorn calls this inside `except HttpParserError`, which says what was wrong.
        self._head_done()
        self._refuse(400, ValidationFailed.code, ValidationFailed.message, _what_is_wrong(sys.exception()))

    def _await_head(self) -> None:
        self.waiting.add(self)
        self._in_head = True
        self._head_bytes = 0

    def _head_done(self) -> None:
        if self._in_head:
            self._in_head = False
            del self.waiting.deadlines[self]

    def _give_up(self, why: str | None = None) -> None:
        """The headers are late (`why` None) or their slot is needed: a 408, or just a close if
        nothing of a request came."""
        self._head_done()
        if self.scope is None:  # the connection's first request has not begun
            self.transport.close()
        else:
            self._refuse(408, "REQUEST_TIMEOUT", "Request headers not received in time",
                         why or f"the request line and headers did not arrive within {self.waiting.timeout:g} s")

    def _refuse(self, status: int, code: str, message: str, detail: str) -> None:
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and not cycle.more_body:
            # The previous request arrived whole and its response is still being made (pipelining):
            # an answer now would land inside it. Read no more; close once it is sent.
            cycle.keep_alive = False
            self.flow.pause_reading()
            return
        body = error_body(code, message, [f"request: {detail}"])
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"content-type: %s\r\ncontent-length: %d\r\nconnection: close\r\nx-request-id: %s\r\n\r\n"
                    % (JSON.encode(), len(body), request_id().encode()))
        self.transport.write(b"".join(head) + body)
        self._close_lingering()

    def _close_lingering(self) -> None:
        transport = self.transport
        if not transport.can_write_eof():
            transport.close()
            return
        self._lingering = True
        transport.write_eof()  # after the answer is flushed; the client's close then ends it
        self.loop.call_later(LINGER_SECONDS, transport.close)
