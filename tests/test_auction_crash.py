"""Crash safety of a campaign that sells at auction (CONTRACT 9.1 "Durable like delivery"; issue
34 item 4): the machinery of tests/test_crash_safety.py (a real `appliance serve` on SQLite,
SIGKILL at a random moment under submit load, restart, bounded drain, checks through the API),
with an exclusive auction over three real loopback buyers (tests/buyer_server.py, in this
process). The SIGKILL takes the server, its delivery process, or both at once (a machine's
crash): a server killed alone lets its delivery process finish the rounds and posts it holds
before it ends, so the other two kinds are the ones that cut rounds and posts. The buyers:

- `a` and `b` answer every ping at once with a random bid and a token of their own, and accept
  every post (after POST_DELAY s, so that posts are in flight when a kill comes);
- `late` answers every ping with the highest bid, but only after LATE_DELAY s, long after the
  round's deadline (ROUND_MS): every round lasts about ROUND_MS, so a kill of the delivery
  process always cuts rounds, and `late` is always `timeout` and never sold to.

A round cut by a kill was never recorded: the lead is pinged again after the restart and sold
once. A round recorded is never held again: the job was pinned to its winner in the same write,
so a kill between the round and the post, or during the post, posts to that winner (again, with
the same Idempotency-Key). After every cycle, for every lead acknowledged so far:
- qualified -> `delivered`; disqualified (NY) -> never pinged, never posted;
- at least one round recorded; exactly one with a winner, one winner (exclusive), the best bid
  of that round; `late` is `timeout` in every round and each round lasted about its deadline;
- every post of the lead went to that winner, carried `Idempotency-Key: <submissionId>`, the
  round's auctionId, the winning bid and the token the winner gave in that round's ping;
- the ledger has exactly one `revenue` entry for the lead: the winning bid, naming the winner
  (the campaign's `delivered` revenue milestone is replaced by it);
- each bid recorded is a ping the buyer answered; a lead pinged by `a` or `b` more often than
  rounds were recorded had a round cut by a kill (counted: some must occur over the run, and
  some lead must have been posted again after a kill).
SQLite only, as test_crash_safety.py; SEED / CRASH_SEED as there.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
import httpx
import pytest

from tests.buyer_server import BuyerServer, Received, Reply
from tests.conftest import Cli
from tests.processes import alive, running_delivery_pid, stop_process
from tests.test_crash_safety import Acked, Server, _db_check, _open_jobs, kill_under_load

pytestmark = pytest.mark.sqlite_only

SEED = 20261207                # CRASH_SEED overrides it
CYCLES = 4
SUBMITTERS = 2                 # submit tasks; each waits SUBMIT_PAUSE s between submits
SUBMIT_PAUSE = 0.15
KILL_WINDOW = (1.2, 3.5)       # seconds after the first acknowledged submit: rounds and posts in flight
BUDGET_SECONDS = 48.0          # no new cycle (after the first two) starts after this much of the test
CYCLE_RESERVE_SECONDS = 12.0
DRAIN_TIMEOUT = 25.0
AFTER_RESTART = 0.5
ROUND_MS = 1200                # the auction's timeoutMs: the whole round
LATE_DELAY = 4.0               # `late` answers its pings this long after them (never in time)
POST_DELAY = 0.3               # `a` and `b` answer a post this long after it arrived
CAMPAIGN = "AUCX1"
BIDDERS = ("a", "b")
LATE = "late"
WHO = {"server": "the server", "delivery": "the delivery process", "both": "the server and its delivery process"}


@dataclass(frozen=True)
class Ping:
    buyer: str
    lead_id: str
    bid: float
    token: str


class Buyers:
    """The three loopback buyers and every ping they answered, by token."""

    def __init__(self, seed: int) -> None:
        self.servers = {name: BuyerServer() for name in (*BIDDERS, LATE)}
        self.lock = threading.Lock()
        self.rng = random.Random(seed)
        self.pings: dict[str, Ping] = {}
        self.serial = itertools.count(1)

    def start(self) -> None:
        for name, server in self.servers.items():
            server.start()
            server.route("/ping", self._pinged(name))
            server.route("/post", self._posted(name))

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()

    def _pinged(self, name: str):  # type: ignore[no-untyped-def]
        def answer(received: Received) -> Reply:
            lead_id = received.json()["leadId"]
            with self.lock:
                bid = 999.0 if name == LATE else round(self.rng.uniform(1, 100), 2)
                token = f"tok-{name}-{next(self.serial)}"
                self.pings[token] = Ping(name, lead_id, bid, token)
            return Reply(status=200, body={"bid": bid, "token": token}, delay=LATE_DELAY if name == LATE else 0)
        return answer

    def _posted(self, name: str):  # type: ignore[no-untyped-def]
        def answer(received: Received) -> Reply:
            return Reply(status=200, body={"id": f"{name}-{received.json()['leadId']}"}, delay=POST_DELAY)
        return answer

    def pings_of(self) -> dict[str, list[Ping]]:
        """Pings by lead, in the order they came."""
        with self.lock:
            found: dict[str, list[Ping]] = defaultdict(list)
            for ping in self.pings.values():
                found[ping.lead_id].append(ping)
            return found

    def posts_of(self) -> dict[str, list[tuple[str, Received]]]:
        """(buyer, request) of every post, by lead."""
        found: dict[str, list[tuple[str, Received]]] = defaultdict(list)
        for name, server in self.servers.items():
            for received in server.requests_to("/post"):
                found[received.json()["leadId"]].append((name, received))
        return found


def _bundle(buyers: Buyers) -> dict:
    def endpoint(name: str) -> dict:
        server = buyers.servers[name]
        return {
            "deliveryEndpointId": name, "url": server.url("/post"),
            "fieldMapping": [
                {"clientKey": "leadId", "leadField": "leadId"},
                {"clientKey": "email", "leadField": "email", "required": True},
                {"clientKey": "auctionId", "leadField": "auction.auctionId"},
                {"clientKey": "bid", "leadField": "auction.bid", "type": "number"},
                {"clientKey": "token", "leadField": "auction.pingToken"},
            ],
            "responseRules": {"success": {"statusCodes": [200]}, "clientLeadIdPath": "id"},
            "timeoutSeconds": 5,
            # A post whose answer the kill lost is sent again by the restart, not by backoff.
            "retry": {"maxAttempts": 5, "backoffSeconds": [0.2, 0.5, 1]},
            "ping": {
                "url": server.url("/ping"),
                "fieldMapping": [{"clientKey": "leadId", "leadField": "leadId"},
                                 {"clientKey": "state", "leadField": "address.state"}],
                # `late`'s own timeout is longer than the round: the round's deadline ends its ping.
                "timeoutMs": 5000 if name == LATE else 1000,
                "responseRules": {"bidPath": "bid", "pingTokenPath": "token"},
            },
        }

    return {
        "deliveryEndpoints": [endpoint(name) for name in buyers.servers],
        "campaigns": [{
            "campaignId": CAMPAIGN, "name": "Auction crash safety",
            "client": {"clientId": "cli-auc", "clientName": "Auction Buyers"},
            "offer": {"offerId": "off-auc", "offerName": "Auction"},
            "qualification": {"rules": [{
                "name": "Not in NY", "logicalOperator": "AND",
                "subRules": [{"logicalOperator": "AND", "conditions": [
                    {"field": "address.state", "operator": "equals", "value": ["NY"],
                     "maxSeverity": "disqualify"}]}]}]},
            "delivery": {
                "distribution": {
                    "method": "auction",
                    "auction": {"mode": "exclusive", "timeoutMs": ROUND_MS, "bidTtlSeconds": 600,
                                "noBid": "fail"},
                    "endpoints": [{"deliveryEndpointId": name} for name in buyers.servers],
                },
                # Replaced by each sale's bid (CONTRACT 9.1): must not be booked.
                "revenueMilestones": [{"leadStatus": "delivered", "amount": 25}],
            },
        }],
    }


# ---- the load ----------------------------------------------------------------------------------


def _body(n: int) -> dict:
    # Every 4th lead is in NY, which the campaign disqualifies: never pinged, never posted.
    return {"campaignId": CAMPAIGN, "firstName": "ada", "lastName": "lovelace", "email": f"auction.{n}@example.com",
            "phone": f"+1415{3_000_000 + n:07d}", "address": {"state": "NY" if n % 4 == 0 else "CA"},
            "customFields": {"n": n}}


async def _get_all(base_url: str, key: str, paths: list[str]) -> dict[str, tuple[int, Any]]:
    """GET each path (16 at a time): (status, data)."""
    found: dict[str, tuple[int, Any]] = {}
    queue = list(paths)
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(10.0), headers={"X-API-Key": key}) as client:
        async def worker() -> None:
            while queue:
                path = queue.pop()
                response = await client.get(path)
                found[path] = (response.status_code, response.json().get("data"))

        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(16))), timeout=60)
    return found


def _revenue(base_url: str, key: str) -> dict[str, list[dict]]:
    """Every revenue entry of the campaign, by lead."""
    entries: dict[str, list[dict]] = defaultdict(list)
    cursor = None
    with httpx.Client(base_url=base_url, timeout=10.0, headers={"X-API-Key": key}) as client:
        while True:
            params = {"campaignIds": CAMPAIGN, "kind": "revenue", "limit": "100"}
            if cursor:
                params["cursor"] = cursor
            response = client.get("/api/v1/ledger", params=params)
            assert response.status_code == 200, response.text
            page = response.json()["data"]
            for entry in page["items"]:
                entries[entry["leadId"]].append(entry)
            cursor = page["nextCursor"]
            if not page["hasMore"]:
                return entries


def _wait_drained(db_file: Path, buyers: Buyers, wanted: set[str], deadline: float) -> tuple[int, set[str]]:
    """Until no job is ready or running and every wanted lead was posted (or the deadline)."""
    while True:
        open_jobs = _open_jobs(db_file)
        missing = wanted - buyers.posts_of().keys()
        if (open_jobs == 0 and not missing) or time.monotonic() > deadline:
            return open_jobs, missing
        time.sleep(0.1)


def _explain(db_file: Path, lead_ids: list[str]) -> list[str]:
    """What the database says of leads that were not posted: their jobs and rounds."""
    conn = apsw.Connection(str(db_file), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        conn.setbusytimeout(5000)
        said = []
        for lead_id in lead_ids:
            status = conn.execute("SELECT status FROM leads WHERE lead_id = ?", (lead_id,)).fetchone()
            jobs = conn.execute("SELECT state, attempts, last_error, endpoint_id, tried FROM jobs WHERE lead_id = ?",
                                (lead_id,)).fetchall()
            rounds = [json.loads(row[0]) for row in conn.execute(
                "SELECT record FROM auctions WHERE lead_id = ? ORDER BY started_at", (lead_id,))]
            said.append(f"{lead_id}: {status} jobs {jobs} rounds " + "; ".join(
                f"{r['startedAt']} {r['durationMs']} ms "
                + " ".join(f"{b['deliveryEndpointId']}:{b['outcome']}:{b['responseMs']}" for b in r["bids"])
                + f" won by {r['winners']}" for r in rounds))
        return said
    finally:
        conn.close()


# ---- the checks ------------------------------------------------------------------------------

@dataclass
class Tally:
    leads: int = 0
    repinged: int = 0            # leads pinged in more rounds than were recorded: a round cut by a kill
    reposted: int = 0            # leads posted more than once (same Idempotency-Key, same buyer)
    rounds: int = 0
    longest_round_ms: int = 0


def _check(base_url: str, key: str, acked: list[Acked], buyers: Buyers) -> tuple[list[str], Tally]:
    """Every check of the module's docstring for `acked`: the problems found, and what was seen."""
    lead_paths = [f"/api/v1/leads/{a.lead_id}" for a in acked]
    auction_paths = [f"/api/v1/leads/{a.lead_id}/auctions?limit=100" for a in acked]
    found = asyncio.run(_get_all(base_url, key, lead_paths + auction_paths))
    revenue = _revenue(base_url, key)
    pings, posts = buyers.pings_of(), buyers.posts_of()
    problems: list[str] = []
    tally = Tally(leads=len(acked))
    for a in acked:
        said = f"{a.lead_id} (cycle {a.cycle})"
        status_code, lead = found[f"/api/v1/leads/{a.lead_id}"]
        if status_code != 200 or lead is None:
            problems.append(f"{said}: GET answered {status_code}")
            continue
        subs = {s["submissionId"]: s for s in lead["submissions"]}
        if a.submission_id not in subs:
            problems.append(f"{said}: submission {a.submission_id} missing")
            continue
        lead_pings, lead_posts = pings.get(a.lead_id, []), posts.get(a.lead_id, [])
        if a.status != "qualified":
            if lead["status"] != a.status:
                problems.append(f"{said}: acknowledged {a.status}, now {lead['status']}")
            if lead_pings or lead_posts:
                problems.append(f"{said}: {a.status} lead was pinged {len(lead_pings)} / posted "
                                f"{len(lead_posts)} times")
            continue
        if lead["status"] != "delivered" or subs[a.submission_id]["status"] != "delivered":
            problems.append(f"{said}: lead {lead['status']} / submission {subs[a.submission_id]['status']}, "
                            f"want delivered")

        status_code, page = found[f"/api/v1/leads/{a.lead_id}/auctions?limit=100"]
        rounds = page["items"] if status_code == 200 and page else []
        tally.rounds += len(rounds)
        if not rounds:
            problems.append(f"{said}: no auction recorded (GET auctions answered {status_code})")
            continue
        sold = [r for r in rounds if r["winners"]]
        if len(sold) != 1 or len(sold[0]["winners"]) != 1:
            problems.append(f"{said}: want one round with one winner, got {[r['winners'] for r in rounds]}")
            continue
        round_, winner = sold[0], sold[0]["winners"][0]
        bids = {b["deliveryEndpointId"]: b for b in round_["bids"]}
        winning = bids[winner]["bid"]
        for r in rounds:
            tally.longest_round_ms = max(tally.longest_round_ms, r["durationMs"])
            late = next(b for b in r["bids"] if b["deliveryEndpointId"] == LATE)
            if late["outcome"] != "timeout":
                problems.append(f"{said}: {LATE} answered after the round yet is {late['outcome']} in {r['auctionId']}")
            if r["durationMs"] > ROUND_MS + 1000:
                problems.append(f"{said}: round {r['auctionId']} lasted {r['durationMs']} ms for a {ROUND_MS} ms "
                                f"deadline")
        best = max((b["bid"] for b in round_["bids"] if b["outcome"] == "bid"), default=None)
        if winner not in BIDDERS or bids[winner]["outcome"] != "bid" or winning != best:
            problems.append(f"{said}: winner {winner} is not the best bid of {round_['bids']}")

        # The posts: all to the winner, one Idempotency-Key, the round's sale.
        if not lead_posts:
            problems.append(f"{said}: never posted")
        if len(lead_posts) > 1:
            tally.reposted += 1
        winner_pings = [p for p in lead_pings if p.buyer == winner]
        for buyer, received in lead_posts:
            body = received.json()
            if buyer != winner:
                problems.append(f"{said}: posted to {buyer}, the round's winner is {winner} (sold twice?)")
            if received.headers.get("idempotency-key") != a.submission_id:
                problems.append(f"{said}: post with Idempotency-Key {received.headers.get('idempotency-key')!r}, "
                                f"want {a.submission_id}")
            if body.get("auctionId") != round_["auctionId"] or body.get("bid") != winning:
                problems.append(f"{said}: post carries auction {body.get('auctionId')} bid {body.get('bid')}, "
                                f"the round is {round_['auctionId']} won at {winning}")
            ping = buyers.pings.get(body.get("token") or "")
            if ping is None or ping.buyer != winner or ping.lead_id != a.lead_id or ping.bid != winning:
                problems.append(f"{said}: post token {body.get('token')!r} is not {winner}'s bid for the lead ({ping})")
            elif winner_pings and ping != winner_pings[-1]:
                problems.append(f"{said}: post token {ping.token} is from an earlier ping than the recorded round's")

        # One revenue entry: the winning bid, naming the winner.
        entries = revenue.get(a.lead_id, [])
        if [(e["amount"], e["deliveryEndpointId"], e["currency"]) for e in entries] != [(winning, winner, "USD")]:
            problems.append(f"{said}: revenue {[(e['amount'], e['deliveryEndpointId']) for e in entries]}, "
                            f"want one entry {winning} for {winner}")

        # A bid recorded is a ping answered; pinged more often than that: a round was cut by a kill.
        # (`late` may time out before its ping even left: it is not counted.)
        by_buyer = Counter(p.buyer for p in lead_pings)
        for name in BIDDERS:
            bid_in = sum(1 for r in rounds for b in r["bids"]
                         if b["deliveryEndpointId"] == name and b["outcome"] == "bid")
            if by_buyer[name] < bid_in:
                problems.append(f"{said}: {name} bid in {bid_in} recorded rounds, pinged {by_buyer[name]} times")
        if max(by_buyer[name] for name in BIDDERS) > len(rounds):
            tally.repinged += 1
    return problems, tally


