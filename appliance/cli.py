"""The `appliance` command. Every command reads the same config (`--config FILE` or
$APPLIANCE_CONFIG); `serve` is the default. An operator's mistake is one line `error: ...` and
exit code 1 (2 for a usage error, as click gives), never a traceback. Only `init` and `demo`
create a database or a master key (and `restore` a database from a backup)."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
import socket
import stat
import sys
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from functools import wraps
from pathlib import Path
from typing import IO, Any
from zoneinfo import ZoneInfo

import click
import msgspec

from appliance import __version__, logs
from appliance.domain.permissions import ADMIN, KEY_ROLES, ROLES
from appliance.errors import ApiError
from appliance.services import tenancy, users
from appliance.services.bundle import BundleError, format_from_filename
from appliance.config import CONFIG_ENV, Config, ConfigError, load_config
from appliance.clock import iso
from appliance.crypto import SecretBox, SecretError, load_master_key
from appliance.instance_lock import DataFolderBusy, hold, let_go, running_server, server_processes
from appliance.plugins import PluginError, load_plugins
from appliance.processes import DeliveryProcess, run_delivery_process, settle_for_serving
from appliance.private_paths import private_folder
from appliance.runtime import Runtime, create_runtime, initialize, open_runtime
from appliance.storage import (
    MIGRATIONS, StorageError, copy_to_postgresql, inspect_backup, redact_url, restore_database, restore_to_postgresql,
)


def _fail(problems: list[str] | str) -> None:
    for problem in [problems] if isinstance(problems, str) else problems:
        click.echo(f"error: {problem}", err=True)
    sys.exit(1)


def _read(file: str) -> bytes:
    try:
        return Path(file).read_bytes()
    except OSError as exc:
        _fail(f"cannot read {file}: {exc.strerror}")
        raise  # not reached: _fail exits


def _emit(as_json: bool, data: Any, text: str) -> None:
    click.echo(json.dumps(data, indent=2) if as_json else text)


def admin_command(fn: Callable) -> Callable:
    """Open the runtime for the command and turn refusals into `error: ...` lines."""

    @wraps(fn)
    @click.pass_context
    def wrapper(ctx: click.Context, *args: Any, **kwargs: Any) -> Any:
        runtime = None
        try:
            runtime = open_runtime(ctx.obj["config"]())
            return fn(runtime, *args, **kwargs)
        except tenancy.AdminError as exc:
            _fail(exc.problems)
        except ApiError as exc:  # a service's refusal, as the API would answer it
            _fail(exc.details or exc.message)
        except BundleError as exc:
            _fail(exc.problems)
        except (StorageError, SecretError) as exc:
            _fail(str(exc))
        finally:
            if runtime is not None:
                runtime.close()

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, invoke_without_command=True)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), envvar=CONFIG_ENV,
              help=f"TOML config file (default: ${CONFIG_ENV}, else built-in defaults).")
@click.version_option(__version__, prog_name="appliance")
@click.pass_context
def main(ctx: click.Context, config_path: str | None) -> None:
    """Lead intake, qualification and delivery appliance. Without a command: serve."""
    loaded: list[Config] = []

    def config() -> Config:
        if not loaded:
            try:
                loaded.append(load_config(config_path))
            except ConfigError as exc:
                _fail(str(exc))
        return loaded[0]

    ctx.obj = {"config": config, "config_path": config_path}
    if ctx.invoked_subcommand is None:
        ctx.invoke(serve)


@main.command()
@click.pass_context
def init(ctx: click.Context) -> None:
    """Create the data folder, the database and the master key (safe to repeat)."""
    config = ctx.obj["config"]()
    try:
        created_key, created_db = initialize(config)
    except (StorageError, SecretError) as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"cannot create {exc.filename or config.data_dir}: {exc.strerror}")
    where = redact_url(config.database_url) if config.storage.backend == "postgresql" else config.database_file
    click.echo(f"database   {where} ({'created' if created_db else 'up to date'})")
    click.echo(f"master key {config.master_key_path} ({'created, mode 0600' if created_key else 'kept'})")


def _cannot_listen(host: str, port: int) -> str | None:
    """Why the server could not bind `host:port` (checked first, so a port in use is one line and
    exit code 1 rather than uvicorn's error after start-up)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return exc.strerror
    family, kind, proto, _name, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as exc:
            return exc.strerror
    return None


def _serve(config: Config, host: str | None, port: int | None,
           setup: Callable[[], Callable[[str], None]] | None = None) -> None:
    """`setup` (demo) prepares the install once the port is free and the folder is ours, and
    returns the banner to print; without it the install must exist."""
    import uvicorn

    from appliance.api.server_protocol import server_protocol
    from appliance.app import create_app
    from appliance.tls import Server, TlsError, check_listening

    bind_host, bind_port = host or config.server.host, port or config.server.port
    tls = config.server.tls
    url = f"{'https' if tls else 'http'}://{bind_host}:{bind_port}"
    logs.configure(config.logging.format, config.log_level)
    problem = _cannot_listen(bind_host, bind_port)
    if problem:
        _fail(f"cannot listen on {bind_host}:{bind_port}: {problem}")
    try:
        warning = check_listening(config.server.tls_cert_file, config.server.tls_key_file, bind_host, bind_port)
    except (TlsError, OSError) as exc:  # OSError: a name the probe above resolved no longer does
        _fail(str(exc))
    if warning:
        logging.getLogger("appliance.tls").warning("%s", warning)
    if setup is not None:
        try:
            private_folder(config.data_dir)
        except OSError as exc:
            _fail(f"cannot create {exc.filename or config.data_dir}: {exc.strerror}")
    elif not config.data_dir.is_dir():
        _fail(f"no data folder at {config.data_dir}: run `appliance init` first, "
              "or point [storage] path at the data folder")
    try:  # before the database is opened: a second server must not touch it at all
        lock = hold(config.data_dir, iso(datetime.now(timezone.utc)), url=url)
    except DataFolderBusy as exc:
        _fail(str(exc))
    try:
        banner = setup() if setup is not None else None
        runtime = open_runtime(config, keep_trying=True)  # an unreachable PostgreSQL: served with 503s until reached
    except (StorageError, SecretError) as exc:  # e.g. a folder never initialised: left as it was
        let_go(lock, config.data_dir)
        _fail(str(exc))
    except BaseException:  # setup refused (one line already printed): the folder is free again
        let_go(lock, config.data_dir)
        raise
    delivery_process = DeliveryProcess(config, lock, runtime.metrics) if config.delivery.own_process() else None
    try:
        app = create_app(runtime, delivery_process=delivery_process)
    except PluginError as exc:
        runtime.close()
        let_go(lock, config.data_dir)
        _fail(str(exc))
    server = None
    try:
        if banner:
            banner(url)
        settle_for_serving()
        # One HTTP process: SQLite has one writer, and a second intake process only waits for its
        # lock (measured: bench/HISTORY.md, "Two intake processes on one port"); delivery may have
        # a process of its own (appliance/processes.py). No proxy header rewriting: nothing here
        # reads the client address (limits are per API key).
        server = Server(uvicorn.Config(
            app, host=bind_host, port=bind_port, log_config=None, log_level=config.log_level, access_log=False,
            server_header=False, proxy_headers=False, lifespan="on", ws="none", http=server_protocol(config.server),
            ssl_certfile=config.server.tls_cert_file or None, ssl_keyfile=config.server.tls_key_file or None))
        if delivery_process is not None:
            delivery_process.stop_server = lambda: setattr(server, "should_exit", True)
        server.run()
    finally:
        runtime.close()
        if server is not None and server.started:
            lock.close()
        else:  # refused after all (the port taken since it was probed): leave nothing behind
            let_go(lock, config.data_dir)
    if delivery_process is not None and delivery_process.gave_up:
        _fail(f"stopped: {delivery_process.gave_up}")


@main.command()
@click.option("--host", default=None, help="Bind address (default: [server] host).")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Port (default: [server] port).")
@click.pass_context
def serve(ctx: click.Context, host: str | None, port: int | None) -> None:
    """Run the HTTP API and the background job loop."""
    _serve(ctx.obj["config"](), host, port)


@main.command("_deliver", hidden=True)
@click.option("--channel-fd", type=int, required=True)
def deliver_process(channel_fd: int) -> None:
    """The delivery process `serve` starts for itself (appliance/processes.py); not for people."""
    sys.exit(run_delivery_process(channel_fd))


@main.command()
@click.option("--host", default=None, help="Bind address (default: [server] host).")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Port (default: [server] port).")
@click.pass_context
def demo(ctx: click.Context, host: str | None, port: int | None) -> None:
    """Set up a demo tenant with sample campaigns, print a fresh key and a curl line, and serve."""
    from appliance.services.demo import ensure_demo_tenant

    config = ctx.obj["config"]()

    def setup() -> Callable[[str], None]:
        try:
            runtime = create_runtime(config)
        except (StorageError, SecretError) as exc:
            _fail(str(exc))
        except OSError as exc:
            _fail(f"cannot create {exc.filename or config.data_dir}: {exc.strerror}")
        try:
            made = ensure_demo_tenant(runtime)
        finally:
            runtime.close()
        return lambda base_url: _demo_banner(made, base_url)

    _serve(config, host, port, setup)


def _demo_banner(made: Any, base_url: str) -> None:
    from appliance.services.demo import DEMO_LEAD

    key = made.key
    click.echo(f"demo tenant {made.tenant_id}")
    click.echo(f"API key (shown once): {key}")
    click.echo("submit a lead (the demo buyer inside the appliance takes it within a second):")
    click.echo(f"  curl -s -X POST -H 'X-API-Key: {key}' -H 'Content-Type: application/json' "
               f"{base_url}/api/v1/leads/submit -d '{json.dumps(DEMO_LEAD, separators=(',', ':'))}'")
    click.echo("then see it delivered:")
    click.echo(f"  curl -s -H 'X-API-Key: {key}' {base_url}/api/v1/leads")
    click.echo(f"admin console: choose the demo owner's password at {base_url}{made.setup_path}")
    click.echo(f"  (the link works once), then sign in at {base_url}/admin/ as {made.owner}")
    click.echo(f"API docs: {base_url}/schema/swagger (OpenAPI document: {base_url}/schema/openapi.json)")


@main.group()
def tenant() -> None:
    """Create and list tenants."""


@tenant.command("create")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@admin_command
def tenant_create(runtime: Runtime, name: str, as_json: bool) -> None:
    tenant_id = tenancy.create_tenant(runtime, name)
    _emit(as_json, {"tenantId": tenant_id, "name": name.strip()}, tenant_id)


@tenant.command("list")
@click.option("--json", "as_json", is_flag=True)
@admin_command
def tenant_list(runtime: Runtime, as_json: bool) -> None:
    rows = runtime.store.reader().tenants.list_tenants()
    _emit(as_json, [{"tenantId": t, "name": n, "createdAt": c} for t, n, c in rows],
          "\n".join(f"{t}\t{n}\t{c}" for t, n, c in rows))


@main.group()
def key() -> None:
    """Create, list and revoke API keys."""


@key.command("create")
@click.option("--tenant", "tenant_id", required=True, help="tenantId from `tenant create`.")
@click.option("--name", default="", help="What the key is for.")
@click.option("--source", "source_id", default=None, help="Bind the key to this ingestion source (submit only).")
@click.option("--role", type=click.Choice(KEY_ROLES), default=ADMIN, show_default=True,
              help="What a tenant key may do (docs/api.md: roles).")
@click.option("--json", "as_json", is_flag=True)
@admin_command
def key_create(runtime: Runtime, tenant_id: str, name: str, source_id: str | None, role: str, as_json: bool) -> None:
    new = tenancy.create_key(runtime, tenant_id, name=name, source_id=source_id, role=role)
    data = {"keyId": new.key_id, "key": new.key, "prefix": new.prefix, "tenantId": new.tenant_id,
            "kind": new.kind, "sourceId": new.source_id, "name": new.name,
            "role": None if new.kind == "source" else new.role}
    _emit(as_json, data, f"{new.key}\n(key id {new.key_id}; the key is shown only now)")


@key.command("list")
@click.option("--tenant", "tenant_id", required=True)
@click.option("--json", "as_json", is_flag=True)
@admin_command
def key_list(runtime: Runtime, tenant_id: str, as_json: bool) -> None:
    rows = runtime.store.reader().tenants.list_keys(tenant_id)
    data = [{"keyId": r.key_id, "name": r.name, "kind": r.kind, "role": None if r.kind == "source" else r.role,
             "sourceId": r.source_id, "prefix": r.prefix,
             "createdAt": r.created_at, "revokedAt": r.revoked_at, "lastUsedAt": r.last_used_at} for r in rows]
    _emit(as_json, data, "\n".join(
        f"{r.key_id}\t{r.prefix}...\t{r.kind if r.kind == 'source' else r.role}\t{'revoked' if r.revoked_at else 'active'}\t{r.last_used_at or 'never used'}"
        for r in rows))


@key.command("revoke")
@click.argument("key_or_id", metavar="KEY_ID")
@click.option("--json", "as_json", is_flag=True)
@admin_command
def key_revoke(runtime: Runtime, key_or_id: str, as_json: bool) -> None:
    """Revoke a key by its key id (`key list --tenant T`), or by the key itself, say one that
    leaked: it is looked up by its hash and never printed."""
    key_id, tenant_id = tenancy.revoke_key(runtime, key_or_id)
    _emit(as_json, {"keyId": key_id, "tenantId": tenant_id, "revoked": True},
          f"revoked {key_id} (tenant {tenant_id})")


@main.group()
def user() -> None:
    """People of a tenant: add (a one-time setup link to choose a password), list, reset, disable."""


def _user_of(runtime: Runtime, tenant_id: str, email: str) -> str:
    from appliance.domain.normalize import normalize_email  # noqa: PLC0415 - only these commands need it
    found = runtime.store.reader().users.by_email(tenant_id, normalize_email(email))
    if found is None:
        _fail(f"tenant {tenant_id} has no user with the email {email}")
    return found.user_id


@user.command("add")
@click.option("--tenant", "tenant_id", required=True)
@click.option("--email", required=True)
@click.option("--role", type=click.Choice(ROLES), required=True)
@click.option("--name", default="")
@click.option("--client", "client_id", default=None, help="The buyer's clientId (role buyer).")
@click.option("--supplier", "supplier_id", default=None, help="The supplier: a source's supplierId, or its sourceId (role supplier).")
@click.option("--json", "as_json", is_flag=True)
@admin_command
def user_add(runtime: Runtime, tenant_id: str, email: str, role: str, name: str, client_id: str | None,
             supplier_id: str | None, as_json: bool) -> None:
    """Prints the user's setup link: give it to the person, who chooses a password there (24 h, once)."""
    tenancy.require_tenant(runtime, tenant_id)
    made = asyncio.run(users.create(runtime, tenant_id, "cli", None, users.NewUser(
        email=email, name=name, role=role, client_id=client_id, supplier_id=supplier_id)))
    _emit(as_json, {"userId": made.user_id, "email": made.email, "name": made.name, "role": made.role,
                    "setupUrl": made.setup_url},
          f"{made.setup_url}\n(user {made.user_id}, {made.role}; the link works once, for 24 hours)")


@user.command("list")
@click.option("--tenant", "tenant_id", required=True)
@click.option("--json", "as_json", is_flag=True)
@admin_command
def user_list(runtime: Runtime, tenant_id: str, as_json: bool) -> None:
    tenancy.require_tenant(runtime, tenant_id)
    found, after = [], None
    while True:
        listed = users.page(runtime, tenant_id, after, 100)
        found += listed.items
        if not listed.has_more:
            break
        after = listed.next_cursor
    _emit(as_json, [msgspec.to_builtins(u) for u in found], "\n".join(
        f"{u.user_id}\t{u.email}\t{u.role}\t{'active' if u.active else 'disabled'}\t"
        f"{'2fa' if u.two_factor else 'no 2fa'}\t{u.last_sign_in_at or 'never signed in'}" for u in found))


@user.command("reset-password")
@click.option("--tenant", "tenant_id", required=True)
@click.option("--email", required=True)
@click.option("--json", "as_json", is_flag=True)
@admin_command
def user_reset_password(runtime: Runtime, tenant_id: str, email: str, as_json: bool) -> None:
    """A new setup link; the old password stops working and the user's sessions end."""
    tenancy.require_tenant(runtime, tenant_id)
    link = asyncio.run(users.reset_password(runtime, tenant_id, "cli", None, user_id=_user_of(runtime, tenant_id, email)))
    _emit(as_json, {"userId": link.user_id, "email": link.email, "setupUrl": link.setup_url},
          f"{link.setup_url}\n(user {link.user_id}; the link works once, for 24 hours)")


@user.command("disable")
@click.option("--tenant", "tenant_id", required=True)
@click.option("--email", required=True)
@click.option("--json", "as_json", is_flag=True)
@admin_command
def user_disable(runtime: Runtime, tenant_id: str, email: str, as_json: bool) -> None:
    """The user can no longer sign in; its sessions end."""
    tenancy.require_tenant(runtime, tenant_id)
    done = asyncio.run(users.disable(runtime, tenant_id, "cli", None, _user_of(runtime, tenant_id, email)))
    _emit(as_json, msgspec.to_builtins(done), f"disabled {done.user_id} ({done.email})")


@main.group()
def endpoint() -> None:
    """A tenant's delivery endpoints: health, pause and resume."""


def _endpoint_change(runtime: Runtime, tenant_id: str, change: Callable, endpoint_id: str, reason: str | None):
    """Run `pause_now` or `resume_now` of appliance/services/endpoints for the CLI."""
    from appliance.errors import NotFound
    from appliance.services.tenant_settings import load_settings

    store = runtime.store
    if not store.reader().tenants.tenant_exists(tenant_id):
        _fail(f"tenant {tenant_id} does not exist")
    settings = load_settings(store, tenant_id, store.reader().tenants.config_rev(tenant_id))
    try:
        return change(runtime, settings, tenant_id, endpoint_id, reason)
    except NotFound:
        _fail(f"no delivery endpoint {endpoint_id} in tenant {tenant_id}")
        raise  # not reached: _fail exits


def _endpoint_line(item: Any) -> str:
    day = item.last24h
    return (f"{item.delivery_endpoint_id}\t{item.state}\t{item.host or item.adapter}\t"
            f"24h: {day.delivered} delivered, {day.failed} failed, {day.error} errors\t"
            f"{item.consecutive_errors} errors in a row\t{item.waiting} waiting"
            + (f"\t({item.paused_reason})" if item.paused_reason else ""))


@endpoint.command("list")
@click.option("--tenant", "tenant_id", required=True)
@click.option("--json", "as_json", is_flag=True)
@admin_command
def endpoint_list(runtime: Runtime, tenant_id: str, as_json: bool) -> None:
    from appliance.services import endpoints

    if not runtime.store.reader().tenants.tenant_exists(tenant_id):
        _fail(f"tenant {tenant_id} does not exist")
    items = endpoints.page(runtime, tenant_id, None, 1_000_000).items
    _emit(as_json, msgspec.to_builtins(items), "\n".join(_endpoint_line(item) for item in items)
          or "no delivery endpoints")


@endpoint.command("pause")
@click.option("--tenant", "tenant_id", required=True)
@click.argument("endpoint_id")
@click.option("--reason", default=None, help="Shown as the endpoint's pausedReason.")
@click.option("--json", "as_json", is_flag=True)
@admin_command
def endpoint_pause(runtime: Runtime, tenant_id: str, endpoint_id: str, reason: str | None, as_json: bool) -> None:
    """Deliveries to the endpoint wait (they do not fail) until it is resumed."""
    from appliance.services.endpoints import pause_now

    done = _endpoint_change(runtime, tenant_id, pause_now, endpoint_id, reason)
    _emit(as_json, msgspec.to_builtins(done.item),
          f"{endpoint_id} {'paused' if done.changed else 'was already paused'}")


@endpoint.command("resume")
@click.option("--tenant", "tenant_id", required=True)
@click.argument("endpoint_id")
@click.option("--reason", default=None, help="Logged with the resume.")
@click.option("--json", "as_json", is_flag=True)
@admin_command
def endpoint_resume(runtime: Runtime, tenant_id: str, endpoint_id: str, reason: str | None, as_json: bool) -> None:
    """The deliveries that waited for the endpoint are due at once (a running server takes them
    within a second)."""
    from appliance.services.endpoints import resume_now

    done = _endpoint_change(runtime, tenant_id, resume_now, endpoint_id, reason)
    _emit(as_json, msgspec.to_builtins(done.item),
          f"{endpoint_id} {'resumed' if done.changed else 'was not paused'}; {done.released} waiting deliveries released")


@main.command("import")
@click.option("--tenant", "tenant_id", required=True)
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True)
@admin_command
def import_(runtime: Runtime, tenant_id: str, file: str, as_json: bool) -> None:
    """Upsert a tenant bundle (JSON or TOML) into a tenant."""
    # Campaign documents name an e-signature adapter and verification steps a verifier: the
    # plugins say which are there (and what a verifier's config must be).
    registry = load_plugins(runtime.config)
    counts = tenancy.import_bundle(runtime, tenant_id, _read(file), format_from_filename(file),
                                   esign_adapters=frozenset(registry.esign_adapters), verifiers=registry.verifiers)
    shown_once = counts.pop("webhookSecrets", {})
    _emit(as_json, {"tenantId": tenant_id, "file": file, "imported": counts,
                    **({"webhookSecrets": shown_once} if shown_once else {})},
          "imported " + ", ".join(f"{n} {k}" for k, n in counts.items())
          + "".join(f"\nwebhook {hook} signs with {secret} (shown once: keep it)" for hook, secret in shown_once.items()))


