"""A small HTTP/1.1 load client: N keep-alive connections over raw asyncio transports.

Each connection sends one request, waits for the whole response, records latency and status,
and sends the next one straight from the protocol callback (no task switch per request). A run
stops by itself: after `duration` seconds, or after `requests` responses (bounded by
`max_duration`), and a request that takes longer than `timeout` counts as an error.

Only 2xx answers count as work done: `ok`, `rps` and the latencies are theirs. Any other answer
(a fast 429 or 503 would inflate a rate) is counted apart in `non_2xx` and `statuses`, and makes
the CLI exit 1, as errors do.

    from bench.loadgen import Request, run_load
    result = run_load("http://127.0.0.1:8080/api/v1/campaigns", connections=64, duration=10,
                      request=Request(headers={"X-API-Key": key}))
    print(result.summary())

Requests vary with `factory(n) -> Request` (n counts requests within one client process), e.g.
a submit benchmark sending a different body each time. `processes=P` runs the connections in P
separate client processes (spawned: a factory must be a module-level function).

CLI:  python -m bench.loadgen URL -c 64 -d 10 -H 'X-API-Key: ...'
      python -m bench.loadgen --selftest        # the client's own ceiling vs a trivial server
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

__all__ = ["Request", "LoadResult", "run_load", "run_load_async", "encode_request", "wait_for_port"]


@dataclass(frozen=True)
class Request:
    method: str = "GET"
    path: str = "/"  # path and query
    headers: Mapping[str, str] | Sequence[tuple[str, str]] = ()
    body: bytes = b""


RequestFactory = Callable[[int], Request]


def encode_request(req: Request, host: str) -> bytes:
    """The request as bytes on the wire (Host and Content-Length added unless given)."""
    items = list(req.headers.items()) if isinstance(req.headers, Mapping) else list(req.headers)
    names = {k.lower() for k, _ in items}
    lines = [f"{req.method} {req.path} HTTP/1.1"]
    if "host" not in names:
        lines.append(f"Host: {host}")
    lines.extend(f"{k}: {v}" for k, v in items)
    if "content-length" not in names and (req.body or req.method in ("POST", "PUT", "PATCH")):
        lines.append(f"Content-Length: {len(req.body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + req.body


# ---- results ------------------------------------------------------------------------------------

@dataclass
class LoadResult:
    url: str
    connections: int
    elapsed: float  # seconds from the first request sent to the last response received
    latencies: array = field(default_factory=lambda: array("d"), repr=False)  # seconds, of the 2xx answers
    statuses: dict[int, int] = field(default_factory=dict)  # every answer
    errors: dict[str, int] = field(default_factory=dict)
    bytes_received: int = 0
    client_cpu: float = 0.0  # CPU seconds used by the client process(es) during the run
    processes: int = 1

    @property
    def ok(self) -> int:
        """2xx answers: the only ones a rate or a latency counts."""
        return len(self.latencies)

    @property
    def non_2xx(self) -> int:
        """Answers of any other status, counted apart."""
        return sum(self.statuses.values()) - self.ok

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def rps(self) -> float:
        return self.ok / self.elapsed if self.elapsed > 0 else 0.0

    def percentile(self, p: float) -> float:
        """Nearest-rank percentile in seconds (0 <= p <= 100)."""
        if not self.latencies:
            return float("nan")
        ordered = self._sorted()
        rank = max(1, min(len(ordered), int(-(-p * len(ordered) // 100))))
        return ordered[rank - 1]

    def _sorted(self) -> list[float]:
        cached = getattr(self, "_sorted_cache", None)
        if cached is None or len(cached) != len(self.latencies):
            cached = sorted(self.latencies)
            object.__setattr__(self, "_sorted_cache", cached)
        return cached

    @property
    def p50(self) -> float:
        return self.percentile(50)

    @property
    def p90(self) -> float:
        return self.percentile(90)

    @property
    def p99(self) -> float:
        return self.percentile(99)

    @property
    def max(self) -> float:
        return self._sorted()[-1] if self.latencies else float("nan")

    @property
    def mean(self) -> float:
        return sum(self.latencies) / len(self.latencies) if self.latencies else float("nan")

    def to_dict(self) -> dict[str, Any]:
        ms = lambda s: round(s * 1000, 3)  # noqa: E731
        return {
            "url": self.url, "connections": self.connections, "processes": self.processes,
            "elapsed_s": round(self.elapsed, 3), "ok": self.ok, "non_2xx": self.non_2xx, "rps": round(self.rps, 1),
            "latency_ms": {"mean": ms(self.mean), "p50": ms(self.p50), "p90": ms(self.p90),
                           "p99": ms(self.p99), "max": ms(self.max)},
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "errors": dict(self.errors), "bytes_received": self.bytes_received,
            "client_cpu_pct": round(100 * self.client_cpu / self.elapsed, 1) if self.elapsed else 0.0,
        }

    def summary(self) -> str:
        d = self.to_dict()
        lat = d["latency_ms"]
        return (f"{d['ok']} 2xx answers in {d['elapsed_s']} s over {self.connections} connections: "
                f"{d['rps']} req/s; latency ms p50 {lat['p50']} p90 {lat['p90']} p99 {lat['p99']} max {lat['max']}; "
                f"non-2xx {d['non_2xx']}; statuses {d['statuses']}; errors {d['errors'] or 0}; "
                f"client CPU {d['client_cpu_pct']}%")

    @classmethod
    def merge(cls, parts: Sequence["LoadResult"]) -> "LoadResult":
        merged = cls(url=parts[0].url, connections=sum(p.connections for p in parts),
                     elapsed=max(p.elapsed for p in parts), processes=len(parts))
        for p in parts:
            merged.latencies.extend(p.latencies)
            merged.bytes_received += p.bytes_received
            merged.client_cpu += p.client_cpu
            for k, v in p.statuses.items():
                merged.statuses[k] = merged.statuses.get(k, 0) + v
            for k, v in p.errors.items():
                merged.errors[k] = merged.errors.get(k, 0) + v
        return merged


# ---- the client ---------------------------------------------------------------------------------

_HEAD, _LENGTH, _CHUNKED, _UNTIL_CLOSE, _IDLE = range(5)
_MAX_HEAD = 64 * 1024


class _Run:
    """Shared state of one client process's run: when to stop, what to send, what was seen."""

    def __init__(self, loop: asyncio.AbstractEventLoop, host: str, port: int, hostname: str,
                 request: Request | None, factory: RequestFactory | None, requests: int | None,
                 timeout: float) -> None:
        self.loop = loop
        self.host, self.port = host, port
        self.static = encode_request(request, hostname) if factory is None else None
        self.factory = factory
        self.hostname = hostname
        self.head_only = (request.method if request else "") == "HEAD"
        self.budget = requests if requests is not None else -1  # -1: no request limit
        self.deadline = float("inf")
        self.timeout = timeout
        self.stopping = False
        self.counter = 0
        self.latencies = array("d")
        self.statuses: dict[int, int] = {}
        self.errors: dict[str, int] = {}
        self.bytes_received = 0
        self.first_sent = 0.0
        self.last_done = 0.0
        self.conns: list[_Conn] = []
        self.tasks: set[asyncio.Task] = set()  # reconnections under way
        self.live = 0
        self.done: asyncio.Future = loop.create_future()

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def next_request(self) -> bytes | None:
        if self.stopping:
            return None
        if time.perf_counter() >= self.deadline:
            self.stopping = True
            return None
        if self.budget == 0:
            self.stopping = True
            return None
        if self.budget > 0:
            self.budget -= 1
        if self.static is not None:
            return self.static
        n = self.counter
        self.counter += 1
        return encode_request(self.factory(n), self.hostname)  # type: ignore[misc]

    def conn_finished(self) -> None:
        self.live -= 1
        if self.live <= 0 and not self.done.done():
            self.done.set_result(None)

    async def connect(self, conn: "_Conn") -> bool:
        try:
            await self.loop.create_connection(lambda: conn, self.host, self.port)
            return True
        except OSError as exc:
            self.error(f"connect:{type(exc).__name__}")
            return False

    def reconnect(self, conn: "_Conn") -> None:
        async def again() -> None:
            while not self.stopping and time.perf_counter() < self.deadline:
                fresh = _Conn(self)
                if await self.connect(fresh):
                    self.conns.append(fresh)
                    fresh.send_next()
                    return
                await asyncio.sleep(0.01)
            self.conn_finished()

        task = self.loop.create_task(again())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def shutdown(self) -> None:
        self.stopping = True
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        for conn in self.conns:
            if conn.transport is not None:
                conn.transport.abort()
        await asyncio.sleep(0)  # let the transports close before the loop does

    def watchdog(self) -> None:
        now = time.perf_counter()
        if self.stopping or now >= self.deadline:
            self.stopping = True
            grace = self.timeout
        else:
            grace = None
        for conn in list(self.conns):
            if conn.in_flight and now - conn.sent_at > self.timeout:
                conn.fail("timeout")
            elif grace is not None and not conn.in_flight and not conn.finished:
                conn.finish()
        self.conns = [c for c in self.conns if not c.finished]
        if not self.done.done():
            self.loop.call_later(0.05, self.watchdog)


