"""HTTPS served by the appliance itself (`[server] tls_cert_file` and `tls_key_file`,
appliance/tls.py), through real `appliance serve` processes, the CLI and HTTP: with both set it
answers HTTPS only; SIGHUP gives new connections a new certificate while open ones go on with
theirs, keeps the certificate in use when the new files are broken (an ERROR naming the file), and
does nothing but say so without TLS; the delivery process ignores SIGHUP; a bad file at start is
one line naming it and exit code 1; plain HTTP beyond loopback is a WARNING at start and in
doctor; console pages carry HSTS over TLS only. Certificates are made here, self-signed."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import ssl
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.conftest import Cli
from tests.http_helpers import write_certificate
from tests.processes import alive, free_port, running_delivery_pid, serving
from tests.servers import write_config
from tests.test_operator_errors import one_error_line

NAMES = ("127.0.0.1", "localhost")


# ---- certificates, connections, log lines ---------------------------------------------------------

def make_pair(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost and its key in `folder`; its subject names the
    folder, so that a client may trust two such certificates at once."""
    folder.mkdir(exist_ok=True)
    cert, key = folder / "cert.pem", folder / "key.pem"
    write_certificate(cert, key, f"{folder.name}.test", *NAMES)
    return cert, key


def fingerprint(cert: Path) -> str:
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(cert.read_text())).hexdigest()


def trusting(*certs: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs[0]))
    for cert in certs[1:]:
        context.load_verify_locations(cafile=str(cert))
    return context


def connect(port: int, trust: ssl.SSLContext) -> http.client.HTTPSConnection:
    return http.client.HTTPSConnection("127.0.0.1", port, context=trust, timeout=10)


def healthz(connection: http.client.HTTPConnection) -> int:
    """GET /healthz on `connection`, kept alive; its status."""
    connection.request("GET", "/healthz")
    answer = connection.getresponse()
    answer.read()
    assert not answer.will_close
    return answer.status


def served(connection: http.client.HTTPSConnection) -> str:
    """The fingerprint of the certificate the server showed on `connection`."""
    return hashlib.sha256(connection.sock.getpeercert(binary_form=True)).hexdigest()


