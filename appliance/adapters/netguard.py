"""Server-side request forgery guard for outgoing deliveries: private and loopback addresses are
refused unless `[delivery] allow_private_addresses` allows them.

A destination is refused when its scheme is not http/https, or its host is, or resolves to, an
address that is not a public unicast one: loopback, private (10/8, 172.16/12, 192.168/16,
fc00::/7...), shared (100.64/10), link-local (169.254/16 incl. the cloud metadata address,
fe80::/10), multicast, reserved, unspecified, site-local; IPv6 forms that embed an IPv4 address
(::ffff:a.b.c.d, 6to4 2002::/16, Teredo, NAT64 64:ff9b::/96) are judged by that address too.
Hosts written as numbers are read the way the C resolver reads them (`inet_aton`: `2130706433`,
`0x7f000001`, `0177.0.0.1`, `127.1`); any other name is resolved with getaddrinfo (in a worker
thread, bounded) and refused if ANY of its addresses is refused.

`resolve_destination` returns the checked address so the caller connects to exactly that address
(the request keeps the original Host header and TLS server name): a second DNS answer cannot
point the connection somewhere else (DNS rebinding). It keeps a successful lookup for
RESOLVED_TTL_SECONDS and judges the kept addresses again on every use.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import ipaddress
import re
import socket
import threading
import time
from typing import NamedTuple

import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

RESOLVE_TIMEOUT_SECONDS = 5.0

_NUMERIC_V4 = re.compile(r"^[0-9a-fA-FxX.]+$")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SHARED = ipaddress.ip_network("100.64.0.0/10")
# What a host may be once IDNA-encoded: DNS labels (underscores too, as some resolvers allow) or
# an IPv6 address; anything else (a space, a percent escape) can never resolve.
_HOST_CHARACTERS = re.compile(r"^[A-Za-z0-9._-]+$|^[0-9A-Fa-f:.]+$")


class Destination(NamedTuple):
    """Where to connect: `ip` is the checked address (None when refused, when resolution failed,
    or when private addresses are allowed and nothing was resolved). `transient` marks a
    resolution failure that a later attempt may not have."""

    ip: str | None
    reason: str | None = None
    transient: bool = False


def literal_address(host: str) -> IPAddress | None:
    """`host` as an IP address when it is written as one, in any form the resolver accepts."""
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if _NUMERIC_V4.match(host) and any(c.isdigit() for c in host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except (OSError, ValueError):
            return None
    return None


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]  # the client's (obfuscation removed) address
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_problem(ip: IPAddress) -> str | None:
    """Why `ip` may not be a delivery destination, or None for a public unicast address."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_v4(ip)
        if inner is not None:
            problem = address_problem(inner)
            if problem:
                return problem
        if ip.is_site_local:
            return "private"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED:
        return "shared (carrier-grade NAT)"
    if ip.is_private:
        return "private"
    if ip.is_reserved:
        return "reserved"
    if not ip.is_global:
        return "non-public"
    return None


