"""A fast loopback buyer for delivery benchmarks and the crash-safety test.

A raw asyncio protocol (uvloop when installed), HTTP/1.1 with keep-alive: every request to any
path but the control paths below is answered at once with `200 {"id": "B-<n>"}` (optionally
after `--delay-ms`), and its `Idempotency-Key` header is recorded with its arrival time,
`time.monotonic()` (CLOCK_MONOTONIC on Linux: comparable with the same clock in other processes
on the machine). Requests without the header are counted as `noKey`.

Control paths (same port):
    GET  /_buyer/stats   {"requests", "keys", "duplicates", "noKey", "first", "last"}
    GET  /_buyer/keys    {"keys": {key: [arrival, ...]}}   (every arrival of every key)
    POST /_buyer/reset   forget everything

Run as a subprocess (one process; pin it with taskset or sched_setaffinity if you like):

    python -m bench.buyer --port 8091 [--delay-ms 0] [--host 127.0.0.1]

The parser is deliberately small: request heads up to 64 KiB, bodies by Content-Length (what
httpx sends); a chunked request or a malformed head gets a 400 and the connection is closed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time

_MAX_HEAD = 64 * 1024


class Ledger:
    """What the buyer has seen, by Idempotency-Key."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.keys: dict[str, list[float]] = {}
        self.requests = 0
        self.no_key = 0
        self.duplicates = 0
        self.first = 0.0
        self.last = 0.0

    def record(self, key: str | None, at: float) -> None:
        self.requests += 1
        if not self.first:
            self.first = at
        self.last = at
        if key is None:
            self.no_key += 1
            return
        seen = self.keys.get(key)
        if seen is None:
            self.keys[key] = [at]
        else:
            seen.append(at)
            self.duplicates += 1

    def stats(self) -> dict:
        return {"requests": self.requests, "keys": len(self.keys), "duplicates": self.duplicates,
                "noKey": self.no_key, "first": self.first, "last": self.last}


def response(status: str, body: bytes, close: bool = False) -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            + ("Connection: close\r\n" if close else "") + "\r\n")
    return head.encode("latin-1") + body


class RequestReader(asyncio.Protocol):
    """The small HTTP/1.1 request reader both loopback buyers share (bench/bidders.py too): it reads
    heads and Content-Length bodies off a kept-alive connection and hands each request to
    `answer(method, target, key, close, body)`, `key` its Idempotency-Key. `keeps_body` False:
    the body is skipped (b"" given), which the fast buyer wants."""

    __slots__ = ("transport", "buf", "body", "need", "pending", "closing")
    keeps_body = False

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.body = b""
        self.need = -1  # body bytes still to read for the request being read; -1: reading a head
        self.pending: tuple[str, str, str | None, bool] | None = None
        self.closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        while buf and not self.closing:
            if self.need >= 0:  # inside a body
                if len(buf) < self.need:
                    if self.keeps_body:
                        self.body += buf
                    self.need -= len(buf)
                    buf = b""
                    break
                if self.keeps_body:
                    self.body += buf[:self.need]
                buf = buf[self.need:]
                self.need = -1
                self._complete()
                continue
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    self._fail()
                    return
                break
            head, buf = buf[:end], buf[end + 4:]
            if not self._parse_head(head):
                return
        self.buf = buf

    def _parse_head(self, head: bytes) -> bool:
        lines = head.split(b"\r\n")
        try:
            method, target, _version = lines[0].decode("latin-1").split(" ", 2)
        except ValueError:
            self._fail()
            return False
        key = None
        length = 0
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            lname = name.strip().lower()
            if lname == b"idempotency-key":
                key = value.strip().decode("latin-1")
            elif lname == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    self._fail()
                    return False
            elif lname == b"transfer-encoding":
                self._fail()
                return False
            elif lname == b"connection" and b"close" in value.lower():
                close = True
        self.pending = (method, target, key, close)
        self.body = b""
        self.need = length
        if length == 0:
            self.need = -1
            self._complete()
        return True

    def _complete(self) -> None:
        assert self.pending is not None
        method, target, key, close = self.pending
        self.pending = None
        self.answer(method, target, key, close, self.body)

    def answer(self, method: str, target: str, key: str | None, close: bool, body: bytes) -> None:
        raise NotImplementedError

    def send(self, payload: bytes, close: bool) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(payload)
        if close:
            self.closing = True
            transport.close()

    def _fail(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.write(response("400 Bad Request", b'{"error":"bad request"}', True))
            self.transport.close()


class BuyerProtocol(RequestReader):
    __slots__ = ("ledger", "delay")

    def __init__(self, ledger: Ledger, delay: float) -> None:
        super().__init__()
        self.ledger = ledger
        self.delay = delay

    def answer(self, method: str, target: str, key: str | None, close: bool, body: bytes) -> None:
        ledger = self.ledger
        if target.startswith("/_buyer/"):
            if target == "/_buyer/stats":
                answer = json.dumps(ledger.stats()).encode()
            elif target == "/_buyer/keys":
                answer = json.dumps({"keys": ledger.keys}, separators=(",", ":")).encode()
            elif target == "/_buyer/reset" and method == "POST":
                ledger.reset()
                answer = b'{"ok":true}'
            else:
                answer = b'{"error":"unknown control path"}'
            self.send(response("200 OK", answer, close), close)
            return
        ledger.record(key, time.monotonic())
        payload = response("200 OK", b'{"id":"B-%d"}' % ledger.requests, close)
        if self.delay > 0:
            asyncio.get_running_loop().call_later(self.delay, self.send, payload, close)
        else:
            self.send(payload, close)


async def serve(host: str, port: int, delay: float) -> None:
    loop = asyncio.get_running_loop()
    ledger = Ledger()
    server = await loop.create_server(lambda: BuyerProtocol(ledger, delay), host, port, backlog=2048,
                                      reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.buyer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="answer each delivery after this many ms")
    args = parser.parse_args(argv)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    runner(serve(args.host, args.port, args.delay_ms / 1000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
