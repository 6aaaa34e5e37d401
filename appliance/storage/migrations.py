"""Schema changes as named Python functions, applied in order at open and recorded by name, so
running them twice changes nothing. Never edit a released migration: add a new one."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

import apsw

from appliance.ids import floor_id

Migration = Callable[[apsw.Connection], None]
MIGRATIONS: list[tuple[str, Migration]] = []


def migration(fn: Migration) -> Migration:
    MIGRATIONS.append((fn.__name__, fn))
    return fn


def apply(conn: apsw.Connection) -> list[str]:
    """Run the migrations not yet recorded; returns the names applied now."""
    conn.execute("CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
    done = {name for (name,) in conn.execute("SELECT name FROM migrations")}
    applied = []
    for name, fn in MIGRATIONS:
        if name in done:
            continue
        with conn:  # one transaction per migration: a failure leaves the earlier ones in place
            fn(conn)
            conn.execute(
                "INSERT INTO migrations(name, applied_at) VALUES (?, ?)",
                (name, datetime.now(timezone.utc).isoformat()),
            )
        applied.append(name)
    return applied


@migration
def m001_tenants_keys_catalog(conn: apsw.Connection) -> None:
    conn.execute(
        """
        CREATE TABLE tenants (
            tenant_id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            created_at TEXT NOT NULL,
            config_rev INTEGER NOT NULL DEFAULT 0  -- bumped on every config change: caches compare it
        );
        CREATE TABLE api_keys (
            key_id TEXT PRIMARY KEY,
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            name TEXT NOT NULL DEFAULT '',
            kind TEXT NOT NULL CHECK (kind IN ('tenant', 'source')),
            source_id TEXT,
            prefix TEXT NOT NULL,
            key_hash BLOB NOT NULL UNIQUE,
            created_at TEXT NOT NULL,
            revoked_at TEXT,
            last_used_at TEXT
        );
        CREATE INDEX api_keys_tenant ON api_keys(tenant_id, created_at);
        CREATE TABLE campaigns (
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            campaign_id TEXT NOT NULL,
            name TEXT NOT NULL,
            client_id TEXT,
            client_name TEXT,
            offer_id TEXT,
            offer_name TEXT,
            active INTEGER NOT NULL,
            archived_at TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            doc BLOB NOT NULL,         -- the full campaign (secrets removed: they live in secrets)
            public_doc BLOB NOT NULL,  -- the JSON GET /campaigns returns, encoded once at import
            PRIMARY KEY (tenant_id, campaign_id)
        );
        CREATE TABLE questionnaires (
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            questionnaire_id TEXT NOT NULL,
            doc BLOB NOT NULL,
            PRIMARY KEY (tenant_id, questionnaire_id)
        );
        CREATE TABLE field_library (
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            key TEXT NOT NULL,
            category TEXT NOT NULL,
            active INTEGER NOT NULL,
            label TEXT NOT NULL DEFAULT '',
            doc BLOB NOT NULL,
            PRIMARY KEY (tenant_id, key)
        );
        CREATE TABLE value_sets (
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            value_set_id TEXT NOT NULL,
            doc BLOB NOT NULL,
            PRIMARY KEY (tenant_id, value_set_id)
        );
        CREATE TABLE delivery_endpoints (
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            endpoint_id TEXT NOT NULL,
            doc BLOB NOT NULL,
            PRIMARY KEY (tenant_id, endpoint_id)
        );
        CREATE TABLE sms_settings (
            tenant_id TEXT PRIMARY KEY REFERENCES tenants(tenant_id),
            doc BLOB NOT NULL
        );
        CREATE TABLE pixels (
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            pixel_id TEXT NOT NULL,
            platform TEXT NOT NULL,
            doc BLOB NOT NULL,
            PRIMARY KEY (tenant_id, pixel_id)
        );
        CREATE TABLE secrets (
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            ref TEXT NOT NULL,      -- what the secret belongs to, e.g. endpoint:<id>:auth.token
            sealed BLOB NOT NULL,   -- AES-256-GCM envelope (see appliance/crypto.py)
            updated_at TEXT NOT NULL,
            PRIMARY KEY (tenant_id, ref)
        );
        CREATE TABLE activity_log (
            id INTEGER PRIMARY KEY,
            at TEXT NOT NULL,
            tenant_id TEXT,
            key_id TEXT,
            method TEXT NOT NULL,
            route TEXT NOT NULL,
            status INTEGER NOT NULL,
            duration_ms REAL NOT NULL,
            request_id TEXT NOT NULL
        );
        CREATE INDEX activity_log_tenant ON activity_log(tenant_id, id);
        """
    )


@migration
def m002_leads_submissions_jobs_ledger(conn: apsw.Connection) -> None:
    conn.execute(
        """
        CREATE TABLE leads (
            seq INTEGER PRIMARY KEY,           -- the rowid, declared so VACUUM keeps it: leads_names uses it
            lead_id TEXT NOT NULL UNIQUE,      -- time-ordered: newest-first listing is an id range scan
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            intake_campaign_id TEXT NOT NULL,  -- the campaign it was posted to: the dedupe scope
            campaign_id TEXT,
            client_id TEXT,
            offer_id TEXT,
            source_id TEXT,
            status TEXT NOT NULL,
            email TEXT,
            phone_e164 TEXT,
            is_test INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            doc BLOB NOT NULL                  -- the rest of the lead record (storage/packed.py)
        );
        CREATE INDEX leads_by_tenant ON leads(tenant_id, lead_id);
        CREATE INDEX leads_by_email ON leads(tenant_id, email, created_at);
        CREATE INDEX leads_by_phone ON leads(tenant_id, phone_e164, created_at);
        CREATE INDEX leads_by_status ON leads(tenant_id, status, lead_id);
        CREATE INDEX leads_by_campaign ON leads(tenant_id, campaign_id, lead_id);
        -- Names for search; contentless (the names live in leads.doc), keyed by leads.rowid.
        CREATE VIRTUAL TABLE leads_names USING fts5(
            name, content='', contentless_delete=1, tokenize='unicode61 remove_diacritics 2'
        );
        CREATE TABLE submissions (
            submission_id TEXT PRIMARY KEY,
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            lead_id TEXT NOT NULL REFERENCES leads(lead_id),
            submission_number INTEGER NOT NULL,
            campaign_id TEXT,
            status TEXT NOT NULL,
            flow_type TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            doc BLOB NOT NULL,
            UNIQUE (lead_id, submission_number)
        );
        CREATE TABLE jobs (
            job_id INTEGER PRIMARY KEY,
            tenant_id TEXT NOT NULL,
            kind TEXT NOT NULL,             -- deliver, evaluate
            lead_id TEXT NOT NULL,
            submission_id TEXT NOT NULL,
            state TEXT NOT NULL,            -- ready, held, running, done, dead, cancelled
            due_at TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            last_error TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        );
        CREATE INDEX jobs_due ON jobs(state, due_at);
        CREATE INDEX jobs_by_submission ON jobs(submission_id);
        CREATE TABLE ledger (
            entry_id INTEGER PRIMARY KEY,
            tenant_id TEXT NOT NULL,
            lead_id TEXT NOT NULL,
            submission_id TEXT NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('cost', 'revenue')),
            lead_status TEXT NOT NULL,
            amount REAL NOT NULL,
            currency TEXT NOT NULL,
            campaign_id TEXT,
            source_id TEXT,
            created_at TEXT NOT NULL
        );
        CREATE INDEX ledger_by_lead ON ledger(tenant_id, lead_id);
        CREATE TABLE cap_counters (
            tenant_id TEXT NOT NULL,
            scope TEXT NOT NULL,         -- e.g. source:<campaignId>:<sourceId>:daily
            period_start TEXT NOT NULL,  -- UTC start of the counted period; '' for lifetime
            count INTEGER NOT NULL,
            PRIMARY KEY (tenant_id, scope, period_start)
        ) WITHOUT ROWID;
        """
    )


@migration
def m003_leads_by_client_and_offer(conn: apsw.Connection) -> None:
    """GET /api/v1/leads filters by clientIds and offerIds: without these a rare client's page
    walked every lead of the tenant (1.3 s at 1M leads; bench/volume.py)."""
    conn.execute(
        """
        CREATE INDEX leads_by_client ON leads(tenant_id, client_id, lead_id);
        CREATE INDEX leads_by_offer ON leads(tenant_id, offer_id, lead_id);
        """
    )


@migration
def m004_files_sms(conn: apsw.Connection) -> None:
    """File references, SMS conversations and the
    messages sent in them."""
    conn.execute(
        """
        CREATE TABLE files (
            file_id TEXT PRIMARY KEY,
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            lead_id TEXT NOT NULL,
            file_key TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            doc BLOB NOT NULL,                 -- the file reference as the API returns it
            UNIQUE (tenant_id, lead_id, file_key)
        );
        CREATE TABLE sms_conversations (
            interaction_id TEXT PRIMARY KEY,
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            lead_id TEXT NOT NULL,
            sender TEXT NOT NULL,              -- the number (or sender id) the conversation was opened from
            recipient TEXT NOT NULL,
            status TEXT NOT NULL,              -- open, closed
            message_count INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        );
        CREATE INDEX sms_conversations_open ON sms_conversations(tenant_id, lead_id, sender, status, created_at);
        CREATE TABLE sms_messages (
            message_id TEXT PRIMARY KEY,
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            interaction_id TEXT NOT NULL REFERENCES sms_conversations(interaction_id),
            lead_id TEXT NOT NULL,
            direction TEXT NOT NULL,           -- outbound
            sender TEXT NOT NULL,
            recipient TEXT NOT NULL,
            body TEXT NOT NULL,
            encoding TEXT NOT NULL,            -- GSM-7 or UCS-2
            segments INTEGER NOT NULL,
            provider_id TEXT,                  -- the tenant's providerId; NULL for the built-in default
            provider_type TEXT NOT NULL,       -- twilio, telnyx or a plugin's
            provider_message_id TEXT,
            provider_status TEXT,
            status TEXT NOT NULL,              -- sending, sent, failed (refused), error (unreachable)
            reason TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        );
        CREATE INDEX sms_messages_by_conversation ON sms_messages(interaction_id, message_id);
        CREATE INDEX sms_messages_by_lead ON sms_messages(tenant_id, lead_id, message_id);
        """
    )


@migration
def m005_job_reservations(conn: apsw.Connection) -> None:
    # Delivery-limit slots a running attempt holds, so an interrupted attempt gives them back.
    conn.execute("ALTER TABLE jobs ADD COLUMN reservations TEXT")


@migration
def m006_sms_messages_sending(conn: apsw.Connection) -> None:
    # The ticker looks for messages left `sending` every minute; only those few are indexed.
    conn.execute("CREATE INDEX sms_messages_sending ON sms_messages(created_at) WHERE status = 'sending'")


@migration
def m007_ledger_entries(conn: apsw.Connection) -> None:
    # Entries get public `led_` ids (time-ordered: listing and date ranges are id ranges), the
    # client and delivery endpoint they belong to, `return` entries, and the identity of the
    # milestone that made them: one entry per (milestone, submission), whichever path fires it.
    conn.execute(
        """
        CREATE TABLE ledger_entries (
            entry_id TEXT PRIMARY KEY,
            tenant_id TEXT NOT NULL,
            lead_id TEXT NOT NULL,
            submission_id TEXT NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('cost', 'revenue', 'return')),
            milestone TEXT,
            lead_status TEXT NOT NULL,
            amount REAL NOT NULL,
            currency TEXT NOT NULL,
            campaign_id TEXT,
            client_id TEXT,
            source_id TEXT,
            delivery_endpoint_id TEXT,
            created_at TEXT NOT NULL
        ) WITHOUT ROWID;
        CREATE UNIQUE INDEX ledger_once ON ledger_entries(tenant_id, submission_id, milestone)
            WHERE milestone IS NOT NULL;
        CREATE INDEX ledger_entries_by_tenant ON ledger_entries(tenant_id, entry_id);
        CREATE INDEX ledger_entries_by_lead ON ledger_entries(tenant_id, lead_id, entry_id);
        """
    )
    # The entries kept so far get ids of their creation time, their old number making them unique.
    old = conn.execute("SELECT entry_id, tenant_id, lead_id, submission_id, kind, lead_status, amount, currency,"
                       " campaign_id, source_id, created_at FROM ledger ORDER BY entry_id").fetchall()
    for entry_id, tenant_id, lead_id, submission_id, kind, status, amount, currency, campaign, source, at in old:
        moment = datetime.fromisoformat(at.replace("Z", "+00:00"))
        ref = floor_id("led", int(moment.timestamp() * 1000))[:-8] + f"{entry_id:08d}"
        conn.execute("INSERT INTO ledger_entries(entry_id, tenant_id, lead_id, submission_id, kind, milestone,"
                     " lead_status, amount, currency, campaign_id, source_id, created_at)"
                     " VALUES (?, ?, ?, ?, ?, NULL, ?, ?, ?, ?, ?, ?)",
                     (ref, tenant_id, lead_id, submission_id, kind, status, amount, currency, campaign, source, at))
    conn.execute("DROP TABLE ledger")
