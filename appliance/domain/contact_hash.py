"""Contact values as a supplier's ping may send them instead of the values themselves: the
lowercase hex SHA-256 of a normalized email or of an E.164 phone. Leads keep the first 64 bits
of each digest (`hash64`) in an indexed column, so a ping's duplicate check finds the leads that
may share a value; the whole digest of each lead found then decides."""

from __future__ import annotations

import functools
import hashlib


def sha256_hex(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def hash64_of_hex(digest_hex: str) -> int:
    """The indexed part of a digest: its first 8 bytes as a signed 64-bit integer."""
    return int.from_bytes(bytes.fromhex(digest_hex[:16]), "big", signed=True)


@functools.lru_cache(maxsize=8192)  # a submit digests each value twice: its dedupe lookup, then its row
def hash64(value: str | None) -> int | None:
    if not value:
        return None
    return int.from_bytes(hashlib.sha256(value.encode()).digest()[:8], "big", signed=True)
