"""The storage seam: what services, jobs, the API and the CLI use of storage.

A `Store` runs units of work and hands out read sessions; a `Session` is one connection's set
of repositories, one per aggregate (`tx.leads`, `tx.jobs`, `tx.caps`, `tx.ledger`,
`tx.catalog`, `tx.tenants`, `tx.secrets`, `tx.messages`, `tx.files`, `tx.activity`, `tx.reports`,
`tx.webhooks`, `tx.suppression`, `tx.endpoints`, `tx.imports`, `tx.console_sessions`,
`tx.auctions`, `tx.pings`, `tx.users`, `tx.audit`, `tx.return_requests`, `tx.balances`).
Nothing above this package sees a connection, SQL or the database engine, so a second backend
implements these two classes and its repositories and leaves the callers alone.

Units of work: `await store.write(unit)` runs `unit(tx)` inside the next group transaction and
returns once it is committed. A unit may run more than once before its group commits (a unit
that raised sends its group round again), so it acts only through `tx` and leaves logging,
counting and other effects to the caller, after the commit.

Reads: `store.reader()` is this thread's session, each statement its own snapshot; `with
store.reader() as tx:` makes the reads inside one transaction, all as of the same commit.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import apsw

from appliance.storage.activity import Activity
from appliance.storage.audit import Audit
from appliance.storage.return_requests import ReturnRequests
from appliance.storage.users import Users
from appliance.storage.auctions import Auctions
from appliance.storage.balances import Balances
from appliance.storage.caps import Caps
from appliance.storage.catalog import Catalog
from appliance.storage.change_signal import ChangeSignal
from appliance.storage.console_sessions import ConsoleSessions
from appliance.storage.db import Database, StorageUnavailable, optimize
from appliance.storage.endpoints import Endpoints
from appliance.storage.files import Files
from appliance.storage.imports import Imports
from appliance.storage.jobs import Jobs
from appliance.storage.leads import Leads
from appliance.storage.ledger import Ledger
from appliance.storage.messages import Messages
from appliance.storage.pings import Pings
from appliance.storage.reports import Reports
from appliance.storage.secrets import Secrets
from appliance.storage.suppression import Suppression
from appliance.storage.tenants import Tenants
from appliance.storage.webhooks import Webhooks

T = TypeVar("T")


class Session:
    """The repositories over one connection. Used as a context manager, one transaction."""

    __slots__ = ("_conn", "activity", "audit", "auctions", "balances", "caps", "catalog", "console_sessions", "endpoints", "files", "imports", "jobs", "leads", "ledger", "pings",
                 "messages", "reports", "return_requests", "secrets", "suppression", "tenants", "users",
                 "webhooks")

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn
        self.leads = Leads(conn)
        self.jobs = Jobs(conn)
        self.caps = Caps(conn)
        self.ledger = Ledger(conn)
        self.catalog = Catalog(conn)
        self.tenants = Tenants(conn)
        self.secrets = Secrets(conn)
        self.messages = Messages(conn)
        self.files = Files(conn)
        self.activity = Activity(conn)
        self.audit = Audit(conn)
        self.users = Users(conn)
        self.return_requests = ReturnRequests(conn)
        self.reports = Reports(conn)
        self.webhooks = Webhooks(conn)
        self.suppression = Suppression(conn)
        self.endpoints = Endpoints(conn)
        self.imports = Imports(conn)
        self.console_sessions = ConsoleSessions(conn)
        self.auctions = Auctions(conn)
        self.balances = Balances(conn)
        self.pings = Pings(conn)

    def __enter__(self) -> Session:
        self._conn.__enter__()
        return self

    def __exit__(self, *exc: object) -> bool | None:
        return self._conn.__exit__(*exc)


Unit = Callable[[Session], T]


class Store:
    """The SQLite store: its `Database` (storage/db.py) runs the units, on one write connection
    with group commit, and the reads, on a connection per thread."""

    names_locks = False  # one writer: a unit's `locks` are ignored, so callers need not build them

    def __init__(self, database: Database) -> None:
        self.sqlite = database  # the engine underneath: for storage's own tests and tools only
        self._writer = Session(database.write_connection)
        self._local = threading.local()

    @classmethod
    def open(cls, path: Path, *, synchronous: str = "FULL") -> Store:
        return cls(Database(path, synchronous=synchronous).open())

    def close(self) -> None:
        self.sqlite.close()
        self._local = threading.local()

    @property
    def path(self) -> Path:
        return self.sqlite.path

    # ---- units of work ----------------------------------------------------------------------

    def _on_writer(self, unit: Unit[T]) -> Callable[[apsw.Connection], T]:
        # In its caller's context wherever the group runs it (another request's, the writer
        # thread): the audit log's request id and address, and log lines, are the caller's.
        writer, context = self._writer, contextvars.copy_context()
        return lambda _conn: context.run(unit, writer)

    def _full(self, exc: apsw.FullError) -> StorageUnavailable:
        """A full disk: nothing of the unit was kept, and freeing space is the remedy (not a bug)."""
        return StorageUnavailable(f"write failed: the disk of {self.sqlite.path} is full ({exc})",
                                  reason="the database's disk is full")

    async def write(self, unit: Unit[T], *, may_refuse: bool = False, locks: Iterable[str] | None = None) -> T:
        """`unit(tx)` in the next group transaction, on the event loop; returns once committed.
        `may_refuse`: the unit raises for ordinary reasons (not found, a conflict), so it runs
        under a savepoint of its own and its refusal leaves the rest of the group alone.
        `locks`: what the unit must be exact about (storage/locks.py), where several processes
        write (PostgreSQL); a unit that names none is exact against every other. SQLite's one
        writer makes every unit exact, and it ignores them."""
        try:
            return await self.sqlite.write(self._on_writer(unit), may_refuse=may_refuse)
        except apsw.FullError as exc:
            raise self._full(exc) from None

    async def write_off_loop(self, unit: Unit[T], *, may_refuse: bool = False,
                             locks: Iterable[str] | None = None) -> T:
        """`write` for a long unit (a bulk update, the activity log's batch): it runs on the
        writer thread, so the event loop goes on answering requests meanwhile."""
        try:
            return await self.sqlite.write_off_loop(self._on_writer(unit), may_refuse=may_refuse)
        except apsw.FullError as exc:
            raise self._full(exc) from None

    def write_sync(self, unit: Unit[T], *, may_refuse: bool = False, locks: Iterable[str] | None = None) -> T:
        """`write` for threads without an event loop (the CLI, start-up)."""
        try:
            return self.sqlite.write_sync(self._on_writer(unit), may_refuse=may_refuse)
        except apsw.FullError as exc:
            raise self._full(exc) from None

    # ---- reads ------------------------------------------------------------------------------

    def reader(self) -> Session:
        """This thread's read session (WAL: readers never block the writer)."""
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = Session(self.sqlite.reader())
        return session

    async def read_off_loop(self, read: Callable[[Session], T]) -> T:
        """A longer read (lists, searches) on a worker thread with its own session."""
        return await asyncio.to_thread(lambda: read(self.reader()))

    # ---- operations -------------------------------------------------------------------------

    def on_open(self, check: Callable[[], None]) -> None:
        """Run `check` once the database is open: at once, since an SQLite file opens or fails
        at start (a PostgreSQL server may be reached later)."""
        check()

    @property
    def changes(self) -> ChangeSignal | None:
        """The signal of admin changes between processes (None where it could not be opened)."""
        return self.sqlite.changes

    def announce_admin_change(self) -> None:
        """Tell every process using this database that keys or tenant configuration changed."""
        self.sqlite.announce_admin_change()

    def ping(self) -> None:
        """A trivial read: raises when the database does not answer."""
        self.sqlite.ping()

    def health(self) -> tuple[str, int]:
        """(the integrity check's verdict, migrations applied)."""
        return self.sqlite.health()

    def describe(self) -> dict[str, object]:
        """The backend and where it keeps the data, for `appliance doctor`."""
        return {"backend": "sqlite", "file": str(self.sqlite.path)}

    def backup_to(self, dest: Path) -> None:
        """A consistent copy while the service keeps writing."""
        self.sqlite.backup_to(dest)

    async def runs_timed_work(self) -> bool:
        """Whether this process runs the timed work (purges, settling interrupted SMS) that must
        run once per database: here always, since one process owns the SQLite file."""
        return True

    async def optimize(self) -> None:
        """Let the database refresh its query planner's statistics (cheap when nothing changed)."""
        await self.sqlite.write(optimize)
