"""`appliance migrate --to postgresql://...`: an SQLite install copied into an empty PostgreSQL
database. The schema is made by the PostgreSQL migrations; every table is copied from one read
snapshot of the SQLite file in one PostgreSQL transaction, and the row counts of every table are
compared before it commits: the copy is whole or nothing."""

from __future__ import annotations

from pathlib import Path

import apsw
import psycopg

from appliance.storage.db import StorageError
from appliance.storage.leads import _LEADS, _names
from appliance.storage.postgres.connection import reason
from appliance.storage.postgres.engine import connect
from appliance.storage.postgres.url import redact
from appliance.storage.postgres.migrations import apply as apply_migrations
from appliance.storage.postgres.repositories import _fold

# SQLite's leads_names is a contentless FTS5 index (its names cannot be read back): rebuilt here
# from the leads, as PgLeads.insert_lead writes it.
_REBUILT = "leads_names"


def copy_sqlite_to_postgresql(sqlite_file: Path, url: str) -> dict[str, int]:
    """Rows copied per table. Refused unless every appliance table of the target is empty."""
    where = redact(url)
    try:
        target = connect(url, autocommit=True)
    except psycopg.Error as exc:
        raise StorageError(f"cannot open database {where}: {reason(exc)}") from None
    source = apsw.Connection(str(sqlite_file), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        apply_migrations(target)
        tables = _tables_in_order(target)
        for table in tables:
            if target.execute(f'SELECT EXISTS (SELECT 1 FROM "{table}")').fetchone()[0]:
                raise StorageError(f"{where} is not empty (table {table} has rows): migrate copies into an "
                                   "empty database only")
        source.execute("BEGIN")  # one snapshot of every table
        with target.transaction():
            counts = {table: _copy(source, target, table) for table in tables}
            _verify(source, target, counts)
        source.execute("COMMIT")
        return counts
    except psycopg.Error as exc:
        raise StorageError(f"copy to {where} failed: {reason(exc)}") from None
    finally:
        source.close()
        target.close()


def _tables_in_order(target: psycopg.Connection) -> list[str]:
    """The appliance's tables, each after the tables its foreign keys name."""
    names = [name for (name,) in target.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        " AND table_type = 'BASE TABLE' AND table_name <> 'migrations' ORDER BY table_name")]
    needs: dict[str, set[str]] = {name: set() for name in names}
    for child, parent in target.execute(
            "SELECT conrelid::regclass::text, confrelid::regclass::text FROM pg_constraint WHERE contype = 'f'"):
        if child in needs and parent != child:
            needs[child].add(parent)
    ordered: list[str] = []
    while needs:
        ready = sorted(name for name, parents in needs.items() if not parents - set(ordered))
        ordered += ready
        for name in ready:
            del needs[name]
    return ordered


def _copy(source: apsw.Connection, target: psycopg.Connection, table: str) -> int:
    columns = target.execute(
        "SELECT column_name, data_type, is_identity FROM information_schema.columns"
        " WHERE table_schema = 'public' AND table_name = %s ORDER BY ordinal_position", (table,)).fetchall()
    if table == _REBUILT:
        rows = _names_of_leads(source)
        names = ["seq", "name"]
    else:
        present = {row[1] for row in source.execute(f'PRAGMA table_info("{table}")')}
        if not present:
            raise StorageError(f"the SQLite database has no table {table}: open it with this version first")
        names = [name for name, _, _ in columns if name in present]  # PostgreSQL's own columns stay default
        kinds = {name: kind for name, kind, _ in columns}
        rows = (_as(row, [kinds[name] for name in names])
                for row in source.execute(f'SELECT {_quoted(names)} FROM "{table}"'))
    count = 0
    # The money rollups are copied as they are: the trigger that keeps them must not add the
    # ledger entries to them a second time.
    target.execute(f'ALTER TABLE "{table}" DISABLE TRIGGER USER')
    with target.cursor().copy(f'COPY "{table}" ({_quoted(names)}) FROM STDIN') as copy:
        for row in rows:
            copy.write_row(row)
            count += 1
    target.execute(f'ALTER TABLE "{table}" ENABLE TRIGGER USER')
    for name, _, identity in columns:
        if identity == "YES":  # identities continue after the copied ids
            target.execute(f"SELECT setval(pg_get_serial_sequence(%s, %s), coalesce(max(\"{name}\"), 0) + 1, false)"
                           f' FROM "{table}"', (table, name))
    return count


def _quoted(names: list[str]) -> str:
    return ", ".join(f'"{name}"' for name in names)


def _as(row: tuple, kinds: list[str]) -> tuple:
    """SQLite's values as the PostgreSQL column takes them (SQLite stored some JSON text as bytes)."""
    return tuple(value.decode() if kind == "text" and isinstance(value, bytes)
                 else value.encode() if kind == "bytea" and isinstance(value, str)
                 else value for value, kind in zip(row, kinds, strict=True))


def _names_of_leads(source: apsw.Connection) -> list[tuple[int, str]]:
    columns = ", ".join((*_LEADS.columns, "doc"))
    return [(row[0], _fold(names)) for row in source.execute(f"SELECT seq, {columns} FROM leads")
            if (names := _names(_LEADS.unpack(row[1:])))]


def _verify(source: apsw.Connection, target: psycopg.Connection, counts: dict[str, int]) -> None:
    for table, copied in counts.items():
        expected = copied if table == _REBUILT else source.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
        (stored,) = target.execute(f'SELECT count(*) FROM "{table}"').fetchone()
        if not expected == copied == stored:
            raise StorageError(f"copy of {table} incomplete: {expected} rows in SQLite, {stored} in PostgreSQL;"
                               " nothing was committed")
