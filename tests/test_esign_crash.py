"""Crash safety of campaign documents for e-signature (CONTRACT 9.1 "Durable like delivery: sending
a document is a job (a crash sends it at most once more, with the provider's idempotency where it
has one, and never loses the lead)"): the machinery of tests/test_crash_safety.py (a real
`appliance serve` on SQLite with its own delivery process, SIGKILL at a random moment under submit
load, restart, bounded drain, checks through the API), with a campaign that sends two required
`autoSend` documents through the built-in `documenso` adapter to a fake Documenso
(tests/documenso_fake.py) in this process. Its generate-document answers come GENERATE_DELAY s
late, so sends are in flight when a kill comes.

Every qualified lead gets an `esign` job: each document is GET template, POST generate-document,
POST send, then recorded as a file reference of the lead; the lead waits at `document_sent` (no
`expiresInDays`: the job is then done, not asleep). Documenso keeps no idempotency key: a kill
between the generate-document request and the record of its answer sends that document once more
after the restart (a new Documenso document, the same `externalId` `<leadId>/<fileKey>`). The
SIGKILL takes the server (its delivery process finishes the sends it holds, then ends), the
delivery process (the server starts another) or both at once (a machine's crash); one of each, in
an order the seed picks. After every cycle's drain, for every lead acknowledged so far:
- the lead exists and is `document_sent` (never lost, never left `qualified` or `pending`);
- each of its two documents is a file reference (`provider: esign_vendor`, status `pending`) whose
  `providerDocumentId` is a Documenso document with its `externalId` that was sent;
- each (lead, document) was generated at Documenso at least once and at most twice (any document
  at Documenso, an unacknowledged lead's too: at most twice); generated twice is counted, and
  must occur over the run (a kill cut a send);
- no job is left ready or running (so no `esign` job is open).
SQLite only, as test_crash_safety.py; SEED / CRASH_SEED as there.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.buyer_server import Received, Reply
from tests.conftest import Cli
from tests.documenso_fake import FakeDocumenso
from tests.processes import alive, running_delivery_pid, stop_process
from tests.test_auction_crash import _get_all
from tests.test_crash_safety import Acked, Server, _db_check, _open_jobs, kill_under_load

pytestmark = pytest.mark.sqlite_only

SEED = 20261215                # CRASH_SEED overrides it
SUBMITTERS = 2                 # submit tasks; each waits SUBMIT_PAUSE s between submits
SUBMIT_PAUSE = 0.15
KILL_WINDOW = (0.8, 2.5)       # seconds after the first acknowledged submit: sends in flight
GENERATE_DELAY = 0.4           # every generate-document answer comes this late
DRAIN_TIMEOUT = 25.0
CAMPAIGN = "ESGX1"
API_KEY = "dk_crash_documenso_0042"
SECRET = "whsec-crash-documenso-0042"
RECIPIENT = [{"id": 7, "email": "", "name": "Signer", "role": "SIGNER"}]
DOCUMENTS = [
    {"documentId": "disclosure", "kind": "esign", "signTemplateId": "tpl-disclosure", "name": "Disclosure",
     "required": True, "autoSend": True, "order": 1},
    {"documentId": "retainer", "kind": "esign", "signTemplateId": "tpl-retainer", "name": "Retainer",
     "required": True, "autoSend": True, "order": 2},
]
FILE_KEYS = ("esign_disclosure", "esign_retainer")  # domain/documents.file_key_of
KINDS = ("server", "delivery", "both")
WHO = {"server": "the server", "delivery": "the delivery process", "both": "the server and its delivery process"}


class SlowDocumenso(FakeDocumenso):
    """The fake whose generate-document answers come GENERATE_DELAY s late (the document is made
    when the request arrives, as at Documenso: a kill during the wait leaves it unrecorded)."""

    def _answer(self, received: Received) -> Reply:
        reply = super()._answer(received)
        if received.method == "POST" and received.path.endswith("/generate-document"):
            reply.delay += GENERATE_DELAY
        return reply


def _bundle() -> dict:
    return {"campaigns": [{
        "campaignId": CAMPAIGN, "name": "E-signature crash safety",
        "client": {"clientId": "cli-esx", "clientName": "Signed Retainers"},
        "offer": {"offerId": "off-esx", "offerName": "Retainer"},
        "documents": DOCUMENTS,
    }]}


def _body(n: int) -> dict:
    return {"campaignId": CAMPAIGN, "firstName": "marie", "lastName": "curie", "email": f"esign.{n}@example.com",
            "phone": f"+1415{4_000_000 + n:07d}", "address": {"state": "CA"}, "customFields": {"n": n}}


def _generated(documenso: FakeDocumenso) -> dict[str, list[int]]:
    """Documenso's documents by externalId (in the order they were made)."""
    with documenso.lock:
        found: dict[str, list[int]] = {}
        for document_id, document in sorted(documenso.documents.items()):
            found.setdefault(document["externalId"], []).append(document_id)
        return found


