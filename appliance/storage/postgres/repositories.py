"""The repositories on PostgreSQL: each subclasses its SQLite one (same methods, same records)
and overrides only the statements PostgreSQL spells differently (INSERT OR IGNORE/REPLACE, an
upsert without a conflict target, rowid, FTS5, json_extract, total(), scalar max(), a parameter
whose type only its value tells). Everything else runs the SQLite module's SQL through
connection.py's placeholder translation."""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import msgspec

from appliance.domain.contact_hash import hash64
from appliance.domain.lead import LeadRecord
from appliance.storage import locks
from appliance.storage.balances import Balances
from appliance.storage.caps import Caps
from appliance.storage.catalog import CampaignFilter, Catalog, _like
from appliance.storage.endpoints import _HEALTH, Endpoints
from appliance.storage.imports import Imports
from appliance.storage.jobs import ClaimLost, Job, Jobs
from appliance.storage.leads import (
    _DIGESTS,
    _INSERT_LEAD,
    _LEAD_BY_ID,
    _LEAD_ROW,
    _LEADS,
    _SUBMISSION_BY_ID,
    _SUBMISSIONS,
    LeadFilter,
    Leads,
    _by_digest,
    _lead_row,
    _moved_counts,
    _names,
    _was,
    _was_of,
)
from appliance.storage.ledger import Ledger
from appliance.storage.postgres.connection import PgConnection
from appliance.storage.postgres.engine import application_name
from appliance.storage.postgres.leases import JobLeases
from appliance.storage.postgres.migrations import SHARD
from appliance.storage.reports import _MONEY_KEYS, Reports, _pieces
from appliance.storage.suppression import Suppression

_BUCKETS = (("", 900), ("_daily", 86400))


def _epoch(created_at: str) -> int:
    """SQLite's coalesce(unixepoch(t), 0): seconds since the epoch, 0 for a time that does not parse."""
    try:
        return int(datetime.fromisoformat(created_at).timestamp())
    except (TypeError, ValueError):
        return 0


