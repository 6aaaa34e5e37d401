"""A psycopg connection shaped like the apsw one the repositories were written against:
`execute` and `executemany` taking `?` / `?N` parameters, `changes()` and `total_changes()`, and
use as a context manager for one transaction. The repositories' standard SQL thus runs on both
engines; what PostgreSQL spells differently is overridden per repository (repositories.py).

The translation is mechanical and cached per statement: `?` and `?N` become `%s` (the values
reordered and repeated as `?N` asks), a literal `%` is doubled for psycopg, string literals are
left alone, and SQLite's planner hint `INDEXED BY name` is dropped (PostgreSQL plans with its own
statistics)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

import psycopg
from psycopg.adapt import Loader
from psycopg.types.string import StrDumper

from appliance.storage.db import StorageUnavailable, UnstorableText
from appliance.storage.locks import key_of

_TOKEN = re.compile(r"'(?:[^']|'')*'|\?(\d*)|%|\s+INDEXED BY \w+")


@lru_cache(maxsize=4096)
def translate(sql: str) -> tuple[str, tuple[int, ...] | None]:
    """(psycopg SQL, the index of the value each placeholder takes; None: in order)."""
    order: list[int] = []
    numbered = False

    def swap(match: re.Match) -> str:
        nonlocal numbered
        token = match.group(0)
        if token == "%":
            return "%%"
        if token.startswith("?"):
            if match.group(1):
                numbered = True
                order.append(int(match.group(1)) - 1)
            else:
                order.append(len(order))
            return "%s"
        if token.lstrip().startswith("INDEXED BY"):
            return ""
        return token  # a string literal

    translated = _TOKEN.sub(swap, sql)
    return translated, tuple(order) if numbered else None


def _values(params: Sequence[Any] | None, order: tuple[int, ...] | None) -> Sequence[Any] | None:
    if params is None or order is None:
        return params
    return [params[i] for i in order]


class _IntegralNumeric(Loader):
    """sum() of an integer column is `numeric` in PostgreSQL; the callers expect what SQLite
    gives: an int (a float where the value has a fraction)."""

    def load(self, data: bytes) -> int | float:
        text = bytes(data).decode()
        return float(text) if "." in text or "e" in text.lower() or text == "NaN" else int(text)


# What libpq says when the server answered and refused the login: retrying will not help. Connection
# failures carry no SQLSTATE, so the (English, the server's default) text is all there is to go by.
_REFUSED_FOR_GOOD = ("does not exist", "authentication failed", "pg_hba.conf", "password", "permission denied",
                     "not permitted to log in")


def refused_for_good(exc: psycopg.Error) -> bool:
    """A login the server refused (credentials, database name, access rules), not an outage."""
    text = str(exc)
    return ("FATAL" in text and any(phrase in text for phrase in _REFUSED_FOR_GOOD)) or "fe_sendauth" in text


def unavailable(exc: BaseException) -> bool:
    """A failure of the server or of the way to it, not of the statement: no connection, the
    connection lost, the server starting, stopping, out of connections or of disk. A
    serialization failure is an OperationalError too, and is not one of these."""
    if not isinstance(exc, psycopg.OperationalError) or refused_for_good(exc):
        return False
    state = exc.sqlstate
    return state is None or state.startswith(("08", "53", "57P"))


def reason(exc: BaseException) -> str:
    """The first line of a driver error (later lines may quote a statement)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def lost(exc: BaseException) -> StorageUnavailable:
    return StorageUnavailable(f"the database stopped answering: {reason(exc)}")


def configure(raw: psycopg.Connection) -> None:
    """Adapters every appliance connection uses: str sent as `text` (so `? IS NULL` has a type),
    numeric read as SQLite would answer."""
    raw.adapters.register_dumper(str, StrDumper)
    raw.adapters.register_loader("numeric", _IntegralNumeric)


class LockBusy(BaseException):
    """A lock the unit at `position` of the writer's group tried is held by another transaction
    (a BaseException: no unit's own `except Exception` may swallow it; engine.py handles it)."""

    def __init__(self, position: int, key: int) -> None:
        self.position = position
        self.key = key


def _refused(tried: list[tuple[psycopg.Cursor, int, int]]) -> LockBusy | None:
    """The first lock try answered "not taken" (tries the database passed over have no answer)."""
    for cur, position, key in tried:
        try:
            taken = cur.fetchone()[0] if cur.pgresult is not None else True
        except psycopg.Error:
            continue
        if not taken:
            return LockBusy(position, key)
    return None


class Cursor:
    """What `execute` returns: rows by iteration, `fetchone` and `fetchall`. In a pipeline, a
    fetch first waits for the results of everything sent (one round trip)."""

    __slots__ = ("_conn", "_cur")

    def __init__(self, cur: psycopg.Cursor, conn: PgConnection) -> None:
        self._cur = cur
        self._conn = conn

    def fetchone(self) -> tuple | None:
        self._conn.sync()
        return self._cur.fetchone() if self._cur.description is not None else None

    def fetchall(self) -> list[tuple]:
        self._conn.sync()
        return self._cur.fetchall() if self._cur.description is not None else []

    def __iter__(self):
        return iter(self.fetchall())


