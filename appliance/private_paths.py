"""Folders and files that hold lead data or keys are created for their owner alone (0700 / 0600):
another local user must not read leads, backups or the master key. Existing ones keep the mode
their owner gave them."""

from __future__ import annotations

import os
from pathlib import Path

FOLDER_MODE = 0o700
FILE_MODE = 0o600


def private_folder(path: Path) -> None:
    """Create `path` (and missing parents) as 0700; leave an existing folder as it is."""
    if path.is_dir():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=FOLDER_MODE)
    except FileExistsError:
        return
    os.chmod(path, FOLDER_MODE)  # mkdir's mode is filtered by the umask


def private_file(path: Path) -> bool:
    """Create an empty `path` as 0600 unless it exists (SQLite then gives its -wal and -shm files
    the same mode); True when created. Its folder must exist: only `init` makes the data folder,
    and a backup into a folder that is not there is a mistake to report, not to paper over."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return False
    os.close(fd)
    os.chmod(path, FILE_MODE)
    return True