@main.command()
@click.option("--tenant", "tenant_id", required=True)
@click.option("--list", "list_id", required=True, help="The suppression list's id (sup_...).")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--remove", is_flag=True, help="Remove the file's values from the list instead of adding them.")
@click.option("--json", "as_json", is_flag=True)
@admin_command
def suppress(runtime: Runtime, tenant_id: str, list_id: str, file: str, remove: bool, as_json: bool) -> None:
    """Add (or remove) the emails and phones of a CSV file to a suppression list: a column named
    email and/or phone, or a single column of values. Bad rows are counted and reported."""
    from appliance.errors import NotFound
    from appliance.services import suppression

    data = _read(file)
    try:
        if not runtime.store.reader().tenants.tenant_exists(tenant_id):
            _fail(f"tenant {tenant_id} does not exist")
        rows = suppression.open_csv(runtime, tenant_id, list_id, data)
        with click.progressbar(length=max(data.count(b"\n"), 1), label="rows", file=sys.stderr,
                               hidden=not sys.stderr.isatty()) as bar:
            report = suppression.load_rows(runtime, tenant_id, list_id, rows, remove=remove,
                                            progress=bar.update)
    except NotFound:
        _fail(f"no suppression list {list_id} in tenant {tenant_id}")
    except suppression.CsvProblem as exc:
        _fail(f"{file}: {exc}")
    verb = "removed" if remove else "loaded"
    _emit(as_json, report.as_dict(remove),
          f"{verb} {report.changed} values from {report.rows} rows, {list_id} ({report.skipped} "
          f"{'not on the list' if remove else 'already there'}, {report.bad_rows} bad rows); "
          f"the list holds {report.count}"
          + "".join(f"\n  {example}" for example in report.bad_examples)
          + (f"\n  ... and {report.bad_rows - len(report.bad_examples)} more" if report.bad_rows > len(
              report.bad_examples) else ""))


