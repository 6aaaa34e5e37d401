"""The admin commands under an operator's mistakes: each is one `error: ...` line and exit code 1
(2 for usage), never a traceback, and nothing is created or lost. Only `init` and `demo` make a
database or a master key; the master key must be the one the stored secrets were sealed with;
`restore` puts a backup back; one server per data folder; `serve` is the default command."""

from __future__ import annotations

import base64
import io
import json
import socket
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bundles import standard_bundle
from appliance.cli import main as cli_main
from tests.conftest import TEST_BACKEND, Cli
from tests.processes import free_port, serving, stop_process, wait_healthy


def one_error_line(result, *expected: str) -> str:
    text = result.output
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    for part in expected:
        assert part in lines[0], (part, lines[0])
    return lines[0]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def config_with(tmp_path: Path, extra: str = "", name: str = "other.toml") -> Cli:
    """Another config on the same install (the same database under APPLIANCE_TEST_BACKEND=postgresql)."""
    return Cli(write(tmp_path / name, f'[storage]\npath = "{tmp_path / "data"}"\n{same_database(tmp_path)}'
                                       f'[plugins]\ndirs = ["{tmp_path / "plugins"}"]\n{extra}'))


def same_database(tmp_path: Path) -> str:
    """The test install's [storage] backend and url lines, when its config (tests/conftest.py) has them."""
    main = tmp_path / "appliance.toml"
    lines = main.read_text().splitlines() if main.exists() else []
    return "".join(f"{line}\n" for line in lines if line.startswith(("backend = ", "url = ")))


