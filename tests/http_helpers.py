"""What the http delivery tests share (this module holds no tests): a lead, an endpoint from
its wire fields, a resolver that answers what the test says, and a certificate for given names."""

from __future__ import annotations

import ipaddress
import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from appliance.adapters import netguard
from appliance.domain.endpoint import DeliveryEndpoint


LEAD: dict[str, Any] = {
    "leadId": "lead_1",
    "firstName": "Ann",
    "lastName": "O'Neil & <Co>",
    "email": "ann@example.com",
    "phone": "(555) 123-4567",
    "phoneE164": "+15551234567",
    "dateOfBirth": "1980-05-01",
    "address": {"state": "CA", "zip": "94105"},
    "questionnaire": [
        {"key": "debt", "question": "How much debt?", "answer": "25000"},
        {"key": "homeowner", "question": "Own a home?", "answer": "Yes"},
        {"key": "rate", "question": "Rate?", "answer": "4.5"},
    ],
    "isTest": False,
}


def make_endpoint(url: str, **fields: Any) -> DeliveryEndpoint:
    return msgspec.convert({"deliveryEndpointId": "ep_1", "url": url, **fields}, DeliveryEndpoint)


def fake_dns(monkeypatch: pytest.MonkeyPatch, answers: list[str]) -> None:
    monkeypatch.setattr(netguard, "_lookup", lambda host: [ipaddress.ip_address(a) for a in answers])


def write_certificate(cert_file: Path, key_file: Path, *names: str) -> None:
    """A self-signed certificate valid for `names` (host names or IP addresses) and its key, as
    PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def alt_name(name: str) -> x509.GeneralName:
        try:
            return x509.IPAddress(ipaddress.ip_address(name))
        except ValueError:
            return x509.DNSName(name)

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(days=1))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([alt_name(name) for name in names]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))


def self_signed(tmp_path: Path, *names: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context, client context trusting it) for a certificate valid for `names` only."""
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    write_certificate(cert_file, key_file, *names)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert_file, key_file)
    client = ssl.create_default_context(cafile=str(cert_file))
    return server, client