def logged(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def wait_until(condition: Callable[[], object], what: str, timeout: float = 15.0, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        tail = log.read_text()[-3000:] if log is not None else ""
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s\n{tail}"
        time.sleep(0.05)
    return found


def wait_logged(log: Path, wanted: Callable[[dict], bool], what: str) -> dict:
    return wait_until(lambda: [line for line in logged(log) if wanted(line)], f"{what} logged", log=log)[-1]


def sighup_ignored(pid: int) -> bool:
    ignored = int(re.search(r"^SigIgn:\s+([0-9a-f]+)", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)[1], 16)
    return bool(ignored & 1 << (signal.SIGHUP - 1))


def install(tmp_path: Path, backend_toml: str, server_lines: str = "") -> Path:
    """An initialised install logging JSON, its delivery in a process of its own."""
    config = write_config(tmp_path, backend=backend_toml,
                          extra=f'\n[server]\n{server_lines}\n[logging]\nformat = "json"\n\n'
                                '[delivery]\nprocess = "own"\n')
    (tmp_path / "plugins").mkdir()
    Cli(config)("init")
    return config


def tls_lines(cert: Path, key: Path) -> str:
    return f'tls_cert_file = "{cert}"\ntls_key_file = "{key}"\n'


# ---- serving HTTPS and SIGHUP ------------------------------------------------------------------------

def test_sighup_gives_new_connections_the_new_certificate_while_open_ones_go_on(tmp_path, backend_toml):
    cert, key = make_pair(tmp_path / "tls")
    renewed_cert, renewed_key = make_pair(tmp_path / "renewed")
    first, second = fingerprint(cert), fingerprint(renewed_cert)
    trust = trusting(cert, renewed_cert)
    config = install(tmp_path, backend_toml, tls_lines(cert, key))
    port, log = free_port(), tmp_path / "serve.log"
    with serving(config, log, port, scheme="https", verify=trust) as server:
        with pytest.raises(httpx.TransportError):  # HTTPS only: plain HTTP gets no answer
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        before = connect(port, trust)
        assert healthz(before) == 200 and served(before) == first
        opened = before.sock

        shutil.copyfile(renewed_cert, cert)
        shutil.copyfile(renewed_key, key)
        server.send_signal(signal.SIGHUP)
        reloaded = wait_logged(log, lambda line: "loaded again" in line["message"], "the reload")
        assert reloaded["level"] == "INFO" and str(cert) in reloaded["message"]

        after = connect(port, trust)
        assert healthz(after) == 200 and served(after) == second
        assert healthz(before) == 200 and before.sock is opened and served(before) == first  # the open one goes on
        before.close()
        after.close()

        delivery = running_delivery_pid(config)
        wait_until(lambda: sighup_ignored(delivery), "the delivery process ignores SIGHUP once it runs")
        os.kill(delivery, signal.SIGHUP)
        page = httpx.get(f"https://127.0.0.1:{port}/admin/sign-in", verify=trust, timeout=10)
        assert alive(delivery) and running_delivery_pid(config) == delivery

        assert page.headers["strict-transport-security"] == "max-age=31536000"
        assert "secure" in page.headers["set-cookie"].lower()
    lines = logged(log)
    assert any(f"https://127.0.0.1:{port}" in line["message"] for line in lines)  # uvicorn's start line
    assert not [line for line in lines if line["level"] in ("WARNING", "ERROR", "CRITICAL")], log.read_text()


def test_sighup_with_broken_files_keeps_the_certificate_in_use_and_logs_an_error(tmp_path, backend_toml):
    cert, key = make_pair(tmp_path / "tls")
    _other_cert, other_key = make_pair(tmp_path / "other")
    first = fingerprint(cert)
    trust = trusting(cert)
    config = install(tmp_path, backend_toml, tls_lines(cert, key))
    port, log = free_port(), tmp_path / "serve.log"
    good_cert = cert.read_bytes()
    with serving(config, log, port, scheme="https", verify=trust) as server:
        def refused_reload(words: str) -> str:
            server.send_signal(signal.SIGHUP)
            line = wait_logged(log, lambda line: words in line["message"], f"the refusal ({words})")
            assert line["level"] == "ERROR" and "kept the certificate in use" in line["message"]
            connection = connect(port, trust)
            assert healthz(connection) == 200 and served(connection) == first  # still the old one
            connection.close()
            return line["message"]

        cert.write_bytes(other_key.read_bytes())  # a key where the certificate should be
        assert str(cert) in refused_reload("is not a PEM certificate")
        cert.write_bytes(good_cert)
        key.write_bytes(other_key.read_bytes())  # another pair's key
        assert str(key) in refused_reload("does not match the certificate")
        assert not [line for line in logged(log) if "loaded again" in line["message"]]


def test_sighup_without_tls_says_so_and_drops_nothing_and_plain_http_beyond_loopback_warns(tmp_path, backend_toml):
    config = install(tmp_path, backend_toml)
    port, log = free_port(), tmp_path / "serve.log"
    with serving(config, log, port, host="0.0.0.0") as server:
        warned = wait_logged(log, lambda line: "plain HTTP" in line["message"], "the warning")
        assert warned["level"] == "WARNING" and f"0.0.0.0:{port}" in warned["message"]
        assert "tls_cert_file" in warned["message"]
        before = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        assert healthz(before) == 200
        opened = before.sock
        server.send_signal(signal.SIGHUP)
        said = wait_logged(log, lambda line: "SIGHUP" in line["message"], "the SIGHUP line")
        assert said["level"] == "INFO" and "no TLS configured" in said["message"]
        assert healthz(before) == 200 and before.sock is opened
        assert server.poll() is None and httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
        before.close()
        page = httpx.get(f"http://127.0.0.1:{port}/admin/sign-in", timeout=10)
        assert page.status_code == 200 and "strict-transport-security" not in page.headers


def test_plain_http_on_loopback_does_not_warn(tmp_path, backend_toml):
    config = install(tmp_path, backend_toml)
    port, log = free_port(), tmp_path / "serve.log"
    with serving(config, log, port):
        pass
    assert not [line for line in logged(log) if line["level"] == "WARNING"], log.read_text()


def test_hsts_is_not_sent_over_plain_http_even_when_a_proxy_says_https(client):
    plain = client.get("/admin/sign-in", headers={"X-Forwarded-Proto": "https"})
    assert plain.status_code == 200 and "strict-transport-security" not in plain.headers


# ---- refusals at start ------------------------------------------------------------------------------

def encrypted_key(folder: Path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization

    cert, key = make_pair(folder)
    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.BestAvailableEncryption(b"passphrase")))
    return cert, key


def small_rsa_key(folder: Path) -> tuple[Path, Path]:
    """A 1024-bit RSA pair: matched and PEM, but below OpenSSL's default security level."""
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    folder.mkdir()
    private = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.now(UTC)
    made = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(private.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + timedelta(days=1))
            .sign(private, hashes.SHA256()))
    cert, key = folder / "cert.pem", folder / "key.pem"
    cert.write_bytes(made.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return cert, key


def _missing_cert(tmp: Path) -> tuple[Path, Path, Path]:
    cert, key = make_pair(tmp / "tls")
    cert.unlink()
    return cert, key, cert


def _missing_key(tmp: Path) -> tuple[Path, Path, Path]:
    cert, key = make_pair(tmp / "tls")
    key.unlink()
    return cert, key, key


def _unreadable_cert(tmp: Path) -> tuple[Path, Path, Path]:
    _cert, key = make_pair(tmp / "tls")
    folder = tmp / "a-folder.pem"  # tests run as root too, whom file modes do not stop
    folder.mkdir()
    return folder, key, folder


def _cert_not_pem(tmp: Path) -> tuple[Path, Path, Path]:
    cert, key = make_pair(tmp / "tls")
    cert.write_bytes(ssl.PEM_cert_to_DER_cert(cert.read_text()))  # DER: the right certificate, not PEM
    return cert, key, cert


def _key_not_pem(tmp: Path) -> tuple[Path, Path, Path]:
    cert, key = make_pair(tmp / "tls")
    key.write_text("not a key\n")
    return cert, key, key


def _key_of_another_pair(tmp: Path) -> tuple[Path, Path, Path]:
    cert, _key = make_pair(tmp / "tls")
    _other, key = make_pair(tmp / "other")
    return cert, key, key


def _encrypted_key(tmp: Path) -> tuple[Path, Path, Path]:
    cert, key = encrypted_key(tmp / "tls")
    return cert, key, key


def _small_key(tmp: Path) -> tuple[Path, Path, Path]:
    cert, key = small_rsa_key(tmp / "tls")
    return cert, key, cert


BAD_FILES = [
    (_missing_cert, "cannot read the TLS certificate ([server] tls_cert_file)"),
    (_missing_key, "cannot read the TLS key ([server] tls_key_file)"),
    (_unreadable_cert, "Is a directory"),
    (_cert_not_pem, "is not a PEM certificate"),
    (_key_not_pem, "is not a PEM private key"),
    (_key_of_another_pair, "does not match the certificate"),
    (_encrypted_key, "is encrypted"),
    (_small_key, "cannot be used: ee key too small"),
]


@pytest.mark.parametrize(("case", "words"), BAD_FILES, ids=[case.__name__.strip("_") for case, _ in BAD_FILES])
def test_serve_refuses_a_bad_certificate_or_key_with_one_line_naming_the_file(tmp_path, bare_cli, case, words):
    cert, key, named = case(tmp_path)
    with open(bare_cli.config_file, "a") as config:
        config.write(f"\n[server]\n{tls_lines(cert, key)}")
    line = one_error_line(bare_cli("serve", "--port", str(free_port()), expect=1), str(named), words)
    assert "SIGHUP" not in line


@pytest.mark.parametrize(("given", "missing"), [("tls_cert_file", "tls_key_file"), ("tls_key_file", "tls_cert_file")])
def test_one_tls_file_without_the_other_is_a_config_error(tmp_path, bare_cli, given, missing):
    with open(bare_cli.config_file, "a") as config:
        config.write(f'\n[server]\n{given} = "{tmp_path / "x.pem"}"\n')
    one_error_line(bare_cli("serve", expect=1), f"server.{missing}: is needed with {given}")


# ---- doctor -------------------------------------------------------------------------------------------

def listening_check(cli: Cli, tmp_path: Path, server_lines: str, expect: int = 0) -> tuple[dict, str]:
    """Doctor's "listening" check (--json) and its text line, with `server_lines` as [server]."""
    config = tmp_path / "doctor.toml"
    config.write_text(cli.config_file.read_text() + f"\n[server]\n{server_lines}")
    other = Cli(config)
    found = {c["check"]: c for c in json.loads(other("doctor", "--json", expect=expect).stdout)["checks"]}
    text = [line for line in other("doctor", expect=expect).stdout.splitlines() if "  listening: " in line]
    return found["listening"], text[0]


def test_doctor_warns_of_plain_http_beyond_loopback_and_checks_the_certificate(cli, tmp_path):
    check, line = listening_check(cli, tmp_path, 'host = "0.0.0.0"\nport = 8443\n')
    assert check["ok"] is True and check["warning"] is True
    assert "plain HTTP on 0.0.0.0:8443 is reachable from other machines" in check["detail"]
    assert line.startswith("WARN  listening: plain HTTP")

    check, line = listening_check(cli, tmp_path, "port = 8443\n")
    assert check == {"check": "listening", "ok": True, "detail": "http://127.0.0.1:8443 (this machine only)"}
    assert line.startswith("ok    listening: ")

    cert, key = make_pair(tmp_path / "tls")
    check, _ = listening_check(cli, tmp_path, f'host = "0.0.0.0"\n{tls_lines(cert, key)}')
    assert check == {"check": "listening", "ok": True, "detail": f"https://0.0.0.0:8080 (certificate {cert})"}

    _other, other_key = make_pair(tmp_path / "other")
    check, line = listening_check(cli, tmp_path, tls_lines(cert, other_key), expect=1)
    assert check["ok"] is False and str(other_key) in check["detail"] and "does not match" in check["detail"]
    assert line.startswith("FAIL  listening: ")


def test_doctor_fails_a_host_that_does_not_resolve(cli, tmp_path):
    check, line = listening_check(cli, tmp_path, 'host = "no-such-host.invalid"\n', expect=1)
    assert check["ok"] is False and "no-such-host.invalid does not resolve" in check["detail"]
    assert line.startswith("FAIL  listening: ")