def _mapping(ctx: click.Context, param: click.Parameter, pairs: tuple[str, ...]) -> dict[str, str | None]:
    mapping: dict[str, str | None] = {}
    for pair in pairs:
        column, eq, target = pair.rpartition("=")
        if not eq or not column:
            raise click.BadParameter(f"{pair!r}: write COLUMN=FIELD (FIELD empty leaves the column out)")
        mapping[column] = target or None
    return mapping


@main.command("import-leads")
@click.option("--tenant", "tenant_id", required=True)
@click.option("--campaign", "campaign_id", required=True, help="The campaign the leads are posted to.")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--map", "mapping", multiple=True, metavar="COLUMN=FIELD", callback=_mapping,
              help="Fill FIELD (a submit field, dotted paths like address.state) from COLUMN; repeatable. "
                   "Columns named after a field map without it.")
@click.option("--no-process", is_flag=True, help="Store the leads with status new instead of running each "
                                                  "through the submit pipeline (no delivery).")
@click.option("--json", "as_json", is_flag=True)
@admin_command
def import_leads(runtime: Runtime, tenant_id: str, campaign_id: str, file: str, mapping: dict[str, str | None],
                 no_process: bool, as_json: bool) -> None:
    """Import the leads of a CSV file (UTF-8, a header row) into a campaign. Bad rows are counted
    and reported by data row number (1 = the first row after the header); the others are imported.
    Exit code 1 when nothing was imported."""
    from appliance.errors import ValidationFailed
    from appliance.services import lead_import

    if not runtime.store.reader().tenants.tenant_exists(tenant_id):
        _fail(f"tenant {tenant_id} does not exist")
    try:
        handle = open(file, "rb")  # noqa: SIM115 - closed below, after the rows are read
    except OSError as exc:
        _fail(f"cannot read {file}: {exc.strerror}")
    with handle:
        registry = None if no_process else load_plugins(runtime.config)
        try:
            job = lead_import.open_for_cli(runtime, tenant_id, campaign_id, handle, mapping,
                                           plugins_listen=registry is not None and registry.listens_to_lead_events)
        except ValidationFailed as exc:
            _fail([f"{file}:{detail[5:]}" if detail.startswith("file:") else detail for detail in exc.details or []])
        with click.progressbar(length=job.checked.total, label="rows", file=sys.stderr,
                               hidden=not sys.stderr.isatty()) as bar:
            tally = lead_import.run_for_cli(runtime, job, registry, process=not no_process, progress=bar.update)
    report = {"total": job.checked.total, "processed": tally.processed, "created": tally.created,
              "failed": tally.failed, "columns": job.checked.names, "errors": tally.errors}
    _emit(as_json, report,
          f"imported {tally.created} of {job.checked.total} rows into {campaign_id} "
          f"({'stored as new' if no_process else 'processed'}); {tally.failed} failed"
          + "".join(f"\n  row {e['row']}: {'; '.join(e['details'])}" for e in tally.errors[:MAX_SHOWN_ERRORS])
          + (f"\n  ... and {tally.failed - MAX_SHOWN_ERRORS} more" if tally.failed > MAX_SHOWN_ERRORS else ""))
    if tally.created == 0:
        sys.exit(1)


