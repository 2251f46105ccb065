"""Which addresses web_fetch treats as not public: one table, copied from IANA, with its source.

Sources (each row below is one row of these, in their order; copied from the versions current
in 2025-04, the IPv6 registry's newest row being 100:0:0:1::/64 of RFC 9780, 2025-04; the IPv4
registry's newest 192.0.0.10/32 of RFC 8155, 2017-02):

- IANA IPv4 Special-Purpose Address Registry (RFC 6890), 25 rows,
  https://www.iana.org/assignments/iana-ipv4-special-registry/
- IANA IPv6 Special-Purpose Address Registry (RFC 6890), 25 rows,
  https://www.iana.org/assignments/iana-ipv6-special-registry/
- IANA IPv6 Address Space (https://www.iana.org/assignments/ipv6-address-space/): only
  2000::/3 is global unicast; everything else is reserved by the IETF, unique local, link local,
  the deprecated site local fec0::/10 (RFC 3879, kept here by name) or multicast.
- IANA IPv4 Multicast Address Space (RFC 5771): 224.0.0.0/4. Multicast is never a web server.

Every row is refused, including the ones IANA marks globally reachable (the PCP and TURN
anycast addresses, AS112, AMT, ORCHIDv2, drone tags): those hold protocol services, not web
pages, so a page that asks for one is up to something. The exceptions are the rows marked
CARRIES: an IPv6 form that wraps an IPv4 address (mapped, NAT64, Teredo, 6to4) reaches that
IPv4 address, so the guard judges it by what it wraps (`guard._inside`), before this table.
Cross-checked against Python's `ipaddress` lists (3.11 and 3.13): every range they class as
not global is covered here; 3.11 misses 3fff::/20, 5f00::/16, fec0::/10 and 100:0:0:1::/64.
Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
from typing import NamedTuple

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

REFUSED = "refused"
CARRIES = "judged by the IPv4 address it carries"


class Row(NamedTuple):
    network: Network
    name: str
    rule: str


def _rows(*rows: tuple[str, str, str]) -> tuple[Row, ...]:
    return tuple(Row(ipaddress.ip_network(prefix), name, rule) for prefix, name, rule in rows)


TABLE: tuple[Row, ...] = _rows(
    # IANA IPv4 Special-Purpose Address Registry
    ("0.0.0.0/8", '"This network"', REFUSED),
    ("0.0.0.0/32", '"This host on this network"', REFUSED),
    ("10.0.0.0/8", "Private-Use", REFUSED),
    ("100.64.0.0/10", "Shared Address Space", REFUSED),
    ("127.0.0.0/8", "Loopback", REFUSED),
    ("169.254.0.0/16", "Link Local", REFUSED),
    ("172.16.0.0/12", "Private-Use", REFUSED),
    ("192.0.0.0/24", "IETF Protocol Assignments", REFUSED),
    ("192.0.0.0/29", "IPv4 Service Continuity Prefix", REFUSED),
    ("192.0.0.8/32", "IPv4 dummy address", REFUSED),
    ("192.0.0.9/32", "Port Control Protocol Anycast", REFUSED),
    ("192.0.0.10/32", "Traversal Using Relays around NAT Anycast", REFUSED),
    ("192.0.0.170/32", "NAT64/DNS64 Discovery", REFUSED),
    ("192.0.0.171/32", "NAT64/DNS64 Discovery", REFUSED),
    ("192.0.2.0/24", "Documentation (TEST-NET-1)", REFUSED),
    ("192.31.196.0/24", "AS112-v4", REFUSED),
    ("192.52.193.0/24", "AMT", REFUSED),
    ("192.88.99.0/24", "Deprecated (6to4 Relay Anycast)", REFUSED),
    ("192.88.99.2/32", "6a44-relay anycast address", REFUSED),
    ("192.168.0.0/16", "Private-Use", REFUSED),
    ("192.175.48.0/24", "Direct Delegation AS112 Service", REFUSED),
    ("198.18.0.0/15", "Benchmarking", REFUSED),
    ("198.51.100.0/24", "Documentation (TEST-NET-2)", REFUSED),
    ("203.0.113.0/24", "Documentation (TEST-NET-3)", REFUSED),
    ("240.0.0.0/4", "Reserved", REFUSED),
    ("255.255.255.255/32", "Limited Broadcast", REFUSED),
    # IANA IPv4 Multicast Address Space
    ("224.0.0.0/4", "Multicast", REFUSED),
    # IANA IPv6 Special-Purpose Address Registry
    ("::1/128", "Loopback Address", REFUSED),
    ("::/128", "Unspecified Address", REFUSED),
    ("::ffff:0:0/96", "IPv4-mapped Address", CARRIES),
    ("64:ff9b::/96", "IPv4-IPv6 Translat.", CARRIES),
    ("64:ff9b:1::/48", "IPv4-IPv6 Translat.", CARRIES),
    ("100::/64", "Discard-Only Address Block", REFUSED),
    ("100:0:0:1::/64", "Dummy IPv6 Prefix", REFUSED),
    ("2001::/23", "IETF Protocol Assignments", REFUSED),
    ("2001::/32", "TEREDO", CARRIES),
    ("2001:1::1/128", "Port Control Protocol Anycast", REFUSED),
    ("2001:1::2/128", "Traversal Using Relays around NAT Anycast", REFUSED),
    ("2001:1::3/128", "DNS-SD Service Registration Protocol Anycast", REFUSED),
    ("2001:2::/48", "Benchmarking", REFUSED),
    ("2001:3::/32", "AMT", REFUSED),
    ("2001:4:112::/48", "AS112-v6", REFUSED),
    ("2001:10::/28", "Deprecated (previously ORCHID)", REFUSED),
    ("2001:20::/28", "ORCHIDv2", REFUSED),
    ("2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix", REFUSED),
    ("2001:db8::/32", "Documentation", REFUSED),
    ("2002::/16", "6to4", CARRIES),
    ("2620:4f:8000::/48", "Direct Delegation AS112 Service", REFUSED),
    ("3fff::/20", "Documentation", REFUSED),
    ("5f00::/16", "Segment Routing (SRv6) SIDs", REFUSED),
    ("fc00::/7", "Unique-Local", REFUSED),
    ("fe80::/10", "Link-Local Unicast", REFUSED),
    # IANA IPv6 Address Space: deprecated site local, and all that is not 2000::/3 (global
    # unicast): these three rows are its complement, so ::ffff:0:a.b.c.d (the SIIT form) and
    # any other unassigned form are refused without a rule of their own.
    ("fec0::/10", "Site-Local (deprecated, RFC 3879)", REFUSED),
    ("::/96", "IPv4-compatible (deprecated, RFC 4291)", CARRIES),
    ("::/3", "Not global unicast (reserved by IETF)", REFUSED),
    ("4000::/2", "Not global unicast (reserved by IETF, unique and link local, multicast)",
     REFUSED),
    ("8000::/1", "Not global unicast (reserved by IETF, unique and link local, multicast)",
     REFUSED),
)


def special_row(address: Address) -> Row | None:
    """The narrowest row of the table `address` falls in, or None (a public address)."""
    rows = [row for row in TABLE
            if row.network.version == address.version and address in row.network]
    return max(rows, key=lambda row: row.network.prefixlen, default=None)
