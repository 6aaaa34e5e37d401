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


# Two characters per 10 bits, written out: ids are made on every submit, and an unrolled lookup
# is half the cost of a loop.
_PAIRS = [high + low for high in _ALPHABET for low in _ALPHABET]


def _time_part(ms: int, pairs: list[str] = _PAIRS) -> str:
    """10 base32 characters of the low 50 bits, most significant first."""
    return pairs[ms >> 40 & 1023] + pairs[ms >> 30 & 1023] + pairs[ms >> 20 & 1023] + pairs[ms >> 10 & 1023] \
        + pairs[ms & 1023]


def _random_part(value: int, pairs: list[str] = _PAIRS) -> str:
    """16 base32 characters of the low 80 bits, most significant first."""
    return _time_part(value >> 30) + pairs[value >> 20 & 1023] + pairs[value >> 10 & 1023] + pairs[value & 1023]


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
    return f"{prefix}_{_time_part(now_ms)}{_random_part(rand)}"


def request_id() -> str:
    """`req_` + 16 hex characters: for correlating a response with the log, not a secret."""
    return f"req_{_random.getrandbits(64):016x}"


def floor_id(prefix: str, epoch_ms: int) -> str:
    """The smallest id of `prefix` made at `epoch_ms`: a time bound becomes an id bound."""
    return f"{prefix}_{_time_part(max(epoch_ms, 0))}{'0' * 16}"


def is_id(prefix: str, text: str) -> bool:
    """Whether `text` has the form of an id `new_id(prefix)` makes."""
    return len(text) == len(prefix) + 27 and text.startswith(f"{prefix}_") and \
        all(char in _ALPHABET for char in text[len(prefix) + 1:])
