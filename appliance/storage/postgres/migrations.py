"""The migrations of storage/migrations.py expressed for PostgreSQL: same names, same tables and
columns, applied in order at open and recorded by name. Several processes may open one database
at once, so they are applied under an advisory lock. Differences from the SQLite schema, and why:

- BLOB is bytea; INTEGER is bigint (SQLite's integers are 64-bit); REAL is double precision.
- `INTEGER PRIMARY KEY` (a rowid) and AUTOINCREMENT are identity columns (never reused).
- WITHOUT ROWID is dropped: every PostgreSQL table is a heap with its primary key an index.
- leads_names (FTS5, contentless) is a plain table keyed by leads.seq with a GIN index over the
  name's words; the FTS5 query the API builds is turned into a tsquery (repositories.py).
- The old `ledger` table (m002) that m007 copied into ledger_entries and dropped is not made:
  no PostgreSQL install predates m007, so there is nothing to copy.
- The report rollups' money trigger is a PL/pgSQL function; `appliance_bucket` stands in for
  SQLite's `coalesce(unixepoch(t), 0) / seconds`.
- Migrations named pgNN exist only here: job leases (pg01), the process running an import (pg02)
  and counters kept per connection (pg03), which only a database several processes share needs
  (leases.py, PgImports, engine.py).
- Text is compared byte by byte (ids sort as in SQLite) because the database's collation is C:
  `apply` refuses a database created with another (see docs/postgresql.md)."""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg

MIGRATIONS: list[tuple[str, str]] = []
_LOCK = 0x6170706C69616E63  # "applianc": the advisory lock migrations are applied under


def _migration(name: str, sql: str) -> None:
    MIGRATIONS.append((name, sql))


def apply(raw: psycopg.Connection) -> list[str]:
    """Run the migrations not yet recorded on `raw` (autocommit); returns the names applied now."""
    (collation,) = raw.execute("SELECT datcollate FROM pg_database WHERE datname = current_database()").fetchone()
    if collation not in ("C", "POSIX") and not collation.startswith("C."):
        raise psycopg.ProgrammingError(
            f"the database's collation is {collation}; the appliance needs C (ids sort byte by byte): "
            "CREATE DATABASE ... TEMPLATE template0 LOCALE 'C' ENCODING 'UTF8'")
    raw.execute("SELECT pg_advisory_lock(%s)", (_LOCK,))
    try:
        raw.execute("CREATE TABLE IF NOT EXISTS migrations (name text PRIMARY KEY, applied_at text NOT NULL)")
        done = {name for (name,) in raw.execute("SELECT name FROM migrations")}
        applied = []
        for name, sql in MIGRATIONS:
            if name in done:
                continue
            with raw.transaction():  # one transaction per migration, as on SQLite
                raw.execute(sql)
                raw.execute("INSERT INTO migrations(name, applied_at) VALUES (%s, %s)",
                            (name, datetime.now(UTC).isoformat()))
            applied.append(name)
        return applied
    finally:
        raw.execute("SELECT pg_advisory_unlock(%s)", (_LOCK,))