MAX_SHOWN_ERRORS = 10  # failed rows listed by import-leads (all of the first 100 with --json)


@main.command()
@click.option("--tenant", "tenant_id", required=True)
@click.argument("file", required=False, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="With FILE: report as JSON (without FILE the bundle is JSON).")
@admin_command
def export(runtime: Runtime, tenant_id: str, file: str | None, as_json: bool) -> None:
    """Write a tenant bundle (JSON, or TOML for a .toml FILE; stdout without FILE). Secrets stay out."""
    bundle = tenancy.export_bundle(runtime, tenant_id)
    if file is None:
        click.echo(tenancy.encode_bundle(bundle, "json").decode(), nl=False)
        return
    encoded = tenancy.encode_bundle(bundle, format_from_filename(file))
    try:
        Path(file).write_bytes(encoded)
    except OSError as exc:
        _fail(f"cannot write {file}: {exc.strerror}")
    _emit(as_json, {"tenantId": tenant_id, "file": file, "bytes": len(encoded)}, f"exported {tenant_id} to {file}")


@main.command()
@click.argument("dest", type=click.Path())
@click.option("--json", "as_json", is_flag=True)
@admin_command
def backup(runtime: Runtime, dest: str, as_json: bool) -> None:
    """Consistent online copy of the database, safe while the service runs (on PostgreSQL a
    pg_dump custom-format archive, made by pg_dump)."""
    target = Path(dest)
    if target.is_dir():
        suffix = "dump" if runtime.config.storage.backend == "postgresql" else "db"
        target = target / f"appliance-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}.{suffix}"
    if target.exists():
        _fail(f"{target} exists; choose a new file")
    if not target.parent.is_dir():
        _fail(f"{target.parent} is not a folder; create it first")
    runtime.store.backup_to(target)
    key = runtime.config.master_key_path
    _emit(as_json, {"file": str(target), "bytes": target.stat().st_size, "masterKey": str(key)},
          f"backup written to {target}\nsecrets in it open only with the master key {key}: keep a copy apart")