def files_under(path: Path) -> list[str]:
    """The data folder's files, but the lock a restore or a server takes (it holds no data)."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.name != "serve.lock") \
        if path.exists() else []


# ---- nothing is made by mistake ------------------------------------------------------------------

def test_a_mistyped_storage_path_is_refused_and_creates_nothing(cli, tmp_path):
    mistyped = config_with(tmp_path, name="typo.toml")
    mistyped.config_file.write_text(f'[storage]\npath = "{tmp_path / "dta"}"\n')
    for args in (["tenant", "list"], ["key", "list", "--tenant", "tnt_x"], ["export", "--tenant", "tnt_x"],
                 ["backup", str(tmp_path)]):
        one_error_line(mistyped(*args, expect=1), f"no database at {tmp_path / 'dta' / 'appliance.db'}",
                       "appliance init")
    assert not (tmp_path / "dta").exists()


def test_a_mistyped_master_key_path_is_refused_and_creates_no_key(cli, tmp_path):
    other = config_with(tmp_path, f'[security]\nmaster_key_file = "{tmp_path / "nokey.key"}"\n')
    one_error_line(other("tenant", "list", expect=1), f"no master key at {tmp_path / 'nokey.key'}")
    assert not (tmp_path / "nokey.key").exists()
    doctor = json.loads(other("doctor", "--json", expect=1).stdout)
    assert doctor["ok"] is False
    assert {c["check"]: c["ok"] for c in doctor["checks"]}["master key"] is False


def test_another_master_key_is_refused_naming_the_expected_one(cli, tmp_path):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    cli("import", "--tenant", tenant_id, str(write(tmp_path / "b.json", json.dumps(standard_bundle()))))
    expected = json.loads(cli("doctor", "--json").stdout)["checks"][2]["detail"].rsplit(" ", 1)[-1]
    assert expected.startswith("local:")
    wrong = write(tmp_path / "wrong.key", base64.b64encode(os.urandom(32)).decode() + "\n")
    os.chmod(wrong, 0o600)
    other = config_with(tmp_path, f'[security]\nmaster_key_file = "{wrong}"\n')
    line = one_error_line(other("tenant", "list", expect=1), "sealed with", expected, "master_key_file")
    assert str(wrong) in line
    checks = {c["check"]: c for c in json.loads(other("doctor", "--json", expect=1).stdout)["checks"]}
    assert checks["database"]["ok"] is False and expected in checks["database"]["detail"]


# ---- every failure is one line --------------------------------------------------------------------

def test_init_on_a_path_that_cannot_be_a_folder(tmp_path):
    blocker = write(tmp_path / "file", "not a folder")
    bad = Cli(write(tmp_path / "bad.toml", f'[storage]\npath = "{blocker / "data"}"\n'))
    one_error_line(bad("init", expect=1), "cannot create", str(blocker))


def test_backup_and_export_into_a_missing_folder(cli, tmp_path):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    missing = tmp_path / "nowhere"
    one_error_line(cli("backup", str(missing / "copy.db"), expect=1), str(missing), "not a folder")
    one_error_line(cli("export", "--tenant", tenant_id, str(missing / "b.json"), expect=1), "cannot write")
    assert not missing.exists()


@pytest.mark.parametrize(("table", "problem"), [
    ('[server]\nlog_level = "verbose"\n', "server.log_level: must be one of critical, error, warning, info, debug"),
    ("[server]\nport = 99999\n", "server.port: must be a port number from 1 to 65535"),
    ("[server]\nport = 0\n", "server.port: must be a port number from 1 to 65535"),
    ('[defaults]\nregion = "usa"\n', "defaults.region: must be a two-letter uppercase country code"),
    ('[sms.twilio]\nbase_url = "api.twilio.com"\n', "sms.twilio.base_url: must be an http or https URL"),
    ('[pixels.video]\nbase_url = "ftp://x"\n', "pixels.video.base_url: must be an http or https URL"),
    ("[plugins.twilio]\ntimeout_seconds = -1\n", "plugins.twilio.timeout_seconds: must be more than 0"),
    ("[plugins.meta_capi]\ntimeout = 3\n", "plugins.meta_capi.timeout: unknown field"),
    ("[server]\nbogus = 1\n", "server.bogus: unknown field"),
    ('[delivery]\nprocess = "separate"\n', "delivery.process: must be one of auto, own, shared"),
])
@pytest.mark.parametrize("command", [["serve"], ["doctor"], ["tenant", "list"], []])
def test_every_config_value_is_checked_at_load(tmp_path, table, problem, command):
    bad = config_with(tmp_path, table)
    one_error_line(bad(*command, expect=1), problem)
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(("value", "problem"), [
    ("0", "must be from 1 to 600 (seconds)"), ("601", "must be from 1 to 600 (seconds)"),
    ('"soon"', "expected float, got str")])
def test_a_job_lease_out_of_range_is_refused_at_load(tmp_path, value, problem):
    bad = Cli(write(tmp_path / "lease.toml", f'[storage]\npath = "{tmp_path / "data"}"\njob_lease_seconds = {value}\n'))
    one_error_line(bad("serve", expect=1), f"storage.job_lease_seconds: {problem}")
    assert not (tmp_path / "data").exists()


def test_a_port_out_of_range_on_the_command_line_is_a_usage_error(cli):
    result = cli("serve", "--port", "99999", expect=2)
    assert "Traceback" not in result.output and "99999" in result.output


def test_a_broken_plugin_with_strict_loading_stops_serve_in_one_line(tmp_path):
    (tmp_path / "plugins").mkdir()
    write(tmp_path / "plugins" / "broken.py", "raise RuntimeError('kaboom')\n")
    strict = Cli(write(tmp_path / "strict.toml", f'[storage]\npath = "{tmp_path / "data"}"\n'
                                                 f'[plugins]\ndirs = ["{tmp_path / "plugins"}"]\nstrict = true\n'))
    strict("init")
    one_error_line(strict("serve", "--port", str(free_port()), expect=1), "broken")
    one_error_line(strict("plugins", expect=1), "broken")


# ---- --json where a command reports --------------------------------------------------------------

def test_reporting_commands_answer_json(cli, tmp_path):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    bundle = write(tmp_path / "b.json", json.dumps(standard_bundle()))
    imported = json.loads(cli("import", "--tenant", tenant_id, str(bundle), "--json").stdout)
    assert imported["imported"]["campaigns"] == 3 and imported["tenantId"] == tenant_id
    exported = json.loads(cli("export", "--tenant", tenant_id, str(tmp_path / "out.toml"), "--json").stdout)
    assert exported["file"] == str(tmp_path / "out.toml") and exported["bytes"] > 0
    backup = json.loads(cli("backup", str(tmp_path), "--json").stdout)  # PostgreSQL: a pg_dump archive
    assert Path(backup["file"]).is_file() and backup["bytes"] > 0
    if TEST_BACKEND == "postgresql":
        one_error_line(cli("restore", str(bundle), "--yes", expect=1), "not a pg_dump custom-format archive")
    doctor = json.loads(cli("doctor", "--json").stdout)
    assert doctor["ok"] is True and [c["check"] for c in doctor["checks"]] == [
        "config", "master key", "database", "plugin folders", "listening", "server", "processes"]
    assert json.loads(cli("plugins", "--json").stdout)["adapters"]


# ---- restore (PostgreSQL: tests/test_postgresql_operations.py) ------------------------------------

@pytest.mark.sqlite_only  # backup and restore of the SQLite file (PostgreSQL: tests/test_postgresql_operations.py)
def test_restore_puts_a_backup_back_and_keeps_what_it_replaced(cli, tmp_path):
    first = cli.json("tenant", "create", "Before")["tenantId"]
    backup = json.loads(cli("backup", str(tmp_path / "copy.db"), "--json").stdout)["file"]
    cli.json("tenant", "create", "After")
    one_error_line(cli("restore", backup, expect=1), "--yes")  # no terminal to ask
    restored = json.loads(cli("restore", backup, "--yes", "--json").stdout)
    assert [t["name"] for t in cli.json("tenant", "list")] == ["Before"]
    assert json.loads(cli("doctor", "--json").stdout)["ok"] is True
    assert not (tmp_path / "data" / "appliance.db.restoring").exists()
    # the database it replaced is kept whole beside it: restoring that brings "After" back
    cli("restore", restored["previous"], "--yes")
    assert sorted(t["tenantId"] for t in cli.json("tenant", "list"))[0] == first
    assert [t["name"] for t in cli.json("tenant", "list")] == ["Before", "After"]


class Terminal(io.BytesIO):
    """Standard input as an operator at a terminal gives it: the answers typed."""

    def isatty(self) -> bool:
        return True


def at_terminal(cli: Cli, *args: str, answer: str):
    return cli.runner.invoke(cli_main, ["--config", str(cli.config_file), *args],
                             input=Terminal(answer.encode()), catch_exceptions=False)


@pytest.mark.sqlite_only  # backup and restore of the SQLite file (PostgreSQL: tests/test_postgresql_operations.py)
def test_restore_at_a_terminal_asks_and_a_no_changes_nothing(cli, tmp_path):
    cli.json("tenant", "create", "Before")
    backup = json.loads(cli("backup", str(tmp_path / "copy.db"), "--json").stdout)["file"]
    cli.json("tenant", "create", "After")
    data = tmp_path / "data"
    before = sorted(p.name for p in data.iterdir())
    for answer in ("n\n", "\n"):  # no is the default
        refused = at_terminal(cli, "restore", backup, answer=answer)
        assert refused.exit_code == 1
        assert refused.stderr.startswith(f"Replace {data / 'appliance.db'} with {backup}? [y/N]: ")
        assert refused.stderr.endswith(f"error: restore cancelled: {data / 'appliance.db'} was left as it was\n")
        assert sorted(p.name for p in data.iterdir()) == before  # not even the lock a restore takes
    assert [t["name"] for t in cli.json("tenant", "list")] == ["Before", "After"]

    done = at_terminal(cli, "restore", backup, "--json", answer="y\n")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["restored"] == backup  # the question went to standard error
    assert [t["name"] for t in cli.json("tenant", "list")] == ["Before"]


@pytest.mark.sqlite_only  # backup and restore of the SQLite file (PostgreSQL: tests/test_postgresql_operations.py)
def test_restore_refuses_what_is_not_a_sound_appliance_database(cli, tmp_path):
    backup = Path(json.loads(cli("backup", str(tmp_path / "whole.db"), "--json").stdout)["file"])
    half = tmp_path / "half.db"
    half.write_bytes(backup.read_bytes()[: backup.stat().st_size // 2])
    before = files_under(tmp_path / "data")
    one_error_line(cli("restore", str(write(tmp_path / "junk.db", "hello")), "--yes", expect=1), "junk.db")
    one_error_line(cli("restore", str(half), "--yes", expect=1), "half.db")
    assert files_under(tmp_path / "data") == before


@pytest.mark.sqlite_only  # backup and restore of the SQLite file (PostgreSQL: tests/test_postgresql_operations.py)
def test_restore_refuses_a_backup_sealed_with_another_master_key(cli, tmp_path):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    cli("import", "--tenant", tenant_id, str(write(tmp_path / "b.json", json.dumps(standard_bundle()))))
    backup = json.loads(cli("backup", str(tmp_path / "copy.db"), "--json").stdout)["file"]
    elsewhere = Cli(write(tmp_path / "elsewhere.toml", f'[storage]\npath = "{tmp_path / "fresh"}"\n'))
    elsewhere("init")  # a new install, with a master key of its own
    one_error_line(elsewhere("restore", backup, "--yes", expect=1), "sealed with", "master key")


# ---- one server per data folder, serve by default ------------------------------------------------

@pytest.fixture
def server(cli, tmp_path) -> Iterator[tuple[subprocess.Popen, int]]:
    port = free_port()
    with open(cli.config_file, "a") as config:
        config.write(f"\n[server]\nport = {port}\n")
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        # no command: serve is the default
        proc = subprocess.Popen([sys.executable, "-m", "appliance", "--config", str(cli.config_file)],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(f"http://127.0.0.1:{port}", proc, log_path)
            yield proc, port
        finally:
            stop_process(proc)


def test_serve_is_the_default_command_and_a_second_server_on_the_folder_is_refused(cli, server, tmp_path):
    proc, port = server
    second = cli("serve", "--port", str(free_port()), expect=1)
    one_error_line(second, "another appliance serve", f"pid {proc.pid}", f"127.0.0.1:{port}", str(tmp_path / "data"))
    if TEST_BACKEND == "sqlite":
        backup = json.loads(cli("backup", str(tmp_path / "live.db"), "--json").stdout)["file"]  # online: fine
        one_error_line(cli("restore", backup, "--yes", expect=1), "another appliance serve", "stop it before restoring")
        asked = at_terminal(cli, "restore", backup, answer="y\n")  # refused before the question
        assert asked.exit_code == 1
        one_error_line(asked, "another appliance serve", "stop it before restoring")
    checks = {c["check"]: c for c in json.loads(cli("doctor", "--json").stdout)["checks"]}
    assert f"pid {proc.pid}" in checks["server"]["detail"]
    stop_process(proc)
    assert json.loads(cli("doctor", "--json").stdout)["checks"][-1]["detail"] == "no server running"
    if TEST_BACKEND == "sqlite":
        cli("restore", backup, "--yes")  # the folder is free again once the server is gone


def test_demo_on_a_served_folder_or_a_taken_port_changes_nothing(cli, server, tmp_path):
    proc, port = server
    tenants = cli.json("tenant", "list")
    one_error_line(cli("demo", "--port", str(free_port()), expect=1), "another appliance serve", f"pid {proc.pid}")
    one_error_line(cli("demo", "--port", str(port), expect=1), f"cannot listen on 127.0.0.1:{port}")
    assert cli.json("tenant", "list") == tenants  # no demo tenant, no key nobody saw


@pytest.mark.sqlite_only  # moves the database file away
def test_serve_refuses_a_missing_database(cli, tmp_path):
    (tmp_path / "data" / "appliance.db").rename(tmp_path / "elsewhere.db")
    one_error_line(cli("serve", "--port", str(free_port()), expect=1), "no database at", str(tmp_path / "data"))
    assert not (tmp_path / "data" / "appliance.db").exists()


def test_a_refused_serve_leaves_the_folder_as_it_found_it(bare_cli, tmp_path):
    data = tmp_path / "data"
    one_error_line(bare_cli("serve", "--port", str(free_port()), expect=1), f"no data folder at {data}")
    assert not data.exists()
    data.mkdir()  # made by hand, never initialised
    one_error_line(bare_cli("serve", "--port", str(free_port()), expect=1), "appliance init")
    assert list(data.iterdir()) == []  # no serve.lock either
    bare_cli("init")
    with serving(bare_cli.config_file, tmp_path / "server.log", free_port()):
        assert json.loads(bare_cli("doctor", "--json").stdout)["ok"] is True


def test_serve_refuses_another_master_key(cli, tmp_path):
    cli.json("tenant", "create", "Sealed")
    cli("import", "--tenant", cli.json("tenant", "list")[0]["tenantId"],
        str(write(tmp_path / "b.json", json.dumps({"webhooks": [{"webhookId": "w", "url": "https://hooks.example.com/"}]}))))
    (tmp_path / "data" / "master.key").write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    one_error_line(cli("serve", "--port", str(free_port()), expect=1), "stored secrets were sealed with")


def test_a_port_in_use_is_one_line(cli):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        one_error_line(cli("serve", "--port", str(port), expect=1), f"cannot listen on 127.0.0.1:{port}", "in use")


@pytest.mark.sqlite_only  # backup and restore of the SQLite file (PostgreSQL: tests/test_postgresql_operations.py)
def test_restore_replaces_a_damaged_database_and_refuses_a_live_file_copy(cli, tmp_path):
    cli.json("tenant", "create", "Kept")
    backup = Path(json.loads(cli("backup", str(tmp_path / "good.db"), "--json").stdout)["file"])
    database = tmp_path / "data" / "appliance.db"
    database.write_bytes(b"this is no longer a database" * 100)  # what a restore is for
    restored = json.loads(cli("restore", str(backup), "--yes", "--json").stdout)
    assert [t["name"] for t in cli.json("tenant", "list")] == ["Kept"]
    assert Path(restored["previous"]).read_bytes().startswith(b"this is no longer")
    # twice in the same second: the first kept database is not overwritten by the second
    again = json.loads(cli("restore", str(backup), "--yes", "--json").stdout)
    assert again["previous"] != restored["previous"] and Path(restored["previous"]).exists()
    # a file copy of a live database carries its latest commits in the -wal beside it
    live_copy = tmp_path / "copy.db"
    live_copy.write_bytes(backup.read_bytes())
    (tmp_path / "copy.db-wal").write_bytes(b"")
    one_error_line(cli("restore", str(live_copy), "--yes", expect=1), "-wal", "appliance backup")


def test_a_bundle_with_bad_utf8_in_a_string_is_one_line(cli, tmp_path):
    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"campaigns": [{"campaignId": "AB1", "name": "\xff"}]}')
    one_error_line(cli("import", "--tenant", tenant_id, str(bad), expect=1), "not UTF-8")


@pytest.mark.sqlite_only  # backup and restore of the SQLite file (PostgreSQL: tests/test_postgresql_operations.py)
def test_restore_without_the_master_key_or_with_a_garbled_one_creates_nothing(cli, tmp_path):
    tenant_id = cli.json("tenant", "create", "Sealed")["tenantId"]
    cli("import", "--tenant", tenant_id, str(write(tmp_path / "b.json", json.dumps(standard_bundle()))))
    backup = json.loads(cli("backup", str(tmp_path / "b.db"), "--json").stdout)["file"]
    elsewhere = config_with(tmp_path, f'[storage]\npath = "{tmp_path / "new"}"\n', name="new.toml")
    elsewhere.config_file.write_text(f'[storage]\npath = "{tmp_path / "new"}"\n')
    one_error_line(elsewhere("restore", backup, "--yes", expect=1), f"no master key at {tmp_path / 'new' / 'master.key'}")
    assert not (tmp_path / "new").exists()
    (tmp_path / "data" / "master.key").write_text("not base64 at all!\n")
    one_error_line(cli("tenant", "list", expect=1), "is not a base64 key")


def test_a_websocket_upgrade_gets_the_envelope_not_a_bare_refusal(cli, server):
    _proc, port = server
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /api/v1/campaigns HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 401"), answer
    assert json.loads(body)["error"]["code"] == "UNAUTHORIZED"