def _wait_drained(db_file: Path, deadline: float) -> int:
    """Until no job is ready or running (or the deadline): the jobs still open."""
    while True:
        open_jobs = _open_jobs(db_file)
        if open_jobs == 0 or time.monotonic() > deadline:
            return open_jobs
        time.sleep(0.1)


@dataclass
class Tally:
    leads: int = 0
    generated_twice: int = 0     # (lead, document) generated twice: a send cut by a kill
    sent_twice: int = 0          # ... of which both were sent (the signer got the document twice)


def _check(base_url: str, key: str, acked: list[Acked], documenso: FakeDocumenso) -> tuple[list[str], Tally]:
    """The module docstring's checks for `acked`: the problems found, and what was seen."""
    lead_paths = {a.lead_id: f"/api/v1/leads/{a.lead_id}" for a in acked}
    file_paths = {a.lead_id: f"/api/v1/files/{a.lead_id}" for a in acked}
    found = asyncio.run(_get_all(base_url, key, [*lead_paths.values(), *file_paths.values()]))
    generated = _generated(documenso)
    with documenso.lock:
        documents = {document_id: dict(document) for document_id, document in documenso.documents.items()}
    problems: list[str] = []
    tally = Tally(leads=len(acked))
    for external_id, ids in generated.items():  # every document, an unacknowledged lead's too
        if len(ids) > 2:
            problems.append(f"{external_id}: generated {len(ids)} times at Documenso {ids}")
    for a in acked:
        said = f"{a.lead_id} (cycle {a.cycle})"
        status_code, lead = found[lead_paths[a.lead_id]]
        if status_code != 200 or lead is None:
            problems.append(f"{said}: GET answered {status_code}")
            continue
        if a.submission_id not in {s["submissionId"] for s in lead["submissions"]}:
            problems.append(f"{said}: submission {a.submission_id} missing")
        if lead["status"] != "document_sent":
            problems.append(f"{said}: lead {lead['status']} ({lead['submissions'][-1].get('result')}), "
                            f"want document_sent")
        status_code, page = found[file_paths[a.lead_id]]
        files = {f["fileKey"]: f for f in page["files"]} if status_code == 200 and page else {}
        if status_code != 200:
            problems.append(f"{said}: GET files answered {status_code}")
        for file_key in FILE_KEYS:
            external_id = f"{a.lead_id}/{file_key}"
            ids = generated.get(external_id, [])
            if not ids:
                problems.append(f"{said}: {file_key} never generated at Documenso")
            if len(ids) == 2:
                tally.generated_twice += 1
                tally.sent_twice += all(documents[i]["sent"] for i in ids)
            reference = files.get(file_key)
            if reference is None:
                problems.append(f"{said}: no file reference {file_key} (has {sorted(files)})")
                continue
            if reference["provider"] != "esign_vendor" or reference["status"] != "pending":
                problems.append(f"{said}: {file_key} is {reference['provider']} / {reference['status']}")
            provider_id = reference.get("providerDocumentId")
            document = documents.get(int(provider_id)) if provider_id and provider_id.isdigit() else None
            if document is None or int(provider_id) not in ids:
                problems.append(f"{said}: {file_key} names Documenso document {provider_id!r}, "
                                f"its documents are {ids}")
            elif not document["sent"]:
                problems.append(f"{said}: {file_key} names Documenso document {provider_id}, never sent")
    return problems, tally


