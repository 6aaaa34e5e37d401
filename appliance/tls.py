"""HTTPS served by the appliance itself: `[server] tls_cert_file` and `tls_key_file` (PEM).

The pair is checked before uvicorn loads it, so a bad file is one line naming it rather than an
OpenSSL traceback (or, for a key with a passphrase, OpenSSL asking for it on the terminal). On
SIGHUP the server loads the pair again into the SSLContext its listening socket already uses:
new handshakes get the new certificate, connections already open keep theirs. A pair that fails
the check (made on the very bytes then loaded) leaves the one in use alone."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import signal
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import uvicorn
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

log = logging.getLogger("appliance.tls")


class TlsError(Exception):
    """A certificate or key the server cannot use; the message names the file."""


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise TlsError(f"cannot read {what} {path}: {exc.strerror}") from None


_CERT_WHAT = "the TLS certificate ([server] tls_cert_file)"
_KEY_WHAT = "the TLS key ([server] tls_key_file)"


@contextlib.contextmanager
def _checked_copies(cert_file: str, key_file: str) -> Iterator[tuple[str, str]]:
    """The pair read once, checked, and held in memory-only files that OpenSSL then loads: what
    was checked is what is loaded, even when the files are being replaced meanwhile, and the key
    is never written anywhere else."""
    cert_pem, key_pem = _read(cert_file, _CERT_WHAT), _read(key_file, _KEY_WHAT)
    try:
        x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        raise TlsError(f"{_CERT_WHAT} {cert_file} is not a PEM certificate") from None
    try:
        serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:  # cryptography's word for "encrypted"
        raise TlsError(f"{_KEY_WHAT} {key_file} is encrypted: the server needs it without a passphrase "
                       "(readable by the appliance's user only)") from None
    except (ValueError, UnsupportedAlgorithm):
        raise TlsError(f"{_KEY_WHAT} {key_file} is not a PEM private key") from None
    with contextlib.ExitStack() as held:
        paths = []
        for name, pem in (("certificate", cert_pem), ("key", key_pem)):
            try:
                fd = os.memfd_create(f"appliance-tls-{name}")
            except OSError as exc:
                raise TlsError(f"cannot hold the TLS {name} in memory: {exc.strerror}") from None
            held.callback(os.close, fd)
            os.write(fd, pem)
            paths.append(f"/proc/self/fd/{fd}")
        yield paths[0], paths[1]


def _load(context: ssl.SSLContext, copies: tuple[str, str], cert_file: str, key_file: str) -> None:
    try:
        # An empty password: OpenSSL never asks for a passphrase on the terminal.
        context.load_cert_chain(*copies, password=b"")
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TlsError(f"{_KEY_WHAT} {key_file} does not match the certificate {cert_file}") from None
        reason = exc.reason or str(exc)
        raise TlsError(f"the TLS certificate {cert_file} with the key {key_file} cannot be used: "
                       f"{reason.lower().replace('_', ' ')}") from None


def load_pair(cert_file: str, key_file: str, into: ssl.SSLContext | None = None) -> None:
    """Check the pair by loading it into a context of its own, then (given `into`) into `into`;
    raise TlsError saying which file is wrong and how. A failed check leaves `into` alone."""
    with _checked_copies(cert_file, key_file) as copies:
        _load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), copies, cert_file, key_file)
        if into is not None:
            _load(into, copies, cert_file, key_file)


def check_listening(cert_file: str, key_file: str, host: str, port: int) -> str | None:
    """What serving on `host` asks of the operator, for `serve` and `doctor` alike: with TLS
    configured, raise TlsError unless the pair loads; without, the plain-HTTP warning or None."""
    if cert_file:
        load_pair(cert_file, key_file)
        return None
    return plain_http_warning(host, port)


def plain_http_warning(host: str, port: int) -> str | None:
    """What to tell the operator when plain HTTP on `host` is reachable from other machines; None
    when it is loopback only. A name is judged by the addresses it resolves to; one that does not
    resolve is an OSError naming it (nothing can listen there)."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"[server] host {host} does not resolve: {exc.strerror}") from None
    if all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos):
        return None
    return (f"plain HTTP on {host}:{port} is reachable from other machines: API keys and leads cross the "
            "network in clear; set [server] tls_cert_file and tls_key_file (docs/operations.md, "
            "\"Serving it over HTTPS\"), or bind 127.0.0.1 behind a TLS proxy")


class Server(uvicorn.Server):
    """uvicorn's server, and SIGHUP: load the certificate and key again (without TLS, say so)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reload_certificate)
        await super().startup(sockets)

    def reload_certificate(self) -> None:
        live = self.config.ssl
        if live is None:
            log.info("SIGHUP: no TLS configured ([server] tls_cert_file), nothing to reload")
            return
        cert_file, key_file = str(self.config.ssl_certfile), str(self.config.ssl_keyfile)
        try:
            load_pair(cert_file, key_file, into=live)
        except TlsError as exc:
            log.error("SIGHUP: kept the certificate in use: %s", exc)
            return
        log.info("SIGHUP: TLS certificate %s and key %s loaded again; new connections use them", cert_file, key_file)
