"""Time-ordered, prefixed identifiers (`lead_01JD...`): sortable as strings, so the newest-first
lead listing and its cursor are an index range scan on the id itself."""

from __future__ import annotations

import os
import random
import threading
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford base32: no I, L, O, U
_lock = threading.Lock()
# Seeded once from the OS; ids need uniqueness, not secrecy, and os.urandom per id is a system
# call that hands the GIL to other threads on the hot path.
_random = random.Random(os.urandom(32))
_last_ms = 0
_last_rand = 0


# Two characters per 10 bits: half the steps of one character per 5 bits (ids are made per submit).
_PAIRS = [high + low for high in _ALPHABET for low in _ALPHABET]


def _encode(value: int, length: int) -> str:
    """`length` (even) base32 characters of `value`, most significant first."""
    pairs = []
    for _ in range(length // 2):
        pairs.append(_PAIRS[value & 1023])
        value >>= 10
    return "".join(reversed(pairs))


def new_id(prefix: str) -> str:
    """`<prefix>_` + 10 chars of milliseconds + 16 chars of randomness. Within one millisecond the
    random part is incremented, so ids made by this process never go backwards."""
    global _last_ms, _last_rand
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms <= _last_ms:
            now_ms = _last_ms
            _last_rand += 1
        else:
            _last_ms = now_ms
            _last_rand = _random.getrandbits(79)  # 80 bits minus one: headroom for increments
        rand = _last_rand
    return f"{prefix}_{_encode(now_ms, 10)}{_encode(rand, 16)}"


def request_id() -> str:
    """`req_` + 16 hex characters: for correlating a response with the log, not a secret."""
    return f"req_{_random.getrandbits(64):016x}"


def floor_id(prefix: str, epoch_ms: int) -> str:
    """The smallest id of `prefix` made at `epoch_ms`: a time bound becomes an id bound."""
    return f"{prefix}_{_encode(max(epoch_ms, 0), 10)}{'0' * 16}"