_migration("m001_tenants_keys_catalog", """
CREATE TABLE tenants (
    tenant_id text PRIMARY KEY,
    name text NOT NULL,
    created_at text NOT NULL,
    config_rev bigint NOT NULL DEFAULT 0
);
CREATE TABLE api_keys (
    key_id text PRIMARY KEY,
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    name text NOT NULL DEFAULT '',
    kind text NOT NULL CHECK (kind IN ('tenant', 'source')),
    source_id text,
    prefix text NOT NULL,
    key_hash bytea NOT NULL UNIQUE,
    created_at text NOT NULL,
    revoked_at text,
    last_used_at text
);
CREATE INDEX api_keys_tenant ON api_keys(tenant_id, created_at);
CREATE TABLE campaigns (
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    campaign_id text NOT NULL,
    name text NOT NULL,
    client_id text,
    client_name text,
    offer_id text,
    offer_name text,
    active bigint NOT NULL,
    archived_at text,
    created_at text NOT NULL,
    updated_at text NOT NULL,
    doc bytea NOT NULL,
    public_doc bytea NOT NULL,
    PRIMARY KEY (tenant_id, campaign_id)
);
CREATE TABLE questionnaires (
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    questionnaire_id text NOT NULL,
    doc bytea NOT NULL,
    PRIMARY KEY (tenant_id, questionnaire_id)
);
CREATE TABLE field_library (
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    key text NOT NULL,
    category text NOT NULL,
    active bigint NOT NULL,
    label text NOT NULL DEFAULT '',
    doc bytea NOT NULL,
    PRIMARY KEY (tenant_id, key)
);
CREATE TABLE value_sets (
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    value_set_id text NOT NULL,
    doc bytea NOT NULL,
    PRIMARY KEY (tenant_id, value_set_id)
);
CREATE TABLE delivery_endpoints (
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    endpoint_id text NOT NULL,
    doc bytea NOT NULL,
    PRIMARY KEY (tenant_id, endpoint_id)
);
CREATE TABLE sms_settings (
    tenant_id text PRIMARY KEY REFERENCES tenants(tenant_id),
    doc bytea NOT NULL
);
CREATE TABLE pixels (
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    pixel_id text NOT NULL,
    platform text NOT NULL,
    doc bytea NOT NULL,
    PRIMARY KEY (tenant_id, pixel_id)
);
CREATE TABLE secrets (
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    ref text NOT NULL,
    sealed bytea NOT NULL,
    updated_at text NOT NULL,
    PRIMARY KEY (tenant_id, ref)
);
CREATE TABLE activity_log (
    id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    at text NOT NULL,
    tenant_id text,
    key_id text,
    method text NOT NULL,
    route text NOT NULL,
    status bigint NOT NULL,
    duration_ms double precision NOT NULL,
    request_id text NOT NULL
);
CREATE INDEX activity_log_tenant ON activity_log(tenant_id, id);
""")

_migration("m002_leads_submissions_jobs_ledger", """
CREATE TABLE leads (
    seq bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    lead_id text NOT NULL UNIQUE,
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    intake_campaign_id text NOT NULL,
    campaign_id text,
    client_id text,
    offer_id text,
    source_id text,
    status text NOT NULL,
    email text,
    phone_e164 text,
    is_test bigint NOT NULL DEFAULT 0,
    created_at text NOT NULL,
    updated_at text NOT NULL,
    doc bytea NOT NULL
);
CREATE INDEX leads_by_tenant ON leads(tenant_id, lead_id);
CREATE INDEX leads_by_email ON leads(tenant_id, email, created_at);
CREATE INDEX leads_by_phone ON leads(tenant_id, phone_e164, created_at);
CREATE INDEX leads_by_status ON leads(tenant_id, status, lead_id);
CREATE INDEX leads_by_campaign ON leads(tenant_id, campaign_id, lead_id);
CREATE TABLE leads_names (
    seq bigint PRIMARY KEY,
    name text NOT NULL
);
CREATE INDEX leads_names_words ON leads_names USING gin (to_tsvector('simple', name));
CREATE TABLE submissions (
    submission_id text PRIMARY KEY,
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    lead_id text NOT NULL REFERENCES leads(lead_id),
    submission_number bigint NOT NULL,
    campaign_id text,
    status text NOT NULL,
    flow_type text NOT NULL,
    created_at text NOT NULL,
    updated_at text NOT NULL,
    doc bytea NOT NULL,
    UNIQUE (lead_id, submission_number)
);
CREATE TABLE jobs (
    job_id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    tenant_id text NOT NULL,
    kind text NOT NULL,
    lead_id text NOT NULL,
    submission_id text NOT NULL,
    state text NOT NULL,
    due_at text NOT NULL,
    attempts bigint NOT NULL DEFAULT 0,
    last_error text,
    created_at text NOT NULL,
    updated_at text NOT NULL
);
CREATE INDEX jobs_due ON jobs(state, due_at);
CREATE INDEX jobs_by_submission ON jobs(submission_id);
CREATE TABLE cap_counters (
    tenant_id text NOT NULL,
    scope text NOT NULL,
    period_start text NOT NULL,
    count bigint NOT NULL,
    PRIMARY KEY (tenant_id, scope, period_start)
);
""")

