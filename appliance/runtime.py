"""What a running appliance holds: config, database, secret box, clock and in-memory buffers.
The CLI builds one per command; the server builds one per process."""

from __future__ import annotations

from dataclasses import dataclass, field

from appliance.clock import Clock
from appliance.config import Config
from appliance.crypto import SecretBox, ensure_master_key, load_master_key
from appliance.private_paths import private_folder
from appliance.storage.activity import ActivityRow
from appliance.storage.db import Database


@dataclass
class Runtime:
    config: Config
    db: Database
    box: SecretBox
    clock: Clock = field(default_factory=Clock)
    activity: list[ActivityRow] = field(default_factory=list)

    def close(self) -> None:
        self.db.close()


def initialize(config: Config) -> tuple[bool, bool]:
    """`appliance init`: data dir, master key, database with migrations. Safe to repeat.
    Returns (master key created, database created)."""
    private_folder(config.data_dir)
    created_key = ensure_master_key(config.master_key_path)
    created_db = not config.database_file.exists()
    Database(config.database_file, synchronous=config.storage.synchronous).open().close()
    return created_key, created_db


def open_runtime(config: Config, clock: Clock | None = None) -> Runtime:
    initialize(config)
    db = Database(config.database_file, synchronous=config.storage.synchronous).open()
    return Runtime(config=config, db=db, box=SecretBox(load_master_key(config.master_key_path)),
                   clock=clock or Clock())
