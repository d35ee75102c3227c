"""Webhook targets must be public: an orchestrator that POSTs wherever a tenant points it would
otherwise be an SSRF relay into the private network (cloud metadata at 169.254.169.254, the
database, admin ports on loopback).

A URL is refused when its host is, or resolves to, an address that is not globally routable:
private (RFC 1918, fc00::/7), loopback, link-local, CGNAT, multicast, reserved, documentation or
unspecified. IPv6 forms that carry an IPv4 address (IPv4-mapped `::ffff:a.b.c.d`, NAT64
`64:ff9b::/96`, 6to4 `2002::/16`) count as the IPv4 address they carry; forms that reach IPv4
space in ways this process cannot see (IPv4-compatible `::a.b.c.d`, local-use NAT64
`64:ff9b:1::/48`, Teredo `2001::/32`) and the deprecated site-local `fec0::/10` are refused
outright. The check does not trust `ipaddress.is_global` alone: its tables differ between Python
versions and call several of these global.

The check runs when a webhook is created and again before each delivery, and delivery connects
to an address that check resolved (`resolve_public`), never resolving the name a second time, so
DNS cannot answer "public" to the check and "private" to the connection (rebinding).
`STEVORA_WEBHOOK_ALLOW_PRIVATE=true` (set by `stevora dev`) turns the check off for local
receivers. A host that does not resolve at creation is accepted (DNS may not be set up yet);
delivery resolves again and fails the attempt if it still does not.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import SplitResult, urlsplit

RESOLVE_TIMEOUT_S = 5.0

# IPv6 networks never delivered to, whatever `is_global` says on this Python.
_BLOCKED_V6 = tuple(
    ipaddress.IPv6Network(net)
    for net in (
        "::/96",  # unspecified, loopback and IPv4-compatible (deprecated, RFC 4291)
        "64:ff9b:1::/48",  # local-use NAT64 (RFC 8215)
        "100::/64",  # discard-only
        "2001::/32",  # Teredo: tunnels to an IPv4 address
        "2001:db8::/32",  # documentation
        "3fff::/20",  # documentation (RFC 9637)
        "5f00::/16",  # SRv6 segment identifiers
        "fc00::/7",  # unique local
        "fe80::/10",  # link-local
        "fec0::/10",  # site-local (deprecated)
        "ff00::/8",  # multicast
    )
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


class BlockedUrl(ValueError):
    """The URL's host is (or resolves to) a non-public address."""


class InvalidUrl(BlockedUrl):
    """The URL is not an absolute http(s) URL with a host and a port in 1-65535."""


class UnresolvedHost(ValueError):
    """The URL's host does not resolve."""


def parse_webhook_url(url: str) -> SplitResult:
    """`url` split, after checking its form; raises `InvalidUrl` naming what is wrong."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise InvalidUrl("Invalid URL") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
        raise InvalidUrl("URL must be an absolute http:// or https:// URL")
    try:
        port = parts.port  # urlsplit checks the port only when asked
    except ValueError:
        port = 0
    if port == 0:
        raise InvalidUrl("URL port must be a number from 1 to 65535")
    return parts


def _port(parts: SplitResult) -> int:
    return parts.port or (443 if parts.scheme == "https" else 80)


def is_public(address: str) -> bool:
    """Whether `address` (IPv4 or IPv6, a zone id allowed) is globally routable."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone id
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            return _is_public_v4(embedded)
        return ip.is_global and not any(ip in net for net in _BLOCKED_V6)
    return _is_public_v4(ip)


def _is_public_v4(ip: ipaddress.IPv4Address) -> bool:
    return ip.is_global and not ip.is_multicast


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv4-mapped, NAT64 (64:ff9b::/96) or 6to4 address reaches."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour


async def resolve(host: str, port: int) -> list[str]:
    try:
        return [str(ipaddress.ip_address(host.strip("[]")))]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT_S
        )
    except (OSError, TimeoutError, UnicodeError) as exc:
        raise UnresolvedHost(f"Host '{host}' does not resolve") from exc
    return sorted({str(info[4][0]) for info in infos})


async def resolve_public(url: str) -> list[str]:
    """The addresses `url`'s host resolves to (IP literals as they are), all of them public;
    raises `InvalidUrl`, `BlockedUrl` or `UnresolvedHost`. Connect to these, not to the name."""
    parts = parse_webhook_url(url)
    host = parts.hostname or ""
    addresses = await resolve(host, _port(parts))
    for address in addresses:
        if not is_public(address):
            raise BlockedUrl(
                f"URL host '{host}' resolves to {address}, a private, loopback or link-local address; "
                "webhooks must target public addresses (STEVORA_WEBHOOK_ALLOW_PRIVATE=true allows it)"
            )
    return addresses


async def check_webhook_url(url: str, *, allow_private: bool) -> None:
    """Raise `InvalidUrl` for a malformed URL, `BlockedUrl` if it points at a non-public address
    (unless `allow_private`), `UnresolvedHost` if its host does not resolve."""
    if allow_private:
        parse_webhook_url(url)
        return
    await resolve_public(url)