_migration("m003_leads_by_client_and_offer", """
CREATE INDEX leads_by_client ON leads(tenant_id, client_id, lead_id);
CREATE INDEX leads_by_offer ON leads(tenant_id, offer_id, lead_id);
""")

_migration("m004_files_sms", """
CREATE TABLE files (
    file_id text PRIMARY KEY,
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    lead_id text NOT NULL,
    file_key text NOT NULL,
    created_at text NOT NULL,
    updated_at text NOT NULL,
    doc bytea NOT NULL,
    UNIQUE (tenant_id, lead_id, file_key)
);
CREATE TABLE sms_conversations (
    interaction_id text PRIMARY KEY,
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    lead_id text NOT NULL,
    sender text NOT NULL,
    recipient text NOT NULL,
    status text NOT NULL,
    message_count bigint NOT NULL DEFAULT 0,
    created_at text NOT NULL,
    updated_at text NOT NULL
);
CREATE INDEX sms_conversations_open ON sms_conversations(tenant_id, lead_id, sender, status, created_at);
CREATE TABLE sms_messages (
    message_id text PRIMARY KEY,
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    interaction_id text NOT NULL REFERENCES sms_conversations(interaction_id),
    lead_id text NOT NULL,
    direction text NOT NULL,
    sender text NOT NULL,
    recipient text NOT NULL,
    body text NOT NULL,
    encoding text NOT NULL,
    segments bigint NOT NULL,
    provider_id text,
    provider_type text NOT NULL,
    provider_message_id text,
    provider_status text,
    status text NOT NULL,
    reason text,
    created_at text NOT NULL,
    updated_at text NOT NULL
);
CREATE INDEX sms_messages_by_conversation ON sms_messages(interaction_id, message_id);
CREATE INDEX sms_messages_by_lead ON sms_messages(tenant_id, lead_id, message_id);
""")

_migration("m005_job_reservations", "ALTER TABLE jobs ADD COLUMN reservations text")

_migration("m006_sms_messages_sending",
           "CREATE INDEX sms_messages_sending ON sms_messages(created_at) WHERE status = 'sending'")

_migration("m007_ledger_entries", """
CREATE TABLE ledger_entries (
    entry_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    lead_id text NOT NULL,
    submission_id text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('cost', 'revenue', 'return')),
    milestone text,
    lead_status text NOT NULL,
    amount double precision NOT NULL,
    currency text NOT NULL,
    campaign_id text,
    client_id text,
    source_id text,
    delivery_endpoint_id text,
    created_at text NOT NULL
);
CREATE UNIQUE INDEX ledger_once ON ledger_entries(tenant_id, submission_id, milestone) WHERE milestone IS NOT NULL;
CREATE INDEX ledger_entries_by_tenant ON ledger_entries(tenant_id, entry_id);
CREATE INDEX ledger_entries_by_lead ON ledger_entries(tenant_id, lead_id, entry_id);
""")


# The counters' row of the process writing (pg03): the number its connections were given
# (engine.PgDatabase.shard), 0 for any other connection.
SHARD = "coalesce(nullif(current_setting('appliance.shard', true), '')::int, 0)"


def _money_rollup(*, sharded: bool) -> str:
    """The trigger function adding each ledger entry to the money rollups; `sharded`: into its
    process's own row (pg03)."""
    shard, key = (f", {SHARD}", ", shard") if sharded else ("", "")
    inserts = "".join(f"""
    INSERT INTO report_money{table} VALUES (new.tenant_id, appliance_bucket(new.created_at, {seconds}),
        coalesce(new.campaign_id, ''), coalesce(new.client_id, ''), coalesce(new.source_id, ''),
        coalesce(new.delivery_endpoint_id, ''), new.currency,
        CASE WHEN new.kind = 'cost' THEN new.amount ELSE 0 END,
        CASE WHEN new.kind = 'revenue' THEN new.amount ELSE 0 END,
        CASE WHEN new.kind = 'return' THEN new.amount ELSE 0 END{shard})
    ON CONFLICT (tenant_id, bucket, campaign_id, client_id, source_id, delivery_endpoint_id, currency{key}) DO UPDATE
    SET cost = report_money{table}.cost + excluded.cost, revenue = report_money{table}.revenue + excluded.revenue,
        returns = report_money{table}.returns + excluded.returns;""" for table, seconds in (("", 900), ("_daily", 86400)))
    return f"""
CREATE OR REPLACE FUNCTION report_entry_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN{inserts}
    RETURN NULL;
END $$;"""


