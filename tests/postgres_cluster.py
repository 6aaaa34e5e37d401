"""A throwaway PostgreSQL cluster for the tests: initdb and pg_ctl on a data folder under the temp
dir, listening on 127.0.0.1 at a free port, trust authentication, fsync off (a test database need
not survive a power cut). One template database carries the migrations, so each test's database
is a CREATE DATABASE ... TEMPLATE copy (a few milliseconds) instead of running them again.

As root (CI, this machine) the server runs as the `postgres` user: PostgreSQL refuses to run as
root. `.ci/postgres` installs the server packages when they are missing."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

TEMPLATE = "appliance_template"


def server_bin() -> Path | None:
    """The folder of initdb/pg_ctl: on PATH, else Debian's newest /usr/lib/postgresql/N/bin."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(versions[-1]).parent if versions else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="appliance-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._user = None
        if os.geteuid() == 0:
            self._user = "postgres"
            pw = pwd.getpwnam(self._user)
            os.chown(self.root, pw.pw_uid, pw.pw_gid)

    def _run(self, *args: str) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if self._user:
            command = ["runuser", "-u", self._user, "--", *command]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=self.root)

    def start(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--locale=C", "-E", "UTF8",
                  "--no-sync")
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off"
                   " -c synchronous_commit=off -c full_page_writes=off -c max_connections=300")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-o", options, "-w", "start")

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def admin(self, sql: str) -> None:
        """One statement on the maintenance database (CREATE/DROP DATABASE cannot run in a transaction)."""
        import psycopg

        for attempt in range(50):
            try:
                with psycopg.connect(self.url(), autocommit=True) as conn:
                    conn.execute(sql)
                return
            except psycopg.errors.ObjectInUse:
                # CREATE DATABASE ... TEMPLATE needs the template to itself: a connection that
                # just closed may still be leaving.
                time.sleep(0.02 * (attempt + 1))
        raise RuntimeError(f"{sql!r}: the database stayed in use")


class Relay:
    """A TCP relay to the cluster on a port of its own, to cut the appliance off from its
    database and bring it back: `start()` listens and forwards, `stop()` refuses new connections
    and cuts the open ones (as a server that went away)."""

    def __init__(self, cluster: Cluster, port: int) -> None:
        self.target = ("127.0.0.1", cluster.port)
        self.port = port
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def url(self, database: str, password: str | None = None) -> str:
        user = f"postgres:{password}" if password else "postgres"  # trust authentication ignores the password
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> None:
        if self._listener is not None:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (close alone does not)
            self._listener.close()
            self._listener = None
        with self._lock:
            cut, self._open = self._open, set()
        for sock in cut:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
