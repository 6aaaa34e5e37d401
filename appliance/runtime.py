"""What a running appliance holds: config, store, secret box, clock and in-memory buffers.
The CLI builds one per command; the server builds one per process."""

from __future__ import annotations

from dataclasses import dataclass, field

from appliance.clock import Clock, iso
from appliance.config import Config
from appliance.crypto import SecretBox, SecretError, ensure_master_key, load_master_key
from appliance.domain.endpoint import split_credentials
from appliance.domain.secret_refs import endpoint_secret_ref
from appliance.metrics import Metrics
from appliance.private_paths import private_folder
from appliance.storage import DELIVERY_ENDPOINTS, ActivityRow, StorageError, Store, open_postgresql


@dataclass
class Runtime:
    config: Config
    store: Store
    box: SecretBox
    clock: Clock = field(default_factory=Clock)
    activity: list[ActivityRow] = field(default_factory=list)
    metrics: Metrics = field(default_factory=Metrics)

    def close(self) -> None:
        self.store.close()


def initialize(config: Config) -> tuple[bool, bool]:
    """`appliance init`: data dir, master key, database with migrations. Safe to repeat.
    Returns (master key created, database created)."""
    private_folder(config.data_dir)
    created_key = ensure_master_key(config.master_key_path)
    if config.storage.backend == "postgresql":
        store = open_postgresql(config.database_url, create=True, lease_seconds=config.storage.job_lease_seconds)
        created_db = store.created_on_open  # type: ignore[attr-defined]
        store.close()
        return created_key, created_db
    created_db = not config.database_file.exists()
    Store.open(config.database_file, synchronous=config.storage.synchronous).close()
    return created_key, created_db


def open_store(config: Config, *, keep_trying: bool = False) -> Store:
    """The configured backend's store: the SQLite file in the data folder, or PostgreSQL
    (`keep_trying`: a server starts while its PostgreSQL server cannot be reached)."""
    if config.storage.backend == "postgresql":
        return open_postgresql(config.database_url, keep_trying=keep_trying,
                               lease_seconds=config.storage.job_lease_seconds)
    return Store.open(config.database_file, synchronous=config.storage.synchronous)


def open_runtime(config: Config, clock: Clock | None = None, *, keep_trying: bool = False) -> Runtime:
    """An install made by `initialize`: a missing database or master key is refused, never made
    anew (a mistyped path must not start an empty install whose secrets can never be opened), and
    so is a master key other than the one the stored secrets were sealed with. `keep_trying`
    (`appliance serve`): an unreachable PostgreSQL server is opened in the background, and these
    checks run once it is reached."""
    if config.storage.backend == "sqlite" and not config.database_file.is_file():
        raise StorageError(f"no database at {config.database_file}: run `appliance init` first, "
                           "or point [storage] path at the data folder")
    if not config.master_key_path.is_file():
        raise SecretError(f"no master key at {config.master_key_path}: restore it from your copy, or point "
                          "[security] master_key_file at it (`appliance init` makes one for a new install)")
    box = SecretBox(load_master_key(config.master_key_path))
    store = open_store(config, keep_trying=keep_trying)
    runtime = Runtime(config=config, store=store, box=box, clock=clock or Clock())

    def checks() -> None:
        check_master_key(store, box, config.master_key_path)
        _seal_endpoint_credentials_left_in_clear(runtime)

    try:
        store.on_open(checks)
    except (SecretError, StorageError):
        store.close()
        raise
    return runtime


def create_runtime(config: Config, clock: Clock | None = None) -> Runtime:
    """`initialize`, then `open_runtime`: for `appliance demo`, which may start from nothing."""
    initialize(config)
    return open_runtime(config, clock)


def check_master_key(store: Store, box: SecretBox, path: object) -> None:
    expected = store.reader().secrets.key_id_in_use()
    if expected is not None and expected != box.key_id:
        raise SecretError(f"the master key {path} is {box.key_id}, but the stored secrets were sealed with "
                          f"{expected}: point [security] master_key_file at that key")


def _seal_endpoint_credentials_left_in_clear(runtime: Runtime) -> None:
    """Earlier versions sealed only an endpoint's auth secrets: credentials in its headers and URL
    were stored in clear. The first open after the upgrade seals them as an import would now."""
    tx = runtime.store.reader()
    found = []
    for tenant_id, _name, _created in tx.tenants.list_tenants():
        for endpoint in tx.catalog.load_docs(DELIVERY_ENDPOINTS, tenant_id):
            stored, credentials = split_credentials(endpoint)
            if credentials:
                found.append((tenant_id, stored, credentials))
    if not found:
        return
    now = iso(runtime.clock.now())

    def unit(tx):
        for tenant_id, stored, credentials in found:
            for name, value in credentials.items():
                ref = endpoint_secret_ref(stored.delivery_endpoint_id, name)
                tx.secrets.put(tenant_id, ref, runtime.box.seal_bytes(value, f"{tenant_id}/{ref}"), now)
            tx.catalog.upsert_doc(DELIVERY_ENDPOINTS, tenant_id, stored.delivery_endpoint_id, stored, None)

    runtime.store.write_sync(unit)
