"""The store on PostgreSQL: storage/store.py's `Store` and `Session` with the same methods and
repositories, over the engine in engine.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from appliance.storage.activity import Activity
from appliance.storage.console_sessions import ConsoleSessions
from appliance.storage.db import StorageError
from appliance.storage.files import Files
from appliance.storage.imports import Imports
from appliance.storage.messages import Messages
from appliance.storage.postgres.connection import PgConnection
from appliance.storage.postgres.engine import ChangeListener, PgDatabase
from appliance.storage.postgres.leases import LEASE_SECONDS, JobLeases
from appliance.storage.postgres.repositories import (
    PgCaps,
    PgCatalog,
    PgEndpoints,
    PgJobs,
    PgLeads,
    PgLedger,
    PgReports,
    PgSuppression,
)
from appliance.storage.secrets import Secrets
from appliance.storage.store import Session, Store, Unit
from appliance.storage.tenants import Tenants
from appliance.storage.webhooks import Webhooks

T = TypeVar("T")


class PgSession(Session):
    """The repositories over one PostgreSQL connection; as a context manager, one transaction."""

    __slots__ = ()

    def __init__(self, conn: PgConnection, leases: JobLeases) -> None:  # noqa: PLW0231 - the SQLite repositories are not wanted
        self._conn = conn
        self.leads = PgLeads(conn)
        self.jobs = PgJobs(conn, leases)
        self.caps = PgCaps(conn)
        self.ledger = PgLedger(conn)
        self.catalog = PgCatalog(conn)
        self.tenants = Tenants(conn)
        self.secrets = Secrets(conn)
        self.messages = Messages(conn)
        self.files = Files(conn)
        self.activity = Activity(conn)
        self.reports = PgReports(conn)
        self.webhooks = Webhooks(conn)
        self.suppression = PgSuppression(conn)
        self.endpoints = PgEndpoints(conn)
        self.imports = Imports(conn)
        self.console_sessions = ConsoleSessions(conn)


class PgStore(Store):
    """The store on a PostgreSQL database (`[storage] backend = "postgresql"`). Units run each in
    its own serializable transaction (engine.py); `may_refuse` needs nothing more here, since no
    unit shares its transaction with another."""

    def __init__(self, database: PgDatabase, *, lease_seconds: float = LEASE_SECONDS) -> None:  # noqa: PLW0231 - no SQLite engine underneath
        self.postgres = database  # the engine underneath: for storage's own tests and tools only
        self.leases = JobLeases(lambda fn: database.write_sync(lambda conn: fn(PgJobs(conn, self.leases))),
                                seconds=lease_seconds)

    @classmethod
    def open_url(cls, url: str, *, lease_seconds: float = LEASE_SECONDS) -> PgStore:
        return cls(PgDatabase(url).open(), lease_seconds=lease_seconds)

    def close(self) -> None:
        self.leases.close()
        self.postgres.close()

    @property
    def path(self) -> Path:
        raise StorageError("a PostgreSQL store has no database file")

    def _with_session(self, unit: Unit[T]) -> Callable[[PgConnection], T]:
        return lambda conn: unit(PgSession(conn, self.leases))

    async def write(self, unit: Unit[T], *, may_refuse: bool = False) -> T:
        return await self.postgres.write(self._with_session(unit))

    async def write_off_loop(self, unit: Unit[T], *, may_refuse: bool = False) -> T:
        return await self.postgres.write(self._with_session(unit))

    def write_sync(self, unit: Unit[T], *, may_refuse: bool = False) -> T:
        return self.postgres.write_sync(self._with_session(unit))

    def reader(self) -> Session:
        return PgSession(self.postgres.reader(), self.leases)

    async def read_off_loop(self, read: Callable[[Session], T]) -> T:
        return await asyncio.to_thread(lambda: read(self.reader()))

    @property
    def changes(self) -> ChangeListener | None:
        return self.postgres.changes

    def announce_admin_change(self) -> None:
        self.postgres.announce_admin_change()

    def ping(self) -> None:
        self.postgres.ping()

    def health(self) -> tuple[str, int]:
        return self.postgres.health()

    def backup_to(self, dest: Path) -> None:
        raise StorageError("backup of a PostgreSQL database: use pg_dump (docs/postgresql-progress.md)")

    async def runs_timed_work(self) -> bool:
        """Whether this process is the leader among those sharing the database (engine.TimedWorkLeader)."""
        return await asyncio.to_thread(self.postgres.leader.holds)

    async def optimize(self) -> None:
        """PostgreSQL's autovacuum keeps the planner's statistics."""
