"""Lead listing and search at volume: one tenant with --leads leads (default 1,000,000).

Writes the leads straight through the storage layer (`insert_lead` + `insert_submission`, ~5,000
leads per `write_sync` unit) with realistic, varied names, emails, phones and ~1.5 KB lead
documents spread over the last year, then measures in-process, best of --runs:

  storage  the function GET /api/v1/leads runs (`lead_page`) on a read connection
  http     the same request through the real app (Litestar TestClient: routing, auth, envelope)

for: the first page of 100, a deep cursor page of 100 (~90% down), a date-range page, a status
page, exact email, exact phone (national format), name search (common surname, common first +
last name, a rare surname, a two-letter prefix), and the database size per lead after a WAL
checkpoint. Targets: page < 20 ms, email/phone < 10 ms, name < 100 ms (judged on http).
Results go to bench/results/volume.json.

    python -m bench.volume [--leads 1000000] [--batch 5000] [--runs 7] [--work DIR] [--reuse]

--work keeps the data folder there; with --reuse an existing database of that size is measured
again without generating it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import apsw
import msgspec

from appliance.services import tenancy
from appliance.api.leads import search_filter
from appliance.clock import iso
from appliance.config import load_config
from appliance.domain.lead import (
    Address, CampaignSnapshot, JourneyEvent, LeadRecord, QualificationOutcome, QuestionAnswer, RoutingOutcome,
    Submission,
)
from appliance.domain.normalize import to_e164
from appliance.domain.pipeline import snapshot
from appliance.ids import floor_id
from appliance.runtime import Runtime, create_runtime
from appliance.storage import LeadFilter
from appliance.storage.leads import Leads

RESULTS = Path(__file__).resolve().parent / "results"
TARGETS_MS = {"page": 20.0, "exact": 10.0, "name": 100.0}
RARE_SURNAME = "Wojciechowska-Quintero"
RARE_COUNT = 7

# ---- realistic people -------------------------------------------------------------------------

# US-like frequencies (weights roughly per 10,000 people), then a long synthetic tail.
FIRST = [
    ("James", 160), ("Mary", 130), ("Robert", 150), ("Patricia", 80), ("John", 150), ("Jennifer", 90),
    ("Michael", 150), ("Linda", 70), ("David", 140), ("Elizabeth", 80), ("William", 120), ("Barbara", 60),
    ("Richard", 100), ("Susan", 60), ("Joseph", 100), ("Jessica", 70), ("Thomas", 90), ("Sarah", 70),
    ("Christopher", 90), ("Karen", 55), ("Charles", 80), ("Lisa", 55), ("Daniel", 90), ("Nancy", 50),
    ("Matthew", 80), ("Betty", 40), ("Anthony", 70), ("Sandra", 45), ("Mark", 70), ("Margaret", 45),
    ("Donald", 50), ("Ashley", 50), ("Steven", 60), ("Kimberly", 45), ("Andrew", 60), ("Emily", 45),
    ("Paul", 50), ("Donna", 40), ("Joshua", 55), ("Michelle", 45), ("Kenneth", 45), ("Carol", 35),
    ("Kevin", 50), ("Amanda", 40), ("Brian", 50), ("Melissa", 40), ("George", 40), ("Deborah", 35),
    ("Timothy", 40), ("Stephanie", 40), ("Ronald", 40), ("Dorothy", 30), ("Jason", 45), ("Rebecca", 35),
    ("Edward", 35), ("Sharon", 30), ("Jeffrey", 40), ("Laura", 35), ("Ryan", 40), ("Cynthia", 30),
    ("Jacob", 40), ("Amy", 30), ("Gary", 35), ("Kathleen", 25), ("Nicholas", 35), ("Angela", 30),
    ("Eric", 35), ("Shirley", 20), ("Jonathan", 35), ("Brenda", 25), ("Stephen", 35), ("Emma", 30),
    ("Larry", 25), ("Anna", 25), ("Justin", 30), ("Pamela", 20), ("Scott", 30), ("Nicole", 30),
    ("Brandon", 30), ("Samantha", 25), ("Benjamin", 30), ("Katherine", 25), ("Samuel", 25), ("Christine", 20),
    ("Gregory", 25), ("Debra", 20), ("Alexander", 25), ("Rachel", 20), ("Patrick", 25), ("Carolyn", 15),
    ("Frank", 20), ("Janet", 20), ("Raymond", 20), ("Maria", 35), ("Jack", 20), ("Olivia", 20),
    ("Dennis", 15), ("Heather", 20), ("Jerry", 15), ("Helen", 15), ("Tyler", 20), ("Catherine", 15),
    ("José", 30), ("Juan", 30), ("Luis", 25), ("Carlos", 25), ("Jorge", 15), ("Miguel", 20), ("Ana", 15),
    ("Sofía", 10), ("Guadalupe", 10), ("Rosa", 10), ("Wei", 8), ("Mei", 6), ("Priya", 8), ("Rahul", 8),
    ("Mohammed", 10), ("Fatima", 8), ("Aaliyah", 8), ("DeShawn", 6), ("Jamal", 8), ("Imani", 6),
    ("Zoë", 5), ("Chloé", 5), ("Björn", 2), ("Siobhán", 2), ("Nguyen", 4), ("Hiroshi", 3), ("Yuki", 3),
]
LAST = [
    ("Smith", 100), ("Johnson", 80), ("Williams", 70), ("Brown", 60), ("Jones", 60), ("Garcia", 55),
    ("Miller", 55), ("Davis", 50), ("Rodriguez", 50), ("Martinez", 50), ("Hernandez", 50), ("Lopez", 40),
    ("Gonzalez", 40), ("Wilson", 40), ("Anderson", 40), ("Thomas", 40), ("Taylor", 40), ("Moore", 35),
    ("Jackson", 35), ("Martin", 35), ("Lee", 35), ("Perez", 30), ("Thompson", 30), ("White", 30),
    ("Harris", 30), ("Sanchez", 30), ("Clark", 25), ("Ramirez", 25), ("Lewis", 25), ("Robinson", 25),
    ("Walker", 25), ("Young", 25), ("Allen", 25), ("King", 25), ("Wright", 25), ("Scott", 20),
    ("Torres", 20), ("Nguyen", 20), ("Hill", 20), ("Flores", 20), ("Green", 20), ("Adams", 20),
    ("Nelson", 20), ("Baker", 20), ("Hall", 20), ("Rivera", 20), ("Campbell", 18), ("Mitchell", 18),
    ("Carter", 18), ("Roberts", 18), ("Gomez", 15), ("Phillips", 15), ("Evans", 15), ("Turner", 15),
    ("Diaz", 15), ("Parker", 15), ("Cruz", 15), ("Edwards", 15), ("Collins", 15), ("Reyes", 15),
    ("Stewart", 15), ("Morris", 15), ("Morales", 15), ("Murphy", 15), ("Cook", 15), ("Rogers", 15),
    ("O'Brien", 8), ("O'Neil", 6), ("McDonald", 8), ("Van der Berg", 3), ("De la Cruz", 4), ("Núñez", 6),
    ("Peña", 6), ("Muñoz", 8), ("Kowalski", 4), ("Nowak", 4), ("Schmidt", 6), ("Müller", 4), ("Chen", 12),
    ("Wang", 10), ("Kim", 12), ("Patel", 12), ("Singh", 10), ("Khan", 8), ("Ali", 8), ("Okafor", 3),
    ("Johnson-Smith", 2), ("Garcia-Lopez", 2),
]
SYLLABLES = ["ka", "ri", "mo", "len", "bar", "sto", "vi", "der", "an", "tel", "qu", "zor", "ne", "pol", "ash",
             "wen", "gri", "fa", "lo", "mar", "ton", "sel", "dru", "hin", "cal", "ber", "ov", "ski", "ez", "ard"]
DOMAINS = [("gmail.com", 45), ("yahoo.com", 15), ("hotmail.com", 10), ("outlook.com", 8), ("icloud.com", 7),
           ("aol.com", 4), ("comcast.net", 3), ("att.net", 2), ("msn.com", 2), ("protonmail.com", 1)]
AREA_CODES = ["212", "213", "214", "305", "312", "404", "415", "469", "512", "602", "619", "702", "713", "718",
              "786", "813", "818", "832", "909", "917", "949", "954", "972", "210", "281", "323", "346", "407",
              "480", "510", "559", "626", "657", "661", "714", "747", "760", "805", "831", "858", "916", "951"]
STATES = ["CA", "TX", "FL", "NY", "AZ", "GA", "IL", "PA", "OH", "NC", "NV", "WA", "CO", "NJ"]
CITIES = ["Los Angeles", "Houston", "Miami", "Brooklyn", "Phoenix", "Atlanta", "Chicago", "Philadelphia",
          "Columbus", "Charlotte", "Las Vegas", "Seattle", "Denver", "Newark", "San Diego", "Dallas", "Orlando"]
STREETS = ["Main St", "Oak Ave", "Maple Dr", "Cedar Ln", "Elm St", "Washington Blvd", "Park Ave", "Lake Rd",
           "Sunset Blvd", "Hillcrest Dr", "Pine St", "2nd Ave", "Mission St", "Broadway"]
AGENTS = [
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
    "Version/17.4 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (Linux; Android 14; SM-S918U) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.6367.82 "
    "Mobile Safari/537.36",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 "
    "Safari/537.36 Edg/124.0.0.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.3 "
    "Safari/605.1.15",
]
CONSENT = ("I agree to be contacted by {client} about my {offer} claim, including by autodialed calls and texts. "
           "Consent is not a condition of purchase.")
STATUSES = [("delivered", 45), ("disqualified", 15), ("duplicate", 9), ("failed", 9), ("qualified", 5),
            ("pending_action", 5), ("queued", 5), ("rejected", 4), ("error", 2), ("pending", 1)]
UTM = ["google", "facebook", "tiktok", "bing", "newsletter", "affiliate"]


def _weighted(pairs: list[tuple[Any, int]], rng: random.Random, n: int) -> list[Any]:
    values, weights = zip(*pairs)
    return rng.choices(values, weights=weights, k=n)


def _ascii(text: str) -> str:
    import unicodedata
    return "".join(c for c in unicodedata.normalize("NFKD", text) if c.isascii() and c.isalnum()).lower()


class People:
    """Draws names in blocks (random.choices with weights is slow one at a time)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        tail = {("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4)))).title() for _ in range(40_000)}
        self.tail = sorted(tail)
        self._first: list[str] = []
        self._last: list[str] = []

    def name(self) -> tuple[str, str]:
        if not self._first:
            self._first = _weighted(FIRST, self.rng, 50_000)
            self._last = [self.rng.choice(self.tail) if self.rng.random() < 0.35 else name
                          for name in _weighted(LAST, self.rng, 50_000)]
        return self._first.pop(), self._last.pop()


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def b32(value: int, width: int) -> str:
    """`width` Crockford base32 characters of `value`, most significant first (as ids are written)."""
    return "".join(_CROCKFORD[value >> shift & 31] for shift in range(5 * (width - 1), -1, -5))


# ---- documents ----------------------------------------------------------------------------------

def lead_id_at(ms: int, rng: random.Random, prefix: str = "lead") -> str:
    return f"{prefix}_{b32(ms, 10)}{b32(rng.getrandbits(79), 16)}"


def make_lead(i: int, ms: int, rng: random.Random, people: People, campaign, status: str,
              name: tuple[str, str] | None = None) -> tuple[LeadRecord, Submission, str]:
    first, last = name or people.name()
    when = iso(datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=ms))
    area, exchange, line = rng.choice(AREA_CODES), rng.randint(201, 989), rng.randint(0, 9999)
    e164 = f"+1{area}{exchange}{line:04d}"
    phone = rng.choice((f"({area}) {exchange}-{line:04d}", f"{area}-{exchange}-{line:04d}", e164,
                        f"{area}{exchange}{line:04d}"))
    local = rng.choice((f"{_ascii(first)}.{_ascii(last)}", f"{_ascii(first)[0]}{_ascii(last)}",
                        f"{_ascii(first)}{_ascii(last)[:3]}"))
    email = f"{local}{i % 997 if rng.random() < 0.7 else ''}{b32(i, 4).lower()}@{_weighted(DOMAINS, rng, 1)[0]}"
    state = rng.choice(STATES)
    client, offer = campaign.client, campaign.offer
    source = rng.choice(("src-web", "src-fb", "src-aff", "src-gg"))
    utm = rng.choice(UTM)
    agent = rng.choice(AGENTS)
    ip = f"{rng.randint(23, 223)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
    click = "".join(rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") for _ in range(60))
    lead = LeadRecord(
        lead_id=lead_id_at(ms, rng), status=status, campaign_id=campaign.campaign_id,
        client_id=client.client_id if client else None, offer_id=offer.offer_id if offer else None,
        source_id=source, first_name=first, last_name=last, email=email, phone=phone, phone_e164=e164,
        address=Address(street=f"{rng.randint(1, 9999)} {rng.choice(STREETS)}", city=rng.choice(CITIES),
                        state=state, zip=f"{rng.randint(10000, 99999)}"),
        date_of_birth=f"{rng.randint(1945, 2004)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}", country="US",
        questionnaire=[
            QuestionAnswer(key="accident_date", question="When did the accident happen?",
                           answer=f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"),
            QuestionAnswer(key="injured", question="Were you injured?", answer=rng.choice(("yes", "no"))),
        ],
        attribution={"params": {"utm_source": utm, "utm_medium": "cpc", "utm_campaign": f"{campaign.campaign_id}-q3"},
                     "captureUrl": f"https://www.claimhelp.example.com/{offer.offer_id if offer else 'x'}?utm_source={utm}",
                     "referrer": f"https://www.{utm}.com/", "ipAddress": ip, "userAgent": agent,
                     ("gclid" if utm == "google" else "fbclid"): click},
        compliance={"tcpaConsent": True, "consentTimestamp": when,
                    "consentText": CONSENT.format(client=client.client_name if client else "us",
                                                  offer=offer.offer_name if offer else "claim"),
                    "trustedFormCertUrl": f"https://cert.trustedform.com/{click[:40].lower()}",
                    "ipAddress": ip},
        is_test=rng.random() < 0.01, timezone="America/Chicago" if state == "TX" else None,
        custom_fields={"leadScore": rng.randint(1, 100)},
        submission_count=1, created_at=when, updated_at=when,
    )
    snap: CampaignSnapshot = snapshot(campaign)
    passed = status not in ("disqualified", "duplicate")
    submission = Submission(
        submission_id=lead_id_at(ms, rng, "sub"), lead_id=lead.lead_id, submission_number=1, campaign=snap,
        status=status,
        qualification=QualificationOutcome(passed=passed, original_campaign_qualified=passed,
                                           score=100 if passed else 50, method="rules",
                                           reason=None if passed else "Adults in served states", qualified_at=when),
        routing=RoutingOutcome(was_routed=False, original_campaign_id=campaign.campaign_id, routing_method="original",
                               routing_evaluated_at=when),
        result=None if passed else "Adults in served states",
        journey_events=[
            JourneyEvent(timestamp=when, type="received", to_campaign_id=campaign.campaign_id,
                         reason=f"submitted to {campaign.campaign_id}", details={"sourceId": source}),
            JourneyEvent(timestamp=when, type="qualification", to_campaign_id=campaign.campaign_id,
                         reason="passed every rule set" if passed else "failed: Adults in served states"),
            JourneyEvent(timestamp=when, type="delivery_scheduled" if passed else "disqualified"),
        ],
        flow_type="standard", submitted_at=when, qualified_at=when if passed else None, created_at=when,
        updated_at=when,
    )
    return lead, submission, campaign.campaign_id


# ---- generation ---------------------------------------------------------------------------------

def setup(work: Path, name: str = "Volume Agency", tenant_bundle: dict | None = None) -> tuple[Runtime, str, str]:
    """A data folder under `work` with one tenant (`tenant_bundle`, default 40 campaigns) and a
    key; a folder set up before is opened as it is (a bench may reuse its database)."""
    from bench.campaigns_list import build_bundle

    config = work / "appliance.toml"
    if not config.exists():
        config.write_text(f'[storage]\npath = "{work / "data"}"\n\n'
                          f'[security]\nrate_limit_per_minute = 0\n\n[plugins]\ndirs = []\n')
    runtime = create_runtime(load_config(config))
    meta = work / "tenant.json"
    if meta.exists():
        saved = json.loads(meta.read_text())
        return runtime, saved["tenantId"], saved["key"]
    tenant_id = tenancy.create_tenant(runtime, name)
    tenancy.import_bundle(runtime, tenant_id, msgspec.json.encode(tenant_bundle or build_bundle(40)), "json")
    key = tenancy.create_key(runtime, tenant_id, name="bench").key
    meta.write_text(json.dumps({"tenantId": tenant_id, "key": key}))
    return runtime, tenant_id, key


def generate(runtime: Runtime, tenant_id: str, n: int, batch: int, seed: int = 11) -> dict[str, Any]:
    """Inserts n leads (each with one submission), oldest first, spread over the last 365 days.
    Batches are built on this thread while the writer thread commits the previous one."""
    rng = random.Random(seed)
    people = People(rng)
    campaigns = runtime.store.reader().catalog.all_campaigns(tenant_id)
    statuses = _weighted(STATUSES, rng, 100_003)
    # Skewed volumes: the first campaigns take most leads, the last few very few.
    campaign_weights = [(c, 1 / (k + 1) ** 1.6) for k, c in enumerate(campaigns)]
    spread = [c for c in _weighted([(c, int(w * 1e6) + 1) for c, w in campaign_weights], rng, 100_019)]
    end_ms = int(time.time() * 1000) - 60_000
    start_ms = end_ms - 365 * 86_400_000
    step = (end_ms - start_ms) / n
    rare_at = {int(n * k / (RARE_COUNT + 1)) for k in range(1, RARE_COUNT + 1)}
    probes: dict[str, Any] = {}
    pending: queue.Queue = queue.Queue(maxsize=2)
    failure: list[BaseException] = []

    def writer() -> None:
        while (rows := pending.get()) is not None:
            def unit(tx, rows=rows):
                for lead, submission, intake in rows:
                    tx.leads.insert_lead(tenant_id, lead, intake)
                    tx.leads.insert_submission(tenant_id, submission)
            try:
                runtime.store.write_sync(unit)
            except BaseException as exc:  # reported by the generating thread
                failure.append(exc)

    thread = threading.Thread(target=writer, name="bench-feeder")
    thread.start()
    started = time.perf_counter()
    doc_bytes = 0
    try:
        for first in range(0, n, batch):
            if failure:
                raise failure[0]
            rows = []
            for i in range(first, min(n, first + batch)):
                ms = start_ms + int(i * step) + rng.randint(0, max(0, int(step) - 1))
                name = (rng.choice(("Anna", "Tomasz", "Ewa")), RARE_SURNAME) if i in rare_at else None
                row = make_lead(i, ms, rng, people, spread[i % len(spread)], statuses[i % len(statuses)], name)
                rows.append(row)
                if i == n // 2:
                    probes["email"] = row[0].email
                    probes["phone"] = row[0].phone
                    probes["phoneE164"] = row[0].phone_e164
                if i == n // 10:
                    probes["deepCursor"] = row[0].lead_id  # ~90% of the leads are newer
                if i == n // 2 and n >= 10:
                    probes["rangeStart"] = iso(datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=ms))
            doc_bytes += sum(len(msgspec.json.encode(r[0])) for r in rows[:20]) * len(rows) // min(20, len(rows))
            pending.put(rows)
            done = min(n, first + batch)
            if done % (batch * 20) == 0 or done == n:
                rate = done / (time.perf_counter() - started)
                print(f"  {done:>9,} leads  {rate:,.0f}/s", flush=True)
    finally:
        pending.put(None)
        thread.join()
    if failure:
        raise failure[0]
    seconds = time.perf_counter() - started
    probes["meanLeadDocBytes"] = doc_bytes // n
    counts = dict(runtime.store.sqlite.reader().execute(
        "SELECT campaign_id, count(*) FROM leads WHERE tenant_id = ? GROUP BY campaign_id ORDER BY 2 DESC",
        (tenant_id,)).fetchall())
    probes["bigCampaign"], probes["rareCampaign"] = next(iter(counts)), list(counts)[-1]
    probes["campaignCounts"] = {probes["bigCampaign"]: counts[probes["bigCampaign"]],
                                probes["rareCampaign"]: counts[probes["rareCampaign"]]}
    clients = runtime.store.sqlite.reader().execute(
        "SELECT client_id, count(*) FROM leads WHERE tenant_id = ? GROUP BY client_id ORDER BY 2", (tenant_id,)).fetchall()
    probes["rareClient"], probes["bigClient"] = clients[0][0], clients[-1][0]
    probes["clientCounts"] = dict([clients[0], clients[-1]])
    return {"seconds": round(seconds, 1), "leadsPerSecond": round(n / seconds), "probes": probes}


def volume_database(work: Path | None, prefix: str, leads: int, batch: int, reuse: bool,
                    tenant_bundle: dict | None = None,
                    extra: Callable[[Runtime, str], dict[str, Any]] | None = None) -> tuple[Path, str, dict[str, Any]]:
    """A database of `leads` generated leads in `work` (a new temporary folder when None), or,
    with `reuse`, the one built there before; `extra` adds to a new one (its answer goes into the
    build's summary). Answers (the folder, the tenant, the summary); the store is closed, so a
    bench opens a fresh one (an empty SQLite cache) to time its reads."""
    work = work or Path(tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    runtime, tenant_id, _ = setup(work, tenant_bundle=tenant_bundle)
    meta = work / "build.json"
    if reuse and meta.exists():
        build = json.loads(meta.read_text())
        print(f"reusing {build['leads']:,} leads in {work}")
    else:
        print(f"writing {leads:,} leads to {work} ...", flush=True)
        build = generate(runtime, tenant_id, leads, batch)
        build["leads"] = leads
        if extra is not None:
            build.update(extra(runtime, tenant_id))
        checkpoint(runtime)
        meta.write_text(json.dumps(build))
    runtime.close()
    return work, tenant_id, build


def checkpoint(runtime: Runtime) -> None:
    """Planner statistics as the running service keeps them, then the WAL folded into the file."""
    runtime.store.sqlite.write_sync(lambda conn: conn.execute("PRAGMA optimize"))
    conn = apsw.Connection(str(runtime.config.database_file))
    try:
        conn.setbusytimeout(10_000)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


# ---- measurement --------------------------------------------------------------------------------

def _day_bound(day: str, days_after: int) -> str:
    moment = datetime.fromisoformat(day).replace(tzinfo=timezone.utc) + timedelta(days=days_after)
    return floor_id("lead", int(moment.timestamp() * 1000))


def best_of(fn, runs: int) -> dict[str, float]:
    fn()  # warm
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return {"best_ms": round(min(times), 3), "median_ms": round(statistics.median(times), 3)}


def measure(runtime: Runtime, tenant_id: str, key: str, probes: dict[str, Any], runs: int) -> list[dict[str, Any]]:
    from litestar.testing import TestClient

    from appliance.app import create_app

    region = runtime.config.defaults.region
    # A connection opened now, as a freshly started server's would be (it sees the statistics).
    reader = apsw.Connection(str(runtime.config.database_file), flags=apsw.SQLITE_OPEN_READONLY)
    reader.execute("PRAGMA cache_size=-16000")
    range_start = probes["rangeStart"][:10]
    range_end = (datetime.fromisoformat(range_start) + timedelta(days=6)).date().isoformat()
    national = probes["phoneE164"][2:5], probes["phoneE164"][5:8], probes["phoneE164"][8:]
    phone_text = f"({national[0]}) {national[1]}-{national[2]}"
    assert to_e164(phone_text, region) == probes["phoneE164"]
    cases = [
        # (label, kind, query string, LeadFilter fields, cursor)
        ("first page", "page", "limit=100", {}, None),
        ("deep cursor page", "page", f"limit=100&cursor={probes['deepCursor']}", {}, probes["deepCursor"]),
        ("7-day range page", "page", f"limit=100&startDate={range_start}&endDate={range_end}",
         {"after_id": _day_bound(range_start, 0), "before_id": _day_bound(range_end, 1)}, None),
        ("status=failed page", "page", "limit=100&status=failed", {"status": "failed"}, None),
        ("big campaign page", "page", f"limit=100&campaignIds={probes['bigCampaign']}",
         {"campaign_ids": (probes["bigCampaign"],)}, None),
        ("rare campaign page", "page", f"limit=100&campaignIds={probes['rareCampaign']}",
         {"campaign_ids": (probes["rareCampaign"],)}, None),
        ("2 campaigns page", "page", f"limit=100&campaignIds={probes['bigCampaign']},{probes['rareCampaign']}",
         {"campaign_ids": (probes["bigCampaign"], probes["rareCampaign"])}, None),
        ("big client page", "page", f"limit=100&clientIds={probes['bigClient']}",
         {"client_ids": (probes["bigClient"],)}, None),
        ("rare client page", "page", f"limit=100&clientIds={probes['rareClient']}",
         {"client_ids": (probes["rareClient"],)}, None),
        ("email", "exact", "search=" + quote(probes["email"].upper()), search_filter(probes["email"], region), None),
        ("phone (national)", "exact", "search=" + quote(phone_text), search_filter(phone_text, region), None),
        ("name: smith", "name", "limit=100&search=smith", search_filter("smith", region), None),
        ("name: james smith", "name", "limit=100&search=james%20smith", search_filter("james smith", region), None),
        ("name: maria garcia", "name", "limit=100&search=maria%20garcia", search_filter("maria garcia", region), None),
        ("name: rare surname", "name", "limit=100&search=wojciechowska", search_filter("wojciechowska", region), None),
        ("name: prefix 'jo'", "name", "limit=100&search=jo", search_filter("jo", region), None),
    ]
    out = []
    with TestClient(create_app(runtime, background=False), raise_server_exceptions=True) as client:
        headers = {"X-API-Key": key}
        for label, kind, query, fields, cursor in cases:
            response = client.get(f"/api/v1/leads?{query}", headers=headers)
            assert response.status_code == 200, response.text
            page = response.json()["data"]
            count = len(page["leads"])
            if label == "email":
                assert [x["email"] for x in page["leads"]] == [probes["email"]], page["leads"][:1]
            if label == "phone (national)":
                assert probes["phoneE164"] in [x["phoneE164"] for x in page["leads"]]
            if label == "name: rare surname":
                assert count == RARE_COUNT, count
            row: dict[str, Any] = {"case": label, "kind": kind, "rows": count, "hasMore": page["hasMore"],
                                   "bytes": len(response.content)}
            if fields is not None:
                limit = 101 if "limit=100" in query else 26
                where = LeadFilter(**({"before_id": cursor} | fields))
                row["storage"] = best_of(lambda: Leads(reader).lead_page(tenant_id, where, limit), runs)
                spy = _PlanSpy(reader)
                Leads(spy).lead_page(tenant_id, where, limit)
                row["plan"] = spy.plans
            row["http"] = best_of(lambda: client.get(f"/api/v1/leads?{query}", headers=headers), runs)
            target = TARGETS_MS[kind]
            row["target_ms"] = target
            row["meets"] = row["http"]["best_ms"] < target
            out.append(row)
            print(f"  {label:22} {count:>4} rows  http {row['http']['best_ms']:8.2f} ms"
                  + (f"  storage {row['storage']['best_ms']:8.2f} ms" if "storage" in row else ""), flush=True)
    return out


class _PlanSpy:
    """Wraps a connection: records the query plan of each statement run through it."""

    def __init__(self, conn: apsw.Connection) -> None:
        self.conn, self.plans = conn, []

    def execute(self, sql: str, params: Any = ()):
        self.plans.append(" / ".join(row[3] for row in self.conn.execute("EXPLAIN QUERY PLAN " + sql, params)))
        return self.conn.execute(sql, params)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.volume", description=__doc__.split("\n\n")[0])
    parser.add_argument("--leads", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=5_000, help="leads per write unit")
    parser.add_argument("--runs", type=int, default=7, help="timed runs per case (best and median kept)")
    parser.add_argument("--work", type=Path, help="data folder to use and keep (default: a temp folder, removed)")
    parser.add_argument("--reuse", action="store_true", help="measure the database already in --work")
    parser.add_argument("--out", type=Path, default=RESULTS / "volume.json")
    args = parser.parse_args(argv)

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-volume-"))
    work.mkdir(parents=True, exist_ok=True)
    runtime, tenant_id, key = setup(work)
    try:
        have = runtime.store.sqlite.reader().execute("SELECT count(*) FROM leads WHERE tenant_id = ?", (tenant_id,)).fetchone()[0]
        probes_file = work / "generation.json"
        if args.reuse and have == args.leads and probes_file.exists():
            generation = json.loads(probes_file.read_text())
            print(f"reusing {have:,} leads in {work}")
        else:
            if have:
                raise SystemExit(f"{work} already holds {have:,} leads; use --reuse or another --work")
            print(f"generating {args.leads:,} leads in batches of {args.batch:,} into {work}")
            generation = generate(runtime, tenant_id, args.leads, args.batch)
            probes_file.write_text(json.dumps(generation))
        checkpoint(runtime)
        db_file = runtime.config.database_file
        size = db_file.stat().st_size
        wal = Path(str(db_file) + "-wal")
        print(f"database {size / 1e9:.2f} GB ({size / args.leads:,.0f} bytes per lead; WAL "
              f"{wal.stat().st_size if wal.exists() else 0} bytes); mean lead document "
              f"{generation['probes']['meanLeadDocBytes']} bytes")
        print("measuring (best of %d)" % args.runs)
        cases = measure(runtime, tenant_id, key, generation["probes"], args.runs)
    finally:
        runtime.close()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)

    print()
    print(f"{'case':24} {'rows':>5} {'http best':>10} {'http med':>9} {'storage':>9} {'target':>7}  verdict")
    for row in cases:
        storage = f"{row['storage']['best_ms']:9.2f}" if "storage" in row else f"{'-':>9}"
        print(f"{row['case']:24} {row['rows']:>5} {row['http']['best_ms']:>10.2f} {row['http']['median_ms']:>9.2f} "
              f"{storage} {row['target_ms']:>7.0f}  {'ok' if row['meets'] else 'MISSED'}")
    print(f"generation: {args.leads:,} leads in {generation['seconds']} s ({generation['leadsPerSecond']:,}/s); "
          f"{size / args.leads:,.0f} bytes per lead on disk")

    results = {
        "benchmark": "volume",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "settings": {"leads": args.leads, "batch": args.batch, "runs": args.runs, "synchronous": runtime.config.storage.synchronous},
        "generation": {"seconds": generation["seconds"], "leadsPerSecond": generation["leadsPerSecond"],
                       "meanLeadDocBytes": generation["probes"]["meanLeadDocBytes"]},
        "database": {"bytes": size, "bytesPerLead": round(size / args.leads)},
        "cases": cases,
        "targets_ms": TARGETS_MS,
        "meetsAllTargets": all(row["meets"] for row in cases),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