def _sharded_counters() -> str:
    """Counters every submit or delivery adds to, one row per process (the number its connections
    carry in `appliance.shard`) instead of one per key: two processes adding to the same report
    bucket or endpoint hour never wait for each other's commit. Reads sum the rows, as they
    summed buckets."""
    keys = {"report_leads": "tenant_id, bucket, campaign_id, client_id, source_id, status",
            "report_leads_daily": "tenant_id, bucket, campaign_id, client_id, source_id, status",
            "report_money": "tenant_id, bucket, campaign_id, client_id, source_id, delivery_endpoint_id, currency",
            "report_money_daily": "tenant_id, bucket, campaign_id, client_id, source_id, delivery_endpoint_id, currency",
            "endpoint_outcomes": "tenant_id, endpoint_id, hour"}
    return "".join(f"""
ALTER TABLE {table} ADD COLUMN shard integer NOT NULL DEFAULT 0;
ALTER TABLE {table} DROP CONSTRAINT {table}_pkey;
ALTER TABLE {table} ADD PRIMARY KEY ({key}, shard);""" for table, key in keys.items()) + _money_rollup(sharded=True)


def _rollups() -> str:
    tables = []
    for table in ("", "_daily"):
        tables.append(f"""
CREATE TABLE report_leads{table} (
    tenant_id text NOT NULL,
    bucket bigint NOT NULL,
    campaign_id text NOT NULL DEFAULT '',
    client_id text NOT NULL DEFAULT '',
    source_id text NOT NULL DEFAULT '',
    status text NOT NULL,
    leads bigint NOT NULL,
    PRIMARY KEY (tenant_id, bucket, campaign_id, client_id, source_id, status)
);
CREATE TABLE report_money{table} (
    tenant_id text NOT NULL,
    bucket bigint NOT NULL,
    campaign_id text NOT NULL DEFAULT '',
    client_id text NOT NULL DEFAULT '',
    source_id text NOT NULL DEFAULT '',
    delivery_endpoint_id text NOT NULL DEFAULT '',
    currency text NOT NULL,
    cost double precision NOT NULL,
    revenue double precision NOT NULL,
    returns double precision NOT NULL,
    PRIMARY KEY (tenant_id, bucket, campaign_id, client_id, source_id, delivery_endpoint_id, currency)
);""")
    money = _money_rollup(sharded=False)
    # No lead or entry exists yet when this runs on PostgreSQL: no backfill as on SQLite.
    return "".join(tables) + f"""
-- SQLite's coalesce(unixepoch(t), 0) / seconds for the ISO 8601 times the appliance writes.
CREATE FUNCTION appliance_bucket(t text, seconds bigint) RETURNS bigint LANGUAGE sql STABLE STRICT AS
    $$ SELECT floor(extract(epoch FROM t::timestamptz))::bigint / seconds $$;
{money}
CREATE TRIGGER report_entry_added AFTER INSERT ON ledger_entries FOR EACH ROW EXECUTE FUNCTION report_entry_added();
"""


_migration("m008_report_rollups", _rollups())

_migration("m009_webhooks", """
CREATE TABLE webhooks (
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    webhook_id text NOT NULL,
    doc bytea NOT NULL,
    PRIMARY KEY (tenant_id, webhook_id)
);
CREATE TABLE webhook_outbox (
    seq bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    tenant_id text NOT NULL,
    webhook_id text NOT NULL,
    lane bigint NOT NULL,
    event_id text NOT NULL,
    types text NOT NULL,
    sent bigint NOT NULL DEFAULT 0,
    lead_id text,
    submission_id text,
    status text,
    created_at text NOT NULL,
    attempts bigint NOT NULL DEFAULT 0,
    next_attempt_at text
);
CREATE INDEX webhook_outbox_lanes ON webhook_outbox(tenant_id, webhook_id, lane, seq);
CREATE TABLE webhook_attempts (
    attempt_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    webhook_id text NOT NULL,
    event_id text NOT NULL,
    type text NOT NULL,
    attempt bigint NOT NULL,
    status_code bigint,
    error text,
    state text NOT NULL,
    next_attempt_at text,
    created_at text NOT NULL
);
CREATE INDEX webhook_attempts_by_webhook ON webhook_attempts(tenant_id, webhook_id, attempt_id);
""")