def test_sigkill_while_documents_are_sent_sends_each_at_most_once_more(tmp_path: Path) -> None:
    started = time.monotonic()
    seed = int(os.environ.get("CRASH_SEED") or SEED)
    rng = random.Random(seed)
    print(f"\ne-signature crash safety: seed {seed} (replay with CRASH_SEED={seed})")
    victims = rng.sample(KINDS, len(KINDS))  # one of each kind, in the seed's order

    data = tmp_path / "data"
    db_file = data / "appliance.db"
    config = tmp_path / "appliance.toml"
    procs: list[subprocess.Popen] = []
    documenso = SlowDocumenso(api_key=API_KEY)
    try:
        documenso.start()
        for document in DOCUMENTS:
            documenso.template(document["signTemplateId"], recipients=RECIPIENT)
        config.write_text(
            f'[server]\nlog_level = "warning"\n\n[storage]\npath = "{data}"\nsynchronous = "FULL"\n\n'
            f'[security]\nrate_limit_per_minute = 0\n\n'
            # The fake Documenso is on loopback.
            f'[delivery]\nallow_private_addresses = true\nconcurrency = 32\nprocess = "own"\n\n'
            f'[plugins]\ndirs = []\n\n'
            f'[plugins.documenso]\nbase_url = "{documenso.base_url}"\napi_key = "{API_KEY}"\n'
            f'webhook_secret = "{SECRET}"\n')
        cli = Cli(config)
        cli("init")
        tenant_id = cli.json("tenant", "create", "E-signature Crash Agency")["tenantId"]
        key = cli.json("key", "create", "--tenant", tenant_id, "--name", "crash")["key"]
        bundle = tmp_path / "bundle.json"
        bundle.write_text(json.dumps(_bundle()))
        cli("import", "--tenant", tenant_id, str(bundle))

        server_log = tmp_path / "server.log"
        server = Server(config, server_log, procs)
        all_acked: list[Acked] = []
        tally = Tally()
        for cycle, victim in enumerate(victims, start=1):
            kill_after = round(rng.uniform(*KILL_WINDOW), 3)
            acked, errors = kill_under_load(server, config, key, victim, kill_after, cycle, body=_body,
                                            tasks=SUBMITTERS, pause=SUBMIT_PAUSE)
            assert acked, f"cycle {cycle}: no submit was acknowledged before the kill at {kill_after} s"
            assert all(a.status == "qualified" for a in acked), Counter(a.status for a in acked)
            all_acked += acked
            at_kill = _generated(documenso)
            jobs_after_kill = _db_check(db_file)  # the files exactly as the killed processes left them

            if victim in ("server", "both"):
                server = Server(config, server_log, procs)
            open_jobs = _wait_drained(db_file, time.monotonic() + DRAIN_TIMEOUT)
            assert open_jobs == 0, f"cycle {cycle}: {open_jobs} jobs still ready/running after {DRAIN_TIMEOUT} s"

            problems, tally = _check(server.url, key, all_acked, documenso)
            assert not problems, f"cycle {cycle}: {len(problems)} problems, first: {problems[:5]}"
            print(f"  cycle {cycle}: SIGKILL of {WHO[victim]} at {kill_after} s; acknowledged {len(acked)}; "
                  f"lost in flight {dict(errors)}; at the kill {sum(map(len, at_kill.values()))} documents generated "
                  f"at Documenso, jobs {jobs_after_kill}; so far {tally}")

        # The kills came while documents were being generated (every answer GENERATE_DELAY s late).
        assert tally.generated_twice > 0, f"no send was cut by a kill: {tally}"
        delivery = running_delivery_pid(config)
        stop_process(server.proc, timeout=10.0)
        assert server.proc.returncode in (0, -signal.SIGTERM), server_log.read_text(errors="replace")[-2000:]
        assert not alive(delivery)
        final = _db_check(db_file)
        assert set(final) <= {"done"}, final
        print(f"  {len(victims)} cycles, {len(all_acked)} acknowledged leads, "
              f"{len(documenso.documents)} documents at Documenso, final jobs {final}, "
              f"{time.monotonic() - started:.1f} s")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        documenso.stop()
