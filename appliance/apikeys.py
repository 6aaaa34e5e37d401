"""API key format: `lsk_` (tenant) or `lss_` (source) + 32 random base62 characters + a 6
character checksum that tells a mistyped key apart (`well_formed`). Source keys imported from a
bundle may have any format of at least MIN_LENGTH characters. Only a SHA-256 of the key is stored (keys carry 190 bits of randomness, so a slow hash
adds nothing), and the look-up is by that hash, so no secret is ever compared byte by byte."""

from __future__ import annotations

import hashlib
import secrets
import zlib

TENANT_PREFIX = "lsk_"
SOURCE_PREFIX = "lss_"
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_BODY = 32
_CHECK = 6
KEY_LENGTH = 4 + _BODY + _CHECK
MIN_LENGTH = 20
MAX_LENGTH = 256


def _base62(value: int, length: int) -> str:
    out = []
    for _ in range(length):
        value, digit = divmod(value, 62)
        out.append(_BASE62[digit])
    return "".join(reversed(out))


def _checksum(head: str) -> str:
    return _base62(zlib.crc32(head.encode()), _CHECK)


def generate(kind: str) -> str:
    head = (SOURCE_PREFIX if kind == "source" else TENANT_PREFIX) + "".join(
        secrets.choice(_BASE62) for _ in range(_BODY)
    )
    return head + _checksum(head)


def well_formed(key: str) -> bool:
    return (
        len(key) == KEY_LENGTH
        and key[:4] in (TENANT_PREFIX, SOURCE_PREFIX)
        and secrets.compare_digest(_checksum(key[:-_CHECK]), key[-_CHECK:])
    )


def key_hash(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def display_prefix(key: str) -> str:
    """What may be shown after creation: our kind marker and 8 random characters (of 32), or the
    first 6 characters of an imported key."""
    return key[:12] if well_formed(key) else key[:6]
