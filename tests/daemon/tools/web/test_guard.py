"""The address guard refuses private, loopback, link-local and metadata addresses at the
resolution step: a resolver the test controls hands out the addresses, and the check runs on
exactly what it returned. Nothing here opens a connection: were the guard wrong, the test
fails on the returned addresses instead of sending traffic anywhere."""

from __future__ import annotations

import socket

import pytest

from daemon.core.errors import WebRefused
from daemon.tools.web.guard import Guard, GuardedResolver
from daemon.tools.web.special import CARRIES, TABLE, Row

REFUSED = ["10.0.0.5", "10.255.1.1", "172.16.0.1", "172.31.255.254", "192.168.1.1",
           "169.254.169.254", "169.254.1.1", "127.0.0.1", "127.0.0.2", "0.0.0.0",
           "100.64.0.1", "224.0.0.1", "::1", "fc00::1", "fd00:ec2::254", "fe80::1",
           "::ffff:10.0.0.1", "::ffff:169.254.169.254", "::",
           # IPv6 transition forms, judged by the IPv4 inside: NAT64 (RFC 6052 and the local-use
           # 64:ff9b:1::/48 of RFC 8215), 6to4, Teredo (the client address is stored inverted)
           # and the old IPv4-compatible form.
           "64:ff9b::a9fe:a9fe", "64:ff9b::7f00:1", "64:ff9b:1:a9fe:a9:fe00::",
           "2002:a9fe:a9fe::1", "2002:7f00:1::", "2001:0:5db8:1a21::f5ff:fffa",
           "2001:0:a00:5::5601:5e56", "::7f00:1", "::a9fe:a9fe", "::a00:5"]
# The forms issue 48 found classed public: SIIT (IPv4-translated), site-local, the new
# documentation prefix and SRv6 SIDs.
REFUSED += ["::ffff:0:127.0.0.1", "::ffff:0:a9fe:a9fe", "fec0::1", "3fff::1", "5f00::1"]
# One address from every row of the IANA IPv4 and IPv6 Special-Purpose Address Registries
# (written out here, not taken from roost's table, so that a row lost there fails here),
# with multicast and what lies outside IPv6 global unicast.
EVERY_ROW = [
    "0.1.2.3", "0.0.0.0", "10.1.2.3", "100.127.255.254", "127.255.255.254", "169.254.9.9",
    "172.20.0.1", "192.0.0.200", "192.0.0.5", "192.0.0.8", "192.0.0.9", "192.0.0.10",
    "192.0.0.170", "192.0.0.171", "192.0.2.7", "192.31.196.1", "192.52.193.1", "192.88.99.1",
    "192.88.99.2", "192.168.200.1", "192.175.48.6", "198.19.0.1", "198.51.100.9", "203.0.113.9",
    "240.1.2.3", "255.255.255.255", "239.255.255.250",
    "::1", "::", "::ffff:192.168.0.1", "64:ff9b::a00:1", "64:ff9b:1::a00:1", "100::1",
    "100:0:0:1::1", "2001:1ff::1", "2001:0:a00:1::f5ff:fffe", "2001:1::1", "2001:1::2",
    "2001:1::3", "2001:2::1", "2001:3::1", "2001:4:112::1", "2001:10::1", "2001:20::1",
    "2001:30::1", "2001:db8::1", "2002:c0a8:101::1", "2620:4f:8000::1", "3fff:fff::1",
    "5f00:1::1", "fd12:3456::1", "fe80::abcd", "fec0:1::1", "ff02::1", "4000::1", "1000::1",
    "e000::1"]
PUBLIC = ["93.184.216.34", "1.1.1.1", "2606:4700:4700::1111"]