def count_leads(conn: PgConnection, tenant_id: str,
                counts: Mapping[tuple[str, str | None, str | None, str | None, str], int]) -> None:
    """reports.count_leads: the bucket computed here rather than by unixepoch(), the row this
    process's own (pg03); both rollups in one statement."""
    params: list[Any] = []
    for _, seconds in _BUCKETS:
        # One row a key: an INSERT may not update the same row twice.
        summed: Counter[tuple[int, str, str, str, str]] = Counter()
        for (created_at, campaign, client, source, status), step in counts.items():
            summed[(_epoch(created_at) // seconds, campaign or "", client or "", source or "", status)] += step
        params += [tenant_id, *(list(column) for column in zip(*summed)), list(summed.values())]
    if counts:
        conn.execute(_COUNT_LEADS, params)


_COUNT_INTO = (
    "INSERT INTO report_leads{table} SELECT ?, *, " + SHARD + " FROM unnest(?::bigint[], ?::text[], ?::text[],"
    " ?::text[], ?::text[], ?::bigint[]) ON CONFLICT (tenant_id, bucket, campaign_id, client_id, source_id, status,"
    " shard) DO UPDATE SET leads = report_leads{table}.leads + excluded.leads")
_COUNT_LEADS = ("WITH quarter_hours AS (" + _COUNT_INTO.format(table="") + ") "
                + _COUNT_INTO.format(table="_daily"))


# A new lead in one statement (one round trip): its row, its name row, and its count in both rollups.
_ROLLUP_ROW = (f"(?, ?, coalesce(?, ''), coalesce(?, ''), coalesce(?, ''), ?, 1, {SHARD})"
               " ON CONFLICT (tenant_id, bucket, campaign_id, client_id, source_id, status, shard)")
_NEW_LEAD = ("WITH new_lead AS (" + _INSERT_LEAD + " RETURNING seq){names},"
             " counted AS (INSERT INTO report_leads VALUES " + _ROLLUP_ROW +
             " DO UPDATE SET leads = report_leads.leads + 1)"
             " INSERT INTO report_leads_daily VALUES " + _ROLLUP_ROW +
             " DO UPDATE SET leads = report_leads_daily.leads + 1")
_NEW_LEAD_NAMED = _NEW_LEAD.format(names=", named AS (INSERT INTO leads_names(seq, name) SELECT seq, ? FROM new_lead)")
_NEW_LEAD = _NEW_LEAD.format(names="")


_FTS5_TERM = re.compile(r'"((?:[^"]|"")*)"\*')


def _fold(text: str) -> str:
    """Without diacritics, as FTS5's `remove_diacritics 2` compares names (the `simple` text
    search configuration keeps them); stored names and searched words alike."""
    return "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))


def _tsquery(fts5: str) -> str:
    """The API's FTS5 name query (`"jan"* "doe"*`: every word, prefix-matched) as a tsquery."""
    words = [_fold(term.replace('""', '"')) for term in _FTS5_TERM.findall(fts5)]
    return " & ".join("'" + word.replace("\\", "\\\\").replace("'", "''") + "':*" for word in words)


class PgLeads(Leads):
    __slots__ = ()

    def earlier_leads(self, tenant_id: str, intake_campaign_id: str, email: str | None,
                      phone_e164: str | None, since: str) -> list[tuple[str, str | None, str | None, str]]:
        """Leads.earlier_leads in one statement (one round trip), holding the dedupe keys it
        reads: the lead written next is a duplicate or not as of the last holder's commit."""
        parts, params = [], []
        for field, column, value in (("email", "email", email), ("phone", "phone_e164", phone_e164)):
            if value:
                self._conn.lock(locks.dedupe_key(tenant_id, intake_campaign_id, field, value))
                parts.append(
                    f"SELECT lead_id, email, phone_e164, created_at FROM leads WHERE tenant_id = ? AND {_DIGESTS[column]} = ?"
                    f" AND {column} = ? AND created_at >= ? AND intake_campaign_id = ? AND status != 'duplicate'"
                    " AND is_test = 0")
                params += (tenant_id, hash64(value), value, since, intake_campaign_id)
        if not parts:
            return []
        return sorted(self._conn.execute(" UNION ".join(parts), params).fetchall())

    def rows_later(self, tenant_id: str, lead_id: str, submission_id: str) -> Callable[[], tuple[tuple | None, tuple | None]]:
        lead = self._conn.execute(_LEAD_BY_ID, (lead_id, tenant_id))
        submission = self._conn.execute(_SUBMISSION_BY_ID, (submission_id, tenant_id))
        return lambda: (lead.fetchone(), submission.fetchone())

    def rows_of(self, keys: Sequence[tuple[str, str, str]]) -> list[tuple[tuple | None, tuple | None]]:
        # Two statements for the whole list (a claim's jobs), not two round trips a job.
        tenants = [key[0] for key in keys]
        leads = {(row[-1], row[0]): row[:-1] for row in self._conn.execute(
            f"SELECT {_LEAD_ROW}, l.tenant_id FROM leads l JOIN unnest(?::text[], ?::text[]) AS k(tenant_id, lead_id)"
            " ON l.tenant_id = k.tenant_id AND l.lead_id = k.lead_id", (tenants, [key[1] for key in keys]))}
        submissions = {(row[-1], row[0]): row[:-1] for row in self._conn.execute(
            f"SELECT {_SUBMISSION_COLUMNS}, s.tenant_id FROM submissions s JOIN unnest(?::text[], ?::text[])"
            " AS k(tenant_id, submission_id) ON s.tenant_id = k.tenant_id AND s.submission_id = k.submission_id",
            (tenants, [key[2] for key in keys]))}
        return [(leads.get((tenant_id, lead_id)), submissions.get((tenant_id, submission_id)))
                for tenant_id, lead_id, submission_id in keys]

    def insert_lead(self, tenant_id: str, lead: LeadRecord, intake_campaign_id: str) -> None:
        names = _names(lead)
        epoch = _epoch(lead.created_at)
        counted = (lead.campaign_id, lead.client_id, lead.source_id, lead.status)
        self._conn.execute(_NEW_LEAD_NAMED if names else _NEW_LEAD, (
            *_lead_row(tenant_id, lead, intake_campaign_id), *((_fold(names),) if names else ()),
            tenant_id, epoch // 900, *counted, tenant_id, epoch // 86400, *counted))

    def insert_leads(self, tenant_id: str, leads: Sequence[LeadRecord], intake_campaign_id: str) -> None:
        self._conn.executemany(_INSERT_LEAD, [_lead_row(tenant_id, lead, intake_campaign_id) for lead in leads])
        self._conn.executemany("INSERT INTO leads_names(seq, name) SELECT seq, ? FROM leads WHERE lead_id = ?",
                               [(_fold(names), lead.lead_id) for lead in leads if (names := _names(lead))])
        count_leads(self._conn, tenant_id, Counter(
            (lead.created_at, lead.campaign_id, lead.client_id, lead.source_id, lead.status) for lead in leads))

    def update_lead(self, tenant_id: str, lead: LeadRecord, *, names_changed: bool = False,
                    was: LeadRecord | None = None) -> None:
        """`was`: the stored lead as this transaction read it (its row is then not read again)."""
        stored = _was(self._conn, tenant_id, lead.lead_id) if was is None else _was_of(was)
        updated = self._conn.execute(
            "UPDATE leads SET campaign_id = ?, client_id = ?, offer_id = ?, source_id = ?, status = ?, email = ?,"
            " phone_e164 = ?, email_hash64 = ?, phone_hash64 = ?, is_test = ?, updated_at = ?, doc = ?"
            " WHERE tenant_id = ? AND lead_id = ?" + (" RETURNING seq" if names_changed else ""),
            (lead.campaign_id, lead.client_id, lead.offer_id, lead.source_id, lead.status, lead.email,
             lead.phone_e164, hash64(lead.email), hash64(lead.phone_e164), int(lead.is_test), lead.updated_at,
             _LEADS.pack(lead), tenant_id, lead.lead_id),
        )
        if (moved := _moved_counts(stored, _was_of(lead))) is not None:
            count_leads(self._conn, tenant_id, moved)
        # The row's seq is waited for only when its names move with it.
        if names_changed and (found := updated.fetchone()) is not None:
            self._conn.execute("DELETE FROM leads_names WHERE seq = ?", found)
            if names := _names(lead):
                self._conn.execute("INSERT INTO leads_names(seq, name) VALUES (?, ?)", (found[0], _fold(names)))

    def lead_page(self, tenant_id: str, where: LeadFilter, limit: int) -> list[tuple[str, bytes]]:
        """One page of leads, newest first; PostgreSQL's planner picks the index from its
        statistics, so this is one statement whatever the filter."""
        clauses, params = ["l.tenant_id = ?"], [tenant_id]
        for column, values in (("campaign_id", where.campaign_ids), ("client_id", where.client_ids),
                               ("offer_id", where.offer_ids)):
            if values:
                clauses.append(f"l.{column} IN ({','.join('?' * len(values))})")
                params.extend(values)
        for column, value in (("status", where.status), ("email", where.email), ("phone_e164", where.phone_e164),
                              ("lead_id", where.lead_id)):
            if value is not None:
                clauses.append(f"l.{column} = ?")
                params.append(value)
        _by_digest(where, clauses, params)
        if where.after_id is not None:
            clauses.append("l.lead_id >= ?")
            params.append(where.after_id)
        if where.before_id is not None:
            clauses.append("l.lead_id < ?")
            params.append(where.before_id)
        if where.name_query is not None:
            clauses.append("l.seq IN (SELECT seq FROM leads_names"
                           " WHERE to_tsvector('simple', name) @@ to_tsquery('simple', ?))")
            params.append(_tsquery(where.name_query))
        rows = self._conn.execute(
            f"SELECT {_LEAD_ROW} FROM leads l WHERE {' AND '.join(clauses)} ORDER BY l.lead_id DESC LIMIT ?",
            [*params, limit])
        return [(row[0], _LEADS.json_of(row)) for row in rows]


_SUBMISSION_COLUMNS = ", ".join(f"s.{name}" for name in (*_SUBMISSIONS.columns, "doc"))  # storage/leads.py's row
_HOLDS = "SELECT 1 FROM jobs WHERE job_id = ? AND claimed_by = ? AND attempts = ?"
_EXPIRED = "state = 'running' AND (lease_until IS NULL OR lease_until < clock_timestamp())"
_SERVER_NOW = "to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"


class PgJobs(Jobs):
    """Jobs on a database several processes share: a claim takes a lease (leases.py) that this
    process renews; only jobs whose lease ended are queued again. A job's outcome (finish,
    reschedule, park) and its slots are settled only by the process holding its claim: one that
    lost it (cut off from the database past its lease) still sends, a repeat within at-least-once,
    but leaves the job, and the slots the new owner took, to the new owner."""

    __slots__ = ("_leases",)

    def __init__(self, conn: PgConnection, leases: JobLeases) -> None:
        super().__init__(conn)
        self._leases = leases

    def insert_job(self, *, tenant_id: str, kind: str, lead_id: str, submission_id: str,
                   due_at: str, now: str, state: str = "ready", tried: tuple[str, ...] = (),
                   endpoint_id: str | None = None) -> None:
        # Nothing fetched: in the writer's pipeline, the insert waits for no answer.
        self._conn.execute(
            "INSERT INTO jobs(tenant_id, kind, lead_id, submission_id, state, due_at, created_at, updated_at, tried,"
            " endpoint_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (tenant_id, kind, lead_id, submission_id, state, due_at, now, now,
             msgspec.json.encode(tried).decode() if tried else None, endpoint_id))

    def claim_due(self, now: str, limit: int) -> list[Job]:
        # A process that claims runs the lease thread from its first try, claimed or not: it is
        # also what takes over the jobs of a process that died.
        self._leases.keep()
        # SKIP LOCKED: a job another process's claim (or an operator's own transaction) holds is
        # passed over rather than waited for.
        return [Job(*row[:7], tuple(msgspec.json.decode(row[7])) if row[7] else ()) for row in self._conn.execute(
            "UPDATE jobs SET state = 'running', attempts = attempts + 1, updated_at = ?1, hold_client = NULL,"
            " claimed_by = ?3, lease_until = clock_timestamp() + make_interval(secs => ?4)"
            " WHERE job_id IN (SELECT job_id FROM jobs WHERE state = 'ready' AND due_at <= ?1"
            "                  ORDER BY due_at, job_id LIMIT ?2 FOR UPDATE SKIP LOCKED)"
            " RETURNING job_id, tenant_id, kind, lead_id, submission_id, attempts, endpoint_id, tried",
            (now, limit, self._leases.owner, self._leases.seconds),
        )]

    def requeue_interrupted(self, now: str) -> int:
        """At a worker's start: the running jobs whose lease ended and this store's own (left by
        an earlier worker in this process), not every running job: on a shared database the
        others belong to processes still running them."""
        return self.requeue_expired(mine=True)

    def requeue_expired(self, *, mine: bool = False) -> int:
        """Running jobs whose lease ended (and `mine`: this store's) back to `ready`, their slots
        given back. Their due time is kept (it has passed): they come first."""
        expired = self._conn.execute(
            f"SELECT job_id, tenant_id FROM jobs WHERE {_EXPIRED} OR (state = 'running' AND claimed_by = ?)"
            " FOR UPDATE SKIP LOCKED", (self._leases.owner if mine else None,)).fetchall()
        for job_id, tenant_id in expired:
            self._give_back(tenant_id, job_id)
        if expired:
            self._conn.execute(f"UPDATE jobs SET state = 'ready', updated_at = {_SERVER_NOW}, claimed_by = NULL,"
                               " lease_until = NULL WHERE job_id = ANY(?)", ([job_id for job_id, _ in expired],))
        return len(expired)

    def renew_leases(self) -> None:
        self._conn.execute("UPDATE jobs SET lease_until = clock_timestamp() + make_interval(secs => ?)"
                           " WHERE state = 'running' AND claimed_by = ?", (self._leases.seconds, self._leases.owner))

    def hand_back(self) -> None:
        """This process's running jobs claimable now (it stops without finishing them)."""
        self._conn.execute("UPDATE jobs SET lease_until = clock_timestamp() WHERE state = 'running' AND claimed_by = ?",
                           (self._leases.owner,))

    def release_paused(self, tenant_id: str, endpoint_id: str | None, now: str) -> int:
        self._conn.execute(
            "UPDATE jobs SET state = 'ready', due_at = ?1, updated_at = ?1 WHERE tenant_id = ?2 AND state = 'paused'"
            " AND (?3::text IS NULL OR endpoint_id IS NULL OR endpoint_id = ?3)", (now, tenant_id, endpoint_id))
        return self._conn.changes()

    def hold_reservations(self, job_id: int, scopes: list[tuple[str, str]]) -> None:
        # Appended in the statement: nothing to wait for.
        self._conn.execute("UPDATE jobs SET reservations = (coalesce(nullif(reservations, '')::jsonb, '[]'::jsonb)"
                           " || ?::jsonb)::text WHERE job_id = ?", (msgspec.json.encode(scopes).decode(), job_id))

    def finish(self, job_id: int, state: str, now: str, error: str | None = None) -> bool:
        self._conn.execute("UPDATE jobs SET state = ?, updated_at = ?, last_error = ?, reservations = NULL"
                           " WHERE job_id = ? AND state = 'running' AND claimed_by = ?",
                           (state, now, error, job_id, self._leases.owner))
        return self._conn.changes() > 0

    def reschedule(self, job_id: int, due_at: str, now: str, *, error: str | None = None,
                   keep_attempts: bool = False) -> bool:
        self._conn.execute(
            "UPDATE jobs SET state = 'ready', due_at = ?, updated_at = ?, last_error = ?,"
            " attempts = attempts - ? WHERE job_id = ? AND state = 'running' AND claimed_by = ?",
            (due_at, now, error, 1 if keep_attempts else 0, job_id, self._leases.owner))
        return self._conn.changes() > 0

    def park(self, tenant_id: str, job_id: int, endpoint_id: str | None, now: str, reason: str, *,
             attempted: bool) -> bool:
        if not self._holds(job_id):
            return False
        return super().park(tenant_id, job_id, endpoint_id, now, reason, attempted=attempted)

    def release_reservations(self, tenant_id: str, job_id: int) -> None:
        # A cancelled job is still ours (its claim stays): its slots go back too.
        if self._holds(job_id):
            self._give_back(tenant_id, job_id)

    def holds(self, job: Job) -> bool:
        # The attempt number tells this claim from a later one the same process took on the job.
        return self._conn.execute(_HOLDS, (job.job_id, self._leases.owner, job.attempts)).fetchone() is not None

    def fence(self, job: Job) -> None:
        # Answered with the unit's next read or the group's end, not waited for here (a round trip).
        self._conn.expect_row(_HOLDS, (job.job_id, self._leases.owner, job.attempts), ClaimLost)

    def _holds(self, job_id: int) -> bool:
        return self._conn.execute("SELECT 1 FROM jobs WHERE job_id = ? AND claimed_by = ?",
                                  (job_id, self._leases.owner)).fetchone() is not None

    def _give_back(self, tenant_id: str, job_id: int) -> None:
        found = self._conn.execute("SELECT reservations FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        if found and found[0]:
            for scope, period in msgspec.json.decode(found[0]):
                PgCaps(self._conn).take_from_counter(tenant_id, scope, period)
            self._conn.execute("UPDATE jobs SET reservations = NULL WHERE job_id = ?", (job_id,))


class PgCaps(Caps):
    __slots__ = ()

    def counter_value(self, tenant_id: str, scope: str, period_start: str) -> int:
        # Read to decide whether one more fits: held until the commit that adds it.
        self._conn.lock(locks.cap_counter(tenant_id, scope, period_start))
        return super().counter_value(tenant_id, scope, period_start)

    def add_to_counter(self, tenant_id: str, scope: str, period_start: str) -> None:
        self._conn.execute(
            "INSERT INTO cap_counters(tenant_id, scope, period_start, count) VALUES (?, ?, ?, 1)"
            " ON CONFLICT(tenant_id, scope, period_start) DO UPDATE SET count = cap_counters.count + 1",
            (tenant_id, scope, period_start))

    def take_from_counter(self, tenant_id: str, scope: str, period_start: str) -> None:
        self._conn.execute(
            "UPDATE cap_counters SET count = greatest(count - 1, 0)"
            " WHERE tenant_id = ? AND scope = ? AND period_start = ?", (tenant_id, scope, period_start))


class PgBalances(Balances):
    __slots__ = ()

    def last(self, tenant_id: str, client_id: str) -> tuple[int, float]:
        # Read to number the next entry, or to decide whether the client can pay for a sale.
        self._conn.lock(locks.balance(tenant_id, client_id))
        return super().last(tenant_id, client_id)


class PgLedger(Ledger):
    __slots__ = ()

    _INSERT = ("INSERT INTO ledger_entries(entry_id, tenant_id, lead_id, submission_id, kind, milestone,"
               " lead_status, amount, currency, campaign_id, client_id, source_id, delivery_endpoint_id, created_at)"
               " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING")


class PgReports(Reports):
    __slots__ = ()

    def money(self, tenant_id: str, by: str, first: int, end: int, *,
              utc_days: bool = True) -> list[tuple[str | int, str, float, float, float]]:
        key = _MONEY_KEYS[by]
        rows: list[tuple[str | int, str, float, float, float]] = []
        for table, low, high, scale in _pieces(first, end, utc_days):
            column = f"{key} * {scale}" if key == "bucket" else key
            rows += self._conn.execute(
                f"SELECT {column}, currency, sum(cost), sum(revenue), sum(returns) FROM report_money{table}"
                " WHERE tenant_id = ? AND bucket >= ? AND bucket < ? GROUP BY 1, 2",
                (tenant_id, low, high)).fetchall()
        return rows


class PgCatalog(Catalog):
    __slots__ = ()

    def _existing_created_at(self, table: str, id_column: str, tenant_id: str, item_id: str) -> str | None:
        found = self._conn.execute(
            f"SELECT convert_from(doc, 'UTF8')::jsonb ->> 'createdAt' FROM {table} WHERE tenant_id = ? AND {id_column} = ?",
            (tenant_id, item_id),
        ).fetchone()
        return found[0] if found else None

    def list_campaigns(self, tenant_id: str, where: CampaignFilter, page: int, limit: int) -> tuple[int, list[bytes]]:
        # SQLite's LIKE ignores ASCII case: ILIKE here.
        clauses = ["tenant_id = ?"]
        params: list = [tenant_id]
        for column, value in (("active", None if where.active is None else int(where.active)),
                              ("client_id", where.client_id), ("offer_id", where.offer_id)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if not where.include_archived:
            clauses.append("archived_at IS NULL")
        if where.search:
            clauses.append("(name ILIKE ? ESCAPE '\\' OR campaign_id ILIKE ? ESCAPE '\\'"
                           " OR client_name ILIKE ? ESCAPE '\\' OR offer_name ILIKE ? ESCAPE '\\')")
            params.extend([_like(where.search)] * 4)
        sql_where = " AND ".join(clauses)
        (total,) = self._conn.execute(f"SELECT count(*) FROM campaigns WHERE {sql_where}", params).fetchone()
        docs = [doc for (doc,) in self._conn.execute(
            f"SELECT public_doc FROM campaigns WHERE {sql_where} ORDER BY campaign_id LIMIT ? OFFSET ?",
            [*params, limit, (page - 1) * limit])]
        return total, docs


class PgEndpoints(Endpoints):
    __slots__ = ()

    def health(self, tenant_id: str, endpoint_id: str):
        # Read to count one more answer into it (a run of errors pauses the endpoint).
        self._conn.lock(locks.endpoint(tenant_id, endpoint_id))
        return super().health(tenant_id, endpoint_id)

    def healthy_answer(self, tenant_id: str, endpoint_id: str, success_at: str | None) -> None:
        # Ends the run of errors another unit may be counting.
        self._conn.lock(locks.endpoint(tenant_id, endpoint_id))
        super().healthy_answer(tenant_id, endpoint_id, success_at)

    def rotation(self, tenant_id: str, campaign_id: str) -> dict[str, float]:
        # Read to choose the next buyer and save the rotation moved on.
        self._conn.lock(locks.delivery_state(tenant_id, campaign_id))
        return super().rotation(tenant_id, campaign_id)

    # Into this process's own row (pg03).
    _COUNT_ANSWER = ("INSERT INTO endpoint_outcomes(tenant_id, endpoint_id, hour, {column}, shard)"
                     f" VALUES (?, ?, ?, 1, {SHARD}) ON CONFLICT (tenant_id, endpoint_id, hour, shard)"
                     " DO UPDATE SET {column} = endpoint_outcomes.{column} + 1")

    def save_health(self, tenant_id: str, endpoint_id: str, health) -> None:
        updates = ", ".join(f"{c.strip()} = excluded.{c.strip()}" for c in _HEALTH.split(","))
        self._conn.execute(
            f"INSERT INTO endpoint_health(tenant_id, endpoint_id, {_HEALTH}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
            f" ON CONFLICT (tenant_id, endpoint_id) DO UPDATE SET {updates}",
            (tenant_id, endpoint_id, *msgspec.structs.astuple(health)))

    def save_rotation(self, tenant_id: str, campaign_id: str, weights: dict[str, float]) -> None:
        self._conn.execute(
            "INSERT INTO distribution_rotation(tenant_id, campaign_id, weights) VALUES (?, ?, ?)"
            " ON CONFLICT (tenant_id, campaign_id) DO UPDATE SET weights = excluded.weights",
            (tenant_id, campaign_id, msgspec.json.encode(weights)))


class PgSuppression(Suppression):
    __slots__ = ()

    def add_many(self, list_id: str, hashes: Iterable[bytes]) -> int:
        before = self._conn.total_changes()
        self._conn.executemany("INSERT INTO suppression_entries(list_id, hash) VALUES (?, ?) ON CONFLICT DO NOTHING",
                               ((list_id, h) for h in hashes))
        added = self._conn.total_changes() - before
        self._count_by(list_id, added)
        return added


class PgImports(Imports):
    """Several processes share the database, and each runs the imports uploaded to it: an import
    records its process (`runner`, migration pg02), and only the imports of processes that are
    gone, or this process's own (it calls this when it runs none), end `failed`."""

    def create(self, tenant_id: str, import_id: str, campaign_id: str, file_name: str | None, process: bool,
               columns: dict[str, str], total: int, now: str) -> None:
        super().create(tenant_id, import_id, campaign_id, file_name, process, columns, total, now)
        self._conn.execute("UPDATE lead_imports SET runner = ? WHERE import_id = ?", (application_name(), import_id))

    def fail_running(self, reason: str, now: str) -> int:
        self._conn.execute(
            "UPDATE lead_imports SET state = 'failed', reason = ?, updated_at = ?, finished_at = ?"
            " WHERE state = 'running' AND (runner IS NULL OR runner = ? OR runner NOT IN"
            " (SELECT application_name FROM pg_stat_activity WHERE datname = current_database()))",
            (reason, now, now, application_name()))
        return self._conn.changes()
