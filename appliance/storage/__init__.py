"""Everything that touches the database lives below this package; no SQL anywhere else.

The rest of the appliance imports only what this module exports: the store and its sessions
(store.py), the errors, and the records and query shapes the repositories take and return."""

from pathlib import Path

from appliance.storage import locks
from appliance.storage.activity import ActivityRow
from appliance.storage.audit import AuditFilter, AuditRow
from appliance.storage.catalog import (
    CLIENTS, DELIVERY_ENDPOINTS, FIELD_LIBRARY, PIXELS, QUESTIONNAIRES, VALUE_SETS, WEBHOOKS, CampaignFilter,
)
from appliance.storage.console_sessions import ConsoleSessionRecord
from appliance.storage.db import (
    StorageError, StorageUnavailable, UnstorableText, hand_over_the_gil_quickly, inspect_backup, restore_database,
)
from appliance.storage.imports import MAX_ERRORS as MAX_IMPORT_ERRORS, ImportRecord
from appliance.storage.jobs import ClaimLost, Job
from appliance.storage.leads import NAME_JOIN_MAX, LeadFilter
from appliance.storage.ledger import LedgerFilter
from appliance.storage.messages import Conversation, Message, OrphanMessage
from appliance.storage.migrations import MIGRATIONS
from appliance.storage.pings import PingRecord
from appliance.storage.postgres.url import redact as redact_url
from appliance.storage.store import Session, Store, Unit
from appliance.storage.tenants import KeyListing, Principal
from appliance.storage.users import UserRecord
from appliance.storage.webhooks import NewEvents, OutboxEvent



def open_postgresql(url: str, *, lease_seconds: float, create: bool = False, keep_trying: bool = False) -> Store:
    """The store on the PostgreSQL database at `url` (its pending migrations applied; a database
    without the appliance's tables only with `create`; `keep_trying`: see PgStore.open_url), its
    running jobs leased for `lease_seconds` (storage/postgres/leases.py). psycopg is an optional
    extra, imported only here."""
    try:
        from appliance.storage.postgres.store import PgStore
    except ImportError:
        raise StorageError("the PostgreSQL backend needs the `postgresql` extra: "
                           "pip install 'appliance[postgresql]'") from None
    return PgStore.open_url(url, create=create, keep_trying=keep_trying, lease_seconds=lease_seconds)


def copy_to_postgresql(sqlite_file: Path, url: str) -> dict[str, int]:
    """The SQLite database copied into the empty PostgreSQL database at `url`, every table's row
    count checked; rows per table (storage/postgres/copy.py)."""
    try:
        from appliance.storage.postgres.copy import copy_sqlite_to_postgresql
    except ImportError:
        raise StorageError("the PostgreSQL backend needs the `postgresql` extra: "
                           "pip install 'appliance[postgresql]'") from None
    return copy_sqlite_to_postgresql(sqlite_file, url)


def restore_to_postgresql(file: Path, url: str) -> None:
    """The pg_dump archive `file` of an appliance database restored into the empty PostgreSQL
    database at `url` (storage/postgres/dump.py)."""
    try:
        from appliance.storage.postgres.dump import check_dump, restore
    except ImportError:
        raise StorageError("the PostgreSQL backend needs the `postgresql` extra: "
                           "pip install 'appliance[postgresql]'") from None
    check_dump(file)
    restore(file, url)


__all__ = [
    "CLIENTS", "DELIVERY_ENDPOINTS", "FIELD_LIBRARY", "MIGRATIONS", "NAME_JOIN_MAX", "PIXELS", "QUESTIONNAIRES", "VALUE_SETS",
    "WEBHOOKS", "NewEvents", "OutboxEvent",
    "MAX_IMPORT_ERRORS", "ImportRecord",
    "ActivityRow", "AuditFilter", "AuditRow", "UserRecord", "CampaignFilter", "ConsoleSessionRecord", "Conversation", "Job", "KeyListing", "Principal", "LeadFilter", "LedgerFilter",
    "ClaimLost", "Message", "OrphanMessage", "PingRecord", "Session", "StorageError", "StorageUnavailable", "Store", "UnstorableText", "Unit", "copy_to_postgresql", "inspect_backup", "open_postgresql", "redact_url",
    "restore_to_postgresql",
    "restore_database", "hand_over_the_gil_quickly", "locks",
]
