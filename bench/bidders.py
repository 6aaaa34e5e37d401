"""Loopback auction buyers for bench/auction.py: N buyers in one process, each on its own port.

A raw asyncio HTTP/1.1 server per buyer (uvloop when installed, keep-alive), on bench/buyer.py's
request reader, all on one event loop:

    POST /ping   answered after `--delay-ms` (5) with `200 {"bid": x, "token": "b<i>-<n>"}`, x a random
                 bid in [--min-bid, --max-bid) rounded to cents; a buyer listed in `--never` reads
                 its pings and never answers them (the connection stays open until the caller
                 drops it)
    POST /post   (any other path) answered at once with `200 {"status": "accepted", "id": "P-<n>"}`;
                 its `Idempotency-Key` (the appliance's submission id) is recorded with its
                 arrival time (time.monotonic(): CLOCK_MONOTONIC, comparable across processes)
                 and the `token` field of its JSON body (the ping token the post carries back)

Control paths on the control port (`--control-port`):
    GET  /_bidders/stats   per buyer: pings, answered, posts, keys, duplicates, noKey, open
                           connections, and how late the 5 ms timer fired (p50/p99/max ms)
    GET  /_bidders/posts   {"buyers": [{key: [[arrival, token], ...]}, ...]}  (every post)
    POST /_bidders/reset   forget everything

    python -m bench.bidders --ports 8101,8102,... --control-port 8100 [--delay-ms 5] [--never 9]

The parser is deliberately small: heads up to 64 KiB, bodies by Content-Length; anything else
gets a 400 and the connection is closed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import time

from bench.buyer import RequestReader, response

class Bidder:
    """What one buyer has seen."""

    def __init__(self, index: int, never: bool, rng: random.Random, min_bid: float, max_bid: float) -> None:
        self.index, self.never, self.rng = index, never, rng
        self.min_bid, self.max_bid = min_bid, max_bid
        self.connections = 0
        self.reset()

    def reset(self) -> None:
        self.pings = 0
        self.answered = 0
        self.posts: dict[str, list[list]] = {}
        self.post_count = 0
        self.duplicates = 0
        self.no_key = 0
        self.late: list[float] = []  # seconds the answer went out after its due moment

    def ping_answer(self) -> bytes:
        self.pings += 1
        bid = round(self.rng.uniform(self.min_bid, self.max_bid), 2)
        return b'{"bid":%s,"token":"b%d-%d"}' % (repr(bid).encode(), self.index, self.pings)

    def record_post(self, key: str | None, token: str | None, at: float) -> None:
        self.post_count += 1
        if key is None:
            self.no_key += 1
            return
        seen = self.posts.get(key)
        if seen is None:
            self.posts[key] = [[at, token]]
        else:
            seen.append([at, token])
            self.duplicates += 1

    def stats(self) -> dict:
        late = sorted(self.late)

        def q(p: float) -> float | None:
            return round(1000 * late[min(len(late) - 1, int(p * len(late)))], 3) if late else None

        return {"index": self.index, "never": self.never, "pings": self.pings, "answered": self.answered,
                "posts": self.post_count, "keys": len(self.posts), "duplicates": self.duplicates,
                "noKey": self.no_key, "openConnections": self.connections,
                "timerLateMs": {"p50": q(0.50), "p99": q(0.99), "max": round(1000 * late[-1], 3) if late else None}}


class Control:
    def __init__(self, bidders: list[Bidder]) -> None:
        self.bidders = bidders

    def answer(self, method: str, target: str) -> bytes:
        if target == "/_bidders/stats":
            return json.dumps({"buyers": [b.stats() for b in self.bidders]}).encode()
        if target == "/_bidders/posts":
            return json.dumps({"buyers": [b.posts for b in self.bidders]}, separators=(",", ":")).encode()
        if target == "/_bidders/reset" and method == "POST":
            for b in self.bidders:
                b.reset()
            return b'{"ok":true}'
        return b'{"error":"unknown control path"}'


class BidderProtocol(RequestReader):
    __slots__ = ("bidder", "control", "delay")
    keeps_body = True  # a post's body carries the ping token back

    def __init__(self, bidder: Bidder | None, control: Control | None, delay: float) -> None:
        super().__init__()
        self.bidder, self.control, self.delay = bidder, control, delay

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self.bidder is not None:
            self.bidder.connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.bidder is not None:
            self.bidder.connections -= 1

    def answer(self, method: str, target: str, key: str | None, close: bool, body: bytes) -> None:
        if self.control is not None:
            self.send(response("200 OK", self.control.answer(method, target), close), close)
            return
        bidder = self.bidder
        assert bidder is not None
        if target.startswith("/ping"):
            if bidder.never:
                bidder.pings += 1
                return  # never answered: the caller gives up at its deadline
            payload = response("200 OK", bidder.ping_answer(), close)
            due = time.monotonic() + self.delay
            asyncio.get_running_loop().call_later(self.delay, self._answer_ping, payload, close, due)
            return
        token = None
        try:
            token = json.loads(body).get("token")
        except (ValueError, AttributeError):
            pass
        bidder.record_post(key, token, time.monotonic())
        self.send(response("200 OK", b'{"status":"accepted","id":"P-%d"}' % bidder.post_count, close), close)

    def _answer_ping(self, payload: bytes, close: bool, due: float) -> None:
        if self.bidder is not None:
            self.bidder.late.append(time.monotonic() - due)
            self.bidder.answered += 1
        self.send(payload, close)


async def serve(host: str, ports: list[int], control_port: int, delay: float, never: set[int], seed: int,
                min_bid: float, max_bid: float) -> None:
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    bidders = [Bidder(i, i in never, rng, min_bid, max_bid) for i in range(len(ports))]
    control = Control(bidders)
    servers = [await loop.create_server(lambda b=b: BidderProtocol(b, None, delay), host, port, backlog=2048,
                                        reuse_address=True) for b, port in zip(bidders, ports)]
    servers.append(await loop.create_server(lambda: BidderProtocol(None, control, 0.0), host, control_port,
                                            backlog=128, reuse_address=True))
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bidders", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--ports", required=True, help="comma-separated: one buyer per port")
    parser.add_argument("--control-port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=5.0, help="each ping is answered after this many ms")
    parser.add_argument("--never", default="", help="comma-separated buyer indexes that never answer a ping")
    parser.add_argument("--min-bid", type=float, default=5.0)
    parser.add_argument("--max-bid", type=float, default=50.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    ports = [int(p) for p in args.ports.split(",") if p]
    never = {int(i) for i in args.never.split(",") if i}
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    runner(serve(args.host, ports, args.control_port, args.delay_ms / 1000, never, args.seed, args.min_bid,
                 args.max_bid))
    return 0


if __name__ == "__main__":
    sys.exit(main())
