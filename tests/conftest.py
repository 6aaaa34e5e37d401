"""Shared fixtures: a real data folder per test, the real app behind Litestar's test client,
and the real CLI. Nothing is mocked: tests go through the HTTP API, the CLI and the files."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from hypothesis import settings
from click.testing import CliRunner
from litestar.testing import TestClient

from appliance.services import tenancy
from appliance.app import create_app
from appliance.cli import main as cli_main
from appliance.config import Config, load_config
from appliance.runtime import Runtime, create_runtime
from appliance.storage.postgres.store import PgStore
from tests.bundles import standard_bundle
from tests.postgres_cluster import TEMPLATE, Cluster, server_bin

# CI runs the property tests with a fixed seed, so a red run is repeatable and a green one stays
# green; locally each run explores new examples.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(autouse=True)
def logging_as_it_was() -> Iterator[None]:
    """`serve` configures the process's logging (its root handler); in-process tests that run it
    must not leave that handler to the tests after them."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def backend_toml(request: pytest.FixtureRequest) -> str:
    """The `[storage]` lines naming the test's backend, for a config a test writes itself: under
    APPLIANCE_TEST_BACKEND=postgresql `backend` and a fresh database's `url`, else nothing (SQLite
    in the data folder). One database per test: configs of one test share it."""
    if TEST_BACKEND == "postgresql":
        return f'backend = "postgresql"\nurl = "{request.getfixturevalue("postgres_url")}"\n'
    return ""


@pytest.fixture(scope="module")
def module_backend_toml(request: pytest.FixtureRequest) -> Iterator[Callable[[], str]]:
    """`backend_toml` for module-scoped servers: each call another fresh database (each server's
    data folder has its own master key), dropped after the module."""
    with contextlib.ExitStack() as databases:
        def lines() -> str:
            if TEST_BACKEND != "postgresql":
                return ""
            url = databases.enter_context(fresh_database(request.getfixturevalue("postgres_cluster")))
            return f'backend = "postgresql"\nurl = "{url}"\n'

        yield lines


@pytest.fixture
def config_file(tmp_path: Path, backend_toml: str) -> Path:
    path = tmp_path / "appliance.toml"
    # Outbound providers point at a closed loopback port: a test must never reach a real host.
    closed = "http://127.0.0.1:9"
    path.write_text(
        f'[storage]\npath = "{tmp_path / "data"}"\n{backend_toml}\n[security]\nrate_limit_per_minute = 0\n\n'
        f'[sms.twilio]\nbase_url = "{closed}"\n[sms.telnyx]\nbase_url = "{closed}"\n'
        f'[pixels.social]\nbase_url = "{closed}"\n[pixels.video]\nbase_url = "{closed}"\n\n'
        f'[plugins]\ndirs = ["{tmp_path / "plugins"}"]\n'  # last: tests append keys to it
    )
    return path


@pytest.fixture
def config(config_file: Path) -> Config:
    return load_config(config_file)


@pytest.fixture
def runtime(config: Config) -> Iterator[Runtime]:
    rt = create_runtime(config)
    try:
        yield rt
    finally:
        rt.close()


@pytest.fixture
def client(runtime: Runtime) -> Iterator[TestClient]:
    """The app without its background loops: intake tests see jobs exactly as committed."""
    with TestClient(create_app(runtime, background=False), raise_server_exceptions=False) as test_client:
        yield test_client


@dataclass
class Tenant:
    tenant_id: str
    key: str
    key_id: str

    @property
    def headers(self) -> dict[str, str]:
        return {"X-API-Key": self.key}


def make_tenant(runtime: Runtime, name: str, bundle: dict | None = None) -> Tenant:
    tenant_id = tenancy.create_tenant(runtime, name)
    if bundle is not None:
        tenancy.import_bundle(runtime, tenant_id, msgspec.json.encode(bundle), "json")
    new = tenancy.create_key(runtime, tenant_id, name="tests")
    return Tenant(tenant_id, new.key, new.key_id)


@pytest.fixture
def tenant(runtime: Runtime) -> Tenant:
    return make_tenant(runtime, "Acme Leads", standard_bundle())


@pytest.fixture
def other_tenant(runtime: Runtime) -> Tenant:
    return make_tenant(runtime, "Other Agency", standard_bundle(prefix="O"))


class Cli:
    """Runs the real click command with the test's config file."""

    def __init__(self, config_file: Path) -> None:
        self.config_file = config_file
        self.runner = CliRunner()

    def __call__(self, *args: str, expect: int = 0):
        result = self.runner.invoke(cli_main, ["--config", str(self.config_file), *args], catch_exceptions=False)
        assert result.exit_code == expect, (result.exit_code, result.output, result.stderr if hasattr(result, "stderr") else "")
        return result

    def json(self, *args: str):
        return json.loads(self(*args, "--json").stdout)


@pytest.fixture
def bare_cli(config_file: Path) -> Cli:
    """The CLI before `appliance init`: no data folder, database or master key yet."""
    return Cli(config_file)


@pytest.fixture
def cli(bare_cli: Cli) -> Cli:
    """The CLI of an install made by `appliance init`, as an operator starts."""
    bare_cli("init")
    return bare_cli


# ---- PostgreSQL ---------------------------------------------------------------------------------
# APPLIANCE_TEST_BACKEND=postgresql runs every test built on `config_file` (and so `runtime`,
# `client`, `cli`) against a fresh PostgreSQL database; the tests of the PostgreSQL store itself
# always do. The cluster starts once per session (tests/postgres_cluster.py).

TEST_BACKEND = os.environ.get("APPLIANCE_TEST_BACKEND", "sqlite")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sqlite_only: checks what only SQLite has (query plans, PRAGMA, the file)")
    config.addinivalue_line("markers", "postgresql_own: PostgreSQL's own tests; they run on it in every pass, so the "
                                       "PostgreSQL pass does not run them again")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if TEST_BACKEND == "postgresql":
        skip = pytest.mark.skip(reason="SQLite only (APPLIANCE_TEST_BACKEND=postgresql)")
        for item in items:
            if item.get_closest_marker("sqlite_only"):
                item.add_marker(skip)
            elif item.get_closest_marker("postgresql_own"):
                item.add_marker(pytest.mark.skip(reason="PostgreSQL's own: run by the default pass"))


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Cluster]:
    bin_dir = server_bin()
    if bin_dir is None:
        reason = "PostgreSQL server binaries (initdb, pg_ctl) not found: bash .ci/postgres installs them"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    cluster = Cluster(bin_dir)
    cluster.start()
    try:
        cluster.admin(f"CREATE DATABASE {TEMPLATE}")
        PgStore.open_url(cluster.url(TEMPLATE), create=True).close()  # the migrations, once: each test copies them
        yield cluster
    finally:
        cluster.stop()


@contextlib.contextmanager
def fresh_database(cluster: Cluster) -> Iterator[str]:
    """A fresh, migrated database's URL, dropped on exit."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    cluster.admin(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
    try:
        yield cluster.url(name)
    finally:
        cluster.admin(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture
def postgres_url(postgres_cluster: Cluster) -> Iterator[str]:
    """A fresh, migrated database of its own for the test."""
    with fresh_database(postgres_cluster) as url:
        yield url
