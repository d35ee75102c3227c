"""Webhook targets must be public: an orchestrator that POSTs wherever a tenant points it would
otherwise be an SSRF relay into the private network (cloud metadata at 169.254.169.254, the
database, admin ports on loopback).

A URL is refused when its host is, or resolves to, an address that is not globally routable:
private (RFC 1918, fc00::/7), loopback, link-local, CGNAT, multicast, reserved or unspecified —
including IPv4-mapped IPv6 forms. The check runs when a webhook is created and again before each
delivery, since DNS can change. `STEVORA_WEBHOOK_ALLOW_PRIVATE=true` (set by `stevora dev`) turns
it off for local receivers. A host that does not resolve at creation is accepted (DNS may not be
set up yet); delivery resolves again and fails the attempt if it still does not.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

RESOLVE_TIMEOUT_S = 5.0


class BlockedUrl(ValueError):
    """The URL's host is (or resolves to) a non-public address."""


class UnresolvedHost(ValueError):
    """The URL's host does not resolve."""


def is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone id
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


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
    except (OSError, TimeoutError) as exc:
        raise UnresolvedHost(f"Host '{host}' does not resolve") from exc
    return sorted({str(info[4][0]) for info in infos})


async def check_webhook_url(url: str, *, allow_private: bool) -> None:
    """Raise `BlockedUrl` if `url` points at a non-public address (unless `allow_private`),
    `UnresolvedHost` if its host does not resolve."""
    if allow_private:
        return
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    for address in await resolve(host, port):
        if not is_public(address):
            raise BlockedUrl(
                f"URL host '{host}' resolves to {address}, a private, loopback or link-local address; "
                "webhooks must target public addresses (STEVORA_WEBHOOK_ALLOW_PRIVATE=true allows it)"
            )
