"""A counter in a small file beside the database (`<database>-changes`) that admin operations bump
after they commit a change to API keys or a tenant's configuration.

The server caches what it reads for every request (the key behind an `X-API-Key`, with its
tenant's config revision), while those changes are made by CLI commands in other processes.
Reading this counter tells the server its cache is stale, so a revoked key is refused at once.
The server maps the file and reads 8 bytes per request: no system call, so the event loop never
hands the GIL to another thread for it. Like SQLite's own `-shm` file, which is mapped the same
way, the file belongs to the running service: truncating it under a live server faults that
server. A file that was replaced, or that a command could not open, only delays what the server
sees until its cache entries expire (api/auth.py KeyCache: one second)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

_SIZE = 8


class ChangeSignal:
    def __init__(self, path: Path, mode: int) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, mode)
        try:
            if os.fstat(fd).st_size < _SIZE:
                os.ftruncate(fd, _SIZE)
            self._map = mmap.mmap(fd, _SIZE)
        finally:
            os.close(fd)  # the mapping keeps the file

    def value(self) -> int:
        return int.from_bytes(self._map[:_SIZE], "little")

    def bump(self) -> None:
        """Any new value will do: readers only compare it with the one they cached under."""
        self._map[:_SIZE] = ((self.value() + 1) % (1 << 64)).to_bytes(_SIZE, "little")

    def close(self) -> None:
        self._map.close()


def open_signal(database_file: Path) -> ChangeSignal | None:
    """The signal of `database_file`, or None when its file cannot be made (read-only data dir):
    callers then read through to the database every time."""
    try:
        # Whoever may write the database may signal a change to it.
        mode = os.stat(database_file).st_mode & 0o666
        return ChangeSignal(database_file.with_name(database_file.name + "-changes"), mode)
    except OSError:
        return None
