"""One `appliance serve` (or `restore`) per data folder. Two servers on one SQLite file would fight over its
write lock (and double every delivery), and `restore` must not swap the file under a server.

The server holds an exclusive `flock` on `<data folder>/serve.lock` for its whole life; the
operating system drops it when the process ends, however it ends (kill -9 too), so a stale lock
file never blocks a restart. The file says who holds it, for the refusal message; `serve.processes`
beside it lists the server's other processes (`appliance doctor`). A delivery process the server starts inherits the
locked file, so the folder stays taken until every process of the appliance has ended; a server
started while only a dead server's delivery process holds it waits for that to end (a few seconds)."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import IO

from appliance.private_paths import FILE_MODE

LOCK_NAME = "serve.lock"
PROCESSES_NAME = "serve.processes"
ORPHAN_WAIT_SECONDS = 15.0  # a dead server's delivery process stops within its grace (appliance/processes.py)


class DataFolderBusy(Exception):
    """Another server runs on the data folder; the message names it."""


def _record(handle: IO[str]) -> dict:
    """What the holder wrote into the lock file ({} when empty or unreadable)."""
    handle.seek(0)
    try:
        return json.loads(handle.read() or "{}")
    except ValueError:
        return {}


def _describe(held: dict, folder: Path) -> str:
    who = ", ".join(f"{k} {held[k]}" for k in ("pid", "url", "since") if held.get(k)) or "pid unknown"
    if held.get("pid") and not _alive(held["pid"]):
        return (f"the delivery process of an appliance {held.get('command', 'serve')} that ended ({who}) still "
                f"runs on the data folder {folder}")
    return f"another appliance {held.get('command', 'serve')} ({who}) is running on the data folder {folder}"


def _holder_alive(held: dict) -> bool:
    pid = held.get("pid")
    return pid is None or _alive(pid)  # unknown: assume the worst, refuse at once


def _open(folder: Path) -> IO[str]:
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, FILE_MODE)
    return os.fdopen(fd, "r+")


def hold(folder: Path, since: str, *, command: str = "serve", url: str | None = None) -> IO[str]:
    """Take the folder for this process (keep the returned file open while serving or
    restoring), or raise DataFolderBusy naming the process that has it."""
    deadline = time.monotonic() + ORPHAN_WAIT_SECONDS
    while True:
        handle = _open(folder)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # The server that took the folder is gone, but its delivery process still finishes the
            # deliveries it had in flight: wait for it, as a service manager's quick restart must.
            held = _record(handle)
            handle.close()
            if time.monotonic() < deadline and not _holder_alive(held):
                time.sleep(0.1)
                continue
            raise DataFolderBusy(_describe(held, folder)) from None
        if _is_at_path(handle, folder):
            break
        handle.close()  # a refused start removed the file after we opened it: take the one there now
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"command": command, "pid": os.getpid(), "url": url, "since": since}))
    handle.flush()
    return handle


def _is_at_path(handle: IO[str], folder: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(handle.fileno()), os.stat(folder / LOCK_NAME))
    except FileNotFoundError:
        return False


def let_go(handle: IO[str], folder: Path) -> None:
    """Give the folder back after a refused start, removing the lock file so that the refusal
    leaves nothing behind. Removed while still locked: `hold` only keeps a lock on the file that
    is at the path, so no other process can be left holding the removed one."""
    (folder / LOCK_NAME).unlink(missing_ok=True)
    handle.close()


def record_processes(folder: Path, processes: list[dict]) -> None:
    """Write the server's other processes (role, pid, since, starts) beside the lock, replacing
    the file whole so that `doctor` never reads half of it."""
    target = folder / PROCESSES_NAME
    temporary = target.with_name(f".{PROCESSES_NAME}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(processes))
    os.replace(temporary, target)


def server_processes(folder: Path) -> list[dict]:
    """The running server and the processes it recorded, each with `alive` (empty when no
    server runs)."""
    held = _holder_record(folder)
    if held is None:
        return []
    try:
        others = json.loads((folder / PROCESSES_NAME).read_text() or "[]")
    except (OSError, ValueError):
        others = []
    found = [{"role": "server", "pid": held.get("pid"), "since": held.get("since")}, *others]
    for process in found:
        process["alive"] = _alive(process.get("pid"))
    return found


def _holder_record(folder: Path) -> dict | None:
    """The lock file's record while some process holds the folder; None when none does."""
    if not (folder / LOCK_NAME).exists():
        return None
    with _open(folder) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return _record(handle)
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def _alive(pid: object) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def running_server(folder: Path) -> str | None:
    """Who serves on the folder now, or None."""
    held = _holder_record(folder)
    return _describe(held, folder) if held is not None else None
