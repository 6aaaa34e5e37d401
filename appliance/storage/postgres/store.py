"""The store on PostgreSQL: storage/store.py's `Store` and `Session` with the same methods and
repositories, over the engine in engine.py."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from appliance.storage.activity import Activity
from appliance.storage.audit import Audit
from appliance.storage.return_requests import ReturnRequests
from appliance.storage.users import Users
from appliance.storage.console_sessions import ConsoleSessions
from appliance.storage.db import StorageError, StorageUnavailable
from appliance.storage.locks import key_of
from appliance.storage.files import Files
from appliance.storage.auctions import Auctions
from appliance.storage.messages import Messages
from appliance.storage.pings import Pings
from appliance.storage.postgres.connection import PgConnection
from appliance.storage.postgres.dump import dump
from appliance.storage.postgres.engine import ChangeListener, PgDatabase
from appliance.storage.postgres.leases import LEASE_SECONDS, JobLeases
from appliance.storage.postgres.migrations import MIGRATIONS as PG_MIGRATIONS
from appliance.storage.postgres.repositories import (
    PgBalances,
    PgCaps,
    PgCatalog,
    PgEndpoints,
    PgImports,
    PgJobs,
    PgLeads,
    PgLedger,
    PgReports,
    PgSuppression,
)
from appliance.storage.postgres.url import redact
from appliance.storage.secrets import Secrets
from appliance.storage.store import Session, Store, Unit
from appliance.storage.tenants import Tenants
from appliance.storage.webhooks import Webhooks

T = TypeVar("T")
log = logging.getLogger("appliance.storage")

_FIRST_RETRY, _LAST_RETRY = 1.0, 30.0  # seconds between attempts to open an unreachable database (doubling)


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
        self.audit = Audit(conn)
        self.users = Users(conn)
        self.return_requests = ReturnRequests(conn)
        self.reports = PgReports(conn)
        self.webhooks = Webhooks(conn)
        self.suppression = PgSuppression(conn)
        self.endpoints = PgEndpoints(conn)
        self.imports = PgImports(conn)
        self.console_sessions = ConsoleSessions(conn)
        self.auctions = Auctions(conn)
        self.balances = PgBalances(conn)
        self.pings = Pings(conn)


def _keys(locks: Iterable[str] | None) -> list[int] | None:
    return None if locks is None else [key_of(name) for name in locks]


class PgStore(Store):
    """The store on a PostgreSQL database (`[storage] backend = "postgresql"`): units run in
    groups on this process's writer thread, scoped by the locks they name (engine.py)."""

    names_locks = True

    def __init__(self, database: PgDatabase, *, lease_seconds: float = LEASE_SECONDS) -> None:  # noqa: PLW0231 - no SQLite engine underneath
        self.postgres = database  # the engine underneath: for storage's own tests and tools only
        self.leases = JobLeases(
            lambda fn, **how: database.write_sync(lambda conn: fn(PgJobs(conn, self.leases)), **how),
            seconds=lease_seconds)
        self._ready = threading.Event()  # open, and the `on_open` checks passed
        self._checks: list[Callable[[], None]] = []
        self._checks_lock = threading.Lock()  # a check registered while the opener succeeds still runs
        self._stop = threading.Event()
        self._opener: threading.Thread | None = None

    @classmethod
    def open_url(cls, url: str, *, create: bool = False, keep_trying: bool = False,
                 lease_seconds: float = LEASE_SECONDS) -> PgStore:
        """The store on `url`. `keep_trying` (a server): when the database cannot be reached, say
        so in one line and open it in the background, retrying with growing waits; meanwhile
        every read and unit raises StorageUnavailable. A refused login or a database without the
        appliance's tables raise StorageError at once: waiting would not mend them."""
        store = cls(PgDatabase(url), lease_seconds=lease_seconds)
        try:
            store.postgres.open(create=create)
        except StorageUnavailable as exc:
            if not keep_trying:
                raise
            log.error("%s; serving anyway, requests that need the database answer 503 until it is reached "
                      "(retrying every %g to %g s)", exc, _FIRST_RETRY, _LAST_RETRY)
            store._opener = threading.Thread(target=store._open_in_background, name="appliance-open", daemon=True)
            store._opener.start()
            return store
        store._ready.set()
        return store

    @property
    def created_on_open(self) -> bool:
        """Whether opening made the appliance's tables (`appliance init` on an empty database)."""
        return any(name.startswith("m001_") for name in self.postgres.migrated_on_open)

    def on_open(self, check: Callable[[], None]) -> None:
        """Run `check` once the database is open: now when it is (its exception propagates),
        else when the background opening succeeds (an exception there keeps the store shut)."""
        with self._checks_lock:
            if not self._ready.is_set():
                self._checks.append(check)
                return
        check()

    def _open_in_background(self) -> None:
        wait = _FIRST_RETRY
        while not self._stop.wait(wait):
            try:
                self.postgres.open()
                with self._checks_lock:
                    for check in self._checks:
                        check()
                    self._ready.set()
            except StorageUnavailable:
                self.postgres.close()
                wait = min(wait * 2, _LAST_RETRY)
                continue
            except Exception as exc:  # noqa: BLE001 - one line, then stay shut (a wrong master key, say)
                self.postgres.close()
                log.error("the database was reached but cannot be served: %s", exc)
                return
            log.warning("database %s reached: serving", redact(self.postgres.url))
            return

    def close(self) -> None:
        self._stop.set()
        if self._opener is not None:
            self._opener.join(timeout=15)
        self.leases.close()
        self.postgres.close()

    def _usable(self) -> None:
        # The opening thread runs the `on_open` checks before the store is ready for anyone else.
        if not self._ready.is_set() and not self._stop.is_set() and threading.current_thread() is not self._opener:
            raise StorageUnavailable("the database has not been reached yet")

    @property
    def path(self) -> Path:
        raise StorageError("a PostgreSQL store has no database file")

    def _with_session(self, unit: Unit[T]) -> Callable[[PgConnection], T]:
        return lambda conn: unit(PgSession(conn, self.leases))

    async def write(self, unit: Unit[T], *, may_refuse: bool = False, locks: Iterable[str] | None = None) -> T:
        self._usable()
        return await self.postgres.write(self._with_session(unit), locks=_keys(locks), may_refuse=may_refuse)

    async def write_off_loop(self, unit: Unit[T], *, may_refuse: bool = False,
                             locks: Iterable[str] | None = None) -> T:
        return await self.write(unit, may_refuse=may_refuse, locks=locks)

    def write_sync(self, unit: Unit[T], *, may_refuse: bool = False, locks: Iterable[str] | None = None) -> T:
        self._usable()
        return self.postgres.write_sync(self._with_session(unit), locks=_keys(locks), may_refuse=may_refuse)

    def reader(self) -> Session:
        self._usable()
        return PgSession(self.postgres.reader(), self.leases)

    async def read_off_loop(self, read: Callable[[Session], T]) -> T:
        return await asyncio.to_thread(lambda: read(self.reader()))

    @property
    def changes(self) -> ChangeListener | None:
        return self.postgres.changes

    def announce_admin_change(self) -> None:
        self.postgres.announce_admin_change()

    def ping(self) -> None:
        self._usable()
        self.postgres.ping()

    def health(self) -> tuple[str, int]:
        self._usable()
        return self.postgres.health()

    def describe(self) -> dict[str, object]:
        """The backend and what `appliance doctor` shows of it (PgDatabase.describe), with the
        number of migrations this version knows."""
        self._usable()
        return {"backend": "postgresql", **self.postgres.describe(), "known_migrations": len(PG_MIGRATIONS)}

    def backup_to(self, dest: Path) -> None:
        """A `pg_dump -Fc` archive: one consistent snapshot while the service keeps writing."""
        dump(self.postgres.url, dest)

    async def runs_timed_work(self) -> bool:
        """Whether this process is the leader among those sharing the database (engine.TimedWorkLeader)."""
        if not self._ready.is_set():
            return False
        return await asyncio.to_thread(self.postgres.leader.holds)

    async def optimize(self) -> None:
        """PostgreSQL's autovacuum keeps the planner's statistics."""
