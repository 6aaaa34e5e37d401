"""Leads and their submissions."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import apsw

from appliance.domain.contact_hash import hash64, hash64_of_hex, sha256_hex
from appliance.domain.lead import LeadRecord, Submission
from appliance.storage.packed import PackedDocs
from appliance.storage.reports import count_lead, count_leads

# The columns each read selects before `doc`, which holds the rest of the record (packed.py).
_LEADS = PackedDocs(LeadRecord, ("lead_id", "status", "campaign_id", "client_id", "offer_id", "source_id", "email",
                                 "phone_e164", "is_test", "created_at", "updated_at"))
_SUBMISSIONS = PackedDocs(Submission, ("submission_id", "lead_id", "submission_number", "status", "flow_type",
                                       "created_at", "updated_at"))
_LEAD_ROW = ", ".join(f"l.{name}" for name in (*_LEADS.columns, "doc"))
_SUBMISSION_ROW = ", ".join((*_SUBMISSIONS.columns, "doc"))
_LEAD_BY_ID = f"SELECT {_LEAD_ROW} FROM leads l WHERE lead_id = ? AND tenant_id = ?"
_SUBMISSION_BY_ID = f"SELECT {_SUBMISSION_ROW} FROM submissions WHERE submission_id = ? AND tenant_id = ?"


_INSERT_LEAD = ("INSERT INTO leads(lead_id, tenant_id, intake_campaign_id, campaign_id, client_id, offer_id, source_id,"
                " status, email, phone_e164, is_test, created_at, updated_at, doc, email_hash64, phone_hash64)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")


def _lead_row(tenant_id: str, lead: LeadRecord, intake_campaign_id: str) -> tuple:
    return (lead.lead_id, tenant_id, intake_campaign_id, lead.campaign_id, lead.client_id, lead.offer_id,
            lead.source_id, lead.status, lead.email, lead.phone_e164, int(lead.is_test), lead.created_at,
            lead.updated_at, _LEADS.pack(lead), hash64(lead.email), hash64(lead.phone_e164))


def _names(lead: LeadRecord) -> str:
    return " ".join(part for part in (lead.first_name, lead.last_name) if part)


_INSERT_SUBMISSION = ("INSERT INTO submissions(submission_id, tenant_id, lead_id, submission_number, campaign_id, status,"
                      " flow_type, created_at, updated_at, doc) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")


def _submission_row(tenant_id: str, submission: Submission) -> tuple:
    return (submission.submission_id, tenant_id, submission.lead_id, submission.submission_number,
            submission.campaign.campaign_id, submission.status, submission.flow_type, submission.created_at,
            submission.updated_at, _SUBMISSIONS.pack(submission))


def _was(conn: apsw.Connection, tenant_id: str, lead_id: str) -> tuple | None:
    """What `update_lead` compares a lead with: the stored lead's status, dimensions and creation
    time (what the report counts are kept by), then its other indexed columns."""
    return conn.execute("SELECT status, campaign_id, client_id, source_id, created_at, offer_id, email, phone_e164"
                        " FROM leads WHERE tenant_id = ? AND lead_id = ?", (tenant_id, lead_id)).fetchone()


def _was_of(lead: LeadRecord) -> tuple:
    return (lead.status, lead.campaign_id, lead.client_id, lead.source_id, lead.created_at, lead.offer_id,
            lead.email, lead.phone_e164)


def _moved_counts(stored: tuple | None, new: tuple) -> dict[tuple, int] | None:
    """The report counts an update moves (`count_leads`' argument), from the stored lead and the
    updated one as `_was` and `_was_of` give them: one lead off the stored status and dimensions,
    one onto the new ones; None when those did not change."""
    if stored is None or stored[:4] == new[:4]:
        return None
    status, campaign_id, client_id, source_id, created_at = stored[:5]
    new_status, new_campaign_id, new_client_id, new_source_id = new[:4]
    return {(created_at, campaign_id, client_id, source_id, status): -1,
            (created_at, new_campaign_id, new_client_id, new_source_id, new_status): 1}


# The lead's columns an index holds, by their place in `_was`. An UPDATE rewrites the entries of
# every index holding a column it sets, even one set to the value it had (recording a delivery
# cost SQLite 14 us instead of 4: bench/HISTORY.md), so `update_lead` names only those that changed.
_INDEXED = {"status": 0, "campaign_id": 1, "client_id": 2, "offer_id": 5, "email": 6, "phone_e164": 7}
_DIGESTS = {"email": "email_hash64", "phone_e164": "phone_hash64"}  # written with the value they digest


@functools.cache
def _update_lead_sql(changed: tuple[str, ...]) -> str:
    columns = [column for name in changed for column in (name, _DIGESTS.get(name)) if column]
    return (f"UPDATE leads SET {''.join(f'{name} = ?, ' for name in columns)}source_id = ?, is_test = ?,"
            " updated_at = ?, doc = ? WHERE tenant_id = ? AND lead_id = ?")


def _changed_values(changed: tuple[str, ...], new: tuple) -> list:
    values = []
    for name in changed:
        value = new[_INDEXED[name]]
        values.append(value)
        if name in _DIGESTS:
            values.append(hash64(value))
    return values


@dataclass(frozen=True)
class LeadFilter:
    campaign_ids: tuple[str, ...] = ()
    client_ids: tuple[str, ...] = ()
    offer_ids: tuple[str, ...] = ()
    status: str | None = None
    email: str | None = None
    phone_e164: str | None = None
    lead_id: str | None = None
    name_query: str | None = None  # FTS5 query over first and last names
    after_id: str | None = None    # lower id bound (startDate), inclusive
    before_id: str | None = None   # upper id bound (endDate or the cursor), exclusive


# Name searches with fewer FTS matches than this (all tenants) look every match up and sort them
# (~4 us each); more common names walk the tenant's leads newest first instead (bench/volume.py).
NAME_JOIN_MAX = 2000
_LIST_INDEXES = {"campaign_id": "leads_by_campaign", "client_id": "leads_by_client", "offer_id": "leads_by_offer"}


def _by_digest(where: LeadFilter, clauses: list[str], params: list) -> None:
    """A filter on a lead's email or phone, also on its digest: the indexed column."""
    for column, value in (("email_hash64", where.email), ("phone_hash64", where.phone_e164)):
        if value is not None:
            clauses.append(f"l.{column} = ?")
            params.append(hash64(value))


class Leads:
    """Leads and their submissions: the records and the documents the API returns."""

    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def insert_lead(self, tenant_id: str, lead: LeadRecord, intake_campaign_id: str) -> None:
        self._conn.execute(_INSERT_LEAD, _lead_row(tenant_id, lead, intake_campaign_id))
        names = _names(lead)
        if names:
            self._conn.execute("INSERT INTO leads_names(rowid, name) VALUES (last_insert_rowid(), ?)", (names,))
        count_lead(self._conn, tenant_id, lead.created_at, lead.campaign_id, lead.client_id, lead.source_id,
                   lead.status, 1)

    def insert_leads(self, tenant_id: str, leads: Sequence[LeadRecord], intake_campaign_id: str) -> None:
        """`insert_lead` for a batch (a CSV import's): the same rows, names and report counts, in
        a few statements instead of several per lead."""
        self._conn.executemany(_INSERT_LEAD, [_lead_row(tenant_id, lead, intake_campaign_id) for lead in leads])
        self._conn.executemany("INSERT INTO leads_names(rowid, name) SELECT seq, ? FROM leads WHERE lead_id = ?",
                               [(names, lead.lead_id) for lead in leads if (names := _names(lead))])
        count_leads(self._conn, tenant_id, Counter(
            (lead.created_at, lead.campaign_id, lead.client_id, lead.source_id, lead.status) for lead in leads))

    def update_lead(self, tenant_id: str, lead: LeadRecord, *, names_changed: bool = False,
                    was: LeadRecord | None = None) -> None:
        """`was`: the stored lead as this transaction read it (its row is then not read again). Only
        the indexed columns that differ from it are written: an older record would leave one stale."""
        stored = _was(self._conn, tenant_id, lead.lead_id) if was is None else _was_of(was)
        new = _was_of(lead)
        changed = tuple(name for name, at in _INDEXED.items() if stored is None or new[at] != stored[at])
        self._conn.execute(
            _update_lead_sql(changed),
            (*_changed_values(changed, new), lead.source_id, int(lead.is_test), lead.updated_at,
             _LEADS.pack(lead), tenant_id, lead.lead_id),
        )
        if (moved := _moved_counts(stored, new)) is not None:
            count_leads(self._conn, tenant_id, moved)
        if names_changed:
            (rowid,) = self._conn.execute("SELECT rowid FROM leads WHERE lead_id = ?", (lead.lead_id,)).fetchone()
            self._conn.execute("DELETE FROM leads_names WHERE rowid = ?", (rowid,))
            if names := _names(lead):
                self._conn.execute("INSERT INTO leads_names(rowid, name) VALUES (?, ?)", (rowid, names))

    def get_lead(self, tenant_id: str, lead_id: str) -> LeadRecord | None:
        found = self.lead_row(tenant_id, lead_id)
        return _LEADS.unpack(found) if found else None

    def lead_row(self, tenant_id: str, lead_id: str) -> tuple | None:
        """The lead's row as stored, `lead_of` its record: two reads of an unchanged lead give
        equal rows, so a reader holding the first's record need not decode the second."""
        return self._conn.execute(_LEAD_BY_ID, (lead_id, tenant_id)).fetchone()

    @staticmethod
    def lead_of(row: tuple) -> LeadRecord:
        return _LEADS.unpack(row)

    def get_leads(self, tenant_id: str, lead_ids: Sequence[str]) -> list[LeadRecord]:
        found: list[LeadRecord] = []
        for start in range(0, len(lead_ids), 500):
            chunk = lead_ids[start:start + 500]
            marks = ",".join("?" * len(chunk))
            found.extend(
                _LEADS.unpack(row) for row in self._conn.execute(
                    f"SELECT {_LEAD_ROW} FROM leads l WHERE tenant_id = ? AND lead_id IN ({marks})", (tenant_id, *chunk))
            )
        return found

    def latest_lead_with_phone(self, tenant_id: str, phone_e164: str) -> str | None:
        """The id of the tenant's most recent lead with this phone (an inbound text's sender)."""
        found = self._conn.execute(
            "SELECT lead_id FROM leads WHERE tenant_id = ? AND phone_hash64 = ? AND phone_e164 = ?"
            " ORDER BY created_at DESC, lead_id DESC LIMIT 1", (tenant_id, hash64(phone_e164), phone_e164)).fetchone()
        return found[0] if found else None

    def earlier_leads(self, tenant_id: str, intake_campaign_id: str, email: str | None,
                      phone_e164: str | None, since: str) -> list[tuple[str, str | None, str | None, str]]:
        """Live (not duplicate, not test) leads posted to the campaign since `since`, sharing the email
        or the phone: (leadId, email, phoneE164, createdAt), oldest first."""
        rows: dict[str, tuple] = {}
        for column, value in (("email", email), ("phone_e164", phone_e164)):
            if not value:
                continue
            for row in self._conn.execute(
                f"SELECT lead_id, email, phone_e164, created_at FROM leads WHERE tenant_id = ? AND {_DIGESTS[column]} = ?"
                f" AND {column} = ? AND created_at >= ? AND intake_campaign_id = ? AND status != 'duplicate'"
                " AND is_test = 0",
                (tenant_id, hash64(value), value, since, intake_campaign_id),
            ):
                rows[row[0]] = row
        return sorted(rows.values())

    def earlier_leads_by_hash(self, tenant_id: str, intake_campaign_id: str, email_sha256: str | None,
                              phone_sha256: str | None, since: str) -> list[tuple[str, str | None, str | None, str]]:
        """`earlier_leads` for a contact given as the hex SHA-256 of its normalized email or
        E.164 phone (a supplier's ping): the leads whose value has that digest."""
        rows: dict[str, tuple] = {}
        for column, value, digest in (("email_hash64", "email", email_sha256),
                                      ("phone_hash64", "phone_e164", phone_sha256)):
            if not digest:
                continue
            for row in self._conn.execute(
                f"SELECT lead_id, email, phone_e164, created_at FROM leads WHERE tenant_id = ? AND {column} = ?"
                " AND created_at >= ? AND intake_campaign_id = ? AND status != 'duplicate' AND is_test = 0",
                (tenant_id, hash64_of_hex(digest), since, intake_campaign_id),
            ):
                stored = row[1] if value == "email" else row[2]
                if stored and sha256_hex(stored) == digest:  # the indexed 64 bits may collide
                    rows[row[0]] = row
        return sorted(rows.values())

    def insert_submission(self, tenant_id: str, submission: Submission) -> None:
        self._conn.execute(_INSERT_SUBMISSION, _submission_row(tenant_id, submission))

    def insert_submissions(self, tenant_id: str, submissions: Sequence[Submission]) -> None:
        self._conn.executemany(_INSERT_SUBMISSION, [_submission_row(tenant_id, s) for s in submissions])

    def update_submission(self, tenant_id: str, submission: Submission) -> None:
        self._conn.execute(
            "UPDATE submissions SET campaign_id = ?, status = ?, flow_type = ?, updated_at = ?, doc = ?"
            " WHERE submission_id = ? AND tenant_id = ?",
            (submission.campaign.campaign_id, submission.status, submission.flow_type, submission.updated_at,
             _SUBMISSIONS.pack(submission), submission.submission_id, tenant_id),
        )

    def get_submission(self, tenant_id: str, submission_id: str) -> Submission | None:
        found = self.submission_row(tenant_id, submission_id)
        return _SUBMISSIONS.unpack(found) if found else None

    def submission_row(self, tenant_id: str, submission_id: str) -> tuple | None:
        """The submission's row as stored, `submission_of` its record (see `lead_row`)."""
        return self._conn.execute(_SUBMISSION_BY_ID, (submission_id, tenant_id)).fetchone()

    def rows_later(self, tenant_id: str, lead_id: str, submission_id: str) -> Callable[[], tuple[tuple | None, tuple | None]]:
        """`lead_row` and `submission_row` asked now, answered when called: a store that sends
        statements without waiting (PostgreSQL's pipeline) answers them with the unit's next wait."""
        rows = self.lead_row(tenant_id, lead_id), self.submission_row(tenant_id, submission_id)
        return lambda: rows

    def rows_of(self, keys: Sequence[tuple[str, str, str]]) -> list[tuple[tuple | None, tuple | None]]:
        """`lead_row` and `submission_row` of each (tenant_id, lead_id, submission_id), in order."""
        return [(self.lead_row(tenant_id, lead_id), self.submission_row(tenant_id, submission_id))
                for tenant_id, lead_id, submission_id in keys]

    @staticmethod
    def submission_of(row: tuple) -> Submission:
        return _SUBMISSIONS.unpack(row)

    def submissions_of(self, tenant_id: str, lead_id: str) -> list[Submission]:
        return [_SUBMISSIONS.unpack(row) for row in self._conn.execute(
            f"SELECT {_SUBMISSION_ROW} FROM submissions WHERE lead_id = ? AND tenant_id = ? ORDER BY submission_number",
            (lead_id, tenant_id))]

    def latest_submission(self, tenant_id: str, lead_id: str) -> Submission | None:
        found = self._conn.execute(
            f"SELECT {_SUBMISSION_ROW} FROM submissions WHERE lead_id = ? AND tenant_id = ?"
            " ORDER BY submission_number DESC LIMIT 1", (lead_id, tenant_id)).fetchone()
        return _SUBMISSIONS.unpack(found) if found else None

    def lead_exists(self, tenant_id: str, lead_id: str) -> bool:
        return self._conn.execute("SELECT 1 FROM leads WHERE lead_id = ? AND tenant_id = ?", (lead_id, tenant_id)).fetchone() is not None

    def lead_page(self, tenant_id: str, where: LeadFilter, limit: int) -> list[tuple[str, bytes]]:
        """One page of leads as (leadId, JSON document), newest first; ids are time-ordered, so date
        bounds and the cursor are id bounds.

        Plans that stay good without planner statistics: a name search looks its FTS matches (every
        tenant's) up when they are few and otherwise walks the tenant's leads newest first keeping
        the matches; email and phone use their index by name; several campaign, client
        or offer ids become one ordered index walk per id, each stopping at `limit`, merged."""
        clauses, params = ["l.tenant_id = ?"], [tenant_id]
        source = "leads l"
        lists = {"campaign_id": where.campaign_ids, "client_id": where.client_ids, "offer_id": where.offer_ids}
        exact = where.name_query is not None or where.email is not None or where.phone_e164 is not None \
            or where.lead_id is not None
        driver = None if exact else next((c for c, values in lists.items() if len(values) > 1), None)
        for column, values in lists.items():
            if values and column != driver:
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
            few = self._conn.execute("SELECT count(*) FROM (SELECT 1 FROM leads_names WHERE leads_names MATCH ? LIMIT ?)",
                                     (where.name_query, NAME_JOIN_MAX)).fetchone()[0] < NAME_JOIN_MAX
            if few:  # look each match up, sort them
                source = "leads_names n JOIN leads l ON l.rowid = n.rowid"
                clauses.append("leads_names MATCH ?")
            else:  # walk the tenant's leads newest first, keeping those in the (hashed) set of matches
                source = "leads l INDEXED BY leads_by_tenant"
                clauses.append("l.rowid IN (SELECT rowid FROM leads_names WHERE leads_names MATCH ?)")
            params.append(where.name_query)
        elif where.email is not None:
            # Without planner statistics (a new database, or a connection opened before the last
            # ANALYZE) SQLite walks leads_by_tenant to skip the sort: every lead of the tenant.
            source = "leads l INDEXED BY leads_by_email_hash"
        elif where.phone_e164 is not None:
            source = "leads l INDEXED BY leads_by_phone_hash"
        if driver is not None:
            arm = (f"SELECT * FROM (SELECT {_LEAD_ROW} FROM leads l INDEXED BY {_LIST_INDEXES[driver]}"
                   f" WHERE {' AND '.join(clauses)} AND l.{driver} = ? ORDER BY l.lead_id DESC LIMIT ?)")
            values = lists[driver]
            arm_params: list = []
            for value in values:
                arm_params += [*params, value, limit]
            rows = self._conn.execute(" UNION ALL ".join([arm] * len(values)) + " ORDER BY 1 DESC LIMIT ?",
                                      [*arm_params, limit])
        else:
            params.append(limit)
            rows = self._conn.execute(
                f"SELECT {_LEAD_ROW} FROM {source} WHERE {' AND '.join(clauses)} ORDER BY l.lead_id DESC LIMIT ?", params)
        return [(row[0], _LEADS.json_of(row)) for row in rows]

    def source_page(self, tenant_id: str, source_ids: Sequence[str], before_id: str | None,
                    limit: int) -> list[LeadRecord]:
        """A page of the leads of `source_ids`, newest first, before `before_id` (exclusive): one
        walk of leads_by_source per source, each stopping at `limit`, merged."""
        if not source_ids:
            return []
        bound = " AND l.lead_id < ?" if before_id is not None else ""
        arm = (f"SELECT * FROM (SELECT {_LEAD_ROW} FROM leads l INDEXED BY leads_by_source"
               f" WHERE l.tenant_id = ? AND l.source_id = ?{bound} ORDER BY l.lead_id DESC LIMIT ?) AS arm")
        params: list = []
        for source_id in source_ids:
            params += [tenant_id, source_id, *([before_id] if before_id is not None else []), limit]
        rows = self._conn.execute(" UNION ALL ".join([arm] * len(source_ids)) + " ORDER BY 1 DESC LIMIT ?",
                                  [*params, limit])
        return [_LEADS.unpack(row) for row in rows]

    def source_day_counts(self, tenant_id: str, source_ids: Sequence[str], first_day: int,
                          end_day: int) -> list[tuple[int, str, int]]:
        """(UTC day since the epoch, status, leads) of the leads of `source_ids` created on days
        [first_day, end_day), by their current status: from the daily report rollup."""
        if not source_ids:
            return []
        return self._conn.execute(
            "SELECT bucket, status, sum(leads) FROM report_leads_daily WHERE tenant_id = ? AND bucket >= ?"
            f" AND bucket < ? AND source_id IN ({','.join('?' * len(source_ids))}) GROUP BY 1, 2 HAVING sum(leads) != 0",
            (tenant_id, first_day, end_day, *source_ids)).fetchall()

    def ids_with_status(self, tenant_id: str, status: str, *, campaign_ids: Sequence[str] = (),
                        after_id: str | None = None, before_id: str | None = None, limit: int) -> list[str]:
        """Ids of the tenant's leads at `status`, oldest first (one walk of leads_by_status)."""
        clauses, params = ["tenant_id = ?", "status = ?"], [tenant_id, status]
        if campaign_ids:
            clauses.append(f"campaign_id IN ({','.join('?' * len(campaign_ids))})")
            params.extend(campaign_ids)
        for bound, value in ((">=", after_id), ("<", before_id)):
            if value is not None:
                clauses.append(f"lead_id {bound} ?")
                params.append(value)
        return [lead_id for (lead_id,) in self._conn.execute(
            f"SELECT lead_id FROM leads INDEXED BY leads_by_status WHERE {' AND '.join(clauses)}"
            " ORDER BY lead_id LIMIT ?", [*params, limit])]

    def lead_doc(self, tenant_id: str, lead_id: str) -> bytes | None:
        found = self._conn.execute(f"SELECT {_LEAD_ROW} FROM leads l WHERE lead_id = ? AND tenant_id = ?",
                                   (lead_id, tenant_id)).fetchone()
        return _LEADS.json_of(found) if found else None

    def submission_docs_of(self, tenant_id: str, lead_id: str) -> list[bytes]:
        return [_SUBMISSIONS.json_of(row) for row in self._conn.execute(
            f"SELECT {_SUBMISSION_ROW} FROM submissions WHERE lead_id = ? AND tenant_id = ? ORDER BY submission_number",
            (lead_id, tenant_id))]

    def submission_doc(self, tenant_id: str, submission_id: str) -> bytes | None:
        found = self._conn.execute(
            f"SELECT {_SUBMISSION_ROW} FROM submissions WHERE submission_id = ? AND tenant_id = ?",
            (submission_id, tenant_id)
        ).fetchone()
        return _SUBMISSIONS.json_of(found) if found else None

    def latest_submission_number(self, tenant_id: str, lead_id: str) -> int | None:
        found = self._conn.execute(
            "SELECT max(submission_number) FROM submissions WHERE lead_id = ? AND tenant_id = ?", (lead_id, tenant_id)
        ).fetchone()
        return found[0] if found else None
