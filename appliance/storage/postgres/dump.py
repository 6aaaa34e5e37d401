"""Backup and restore of a PostgreSQL database with the server's own tools: `pg_dump -Fc` (one
consistent snapshot while the service runs) and `pg_restore` into an empty database. The
password goes to them in PGPASSWORD, never on a command line (visible to every user in `ps`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import psycopg

from appliance.storage.db import StorageError
from appliance.storage.postgres.connection import reason
from appliance.storage.postgres.engine import connect, open_error
from appliance.storage.postgres.url import redact, without_password

_MARK = " TABLE public migrations "  # in `pg_restore --list` of an appliance's dump


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise StorageError(f"{name} not found on PATH: install the PostgreSQL client tools "
                           f"(Debian/Ubuntu: postgresql-client) of the server's major version or newer")
    return found


def _split(url: str) -> tuple[str, dict[str, str]]:
    """The URL without its password, and the environment that carries the password."""
    bare, password = without_password(url)
    env = dict(os.environ)
    if password is not None:
        env["PGPASSWORD"] = password
    return bare, env


def _run(command: list[str], url: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = next((line for line in done.stderr.splitlines() if line.strip()), f"exit code {done.returncode}")
        password = without_password(url)[1]
        if password:  # the tools never print it; checked anyway
            said = said.replace(password, "***")
        raise StorageError(f"{Path(command[0]).name} failed: {said.strip()}")
    return done


def dump(url: str, dest: Path) -> None:
    """`pg_dump -Fc` of the database at `url` into `dest` (mode 0600), whole or not at all."""
    pg_dump = _tool("pg_dump")
    target, env = _split(url)
    partial = dest.with_name(dest.name + ".partial")
    os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # its mode before any byte
    try:
        _run([pg_dump, "--format=custom", f"--file={partial}", f"--dbname={target}"], url, env)
        os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)


def check_dump(file: Path) -> None:
    """A pg_dump custom-format archive of an appliance database, or StorageError saying what it is."""
    try:
        listing = _run([_tool("pg_restore"), "--list", str(file)], "", dict(os.environ)).stdout
    except StorageError as exc:
        raise StorageError(f"{file} is not a pg_dump custom-format archive ({exc})") from None
    if _MARK not in listing:
        raise StorageError(f"{file} is a pg_dump archive, but not of an appliance database")


def restore(file: Path, url: str) -> None:
    """`file` (checked by `check_dump`) restored into the database at `url`, which must hold no
    appliance tables: nothing is replaced, and a failed restore leaves it as it was."""
    pg_restore = _tool("pg_restore")
    try:
        with connect(url, autocommit=True) as conn:
            (table,) = conn.execute("SELECT to_regclass('migrations')").fetchone()
    except psycopg.Error as exc:
        raise open_error(url, exc) from None
    if table is not None:
        raise StorageError(f"{redact(url)} already holds an appliance database: restore goes into an empty one "
                           "(CREATE DATABASE ... TEMPLATE template0 LOCALE 'C' ENCODING 'UTF8', and point "
                           "[storage] url at it)")
    target, env = _split(url)
    try:
        _run([pg_restore, "--no-owner", "--exit-on-error", "--single-transaction", f"--dbname={target}", str(file)],
             url, env)
    except StorageError as exc:
        raise StorageError(f"restore into {redact(url)} failed, nothing was kept: {reason(exc)}") from None