_migration("m010_suppression_lists", """
CREATE TABLE suppression_lists (
    list_id text PRIMARY KEY,
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    name text NOT NULL,
    created_at text NOT NULL,
    entry_count bigint NOT NULL DEFAULT 0
);
CREATE INDEX suppression_lists_by_tenant ON suppression_lists(tenant_id, list_id);
CREATE TABLE suppression_entries (
    list_id text NOT NULL,
    hash bytea NOT NULL CHECK (length(hash) = 32),
    PRIMARY KEY (list_id, hash)
);
""")

_migration("m011_buyers", """
ALTER TABLE jobs ADD COLUMN endpoint_id text;
ALTER TABLE jobs ADD COLUMN tried text;
CREATE INDEX jobs_paused ON jobs(tenant_id, endpoint_id) WHERE state = 'paused';
CREATE TABLE endpoint_health (
    tenant_id text NOT NULL,
    endpoint_id text NOT NULL,
    state text NOT NULL DEFAULT 'active',
    paused_reason text,
    paused_at text,
    consecutive_errors bigint NOT NULL DEFAULT 0,
    consecutive_failures bigint NOT NULL DEFAULT 0,
    last_success_at text,
    last_error_at text,
    PRIMARY KEY (tenant_id, endpoint_id)
);
CREATE TABLE endpoint_outcomes (
    tenant_id text NOT NULL,
    endpoint_id text NOT NULL,
    hour text NOT NULL,
    delivered bigint NOT NULL DEFAULT 0,
    failed bigint NOT NULL DEFAULT 0,
    error bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, endpoint_id, hour)
);
CREATE TABLE distribution_rotation (
    tenant_id text NOT NULL,
    campaign_id text NOT NULL,
    weights bytea NOT NULL,
    PRIMARY KEY (tenant_id, campaign_id)
);
ALTER TABLE webhook_outbox ADD COLUMN payload bytea;
""")

_migration("m012_lead_imports", """
CREATE TABLE lead_imports (
    import_id text PRIMARY KEY,
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    campaign_id text NOT NULL,
    file_name text,
    process bigint NOT NULL,
    columns text NOT NULL,
    state text NOT NULL,
    total bigint NOT NULL,
    processed bigint NOT NULL DEFAULT 0,
    created bigint NOT NULL DEFAULT 0,
    failed bigint NOT NULL DEFAULT 0,
    errors text NOT NULL DEFAULT '[]',
    reason text,
    created_at text NOT NULL,
    updated_at text NOT NULL,
    finished_at text
);
CREATE INDEX lead_imports_running ON lead_imports(state) WHERE state = 'running';
""")

_migration("m013_console_sessions", """
CREATE TABLE console_sessions (
    session_hash bytea PRIMARY KEY CHECK (length(session_hash) = 32),
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    key_id text NOT NULL REFERENCES api_keys(key_id),
    csrf_token text NOT NULL,
    created_at text NOT NULL,
    expires_at text NOT NULL
);
CREATE INDEX console_sessions_by_key ON console_sessions(key_id);
CREATE INDEX console_sessions_by_expiry ON console_sessions(expires_at);
""")

_migration("m014_auctions", """
CREATE TABLE auctions (
    auction_id text PRIMARY KEY,
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    lead_id text,
    submission_id text,
    started_at text NOT NULL,
    record bytea NOT NULL
);
CREATE INDEX auctions_by_lead ON auctions(tenant_id, lead_id, auction_id);
CREATE INDEX auctions_by_submission ON auctions(submission_id, auction_id);
""")