class Resolver:
    """Names to addresses, as the test says; records what was asked."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        return self.table[host.lower().rstrip(".")]


@pytest.mark.parametrize("address", REFUSED)
async def test_a_name_that_resolves_inside_is_refused(address: str) -> None:
    resolve = Resolver({"innocent.example": [address]})
    guard = Guard(resolve=resolve)
    with pytest.raises(WebRefused, match="private, loopback, link-local or reserved"):
        await guard.addresses("innocent.example", 80)
    # And through the resolver aiohttp connects with: nothing to connect to comes back.
    with pytest.raises(WebRefused):
        await GuardedResolver(guard).resolve("innocent.example", 80)
    assert resolve.asked == ["innocent.example", "innocent.example"]


@pytest.mark.parametrize("address", REFUSED)
async def test_an_address_written_in_the_url_is_refused_without_resolving(address: str) -> None:
    resolve = Resolver({})
    guard = Guard(resolve=resolve)
    with pytest.raises(WebRefused):
        await guard.addresses(f"[{address}]" if ":" in address else address, 443)
    assert resolve.asked == []


async def test_one_inside_address_among_public_ones_refuses_the_name() -> None:
    # A rebinding name answers with a public address and the metadata one: not fetched at all.
    guard = Guard(resolve=Resolver({"rebind.example": ["93.184.216.34", "169.254.169.254"]}))
    with pytest.raises(WebRefused, match=r"169\.254\.169\.254"):
        await guard.addresses("rebind.example", 80)


async def test_public_addresses_pass_and_are_exactly_what_the_connection_uses() -> None:
    guard = Guard(resolve=Resolver({"example.org": PUBLIC}))
    assert await guard.addresses("example.org", 443) == PUBLIC
    results = await GuardedResolver(guard).resolve("example.org", 443)
    assert [(r["host"], r["port"], r["hostname"]) for r in results] == [
        (a, 443, "example.org") for a in PUBLIC]
    assert [r["family"] for r in results] == [socket.AF_INET, socket.AF_INET, socket.AF_INET6]


async def test_a_transition_form_of_a_public_address_passes() -> None:
    wrapped = ["64:ff9b::5db8:d822", "2002:5db8:d822::1", "::ffff:93.184.216.34"]
    guard = Guard(resolve=Resolver({"nat64.example": wrapped}))
    assert await guard.addresses("nat64.example", 443) == wrapped


async def test_allow_private_and_allow_hosts_let_inside_addresses_through() -> None:
    table = {"nas.lan": ["192.168.1.20"], "printer.lan": ["192.168.1.30"]}
    assert await Guard(allow_private=True, resolve=Resolver(table)).addresses(
        "printer.lan", 80) == ["192.168.1.30"]
    only_nas = Guard(allow_hosts=frozenset({"nas.lan"}), resolve=Resolver(table))
    assert await only_nas.addresses("nas.lan", 80) == ["192.168.1.20"]
    assert await only_nas.addresses("NAS.lan.", 80) == ["192.168.1.20"]
    with pytest.raises(WebRefused):
        await only_nas.addresses("printer.lan", 80)


async def test_a_name_without_addresses_is_refused() -> None:
    with pytest.raises(WebRefused, match="no address"):
        await Guard(resolve=Resolver({"void.example": []})).addresses("void.example", 80)


@pytest.mark.parametrize("address", EVERY_ROW)
async def test_every_special_purpose_row_is_refused_at_resolution(address: str) -> None:
    guard = Guard(resolve=Resolver({"special.example": [address]}))
    with pytest.raises(WebRefused, match="private, loopback, link-local or reserved"):
        await guard.addresses("special.example", 443)


# For a row that carries IPv4, an address in it that carries a private one.
CARRYING_PRIVATE = {"::ffff:0:0/96": "::ffff:10.0.0.1", "64:ff9b::/96": "64:ff9b::a00:1",
                    "64:ff9b:1::/48": "64:ff9b:1:a00:1::", "2001::/32": "2001:0:a00:1::f5ff:fffe",
                    "2002::/16": "2002:a00:1::", "::/96": "::a00:1"}


@pytest.mark.parametrize("row", TABLE, ids=[str(row.network) for row in TABLE])
async def test_each_row_of_the_table_refuses_an_address_inside_it(row: Row) -> None:
    if row.rule == CARRIES:
        address = CARRYING_PRIVATE[str(row.network)]
    else:  # the middle of the row: an address it holds that a row of its own need not cover
        address = str(row.network.network_address + row.network.num_addresses // 2)
    guard = Guard(resolve=Resolver({"row.example": [address]}))
    with pytest.raises(WebRefused):
        await guard.addresses("row.example", 443)
