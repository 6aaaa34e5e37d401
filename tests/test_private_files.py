"""Lead data and keys on disk are for their owner alone: the data folder 0700, the database, its
WAL and shared-memory files, the master key and backups 0600, whatever the umask."""

from __future__ import annotations

import os
import stat

import pytest

from appliance.config import load_config
from appliance.runtime import create_runtime
from tests.conftest import TEST_BACKEND, make_tenant

SQLITE = TEST_BACKEND == "sqlite"  # PostgreSQL keeps no database file in the data folder


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def open_umask():
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def test_init_creates_the_data_folder_and_files_for_the_owner_only(bare_cli, config_file, tmp_path, open_umask):
    cli = bare_cli
    cli("init")
    data = tmp_path / "data"
    assert mode(data) == 0o700
    assert not SQLITE or mode(data / "appliance.db") == 0o600
    assert mode(data / "master.key") == 0o600
    runtime = create_runtime(load_config(config_file))
    try:
        make_tenant(runtime, "Perms")  # writes: the WAL and shared-memory files exist now
        assert {p.name: mode(p) for p in data.iterdir()} == {name: 0o600 for name in os.listdir(data)}
        assert not SQLITE or (data / "appliance.db-wal").exists()
    finally:
        runtime.close()
    if not SQLITE:
        return  # backups: pg_dump
    backups = tmp_path / "backups"
    backups.mkdir()
    cli("backup", str(backups / "copy.db"))
    assert mode(backups / "copy.db") == 0o600


def test_an_existing_folder_keeps_the_mode_its_owner_gave_it(bare_cli, tmp_path, open_umask):
    cli = bare_cli
    (tmp_path / "data").mkdir(mode=0o750)
    os.chmod(tmp_path / "data", 0o750)
    cli("init")
    assert mode(tmp_path / "data") == 0o750
    assert not SQLITE or mode(tmp_path / "data" / "appliance.db") == 0o600