def _host_of(url: str) -> tuple[str | None, str | None]:
    """(ASCII host, refusal reason) for a URL."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError):
        return None, "destination refused: not a valid URL"
    if parsed.scheme not in ("http", "https"):
        return None, "destination refused: only http and https URLs are allowed"
    host = parsed.raw_host.decode("ascii", errors="replace")
    if not host:
        return None, "destination refused: the URL has no host"
    if not _HOST_CHARACTERS.match(host):
        return None, "destination refused: the host is not a valid name or address"
    return host, None


def unsendable_reason(url: str) -> str | None:
    """Why `url` can never be sent whatever the configuration (it does not parse as an http(s)
    URL with a valid host), checked without DNS; None when it may be. Bundle import refuses such
    URLs, so they are not found only at the first delivery."""
    return _host_of(url)[1]


def refused_without_dns(url: str, allow_private: bool) -> str | None:
    """Why `url` is refused before any lookup (unparsable, or a private, loopback or link-local
    address written out, or localhost, unless `allow_private`); None when only DNS can tell."""
    _host, answer = _first_pass(url, allow_private)
    return answer.reason if answer is not None else None


def _refused(host: str, problem: str, ip: IPAddress | None = None) -> str:
    kind = f"{'an' if problem[0] in 'aeiou' else 'a'} {problem} address"
    if ip is None or str(ip) == host:
        return f"destination refused: {host} is {kind}"
    return f"destination refused: {host} resolves to {kind} ({ip})"


def _judge(host: str, addresses: list[IPAddress]) -> Destination:
    if not addresses:
        return Destination(None, f"cannot resolve host {host}", transient=True)
    for ip in addresses:
        problem = address_problem(ip)
        if problem:
            return Destination(None, _refused(host, problem, ip))
    return Destination(str(addresses[0]))


@functools.lru_cache(maxsize=1024)
def _first_pass(url: str, allow_private: bool) -> tuple[str | None, Destination | None]:
    """Checks that need no DNS: (host still to resolve, or a final answer). A pure function of
    its arguments, cached: every delivery to an endpoint asks about the same URL (parsing it was
    a tenth of the delivery process's time, py-spy under bench.product)."""
    host, reason = _host_of(url)
    if reason:
        return None, Destination(None, reason)
    assert host is not None
    if allow_private:
        return None, Destination(None)
    literal = literal_address(host)
    if literal is not None:
        return None, _judge(host, [literal])
    bare = host.rstrip(".").lower()
    if bare == "localhost" or bare.endswith(".localhost"):
        return None, Destination(None, _refused(host, "loopback"))
    return host, None


def _lookup(host: str) -> list[IPAddress]:
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    addresses: list[IPAddress] = []
    for family, _type, _proto, _name, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if ip not in addresses:
            addresses.append(ip)
    return addresses


def _settle(setter, value) -> None:  # type: ignore[no-untyped-def]
    try:
        setter(value)
    except concurrent.futures.InvalidStateError:
        pass  # the caller gave up waiting and cancelled it


def _lookup_in_thread(host: str) -> concurrent.futures.Future[list[IPAddress]]:
    # A daemon thread per lookup rather than an executor: a resolver that never answers must not
    # hold up interpreter exit or asyncio.run's executor shutdown; the caller bounds the wait.
    future: concurrent.futures.Future[list[IPAddress]] = concurrent.futures.Future()

    def run() -> None:
        try:
            addresses = _lookup(host)
        except BaseException as exc:  # handed to the waiting caller
            _settle(future.set_exception, exc)
        else:
            _settle(future.set_result, addresses)

    threading.Thread(target=run, name="netguard-resolve", daemon=True).start()
    return future


# Successful lookups are reused for this long (the JVM's default for the same reason): a delivery
# worker sends to the same few buyers all day, and a lookup per delivery costs a thread and a
# resolver round trip. The addresses are judged again on every use; failures are not kept, and
# concurrent deliveries to one host share the lookup in flight.
RESOLVED_TTL_SECONDS = 30.0
_resolved: dict[str, tuple[float, concurrent.futures.Future[list[IPAddress]]]] = {}
_RESOLVED_MAX = 1024


def _shared_lookup(host: str) -> concurrent.futures.Future[list[IPAddress]]:
    now = time.monotonic()
    found = _resolved.get(host)
    if found is not None:
        started, future = found
        if not future.done():
            if now - started < RESOLVE_TIMEOUT_SECONDS:  # a lookup that hangs longer is not shared
                return future
        elif now - started < RESOLVED_TTL_SECONDS and not future.cancelled() and future.exception() is None:
            return future
    if len(_resolved) >= _RESOLVED_MAX:
        _resolved.clear()
    future = _lookup_in_thread(host)
    _resolved[host] = (now, future)
    return future


def forget_resolutions() -> None:
    """Drop every kept lookup (tests that change what a name resolves to)."""
    _resolved.clear()


async def resolve_destination(url: str, allow_private: bool, *,
                              timeout: float = RESOLVE_TIMEOUT_SECONDS) -> Destination:
    """Check `url` and, unless `allow_private`, the address to connect to (see the module docstring)."""
    host, answer = _first_pass(url, allow_private)
    if answer is not None:
        return answer
    assert host is not None
    try:
        # shield: one caller's timeout must not cancel the lookup the others are sharing
        addresses = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(_shared_lookup(host))), timeout)
    except (TimeoutError, asyncio.TimeoutError):
        return Destination(None, f"cannot resolve host {host}: timed out", transient=True)
    except (OSError, UnicodeError, ValueError):
        return Destination(None, f"cannot resolve host {host}", transient=True)
    return _judge(host, addresses)


def check_destination(url: str, allow_private: bool, *, timeout: float = RESOLVE_TIMEOUT_SECONDS) -> str | None:
    """Blocking form of `resolve_destination` for code outside the event loop: the refusal
    reason, or None when the destination may be used."""
    host, answer = _first_pass(url, allow_private)
    if answer is None:
        assert host is not None
        try:
            answer = _judge(host, _lookup_in_thread(host).result(timeout=timeout))
        except concurrent.futures.TimeoutError:
            answer = Destination(None, f"cannot resolve host {host}: timed out", transient=True)
        except (OSError, UnicodeError, ValueError):
            answer = Destination(None, f"cannot resolve host {host}", transient=True)
    return answer.reason
