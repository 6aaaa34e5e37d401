"""Schema changes as named Python functions, applied in order at open and recorded by name, so
running them twice changes nothing. Never edit a released migration: add a new one."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

import apsw

from appliance.domain.contact_hash import hash64
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


@migration
def m008_report_rollups(conn: apsw.Connection) -> None:
    # GET /api/v1/reports/summary reads these rollups (storage/reports.py), never the raw rows:
    # lead counts and money per tenant, time bucket and dimension, filled here from the rows
    # already there and then kept in the transaction of every write. Two grains: quarter hours
    # since the epoch (every UTC offset in use is a whole number of quarter hours, so any zone's
    # midnights are bucket edges) and UTC days (the inside of a long range). A NULL dimension is
    # stored as '' so rows with it meet on their key; a created_at that does not parse counts in
    # bucket 0 rather than failing the write. Money is kept by a trigger on ledger_entries; lead
    # counts by Leads.insert_lead and update_lead (storage/reports.count_lead), not by triggers on
    # leads: with a trigger, every INSERT and UPDATE of a lead (foreign key, NOT NULL) opens a
    # statement journal that copies each page the statement touches, ~30 us per lead
    # (bench/HISTORY.md), where the two statements cost ~5.
    for table, seconds in (("", 900), ("_daily", 86400)):
        conn.execute(
            f"""
            CREATE TABLE report_leads{table} (
                tenant_id TEXT NOT NULL,
                bucket INTEGER NOT NULL,          -- unixepoch(created_at) / {seconds}
                campaign_id TEXT NOT NULL DEFAULT '',
                client_id TEXT NOT NULL DEFAULT '',
                source_id TEXT NOT NULL DEFAULT '',
                status TEXT NOT NULL,
                leads INTEGER NOT NULL,           -- leads created in the bucket now in this status
                PRIMARY KEY (tenant_id, bucket, campaign_id, client_id, source_id, status)
            ) WITHOUT ROWID;
            CREATE TABLE report_money{table} (
                tenant_id TEXT NOT NULL,
                bucket INTEGER NOT NULL,
                campaign_id TEXT NOT NULL DEFAULT '',
                client_id TEXT NOT NULL DEFAULT '',
                source_id TEXT NOT NULL DEFAULT '',
                delivery_endpoint_id TEXT NOT NULL DEFAULT '',
                currency TEXT NOT NULL,
                cost REAL NOT NULL,
                revenue REAL NOT NULL,
                returns REAL NOT NULL,            -- the `return` entries (negative amounts)
                PRIMARY KEY (tenant_id, bucket, campaign_id, client_id, source_id, delivery_endpoint_id, currency)
            ) WITHOUT ROWID;
            INSERT INTO report_leads{table}
                SELECT tenant_id, coalesce(unixepoch(created_at), 0) / {seconds}, coalesce(campaign_id, ''),
                       coalesce(client_id, ''), coalesce(source_id, ''), status, count(*)
                FROM leads GROUP BY 1, 2, 3, 4, 5, 6;
            INSERT INTO report_money{table}
                SELECT tenant_id, coalesce(unixepoch(created_at), 0) / {seconds}, coalesce(campaign_id, ''),
                       coalesce(client_id, ''), coalesce(source_id, ''), coalesce(delivery_endpoint_id, ''), currency,
                       total(iif(kind = 'cost', amount, 0)), total(iif(kind = 'revenue', amount, 0)),
                       total(iif(kind = 'return', amount, 0))
                FROM ledger_entries GROUP BY 1, 2, 3, 4, 5, 6, 7;
            """
        )
    # Entries are only ever inserted (INSERT OR IGNORE, no foreign key: no statement journal).
    conn.execute(
        "CREATE TRIGGER report_entry_added AFTER INSERT ON ledger_entries BEGIN\n"
        + "".join(
            f"    INSERT INTO report_money{table} VALUES (new.tenant_id, coalesce(unixepoch(new.created_at), 0) / {s},"
            " coalesce(new.campaign_id, ''), coalesce(new.client_id, ''), coalesce(new.source_id, ''),"
            " coalesce(new.delivery_endpoint_id, ''), new.currency, iif(new.kind = 'cost', new.amount, 0),"
            " iif(new.kind = 'revenue', new.amount, 0), iif(new.kind = 'return', new.amount, 0))"
            " ON CONFLICT DO UPDATE SET cost = cost + excluded.cost, revenue = revenue + excluded.revenue,"
            " returns = returns + excluded.returns;\n"
            for table, s in (("", 900), ("_daily", 86400)))
        + "END"
    )


@migration
def m009_webhooks(conn: apsw.Connection) -> None:
    # Subscriptions are tenant configuration documents; their secrets live in `secrets`.
    # The outbox holds each event not yet delivered to one subscriber, written in the transaction
    # of the change that caused it; a lane is sent oldest first (appliance/domain/webhooks), so
    # the heads of the lanes are the first rows of each (tenant, webhook, lane) in the index.
    # One row holds the events one change caused for one subscriber (`types`, sent in order;
    # `sent` of them are delivered): a submit writes one small row, not one per event. It names
    # the lead, the submission and the status the change reached; the lead's data is read when
    # the event is sent, so the submit's transaction does not write the lead twice. A row leaves
    # when its last event is delivered or given up; each attempt stays in webhook_attempts.
    conn.execute(
        """
        CREATE TABLE webhooks (
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            webhook_id TEXT NOT NULL,
            doc BLOB NOT NULL,
            PRIMARY KEY (tenant_id, webhook_id)
        );
        CREATE TABLE webhook_outbox (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: the sender names rows by it
            tenant_id TEXT NOT NULL,
            webhook_id TEXT NOT NULL,
            lane INTEGER NOT NULL,
            event_id TEXT NOT NULL,   -- the first event's id; the next ones add -1, -2...
            types TEXT NOT NULL,      -- event names, comma separated, in order
            sent INTEGER NOT NULL DEFAULT 0,
            lead_id TEXT,
            submission_id TEXT,
            status TEXT,              -- the lead status the change reached
            created_at TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_at TEXT      -- NULL until an attempt failed: due at once
        );
        CREATE INDEX webhook_outbox_lanes ON webhook_outbox(tenant_id, webhook_id, lane, seq);
        CREATE TABLE webhook_attempts (
            attempt_id TEXT PRIMARY KEY,
            tenant_id TEXT NOT NULL,
            webhook_id TEXT NOT NULL,
            event_id TEXT NOT NULL,
            type TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            status_code INTEGER,
            error TEXT,
            state TEXT NOT NULL,
            next_attempt_at TEXT,
            created_at TEXT NOT NULL
        ) WITHOUT ROWID;
        CREATE INDEX webhook_attempts_by_webhook ON webhook_attempts(tenant_id, webhook_id, attempt_id);
        """
    )


@migration
def m010_suppression_lists(conn: apsw.Connection) -> None:
    # A list's entries are SHA-256 digests of normalized, type-prefixed values (never the values):
    # the primary key is the index a check probes, and WITHOUT ROWID keeps it the only b-tree.
    conn.execute(
        """
        CREATE TABLE suppression_lists (
            list_id TEXT PRIMARY KEY,
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            name TEXT NOT NULL,
            created_at TEXT NOT NULL,
            entry_count INTEGER NOT NULL DEFAULT 0  -- kept by the repository with every add and remove
        );
        CREATE INDEX suppression_lists_by_tenant ON suppression_lists(tenant_id, list_id);
        CREATE TABLE suppression_entries (
            list_id TEXT NOT NULL,
            hash BLOB NOT NULL CHECK (length(hash) = 32),
            PRIMARY KEY (list_id, hash)
        ) WITHOUT ROWID;
        """
    )


@migration
def m011_buyers(conn: apsw.Connection) -> None:
    # Several buyers per campaign and their health. A delivery job names the endpoint it goes to
    # once one is chosen (a crash between the choice and the send re-sends to the same buyer),
    # and the endpoints this round of the waterfall already tried (JSON list). A job waiting for
    # a paused endpoint is `paused` until the endpoint resumes.
    # endpoint_health: one row per endpoint that has answered or been paused; endpoint_outcomes:
    # answers per hour, for the last-24-hours counts. distribution_rotation: the smooth weighted
    # round-robin's running weights per campaign (JSON {endpointId: weight}), so the rotation
    # goes on exactly where it was after a restart. An endpoint event carries its data in
    # `payload` (a lead event reads the lead when it is sent).
    conn.execute(
        """
        ALTER TABLE jobs ADD COLUMN endpoint_id TEXT;
        ALTER TABLE jobs ADD COLUMN tried TEXT;
        CREATE INDEX jobs_paused ON jobs(tenant_id, endpoint_id) WHERE state = 'paused';
        CREATE TABLE endpoint_health (
            tenant_id TEXT NOT NULL,
            endpoint_id TEXT NOT NULL,
            state TEXT NOT NULL DEFAULT 'active',
            paused_reason TEXT,
            paused_at TEXT,
            consecutive_errors INTEGER NOT NULL DEFAULT 0,
            consecutive_failures INTEGER NOT NULL DEFAULT 0,
            last_success_at TEXT,
            last_error_at TEXT,
            PRIMARY KEY (tenant_id, endpoint_id)
        ) WITHOUT ROWID;
        CREATE TABLE endpoint_outcomes (
            tenant_id TEXT NOT NULL,
            endpoint_id TEXT NOT NULL,
            hour TEXT NOT NULL,
            delivered INTEGER NOT NULL DEFAULT 0,
            failed INTEGER NOT NULL DEFAULT 0,
            error INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (tenant_id, endpoint_id, hour)
        ) WITHOUT ROWID;
        CREATE TABLE distribution_rotation (
            tenant_id TEXT NOT NULL,
            campaign_id TEXT NOT NULL,
            weights BLOB NOT NULL,
            PRIMARY KEY (tenant_id, campaign_id)
        ) WITHOUT ROWID;
        ALTER TABLE webhook_outbox ADD COLUMN payload BLOB;
        """
    )


@migration
def m012_lead_imports(conn: apsw.Connection) -> None:
    # A CSV import's progress, written with the rows it imports (storage/imports.py).
    conn.execute(
        """
        CREATE TABLE lead_imports (
            import_id TEXT PRIMARY KEY,
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            campaign_id TEXT NOT NULL,
            file_name TEXT,
            process INTEGER NOT NULL,          -- 1: each row through the submit pipeline; 0: stored as `new`
            columns TEXT NOT NULL,             -- JSON: CSV column -> the submit field it fills
            state TEXT NOT NULL,               -- running, done, failed
            total INTEGER NOT NULL,            -- data rows in the file
            processed INTEGER NOT NULL DEFAULT 0,
            created INTEGER NOT NULL DEFAULT 0,
            failed INTEGER NOT NULL DEFAULT 0,
            errors TEXT NOT NULL DEFAULT '[]', -- JSON: the first rows that failed, [{row, details}]
            reason TEXT,                       -- why a failed import stopped
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            finished_at TEXT
        );
        CREATE INDEX lead_imports_running ON lead_imports(state) WHERE state = 'running';
        """
    )


@migration
def m013_console_sessions(conn: apsw.Connection) -> None:
    # The admin console's sign-ins (storage/console_sessions.py): the cookie's token is stored
    # only as its SHA-256, like API keys. A session lives while its key does (reads join api_keys).
    conn.execute(
        """
        CREATE TABLE console_sessions (
            session_hash BLOB PRIMARY KEY CHECK (length(session_hash) = 32),
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            key_id TEXT NOT NULL REFERENCES api_keys(key_id),
            csrf_token TEXT NOT NULL,  -- the forms' token: not a credential on its own
            created_at TEXT NOT NULL,
            expires_at TEXT NOT NULL
        ) WITHOUT ROWID;
        CREATE INDEX console_sessions_by_key ON console_sessions(key_id);
        CREATE INDEX console_sessions_by_expiry ON console_sessions(expires_at);
        """
    )


@migration
def m014_auctions(conn: apsw.Connection) -> None:
    # One ping round of an auction campaign (storage/auctions.py); the record is its JSON.
    conn.execute(
        """
        CREATE TABLE auctions (
            auction_id TEXT PRIMARY KEY,
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            lead_id TEXT,           -- NULL for a supplier's ping until the lead is posted
            submission_id TEXT,
            started_at TEXT NOT NULL,
            record BLOB NOT NULL
        );
        CREATE INDEX auctions_by_lead ON auctions(tenant_id, lead_id, auction_id);
        CREATE INDEX auctions_by_submission ON auctions(submission_id, auction_id);
        """
    )


@migration
def m015_supplier_pings(conn: apsw.Connection) -> None:
    # A supplier's pings (storage/pings.py), and the leads' contact digests (domain/contact_hash.py),
    # filled in for the leads already stored. The digests' indexes replace those on the values:
    # a lookup by value (dedupe, the leads list's email and phone filters) goes through its digest,
    # a ping's duplicate check by the digest alone, and a lead still writes two index entries.
    conn.execute(
        """
        CREATE TABLE pings (
            ping_id TEXT PRIMARY KEY,
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            source_id TEXT,
            campaign_id TEXT NOT NULL,
            accepted INTEGER NOT NULL,
            bid REAL,
            currency TEXT NOT NULL,
            reason TEXT,
            auction_id TEXT,
            created_at TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            lead_id TEXT
        );
        CREATE INDEX pings_by_tenant ON pings(tenant_id, ping_id);
        CREATE INDEX pings_by_created ON pings(created_at);
        ALTER TABLE leads ADD COLUMN email_hash64 INTEGER;
        ALTER TABLE leads ADD COLUMN phone_hash64 INTEGER;
        """
    )
    rows = conn.execute("SELECT seq, email, phone_e164 FROM leads WHERE email IS NOT NULL OR phone_e164 IS NOT NULL"
                        ).fetchall()
    conn.executemany("UPDATE leads SET email_hash64 = ?, phone_hash64 = ? WHERE seq = ?",
                     [(hash64(email), hash64(phone), seq) for seq, email, phone in rows])
    conn.execute(
        """
        DROP INDEX leads_by_email;
        DROP INDEX leads_by_phone;
        CREATE INDEX leads_by_email_hash ON leads(tenant_id, email_hash64, created_at) WHERE email_hash64 IS NOT NULL;
        CREATE INDEX leads_by_phone_hash ON leads(tenant_id, phone_hash64, created_at) WHERE phone_hash64 IS NOT NULL;
        """
    )


@migration
def m016_people(conn: apsw.Connection) -> None:
    # Staff and party users (storage/users.py), their one-time setup links, the sign-in throttle,
    # the audit log (storage/audit.py), tenants' own settings and keys' roles (today's keys stay `admin`). Console
    # sessions now belong to users: the sessions of API keys end here, since keys no longer open
    # the console. Setup tokens and session tokens are stored only as their SHA-256.
    conn.execute(
        """
        ALTER TABLE api_keys ADD COLUMN role TEXT NOT NULL DEFAULT 'admin';
        ALTER TABLE tenants ADD COLUMN settings TEXT NOT NULL DEFAULT '{}';  -- the bundle's `settings`
        CREATE TABLE users (
            user_id TEXT PRIMARY KEY,
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            email TEXT NOT NULL,    -- lower case: one spelling per address
            name TEXT NOT NULL DEFAULT '',
            role TEXT NOT NULL,
            client_id TEXT,
            supplier_id TEXT,
            active INTEGER NOT NULL DEFAULT 1,
            password_hash TEXT,     -- argon2id, PHC string; NULL until the setup link is used
            totp_secret BLOB,       -- sealed with the master key; NULL until enrolled
            totp_pending BLOB,      -- a secret being enrolled, sealed
            totp_last_step INTEGER, -- the last accepted code's time step: a code works once
            recovery_codes TEXT NOT NULL DEFAULT '[]',  -- SHA-256 hex of the unused codes
            created_at TEXT NOT NULL,
            last_sign_in_at TEXT,
            UNIQUE (tenant_id, email)
        );
        CREATE INDEX users_by_email ON users(email);
        CREATE TABLE setup_tokens (
            token_hash BLOB PRIMARY KEY CHECK (length(token_hash) = 32),
            user_id TEXT NOT NULL REFERENCES users(user_id),
            created_at TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            used_at TEXT
        ) WITHOUT ROWID;
        CREATE INDEX setup_tokens_by_user ON setup_tokens(user_id);
        CREATE TABLE sign_in_throttle (
            subject TEXT PRIMARY KEY,  -- 'email:<address>' or 'ip:<address>'
            failures INTEGER NOT NULL,
            blocked_until TEXT NOT NULL,
            updated_at TEXT NOT NULL
        ) WITHOUT ROWID;
        DROP TABLE console_sessions;
        CREATE TABLE console_sessions (
            session_hash BLOB PRIMARY KEY CHECK (length(session_hash) = 32),
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            user_id TEXT NOT NULL REFERENCES users(user_id),
            stage TEXT NOT NULL,    -- 'live', or a step still owed: 'code' (TOTP), 'enrol'
            csrf_token TEXT NOT NULL,
            created_at TEXT NOT NULL,
            expires_at TEXT NOT NULL
        ) WITHOUT ROWID;
        CREATE INDEX console_sessions_by_user ON console_sessions(user_id);
        CREATE INDEX console_sessions_by_expiry ON console_sessions(expires_at);
        CREATE TABLE audit_log (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            audit_id TEXT NOT NULL UNIQUE,
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            at TEXT NOT NULL,
            actor TEXT NOT NULL,
            action TEXT NOT NULL,
            target TEXT,
            before TEXT,            -- JSON, secrets never in it
            after TEXT,
            ip TEXT,
            request_id TEXT
        );
        CREATE INDEX audit_by_tenant ON audit_log(tenant_id, seq);
        CREATE INDEX audit_by_at ON audit_log(at);
        CREATE TRIGGER audit_log_append_only BEFORE UPDATE ON audit_log
        BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
        """
    )


@migration
def m017_clients(conn: apsw.Connection) -> None:
    # Clients (buyers) as records of their own (storage/catalog.py's CLIENTS), a document each.
    conn.execute(
        """
        CREATE TABLE clients (
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            client_id TEXT NOT NULL,
            doc BLOB NOT NULL,
            PRIMARY KEY (tenant_id, client_id)
        );
        """
    )


@migration
def m018_return_requests(conn: apsw.Connection) -> None:
    # Buyers' return requests (storage/return_requests.py), and the index that counts a client's
    # sales of the last days for its return policy's maxPercent.
    conn.execute(
        """
        CREATE TABLE return_requests (
            request_id TEXT PRIMARY KEY,
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            lead_id TEXT NOT NULL,
            client_id TEXT,
            state TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'rejected')),
            reason TEXT NOT NULL,
            note TEXT,
            requested_by TEXT NOT NULL,
            created_at TEXT NOT NULL,
            decided_by TEXT,
            decided_at TEXT,
            decision_note TEXT
        );
        CREATE INDEX return_requests_by_tenant ON return_requests(tenant_id, state, request_id);
        CREATE INDEX return_requests_by_client ON return_requests(tenant_id, client_id, created_at);
        CREATE UNIQUE INDEX return_requests_one_open ON return_requests(tenant_id, lead_id) WHERE state = 'pending';
        CREATE INDEX ledger_entries_sales ON ledger_entries(tenant_id, client_id, created_at) WHERE kind = 'revenue';
        """
    )


@migration
def m019_client_balances(conn: apsw.Connection) -> None:
    # Clients' balances (storage/balances.py): an entry per sale, return and credit with the
    # running balance after it, numbered per client; and the amount a delivery under way holds
    # on its job row until its outcome (counted while the job runs).
    conn.execute(
        """
        CREATE TABLE balance_entries (
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            client_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            at TEXT NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('sale', 'return', 'credit')),
            amount REAL NOT NULL,
            balance REAL NOT NULL,
            currency TEXT NOT NULL,
            lead_id TEXT,
            note TEXT,
            PRIMARY KEY (tenant_id, client_id, seq)
        );
        CREATE INDEX balance_entries_by_time ON balance_entries(tenant_id, client_id, at);
        ALTER TABLE jobs ADD COLUMN hold_client TEXT;
        ALTER TABLE jobs ADD COLUMN hold_amount REAL;
        CREATE INDEX jobs_balance_holds ON jobs(tenant_id, hold_client)
            WHERE state = 'running' AND hold_client IS NOT NULL;
        """
    )


@migration
def m020_portal_indexes(conn: apsw.Connection) -> None:
    # The portal (appliance/portal/): a supplier's leads newest first, and its sources' payouts,
    # each an index walk per source that stops at the page's end.
    conn.execute(
        """
        CREATE INDEX leads_by_source ON leads(tenant_id, source_id, lead_id);
        CREATE INDEX ledger_entries_costs ON ledger_entries(tenant_id, source_id, entry_id) WHERE kind = 'cost';
        """
    )


@migration
def m021_esign_files(conn: apsw.Connection) -> None:
    # Documents sent for e-signature (services/esign.py): a provider's callback names its own
    # document id, found through `esign_ref` (`<adapter>:<provider document id>`); the signed
    # file is kept beside its file reference.
    conn.execute(
        """
        ALTER TABLE files ADD COLUMN esign_ref TEXT;
        CREATE INDEX files_by_esign_ref ON files(tenant_id, esign_ref) WHERE esign_ref IS NOT NULL;
        CREATE TABLE file_contents (
            file_id TEXT PRIMARY KEY REFERENCES files(file_id),
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            content_type TEXT NOT NULL,
            content BLOB NOT NULL,
            created_at TEXT NOT NULL
        );
        """
    )


@migration
def m022_sms_two_way(conn: apsw.Connection) -> None:
    # Two-way SMS (services/sms_webhooks.py): a delivery report names the provider's message id;
    # an inbound message from a number no lead has is kept apart (it has no lead or conversation);
    # an opt-out is the SHA-256 digest of the E.164 phone, as suppression entries are.
    conn.execute(
        """
        CREATE INDEX sms_messages_by_provider_id ON sms_messages(tenant_id, provider_type, provider_message_id)
            WHERE provider_message_id IS NOT NULL;
        CREATE TABLE sms_orphan_messages (
            message_id TEXT PRIMARY KEY,
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            direction TEXT NOT NULL,           -- inbound, or outbound for a HELP answer
            sender TEXT NOT NULL,
            recipient TEXT NOT NULL,
            body TEXT NOT NULL,
            provider_id TEXT,
            provider_type TEXT NOT NULL,
            provider_message_id TEXT,
            status TEXT NOT NULL,
            created_at TEXT NOT NULL
        );
        CREATE INDEX sms_orphan_messages_by_tenant ON sms_orphan_messages(tenant_id, message_id);
        CREATE INDEX sms_orphan_messages_by_provider_id
            ON sms_orphan_messages(tenant_id, provider_type, provider_message_id) WHERE provider_message_id IS NOT NULL;
        CREATE INDEX sms_orphan_messages_sending ON sms_orphan_messages(created_at) WHERE status = 'sending';
        CREATE TABLE sms_opt_outs (
            tenant_id TEXT NOT NULL REFERENCES tenants(tenant_id),
            hash BLOB NOT NULL CHECK (length(hash) = 32),
            keyword TEXT NOT NULL,
            since TEXT NOT NULL,
            PRIMARY KEY (tenant_id, hash)
        ) WITHOUT ROWID;
        """
    )