# The digests' first 8 bytes as a signed bigint, as domain/contact_hash.hash64 makes them.
_migration("m015_supplier_pings", """
CREATE TABLE pings (
    ping_id text PRIMARY KEY,
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    source_id text,
    campaign_id text NOT NULL,
    accepted bigint NOT NULL,
    bid double precision,
    currency text NOT NULL,
    reason text,
    auction_id text,
    created_at text NOT NULL,
    expires_at text NOT NULL,
    lead_id text
);
CREATE INDEX pings_by_tenant ON pings(tenant_id, ping_id);
CREATE INDEX pings_by_created ON pings(created_at);
ALTER TABLE leads ADD COLUMN email_hash64 bigint;
ALTER TABLE leads ADD COLUMN phone_hash64 bigint;
UPDATE leads SET
    email_hash64 = CASE WHEN email IS NULL OR email = '' THEN NULL
                   ELSE ('x' || left(encode(sha256(convert_to(email, 'UTF8')), 'hex'), 16))::bit(64)::bigint END,
    phone_hash64 = CASE WHEN phone_e164 IS NULL OR phone_e164 = '' THEN NULL
                   ELSE ('x' || left(encode(sha256(convert_to(phone_e164, 'UTF8')), 'hex'), 16))::bit(64)::bigint END
WHERE email IS NOT NULL OR phone_e164 IS NOT NULL;
DROP INDEX leads_by_email;
DROP INDEX leads_by_phone;
CREATE INDEX leads_by_email_hash ON leads(tenant_id, email_hash64, created_at) WHERE email_hash64 IS NOT NULL;
CREATE INDEX leads_by_phone_hash ON leads(tenant_id, phone_hash64, created_at) WHERE phone_hash64 IS NOT NULL;
""")

_migration("m016_people", """
ALTER TABLE api_keys ADD COLUMN role text NOT NULL DEFAULT 'admin';
ALTER TABLE tenants ADD COLUMN settings text NOT NULL DEFAULT '{}';
CREATE TABLE users (
    user_id text PRIMARY KEY,
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    email text NOT NULL,
    name text NOT NULL DEFAULT '',
    role text NOT NULL,
    client_id text,
    supplier_id text,
    active bigint NOT NULL DEFAULT 1,
    password_hash text,
    totp_secret bytea,
    totp_pending bytea,
    totp_last_step bigint,
    recovery_codes text NOT NULL DEFAULT '[]',
    created_at text NOT NULL,
    last_sign_in_at text,
    UNIQUE (tenant_id, email)
);
CREATE INDEX users_by_email ON users(email);
CREATE TABLE setup_tokens (
    token_hash bytea PRIMARY KEY CHECK (length(token_hash) = 32),
    user_id text NOT NULL REFERENCES users(user_id),
    created_at text NOT NULL,
    expires_at text NOT NULL,
    used_at text
);
CREATE INDEX setup_tokens_by_user ON setup_tokens(user_id);
CREATE TABLE sign_in_throttle (
    subject text PRIMARY KEY,
    failures bigint NOT NULL,
    blocked_until text NOT NULL,
    updated_at text NOT NULL
);
DROP TABLE console_sessions;
CREATE TABLE console_sessions (
    session_hash bytea PRIMARY KEY CHECK (length(session_hash) = 32),
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    user_id text NOT NULL REFERENCES users(user_id),
    stage text NOT NULL,
    csrf_token text NOT NULL,
    created_at text NOT NULL,
    expires_at text NOT NULL
);
CREATE INDEX console_sessions_by_user ON console_sessions(user_id);
CREATE INDEX console_sessions_by_expiry ON console_sessions(expires_at);
CREATE TABLE audit_log (
    seq bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    audit_id text NOT NULL UNIQUE,
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    at text NOT NULL,
    actor text NOT NULL,
    action text NOT NULL,
    target text,
    before text,
    after text,
    ip text,
    request_id text
);
CREATE INDEX audit_by_tenant ON audit_log(tenant_id, seq);
CREATE INDEX audit_by_at ON audit_log(at);
CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'the audit log is append-only'; END $$;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
""")

_migration("m017_clients", """
CREATE TABLE clients (
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    client_id text NOT NULL,
    doc bytea NOT NULL,
    PRIMARY KEY (tenant_id, client_id)
);
""")