class _Conn(asyncio.Protocol):
    __slots__ = ("run", "transport", "buf", "state", "remaining", "status", "keep_alive",
                 "sent_at", "in_flight", "finished", "nbytes")

    def __init__(self, run: _Run) -> None:
        self.run = run
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.state = _IDLE
        self.remaining = 0
        self.status = 0
        self.keep_alive = True
        self.sent_at = 0.0
        self.in_flight = False
        self.finished = False
        self.nbytes = 0

    # life cycle

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send_next(self) -> None:
        data = self.run.next_request()
        if data is None:
            self.finish()
            return
        self.state = _HEAD
        self.in_flight = True
        self.nbytes = 0
        self.sent_at = now = time.perf_counter()
        if not self.run.first_sent:
            self.run.first_sent = now
        self.transport.write(data)  # type: ignore[union-attr]

    def finish(self) -> None:
        """No more requests on this connection: close it and tell the run."""
        if self.finished:
            return
        self.finished = True
        self.in_flight = False
        if self.transport is not None:
            self.transport.close()
        self.run.conn_finished()

    def fail(self, kind: str) -> None:
        """The request in flight failed: count it, drop the connection, open a new one."""
        if self.finished:
            return
        self.run.error(kind)
        self.finished = True
        self.in_flight = False
        if self.transport is not None:
            self.transport.abort()
        self.run.reconnect(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.finished:
            return
        if self.in_flight and self.state == _UNTIL_CLOSE:
            self.keep_alive = False
            self._complete()  # the body ran to the close; _complete reconnects
            return
        if self.in_flight:
            self.fail("connection_lost")
            return
        self.finished = True
        self.run.reconnect(self)

    # parsing

    def data_received(self, data: bytes) -> None:
        self.nbytes += len(data)
        while data:
            state = self.state
            if state == _LENGTH:
                n = len(data)
                if n < self.remaining:
                    self.remaining -= n
                    return
                data = data[self.remaining:]
                self._complete()
            elif state == _HEAD:
                if self.buf:
                    self.buf += data
                    data = bytes(self.buf)
                    self.buf = bytearray()
                end = data.find(b"\r\n\r\n")
                if end < 0:
                    if len(data) > _MAX_HEAD:
                        self.fail("bad_response")
                        return
                    self.buf += data
                    return
                if not self._parse_head(data[:end]):
                    return
                data = data[end + 4:]
                if self.state == _HEAD:  # 1xx, or a response without a body
                    if self.status >= 200:
                        self._complete()
            elif state == _CHUNKED:
                self.buf += data
                data = b""
                self._parse_chunks()
            elif state == _UNTIL_CLOSE:
                return
            else:  # bytes nobody asked for
                self.fail("unsolicited_data")
                return

    def _parse_head(self, head: bytes) -> bool:
        try:
            first = head.split(b"\r\n", 1)[0]
            version, status = first[:8], int(first[9:12])
        except ValueError:
            self.fail("bad_response")
            return False
        self.status = status
        lower = head.lower()
        self.keep_alive = version == b"HTTP/1.1"
        at = lower.find(b"\r\nconnection:")
        if at >= 0:
            value = lower[at + 13:lower.find(b"\r\n", at + 2) if lower.find(b"\r\n", at + 2) >= 0 else None]
            if b"close" in value:
                self.keep_alive = False
            elif b"keep-alive" in value:
                self.keep_alive = True
        if status < 200:
            self.state = _HEAD  # informational: the real response follows
            return True
        if status in (204, 304) or self.run.head_only:
            self.state = _HEAD
            return True
        at = lower.find(b"\r\ntransfer-encoding:")
        if at >= 0:
            end = lower.find(b"\r\n", at + 2)
            if b"chunked" in lower[at:end if end >= 0 else None]:
                self.state = _CHUNKED
                return True
        at = lower.find(b"\r\ncontent-length:")
        if at >= 0:
            end = lower.find(b"\r\n", at + 2)
            try:
                length = int(lower[at + 17:end if end >= 0 else None])
            except ValueError:
                self.fail("bad_response")
                return False
            if length == 0:
                self.state = _HEAD
            else:
                self.state, self.remaining = _LENGTH, length
            return True
        self.state = _UNTIL_CLOSE
        self.keep_alive = False
        return True

    def _parse_chunks(self) -> None:
        buf = self.buf
        pos = 0
        while True:
            if self.remaining > 0:  # inside a chunk's data (+ its CRLF)
                take = min(self.remaining, len(buf) - pos)
                pos += take
                self.remaining -= take
                if self.remaining:
                    break
                continue
            line_end = buf.find(b"\r\n", pos)
            if line_end < 0:
                break
            try:
                size = int(bytes(buf[pos:line_end]).split(b";", 1)[0].strip(), 16)
            except ValueError:
                self.fail("bad_chunk")
                return
            if size == 0:
                trailers_end = buf.find(b"\r\n\r\n", line_end)
                if buf[line_end:line_end + 4] == b"\r\n\r\n" or trailers_end >= 0:
                    end = line_end + 4 if buf[line_end:line_end + 4] == b"\r\n\r\n" else trailers_end + 4
                    leftover = bytes(buf[end:])
                    self.buf = bytearray()
                    self._complete()
                    if leftover:
                        self.data_received(leftover)
                    return
                break
            pos = line_end + 2
            self.remaining = size + 2
        del buf[:pos]

    def _complete(self) -> None:
        now = time.perf_counter()
        run = self.run
        if 200 <= self.status < 300:
            run.latencies.append(now - self.sent_at)
        run.statuses[self.status] = run.statuses.get(self.status, 0) + 1
        run.bytes_received += self.nbytes
        run.last_done = now
        self.in_flight = False
        self.state = _IDLE
        self.remaining = 0
        if self.keep_alive:
            self.send_next()
        else:
            self.finished = True
            if self.transport is not None:
                self.transport.close()
            if not run.stopping:
                run.reconnect(self)
            else:
                run.conn_finished()


def _split_url(url: str) -> tuple[str, int, str, str]:
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise ValueError("only http:// URLs are supported")
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 80
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    hostname = f"{host}:{port}" if parts.port else host
    return host, port, path, hostname


async def run_load_async(url: str, *, connections: int = 64, duration: float | None = 10.0,
                         requests: int | None = None, request: Request | None = None,
                         factory: RequestFactory | None = None, timeout: float = 10.0,
                         max_duration: float = 600.0, _ready: Callable[[], None] | None = None) -> LoadResult:
    """Run the load in the current event loop. `request.path` defaults to the URL's path; with a
    `factory` each request comes from `factory(n)` instead."""
    host, port, path, hostname = _split_url(url)
    if request is None:
        request = Request(path=path)
    elif request.path == "/" and path != "/":
        request = Request(request.method, path, request.headers, request.body)
    if duration is None and requests is None:
        raise ValueError("give a duration or a request count")
    loop = asyncio.get_running_loop()
    run = _Run(loop, host, port, hostname, request, factory, requests, timeout)
    conns = [_Conn(run) for _ in range(connections)]
    connected = await asyncio.gather(*(run.connect(c) for c in conns))
    run.conns = [c for c, ok in zip(conns, connected) if ok]
    if not run.conns:
        return LoadResult(url=url, connections=connections, elapsed=0.0, errors=run.errors)
    if _ready is not None:
        _ready()  # a multi-process run waits here for its siblings
    cpu0 = time.process_time()
    start = time.perf_counter()
    run.deadline = start + (duration if duration is not None else max_duration)
    run.live = len(run.conns)
    loop.call_later(0.05, run.watchdog)
    for c in run.conns:
        c.send_next()
    try:
        await asyncio.wait_for(asyncio.shield(run.done), (duration or max_duration) + timeout + 5)
    except asyncio.TimeoutError:
        run.error("run_timeout")
    await run.shutdown()
    end = run.last_done or time.perf_counter()
    return LoadResult(url=url, connections=connections, elapsed=max(end - (run.first_sent or start), 1e-9),
                      latencies=run.latencies, statuses=run.statuses, errors=run.errors,
                      bytes_received=run.bytes_received, client_cpu=time.process_time() - cpu0)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


def _run_in_new_loop(coro_fn: Callable[[], Any]) -> Any:
    loop = _new_loop()
    try:
        return loop.run_until_complete(coro_fn())
    finally:
        loop.close()


def _worker(kwargs: dict[str, Any], barrier: Any, out: Any) -> None:
    try:
        result = _run_in_new_loop(lambda: run_load_async(**kwargs, _ready=lambda: barrier.wait(30)))
        out.put(("ok", result))
    except BaseException as exc:  # reported to the parent, which raises
        try:
            barrier.abort()
        except Exception:
            pass
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def run_load(url: str, *, connections: int = 64, duration: float | None = 10.0, requests: int | None = None,
             request: Request | None = None, factory: RequestFactory | None = None, timeout: float = 10.0,
             processes: int = 1, max_duration: float = 600.0) -> LoadResult:
    """Blocking entry point. processes=1 runs in this process on a fresh (uv)loop; processes>1
    spreads the connections (and a request budget) over spawned client processes started together."""
    kwargs = dict(url=url, duration=duration, request=request, factory=factory, timeout=timeout,
                  max_duration=max_duration)
    if processes <= 1:
        return _run_in_new_loop(lambda: run_load_async(connections=connections, requests=requests, **kwargs))
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    out = ctx.Queue()
    procs = []
    for i in range(processes):
        share = connections // processes + (1 if i < connections % processes else 0)
        budget = None if requests is None else requests // processes + (1 if i < requests % processes else 0)
        p = ctx.Process(target=_worker, args=({**kwargs, "connections": share, "requests": budget}, barrier, out),
                        daemon=True)
        p.start()
        procs.append(p)
    parts, problems = [], []
    try:
        limit = (duration or max_duration) + timeout + 60
        for _ in procs:
            kind, value = out.get(timeout=limit)
            (parts if kind == "ok" else problems).append(value)
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    if problems:
        raise RuntimeError("load client process failed: " + "; ".join(problems))
    return LoadResult.merge(parts)


# ---- helpers for benchmark scripts -------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, host: str = "127.0.0.1", timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    """Until something accepts connections on host:port (raises if `proc` exits first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout} s")


# ---- a trivial server: the client's own ceiling ------------------------------------------------

def serve_trivial(port: int, body_size: int = 2) -> None:
    """The cheapest possible keep-alive HTTP server (raw protocol, fixed response): load against it
    measures the client, not the server. Runs until killed."""
    body = (b"{" + b" " * max(0, body_size - 2) + b"}") if body_size >= 2 else b"{}"
    response = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode() + b"\r\n\r\n" + body)

    class Trivial(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            self.buf = b""

        def data_received(self, data: bytes) -> None:
            buf = self.buf + data
            count = buf.count(b"\r\n\r\n")  # GET only: every head ends a request
            if count:
                self.transport.write(response * count)  # type: ignore[attr-defined]
                buf = buf[buf.rfind(b"\r\n\r\n") + 4:]
            self.buf = buf

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Trivial, "127.0.0.1", port, backlog=1024)
        async with server:
            await server.serve_forever()

    _run_in_new_loop(main)


