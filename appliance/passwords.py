"""Staff passwords: argon2id (RFC 9106) through argon2-cffi, parameters chosen so one check costs
about 150 ms of one core on the project's 2-core machines (docs/operations.md: sign-in). Checks
run on a worker thread (argon2-cffi releases the GIL), at most two at a time: each takes 64 MiB."""

from __future__ import annotations

import asyncio
import functools
import threading

from argon2 import PasswordHasher, Type
from argon2.exceptions import InvalidHashError, VerificationError

MIN_LENGTH = 12
MAX_LENGTH = 1024  # longer is no stronger, and would only make each hash dearer
TIME_COST, MEMORY_KIB, PARALLELISM = 2, 64 * 1024, 1

_hasher = PasswordHasher(time_cost=TIME_COST, memory_cost=MEMORY_KIB, parallelism=PARALLELISM, type=Type.ID)
_at_once = threading.BoundedSemaphore(2)


@functools.cache
def _decoy() -> str:
    """Checked against when no user has the address, so an unknown email costs what a wrong
    password does (made at the first sign-in, not at start-up: a hash costs 150 ms)."""
    return _hasher.hash("not anyone's password: a decoy")


def problem(password: object) -> str | None:
    """Why `password` cannot be chosen, or None."""
    if not isinstance(password, str):
        return "must be a string"
    if len(password) < MIN_LENGTH:
        return f"must be at least {MIN_LENGTH} characters"
    if len(password) > MAX_LENGTH:
        return f"must be at most {MAX_LENGTH} characters"
    return None


def hash_password(password: str) -> str:
    with _at_once:
        return _hasher.hash(password)


def matches(stored: str | None, password: str) -> bool:
    """Whether `password` is the one `stored` (a PHC string) was made from; None (no password
    chosen yet) matches nothing but costs the same."""
    with _at_once:
        try:
            return _hasher.verify(stored or _decoy(), password) and stored is not None
        except (VerificationError, InvalidHashError):
            return False


async def hash_async(password: str) -> str:
    return await asyncio.to_thread(hash_password, password)


async def matches_async(stored: str | None, password: str) -> bool:
    return await asyncio.to_thread(matches, stored, password)