class PgConnection:
    """One psycopg connection as the repositories use it. The writer runs a group's units in
    psycopg's pipeline mode (`pipeline`): a statement is sent without waiting for its answer,
    so only a read waits for the database, once for everything sent before it."""

    __slots__ = ("_changes", "_checks", "_deferred", "_total", "_tx", "_unanswered", "lock_hook", "pipeline", "raw")

    def __init__(self, raw: psycopg.Connection) -> None:
        self.raw = raw
        self._changes = 0
        self._total = 0
        self._tx: psycopg.Transaction | None = None
        # Set by the writer (engine.py) while a scoped unit runs; reads and exclusive units lock nothing.
        self.lock_hook: Callable[[int], None] | None = None
        self.pipeline: psycopg.Pipeline | None = None  # set by the writer around a group's units
        self._unanswered: list[psycopg.Cursor] = []  # sent in the pipeline, not yet counted
        self._deferred: list[tuple[psycopg.Cursor, int, int]] = []  # lock tries not yet answered
        self._checks: list[tuple[psycopg.Cursor, Callable[[], Exception]]] = []  # `expect_row`s not yet answered

    def lock(self, name: str) -> None:
        """Hold `name` (storage/locks.py) to the end of this write transaction, before reading
        what it names to decide a write."""
        if self.lock_hook is not None:
            self.lock_hook(key_of(name))

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> Cursor:
        text, order = translate(sql)
        cur = self.raw.cursor()
        with _mapped_errors():
            cur.execute(text, _values(params, order) if params else None)
        if self.pipeline is None:
            self._count(cur.rowcount)
        else:
            self._unanswered.append(cur)
        return Cursor(cur, self)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        text, order = translate(sql)
        rows = [_values(row, order) for row in rows]
        if not rows:
            self._changes = 0
            return
        cur = self.raw.cursor()
        with _mapped_errors():
            cur.executemany(text, rows)
        if self.pipeline is None:
            self._count(cur.rowcount)
            cur.close()
        else:
            self._unanswered.append(cur)

    def try_locks(self, keys: list[int], position: int) -> None:
        """Try advisory locks for the unit at `position` of the writer's group without waiting for
        the answer: the statements sent after it run after it, and the next wait for an answer
        (a read) raises LockBusy first when another transaction holds one of them."""
        cur = self.raw.cursor()
        cur.execute("SELECT bool_and(pg_try_advisory_xact_lock(k)) FROM unnest(%s::bigint[]) AS k", (keys,))
        self._deferred.append((cur, position, keys[0]))

    def expect_row(self, sql: str, params: Sequence[Any], failure: Callable[[], Exception]) -> None:
        """A read that must find a row for the unit to stand, checked without waiting for it: in a
        pipeline its answer comes with the next wait (a later read, or the group's end), which
        raises `failure()` when it found none; the unit's writes sent meanwhile are rolled back
        with it. Outside a pipeline, checked now."""
        text, order = translate(sql)
        cur = self.raw.cursor()
        with _mapped_errors():
            cur.execute(text, _values(params, order))
        if self.pipeline is None:
            if cur.fetchone() is None:
                raise failure()
        else:
            self._checks.append((cur, failure))

    def sync(self) -> None:
        """In a pipeline: wait for the answers to everything sent (raising the first error among
        them, then LockBusy for a lock not taken, then an `expect_row`'s failure), and count the
        rows they changed."""
        if self.pipeline is None or not (self._unanswered or self._deferred or self._checks):
            return
        tried, self._deferred = self._deferred, []
        checks, self._checks = self._checks, []
        answered, self._unanswered = self._unanswered, []
        try:
            with _mapped_errors():
                self.pipeline.sync()
        except Exception:
            # A lock not taken comes first: the error may have come from running without it.
            if (busy := _refused(tried)) is not None:
                raise busy from None
            raise
        if (busy := _refused(tried)) is not None:
            raise busy
        for cur in answered:
            self._count(cur.rowcount)
        for cur, failure in checks:
            if cur.fetchone() is None:
                raise failure()

    def forget_pending(self) -> None:
        """Drop the checks and lock tries still unanswered: the unit that sent them failed and its
        savepoint was rolled back (sync() answered everything before it began)."""
        self._checks.clear()
        self._deferred.clear()

    def _count(self, rowcount: int) -> None:
        self._changes = max(rowcount, 0)
        self._total += self._changes

    def changes(self) -> int:
        """Rows the last statement changed."""
        self.sync()
        return self._changes

    def total_changes(self) -> int:
        """Rows changed on this connection so far (differences of two readings are what counts)."""
        self.sync()
        return self._total

    def __enter__(self) -> PgConnection:
        self._tx = self.raw.transaction()
        self._tx.__enter__()
        return self

    def __exit__(self, *exc: object) -> bool | None:
        tx, self._tx = self._tx, None
        assert tx is not None
        return tx.__exit__(*exc)


@contextmanager
def _mapped_errors() -> Iterator[None]:
    """A statement's failures as the store reports them: a lost connection is an outage
    (StorageUnavailable), a NUL character in a text value is bad input (UnstorableText). In a
    pipeline, a batch aborted after a failed statement counts as an outage too (PipelineAborted
    carries no SQLSTATE): it is also what a connection cut in the middle of a batch gives, and a
    503 asks for the same submit again where a 500 would not."""
    try:
        yield
    except psycopg.OperationalError as exc:
        if unavailable(exc):
            raise lost(exc) from None
        raise
    except psycopg.DataError as exc:
        if "NUL" in str(exc):
            raise UnstorableText("text must not contain the NUL character (\\u0000)") from None
        raise