def selftest(duration: float, connections: int, body_size: int, processes: int = 1) -> LoadResult:
    """Load against serve_trivial in a subprocess. With 2+ CPUs the server is pinned to one and
    the client to the others, so the figure is the client's ceiling on one core."""
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu = {cpus[0]} if len(cpus) >= 2 else None
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "bench.loadgen", "--trivial-server", str(port),
                               "--body-size", str(body_size)],
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              preexec_fn=(lambda: os.sched_setaffinity(0, server_cpu)) if server_cpu else None)
    old = os.sched_getaffinity(0)
    try:
        wait_for_port(port, proc=server)
        if server_cpu:
            os.sched_setaffinity(0, set(cpus[1:]))
        url = f"http://127.0.0.1:{port}/"
        run_load(url, connections=connections, duration=1.0, processes=processes)  # warm-up
        return run_load(url, connections=connections, duration=duration, processes=processes)
    finally:
        os.sched_setaffinity(0, old)
        server.kill()
        server.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__.split("\n\n")[0])
    parser.add_argument("url", nargs="?")
    parser.add_argument("-c", "--connections", type=int, default=64)
    parser.add_argument("-d", "--duration", type=float, default=10.0, help="seconds (ignored with -n)")
    parser.add_argument("-n", "--requests", type=int, default=None, help="stop after this many responses")
    parser.add_argument("-m", "--method", default="GET")
    parser.add_argument("-H", "--header", action="append", default=[], help="'Name: value' (repeatable)")
    parser.add_argument("--body-file", help="request body read from this file")
    parser.add_argument("--timeout", type=float, default=10.0, help="per-request timeout in seconds")
    parser.add_argument("-p", "--processes", type=int, default=1, help="client processes")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--selftest", action="store_true", help="measure the client against a trivial server")
    parser.add_argument("--body-size", type=int, default=2, help="selftest / trivial server response body bytes")
    parser.add_argument("--trivial-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.trivial_server:
        serve_trivial(args.trivial_server, args.body_size)
        return 0
    if args.selftest:
        result = selftest(args.duration, args.connections, args.body_size, args.processes)
    else:
        if not args.url:
            parser.error("a URL is required")
        headers = []
        for h in args.header:
            name, _, value = h.partition(":")
            headers.append((name.strip(), value.strip()))
        body = open(args.body_file, "rb").read() if args.body_file else b""
        _, _, path, _ = _split_url(args.url)
        result = run_load(args.url, connections=args.connections,
                          duration=None if args.requests else args.duration, requests=args.requests,
                          request=Request(args.method.upper(), path, headers, body),
                          timeout=args.timeout, processes=args.processes)
    print(json.dumps(result.to_dict(), indent=2) if args.json else result.summary())
    return 0 if not result.errors and not result.non_2xx else 1


if __name__ == "__main__":
    sys.exit(main())
