"""Secrets at rest: each secret is encrypted with its own AES-256-GCM data key, and that data key
is wrapped (AES-256-GCM again) by the install's master key file. The sealed form has the
interface's `apiKeyEncrypted` shape. The owner reference is bound in as associated data, so a
sealed value copied onto another owner does not open."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from appliance.model import Model
from appliance.private_paths import private_folder

_TAG = 16


class SealedSecret(Model):
    ciphertext: str
    encrypted_data_key: str
    iv: str
    auth_tag: str
    kms_key_id: str


class SecretError(Exception):
    """A secret could not be opened (wrong master key, tampered value). Never carries the value."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def ensure_master_key(path: Path) -> bool:
    """Create the master key file (mode 0600) unless it exists; True when created."""
    private_folder(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as handle:
        handle.write(_b64(AESGCM.generate_key(bit_length=256)).encode("ascii") + b"\n")
    return True


def load_master_key(path: Path) -> bytes:
    try:
        key = base64.b64decode(path.read_bytes().strip(), validate=True)
    except FileNotFoundError:
        raise SecretError(f"no master key at {path}: restore it from your copy, or point "
                          "[security] master_key_file at it") from None
    except OSError as exc:
        raise SecretError(f"cannot read the master key file {path}: {exc.strerror}") from None
    except ValueError:
        raise SecretError(f"the master key file {path} is not a base64 key (was it edited or truncated?)") from None
    if len(key) != 32:
        raise SecretError(f"the master key file {path} does not hold a 256-bit key")
    return key


class SecretBox:
    def __init__(self, master_key: bytes) -> None:
        self._master = AESGCM(master_key)
        self.key_id = "local:" + hashlib.sha256(master_key).hexdigest()[:16]

    def seal(self, plaintext: str, owner_ref: str) -> SealedSecret:
        aad = owner_ref.encode()
        data_key = AESGCM.generate_key(bit_length=256)
        iv = os.urandom(12)
        sealed = AESGCM(data_key).encrypt(iv, plaintext.encode(), aad)
        wrap_iv = os.urandom(12)
        wrapped = wrap_iv + self._master.encrypt(wrap_iv, data_key, self.key_id.encode())
        return SealedSecret(
            ciphertext=_b64(sealed[:-_TAG]),
            encrypted_data_key=_b64(wrapped),
            iv=_b64(iv),
            auth_tag=_b64(sealed[-_TAG:]),
            kms_key_id=self.key_id,
        )

    def open(self, sealed: SealedSecret, owner_ref: str) -> str:
        try:
            wrapped = base64.b64decode(sealed.encrypted_data_key)
            data_key = self._master.decrypt(wrapped[:12], wrapped[12:], sealed.kms_key_id.encode())
            body = base64.b64decode(sealed.ciphertext) + base64.b64decode(sealed.auth_tag)
            return AESGCM(data_key).decrypt(base64.b64decode(sealed.iv), body, owner_ref.encode()).decode()
        except (InvalidTag, ValueError):
            raise SecretError(f"secret {owner_ref} does not open with this master key") from None

    def seal_bytes(self, plaintext: str, owner_ref: str) -> bytes:
        return msgspec.json.encode(self.seal(plaintext, owner_ref))

    def open_bytes(self, blob: bytes, owner_ref: str) -> str:
        return self.open(msgspec.json.decode(blob, type=SealedSecret), owner_ref)