@main.command()
@click.argument("backup_file", metavar="BACKUP", type=click.Path(exists=True, dir_okay=False))
@click.option("--yes", is_flag=True, help="Replace the database without asking (needed without a terminal).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def restore(ctx: click.Context, backup_file: str, yes: bool, as_json: bool) -> None:
    """Replace the database with BACKUP (checked first; refused while a server runs on the data
    folder). Asks first on a terminal; without one, --yes is needed. The database it replaces is
    kept beside it."""
    config = ctx.obj["config"]()
    if config.storage.backend == "postgresql":
        _restore_postgresql(config, Path(backup_file), as_json)
        return
    _check_backup(config, Path(backup_file))  # before anything is created
    if not yes:
        _confirm_restore(config, Path(backup_file))
    lock = _hold_for_restore(config)
    try:
        _restore(config, Path(backup_file), as_json)
    finally:
        lock.close()


def _confirm_restore(config: Config, backup_file: Path) -> None:
    """Ask on a terminal (default no); a script must say --yes. Asked before the data folder is
    made or taken, so that a "no" leaves nothing behind, and not while a server runs on it (the
    restore would be refused after the answer)."""
    if not sys.stdin.isatty():
        _fail("restore replaces the database: confirm with --yes")
    serving = running_server(config.data_dir) if config.data_dir.is_dir() else None
    if serving:
        _fail(f"{serving}: stop it before restoring")
    # On standard error, so that standard output holds only the --json answer.
    if not click.confirm(f"Replace {config.database_file} with {backup_file}?", default=False, err=True):
        _fail(f"restore cancelled: {config.database_file} was left as it was")


def _hold_for_restore(config: Config) -> IO[str]:
    """The data folder, made if missing and held to the end of the restore: no server may start
    on it while its database is swapped or not yet whole."""
    try:
        private_folder(config.data_dir)
    except OSError as exc:
        _fail(f"cannot create {config.data_dir}: {exc.strerror}")
    try:
        return hold(config.data_dir, iso(datetime.now(timezone.utc)), command="restore")
    except DataFolderBusy as exc:
        _fail(f"{exc}: stop it before restoring")


def _restore_postgresql(config: Config, backup_file: Path, as_json: bool) -> None:
    """pg_restore into the configured database, which must be empty: nothing is replaced, so
    nothing is asked. Then opened as a server would (pending migrations, the master key)."""
    lock = _hold_for_restore(config)
    shown = redact_url(config.database_url)
    try:
        restore_to_postgresql(backup_file, config.database_url)
        open_runtime(config).close()
    except (StorageError, SecretError) as exc:
        _fail(str(exc))
    finally:
        lock.close()
    _emit(as_json, {"restored": str(backup_file), "database": shown, "previous": None},
          f"restored {backup_file} to {shown}")


def _check_backup(config: Config, backup_file: Path) -> None:
    """A sound appliance database whose secrets open with this install's master key."""
    try:
        sealed_with = inspect_backup(backup_file)
        if sealed_with is not None:
            box = SecretBox(load_master_key(config.master_key_path))
            if box.key_id != sealed_with:
                _fail(f"the secrets in {backup_file} were sealed with {sealed_with}, but the master key "
                      f"{config.master_key_path} is {box.key_id}: put that install's master key in place first")
    except (StorageError, SecretError) as exc:
        _fail(str(exc))


def _restore(config: Config, backup_file: Path, as_json: bool) -> None:
    stamp = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"
    keep_as = config.database_file.with_name(f"appliance-before-restore-{stamp}.db")
    for n in itertools.count(2):  # a second restore within the same second keeps both
        if not keep_as.exists():
            break
        keep_as = config.database_file.with_name(f"appliance-before-restore-{stamp}-{n}.db")
    try:
        kept = restore_database(backup_file, config.database_file, keep_as)
    except StorageError as exc:
        _fail(str(exc))
    _emit(as_json, {"restored": str(backup_file), "database": str(config.database_file),
                    "previous": str(keep_as) if kept else None},
          f"restored {backup_file} to {config.database_file}" + (f"\nthe database it replaced is kept as {keep_as}"
                                                                  if kept else ""))


@main.command()
@click.option("--to", "url", required=True, metavar="postgresql://USER@HOST/DB",
              help="The empty PostgreSQL database (a password is better given in $APPLIANCE_DATABASE_URL"
                   " and --to \"$APPLIANCE_DATABASE_URL\" left out of shell history).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def migrate(ctx: click.Context, url: str, as_json: bool) -> None:
    """Copy this SQLite install into an empty PostgreSQL database, checking every table's row
    count (refused while a server runs on the data folder). The master key stays in the data folder."""
    config = ctx.obj["config"]()
    if config.storage.backend != "sqlite":
        _fail("migrate copies an SQLite install, and [storage] backend is already postgresql")
    if not url.startswith(("postgresql://", "postgres://")):
        _fail("--to takes a postgresql:// URL")
    if not config.database_file.is_file():
        _fail(f"no database at {config.database_file}: nothing to migrate")
    try:  # held to the end: no server may write while the copy is taken
        lock = hold(config.data_dir, iso(datetime.now(timezone.utc)), command="migrate")
    except DataFolderBusy as exc:
        _fail(f"{exc}: stop it before migrating")
    try:
        open_runtime(config).close()  # the install is sound, its master key right, its migrations applied
        counts = copy_to_postgresql(config.database_file, url)
    except (StorageError, SecretError) as exc:
        _fail(str(exc))
    finally:
        lock.close()
    shown = redact_url(url)
    _emit(as_json, {"to": shown, "rows": counts},
          f"copied {sum(counts.values())} rows in {len(counts)} tables to {shown} (counts checked)\n"
          f"to serve from it: [storage] backend = \"postgresql\" and url (or $APPLIANCE_DATABASE_URL);"
          f" keep [storage] path = {config.data_dir}: the master key stays there")


class _Caution(Exception):
    """A doctor check that passes but deserves a look: a WARN line (`"warning": true` in --json)."""


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def doctor(ctx: click.Context, as_json: bool) -> None:
    """Check the config, the master key (against the stored secrets), the database, the plugin
    folders, the address served (and its TLS certificate), and say whether a server runs on the
    data folder."""
    from appliance.tls import TlsError, check_listening

    config = ctx.obj["config"]()
    results: list[dict[str, Any]] = []

    def check(label: str, fn: Callable[[], str]) -> None:
        try:
            results.append({"check": label, "ok": True, "detail": fn()})
        except _Caution as exc:
            results.append({"check": label, "ok": True, "warning": True, "detail": str(exc)})
        except (StorageError, SecretError, OSError, PluginError, TlsError) as exc:  # every failure, not the first
            results.append({"check": label, "ok": False, "detail": str(exc)})

    def master_key() -> str:
        path = config.master_key_path
        if not path.is_file():
            raise SecretError(f"no master key at {path}")
        load_master_key(path)
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise SecretError(f"{path} is readable by others (mode {mode:o}); chmod 600 it")
        return f"{path} (mode {mode:o})"

    def database() -> str:
        runtime = open_runtime(config)  # refuses a missing database and a master key that does not fit
        try:
            about = runtime.store.describe()
            if about["backend"] == "postgresql":
                others = about["other_processes"]
                return (f"{about['url']}: PostgreSQL {about['version']}, connection ok ({about['latency_ms']} ms "
                        f"a round trip), {about['migrations']}/{about['known_migrations']} migrations, shared with "
                        f"{others} other appliance process{'es' if others != 1 else ''}, "
                        f"secrets open with {runtime.box.key_id}")
            verdict, applied = runtime.store.health()
            if verdict != "ok":
                raise StorageError(f"integrity_check: {verdict}")
            return (f"{config.database_file}: integrity ok, {applied}/{len(MIGRATIONS)} migrations, "
                    f"secrets open with {runtime.box.key_id}")
        finally:
            runtime.close()

    def plugin_dirs() -> str:
        missing = [d for d in config.plugins.dirs if not Path(d).is_dir()]
        if missing and config.plugins.strict:
            raise PluginError(f"missing plugin folders: {', '.join(missing)}")
        return ", ".join(f"{d}{' (missing)' if d in missing else ''}" for d in config.plugins.dirs) or "none"

    def listening() -> str:
        served = config.server
        warning = check_listening(served.tls_cert_file, served.tls_key_file, served.host, served.port)
        if warning:
            raise _Caution(warning)
        if served.tls:
            return f"https://{served.host}:{served.port} (certificate {served.tls_cert_file})"
        return f"http://{served.host}:{served.port} (this machine only)"

    def server() -> str:
        return (running_server(config.data_dir) if config.data_dir.is_dir() else None) or "no server running"

    def processes() -> str:
        found = server_processes(config.data_dir) if config.data_dir.is_dir() else []
        described = ", ".join(
            f"{p.get('role')} pid {p.get('pid')} {'running' if p['alive'] else 'NOT RUNNING'}"
            + (f" since {p['since']}" if p.get("since") else "")
            + (f" (started {p['starts']} times)" if p.get("starts", 1) > 1 else "") for p in found)
        if any(not p["alive"] for p in found):
            raise OSError(f"{described}: a process of the appliance is not running (the server restarts "
                          "its delivery process within seconds, or stops)")
        return described or "no server running"

    check("config", lambda: ctx.obj["config_path"] or "built-in defaults")
    check("master key", master_key)
    check("database", database)
    check("plugin folders", plugin_dirs)
    check("listening", listening)
    check("server", server)
    check("processes", processes)
    failed = [r for r in results if not r["ok"]]
    _emit(as_json, {"ok": not failed, "checks": results},
          "\n".join(f"{'FAIL' if not r['ok'] else 'WARN' if r.get('warning') else 'ok  '}  {r['check']}: "
                    f"{r['detail']}" for r in results))
    if failed:
        sys.exit(1)


@main.command("plugins")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def plugins_(ctx: click.Context, as_json: bool) -> None:
    """List each loaded plugin with the adapters and hooks it provides and the file it comes from,
    and the plugins that failed to load."""
    from appliance.plugins import ADAPTER_HOOKS, load_plugins

    config = ctx.obj["config"]()
    plugin_log = logging.getLogger("appliance.plugins")
    plugin_log.disabled = True  # this command is the report; the load warnings would repeat it
    try:
        registry = load_plugins(config)
    except PluginError as exc:  # [plugins] strict = true
        _fail(str(exc))
    finally:
        plugin_log.disabled = False
    from appliance.adapters import trustedform

    plugins = [{"plugin": r.name, "file": r.file, "builtin": r.builtin,
                "adapters": [{"kind": kind, "name": name} for kind, name in r.provides], "hooks": r.hooks}
               for r in registry.load_report if r.error is None]
    # The certificate claims are built in, not pluggable; listed so an operator sees them with their settings' table.
    plugins.append({"plugin": "trustedform", "file": trustedform.__file__, "builtin": True,
                    "adapters": [{"kind": "compliance", "name": "trustedform"}], "hooks": []})
    adapters = [{**a, "plugin": p["plugin"], "file": p["file"]} for p in plugins for a in p["adapters"]]
    errors = [{"plugin": r.name, "file": r.file, "error": r.error} for r in registry.errors]
    dirs = [str(d) for d in registry.dirs]
    adapter_hooks = {hook for hook, _base in ADAPTER_HOOKS.values()}  # their lines are the adapters they return

    def provided(plugin: dict) -> list[tuple[str, str]]:
        shown = [(a["kind"], a["name"]) for a in plugin["adapters"]]
        shown += [("hook", hook) for hook in plugin["hooks"] if hook not in adapter_hooks]
        return shown or [("-", "provides nothing")]

    lines = [f"{kind:<9} {name:<20} {p['plugin']}  {p['file']}" for p in plugins for kind, name in provided(p)]
    lines += [f"error     {e['plugin'] or '-':<20} {e['file']}: {e['error']}" for e in errors]
    lines.append("plugin folders: " + (", ".join(dirs) or "none"))
    _emit(as_json, {"plugins": plugins, "adapters": adapters, "errors": errors, "dirs": dirs}, "\n".join(lines))


_REPORT_OPTIONS = {"groupBy": "--group-by", "startDate": "--from", "endDate": "--to", "timezone": "--timezone"}
_REPORT_COUNTERS = ("leads", "qualified", "delivered", "failed", "duplicate", "disqualified", "returned")


@main.command()
@click.option("--tenant", "tenant_id", required=True)
@click.option("--group-by", "group_by", default="campaign", show_default=True,
              help="campaign, client, source, endpoint or day.")
@click.option("--from", "start", default=None,
              help="First day, YYYY-MM-DD (or an ISO timestamp); default: 29 days before --to.")
@click.option("--to", "end", default=None, help="Last day, included (or an ISO timestamp); default: today.")
@click.option("--timezone", default="UTC", show_default=True, help="IANA time zone of the days.")
@click.option("--json", "as_json", is_flag=True, help="The API's data object.")
@click.option("--csv", "as_csv", is_flag=True, help="One row per key and currency, with a header row.")
@admin_command
def report(runtime: Runtime, tenant_id: str, group_by: str, start: str | None, end: str | None, timezone: str,
           as_json: bool, as_csv: bool) -> None:
    """Leads and money of a date range by campaign, client, source, endpoint or day (as GET
    /api/v1/reports/summary). Counts are the leads created in the range, by their status now;
    money is the ledger entries created in it, revenue net of returns."""
    from appliance.errors import ValidationFailed
    from appliance.services import reports

    def usage(problem: str) -> None:
        click.echo(f"error: {problem}", err=True)
        sys.exit(2)

    if as_json and as_csv:
        usage("--json and --csv: choose one")
    try:
        span = reports.summary_range(group_by, start, end, timezone, runtime.clock.now())
    except ValidationFailed as exc:  # the API's names for the options
        usage(re.sub(r"\b(groupBy|startDate|endDate|timezone)\b", lambda m: _REPORT_OPTIONS[m[1]],
                     "; ".join(exc.details or [])))
    if not runtime.store.reader().tenants.tenant_exists(tenant_id):
        _fail(f"tenant {tenant_id} does not exist")
    data = msgspec.to_builtins(reports.read_summary(runtime.store.reader(), tenant_id, span))
    if as_json:
        _emit(True, data, "")
    elif as_csv:
        click.echo(reports.summary_csv(data), nl=False)
    else:
        click.echo(_report_table(data))


def _report_table(data: dict) -> str:
    """The summary as aligned columns, a total line per currency under them."""
    zone = ZoneInfo(data["timezone"])
    start, end = (datetime.fromisoformat(data[k].replace("Z", "+00:00")).astimezone(zone)
                  for k in ("rangeStart", "rangeEnd"))
    counters = _REPORT_COUNTERS
    head = ["day" if data["groupBy"] == "day" else data["groupBy"], *counters, "cost", "revenue", "margin", ""]

    def line(label: str, row: dict, money: dict | None) -> list[str]:
        amounts = [f"{money[k]:,.2f}" for k in ("cost", "revenue", "margin")] if money else ["-", "-", "-"]
        return [label, *(str(row[c]) for c in counters), *amounts, (money or {}).get("currency") or ""]

    def name(row: dict) -> str:
        key, label = row["key"], row["label"]
        return label if key is None or key == label else f"{label} ({key})"

    table = [head] + [line(name(r), r, r if r["currency"] else None) for r in data["rows"]]
    totals = data["totals"]
    money_rows = totals["byCurrency"] or [None]
    table += [line("total" if i == 0 else "", totals if i == 0 else dict.fromkeys(counters, ""), m)
              for i, m in enumerate(money_rows)]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    text = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in table]
    text.insert(len(table) - len(money_rows), "-" * len(text[0]))
    if start.time() == end.time() == datetime.min.time():  # whole days
        span = f"{start:%Y-%m-%d} to {end - timedelta(days=1):%Y-%m-%d}"
    else:
        span = f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} (end excluded)"
    title = f"Leads and money by {data['groupBy']}, {span}, {data['timezone']}"
    return "\n".join([title, "", *text] if data["rows"] else [title, "", "no leads and no money in this range"])