_migration("m018_return_requests", """
CREATE TABLE return_requests (
    request_id text PRIMARY KEY,
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    lead_id text NOT NULL,
    client_id text,
    state text NOT NULL CHECK (state IN ('pending', 'approved', 'rejected')),
    reason text NOT NULL,
    note text,
    requested_by text NOT NULL,
    created_at text NOT NULL,
    decided_by text,
    decided_at text,
    decision_note text
);
CREATE INDEX return_requests_by_tenant ON return_requests(tenant_id, state, request_id);
CREATE INDEX return_requests_by_client ON return_requests(tenant_id, client_id, created_at);
CREATE UNIQUE INDEX return_requests_one_open ON return_requests(tenant_id, lead_id) WHERE state = 'pending';
CREATE INDEX ledger_entries_sales ON ledger_entries(tenant_id, client_id, created_at) WHERE kind = 'revenue';
""")

_migration("m019_client_balances", """
CREATE TABLE balance_entries (
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    client_id text NOT NULL,
    seq bigint NOT NULL,
    at text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('sale', 'return', 'credit')),
    amount double precision NOT NULL,
    balance double precision NOT NULL,
    currency text NOT NULL,
    lead_id text,
    note text,
    PRIMARY KEY (tenant_id, client_id, seq)
);
CREATE INDEX balance_entries_by_time ON balance_entries(tenant_id, client_id, at);
ALTER TABLE jobs ADD COLUMN hold_client text;
ALTER TABLE jobs ADD COLUMN hold_amount double precision;
CREATE INDEX jobs_balance_holds ON jobs(tenant_id, hold_client) WHERE state = 'running' AND hold_client IS NOT NULL;
""")

_migration("m020_portal_indexes", """
CREATE INDEX leads_by_source ON leads(tenant_id, source_id, lead_id);
CREATE INDEX ledger_entries_costs ON ledger_entries(tenant_id, source_id, entry_id) WHERE kind = 'cost';
""")

_migration("m021_esign_files", """
ALTER TABLE files ADD COLUMN esign_ref text;
CREATE INDEX files_by_esign_ref ON files(tenant_id, esign_ref) WHERE esign_ref IS NOT NULL;
CREATE TABLE file_contents (
    file_id text PRIMARY KEY REFERENCES files(file_id),
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    content_type text NOT NULL,
    content bytea NOT NULL,
    created_at text NOT NULL
);
""")

_migration("m022_sms_two_way", """
CREATE INDEX sms_messages_by_provider_id ON sms_messages(tenant_id, provider_type, provider_message_id)
    WHERE provider_message_id IS NOT NULL;
CREATE TABLE sms_orphan_messages (
    message_id text PRIMARY KEY,
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    direction text NOT NULL,
    sender text NOT NULL,
    recipient text NOT NULL,
    body text NOT NULL,
    provider_id text,
    provider_type text NOT NULL,
    provider_message_id text,
    status text NOT NULL,
    created_at text NOT NULL
);
CREATE INDEX sms_orphan_messages_by_tenant ON sms_orphan_messages(tenant_id, message_id);
CREATE INDEX sms_orphan_messages_by_provider_id
    ON sms_orphan_messages(tenant_id, provider_type, provider_message_id) WHERE provider_message_id IS NOT NULL;
CREATE INDEX sms_orphan_messages_sending ON sms_orphan_messages(created_at) WHERE status = 'sending';
CREATE TABLE sms_opt_outs (
    tenant_id text NOT NULL REFERENCES tenants(tenant_id),
    hash bytea NOT NULL CHECK (length(hash) = 32),
    keyword text NOT NULL,
    since text NOT NULL,
    PRIMARY KEY (tenant_id, hash)
);
""")

# PostgreSQL's own migrations (named pgNN: SQLite has no counterpart, and main's next mNNN
# cannot collide with them).
_migration("pg01_job_leases", """
ALTER TABLE jobs ADD COLUMN claimed_by text;
ALTER TABLE jobs ADD COLUMN lease_until timestamptz;
CREATE INDEX jobs_running_leases ON jobs(lease_until) WHERE state = 'running';
""")

_migration("pg02_import_runners", """
ALTER TABLE lead_imports ADD COLUMN runner text;
""")

_migration("pg03_sharded_counters", _sharded_counters())