# ---- the test ----------------------------------------------------------------------------------

def test_sigkill_during_auctions_sells_every_lead_once(tmp_path: Path) -> None:
    started = time.monotonic()
    seed = int(os.environ.get("CRASH_SEED") or SEED)
    rng = random.Random(seed)
    print(f"\nauction crash safety: seed {seed} (replay with CRASH_SEED={seed})")
    # Each kind of kill first (in an order the seed picks), then any: the server (its delivery
    # process drains what it holds, then ends), the delivery process (the server starts another),
    # or both at once (the machine's crash: rounds and posts in flight are cut).
    kinds = ("server", "delivery", "both")
    victims = rng.sample(kinds, 3) + [rng.choice(kinds) for _ in range(CYCLES - 3)]
    killed: list[str] = []

    data = tmp_path / "data"
    db_file = data / "appliance.db"
    config = tmp_path / "appliance.toml"
    procs: list[subprocess.Popen] = []
    buyers = Buyers(seed)
    try:
        buyers.start()
        config.write_text(
            f'[server]\nlog_level = "warning"\n\n[storage]\npath = "{data}"\nsynchronous = "FULL"\n\n'
            f'[security]\nrate_limit_per_minute = 0\n\n'
            f'[delivery]\nallow_private_addresses = true\nconcurrency = 32\nprocess = "own"\n\n'
            f'[plugins]\ndirs = []\n')
        cli = Cli(config)
        cli("init")
        tenant_id = cli.json("tenant", "create", "Auction Crash Agency")["tenantId"]
        key = cli.json("key", "create", "--tenant", tenant_id, "--name", "crash")["key"]
        bundle = tmp_path / "bundle.json"
        bundle.write_text(json.dumps(_bundle(buyers)))
        cli("import", "--tenant", tenant_id, str(bundle))

        server_log = tmp_path / "server.log"
        server = Server(config, server_log, procs)
        all_acked: list[Acked] = []
        tally = Tally()
        cycle = 0
        while cycle < CYCLES:
            if cycle >= 3 and time.monotonic() - started > BUDGET_SECONDS - CYCLE_RESERVE_SECONDS:
                print(f"  time budget: stopping after {cycle} cycles")
                break
            victim = victims[cycle]
            cycle += 1
            kill_after = round(rng.uniform(*KILL_WINDOW), 3)
            acked, errors = kill_under_load(server, config, key, victim, kill_after, cycle, body=_body,
                                            tasks=SUBMITTERS, pause=SUBMIT_PAUSE)
            killed.append(victim)
            assert acked, f"cycle {cycle}: no submit was acknowledged before the kill at {kill_after} s"
            all_acked += acked
            pinged_at_kill, posted_at_kill = buyers.pings_of().keys(), buyers.posts_of().keys()
            jobs_after_kill = _db_check(db_file)

            if victim in ("server", "both"):
                server = Server(config, server_log, procs)
            qualified = {a.lead_id for a in all_acked if a.status == "qualified"}
            open_jobs, missing = _wait_drained(db_file, buyers, qualified, time.monotonic() + DRAIN_TIMEOUT)
            assert not missing, f"cycle {cycle}: {len(missing)} acknowledged qualified leads never posted: " \
                                f"{_explain(db_file, sorted(missing)[:3])}"
            assert open_jobs == 0, f"cycle {cycle}: {open_jobs} jobs still ready/running after {DRAIN_TIMEOUT} s"

            problems, tally = _check(server.url, key, all_acked, buyers)
            assert not problems, f"cycle {cycle}: {len(problems)} problems, first: {problems[:5]}"
            print(f"  cycle {cycle}: SIGKILL of {WHO[victim]} at {kill_after} s; acknowledged {len(acked)} "
                  f"{dict(Counter(a.status for a in acked))}; lost in flight {dict(errors)}; at the kill "
                  f"{len(pinged_at_kill - posted_at_kill)} leads pinged and not posted, {len(posted_at_kill)} posted, "
                  f"jobs {jobs_after_kill}; so far {tally}")

        assert set(kinds) <= set(killed), f"killed only: {killed}"
        assert all(a.status in ("qualified", "disqualified") for a in all_acked), Counter(a.status for a in all_acked)
        # The kills came while rounds ran and posts were answered (every round lasts ROUND_MS and
        # every post POST_DELAY under steady load).
        assert buyers.servers[LATE].requests_to("/post") == [], "a buyer that answered too late was sold to"
        assert tally.repinged > 0, f"no round was cut by a kill: {tally}"
        assert tally.reposted > 0, f"no post was cut by a kill: {tally}"
        delivery = running_delivery_pid(config)
        stop_process(server.proc, timeout=10.0)
        assert server.proc.returncode in (0, -signal.SIGTERM), server_log.read_text(errors="replace")[-2000:]
        assert not alive(delivery)
        final = _db_check(db_file)
        assert set(final) <= {"done"}, final
        print(f"  {cycle} cycles, {len(all_acked)} acknowledged leads, final jobs {final}, "
              f"{time.monotonic() - started:.1f} s")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        buyers.stop()
