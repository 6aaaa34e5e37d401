"""The sign-in throttle: failures in a row counted per subject (`email:<address>` for passwords,
`code:<userId>` for two-factor codes, `ip:<address>` for both), and from the FREE_FAILURES-th on
each further try waits, twice as long after each failure (FIRST_WAIT_SECONDS up to
MAX_WAIT_SECONDS). A try is counted as a failure before its secret is checked, in the same unit
of work as the check for a wait, so parallel tries cannot all slip in before the first failure
is written; a success then takes its own count back. A success clears the account's count, never
the client's: one good account does not reopen an address guessing others."""

from __future__ import annotations

from datetime import datetime, timedelta

from appliance.clock import iso
from appliance.storage import Session

FREE_FAILURES = 5
FIRST_WAIT_SECONDS, MAX_WAIT_SECONDS = 30, 3600
KEEP = timedelta(days=1)  # a count untouched this long (its wait long over) is forgotten


def subjects(account: str, address: str | None) -> tuple[str, str]:
    """(the account's subject, the client's)."""
    return account, f"ip:{address or '-'}"


def _wait(failures: int) -> int:
    if failures < FREE_FAILURES:
        return 0
    return min(FIRST_WAIT_SECONDS * 2 ** (failures - FREE_FAILURES), MAX_WAIT_SECONDS)


def waiting(tx: Session, names: tuple[str, ...], now: datetime) -> int | None:
    """Seconds until `names` may try again, or None."""
    waits = []
    for subject in names:
        found = tx.users.throttle(subject)
        if found is not None and found[1] > iso(now):
            waits.append(datetime.fromisoformat(found[1]) - now)
    return max(1, int(max(waits).total_seconds() + 0.999)) if waits else None


def _count(tx: Session, subject: str, now: datetime) -> None:
    found = tx.users.throttle(subject)
    failures = (found[0] if found else 0) + 1
    tx.users.set_throttle(subject, failures, iso(now + timedelta(seconds=_wait(failures))), iso(now))


def attempt(tx: Session, names: tuple[str, ...], now: datetime) -> int | None:
    """Inside the unit that decides a try: the wait when `names` must wait (nothing counted),
    else the try counted as a failure (None)."""
    wait = waiting(tx, names, now)
    if wait is None:
        for subject in names:
            _count(tx, subject, now)
    return wait


def succeeded(tx: Session, names: tuple[str, str], now: datetime) -> None:
    """A counted try that succeeded: the account's count cleared, the client's counted try taken back."""
    account, client = names
    tx.users.clear_throttle(account)
    found = tx.users.throttle(client)
    if found is not None:  # it was not waiting when the try was let in, and waits no more now
        tx.users.set_throttle(client, max(found[0] - 1, 0), iso(now), iso(now))


def purge(tx: Session, now: datetime) -> int:
    return tx.users.purge_throttle(iso(now - KEEP))
