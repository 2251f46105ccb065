"""The address guard of web_fetch (SSRF): a page the model asks for must not reach the box's
own services, the LAN or a cloud metadata endpoint.

A host name is resolved once, here, every address it resolves to is checked, and the
connection is made to those checked addresses (`GuardedResolver` is the resolver aiohttp
connects through), so a name cannot pass the check with one address and connect to another
(DNS rebinding). A redirect is a new URL and goes through the same check. An address literal in
a URL is checked directly (aiohttp does not ask a resolver for those).

Refused unless `web.allow_private` or the host is in `web.allow_hosts`: every address in a
row of the IANA special-purpose registries (IPv4 and IPv6), multicast, and every IPv6 address
outside global unicast (2000::/3), from the one table in `daemon.tools.web.special`, which names
its source. That holds loopback, private, link-local (with the metadata address
169.254.169.254), carrier-grade NAT, documentation, site-local and the rest. IPv4 addresses
wrapped in IPv6 are judged by what they wrap: mapped (::ffff:10.0.0.1), NAT64 (64:ff9b::/96
and 64:ff9b:1::/48), 6to4 (2002::/16), Teredo (2001::/32) and IPv4-compatible (::/96).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from aiohttp.abc import AbstractResolver, ResolveResult

from daemon.core.config import WebSettings
from daemon.core.errors import WebRefused
from daemon.tools.web.special import special_row

# host, port -> the addresses the name resolves to (strings). The system's by default; tests
# give their own, so that the checks of private addresses never depend on, or send, traffic.
Resolve = Callable[[str, int], Awaitable[list[str]]]
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


async def system_resolve(host: str, port: int) -> list[str]:
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise WebRefused(f"the name {host!r} does not resolve ({exc.strerror})") from exc
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def literal(host: str) -> Address | None:
    """The address a URL's host is, if it is one (brackets of IPv6 dropped)."""
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return None


_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052: the IPv4 in the last 32 bits
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215: bits 48-63 and 72-87
_COMPATIBLE = ipaddress.ip_network("::/96")  # the deprecated IPv4-compatible form


def is_public(address: Address) -> bool:
    """Whether web_fetch may reach `address` unasked: a form that wraps IPv4 by what it wraps,
    anything else by whether a row of the IANA table (daemon.tools.web.special) holds it."""
    if isinstance(address, ipaddress.IPv6Address) and (inside := _inside(address)):
        return all(is_public(inner) for inner in inside)
    return special_row(address) is None


def _inside(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses a transition form carries (a packet to it reaches them), or []."""
    value = int(address)
    if address.ipv4_mapped is not None:
        return [address.ipv4_mapped]
    if address in _NAT64 or address in _COMPATIBLE:
        return [ipaddress.IPv4Address(value & 0xFFFFFFFF)]
    if address in _NAT64_LOCAL:
        high, low = (value >> 64) & 0xFFFF, (value >> 40) & 0xFFFF
        return [ipaddress.IPv4Address(high << 16 | low)]
    if address.sixtofour is not None:
        return [address.sixtofour]
    if address.teredo is not None:
        return list(address.teredo)  # the relay server and the client behind it
    return []


@dataclass(frozen=True)
class Guard:
    allow_private: bool = False
    allow_hosts: frozenset[str] = frozenset()
    resolve: Resolve = system_resolve

    def allowed_host(self, host: str) -> bool:
        return self.allow_private or host.strip("[]").lower().rstrip(".") in self.allow_hosts

    def check(self, host: str, addresses: Iterable[str]) -> list[str]:
        """The addresses, if every one may be reached for `host`; else WebRefused. One bad
        address refuses all: a name that also points inside is not fetched at all."""
        found = list(addresses)
        if not found:
            raise WebRefused(f"the name {host!r} resolves to no address")
        if self.allowed_host(host):
            return found
        for text in found:
            address = literal(text)
            if address is None or not is_public(address):
                raise WebRefused(
                    f"{host} leads to {text}, a private, loopback, link-local or reserved "
                    "address; web_fetch does not reach those (web.allow_hosts lets a host "
                    "through)")
        return found

    async def addresses(self, host: str, port: int) -> list[str]:
        """Resolve once and check: the only addresses a connection to `host` may use."""
        if literal(host) is not None:
            return self.check(host, [host.strip("[]")])
        return self.check(host, await self.resolve(host, port))


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver for web_fetch: what it returns is what the guard checked."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        results: list[ResolveResult] = []
        for text in await self.guard.addresses(host, port):
            address = literal(text)
            assert address is not None  # checked: every one is an address
            results.append(ResolveResult(
                hostname=host, host=str(address), port=port,
                family=socket.AF_INET6 if address.version == 6 else socket.AF_INET,
                proto=0, flags=socket.AI_NUMERICHOST))
        return results

    async def close(self) -> None:
        return None


def guard_of(settings: WebSettings, resolve: Resolve = system_resolve) -> Guard:
    """The guard a `WebSettings` describes."""
    return Guard(allow_private=settings.allow_private,
                 allow_hosts=frozenset(h.lower().rstrip(".") for h in settings.allow_hosts),
                 resolve=resolve)
