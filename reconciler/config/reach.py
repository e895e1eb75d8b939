"""What an egress entry allows: a host:port matched against `host:port` entries, and which addresses are the internet.

The rules the egress proxy applies (`connectors/egress.py`) and the built-in llm connector applies to
what it dials itself (`connectors/dialing.py`), and that `handler validate` applies to the built-in's
`base_url` (B011, `checks.tree.bindings`): so they stand here, below both (docs/architecture.md §6).
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

__all__ = ["egress_allows", "is_global_address", "names_address", "url_reach_problem"]

def egress_allows(entries: Sequence[str], host: str, port: int) -> bool:
    """Whether `host:port` matches one of the `host:port` entries (`*` matches any host or any port)."""
    host = host.lower().strip("[]")
    for entry in entries:
        e_host, _, e_port = entry.rpartition(":")
        e_host = e_host.lower().strip("[]")
        if (e_host in ("*", host)) and (e_port == "*" or e_port == str(port)):
            return True
    return False


# The public IPv6 internet is global unicast, 2000::/3 (RFC 4291); outside it, NAT64 (64:ff9b::/96, 64:ff9b:1::/48),
# IPv4-compatible (::/96), IPv4-mapped and -translated (::ffff:0:0/96, ::ffff:0:0:0/96) and site-local (fec0::/10)
# forms hand the packet to a translator or the site, whatever IPv4 address they embed: Python's `is_global` says
# True for several of them.
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
_NOT_GLOBAL_INSIDE = tuple(ipaddress.IPv6Network(net) for net in (
    "2002::/16",  # 6to4: an IPv4 address inside, reached through whatever relay answers
    "2001::/32",  # Teredo: an IPv4 server and client inside
    "2001:db8::/32",  # documentation
    "3fff::/20",  # documentation (RFC 9637)
))
_NOT_GLOBAL_V4 = (ipaddress.IPv4Network("192.88.99.0/24"),)  # 6to4 relays' anycast: into IPv6 by another door


def is_global_address(address: str) -> bool:
    """Whether `address` is on the public internet: not loopback, private, link-local, shared or reserved, and, for
    IPv6, global unicast that no translator or tunnel carries on to an IPv4 address it embeds."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if ip not in _GLOBAL_UNICAST or any(ip in net for net in _NOT_GLOBAL_INSIDE):
            return False
    elif any(ip in net for net in _NOT_GLOBAL_V4):
        return False
    return ip.is_global and not ip.is_multicast


def names_address(entries: Sequence[str], address: str, port: int) -> bool:
    """Whether an entry names `address` itself (an IP literal, never a name or `*`) with this port or `*`."""
    try:
        wanted = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    for entry in entries:
        e_host, _, e_port = entry.rpartition(":")
        with contextlib.suppress(ValueError):
            if ipaddress.ip_address(e_host.strip("[]")) == wanted and e_port in ("*", str(port)):
                return True
    return False


def url_reach_problem(entries: Sequence[str], url: str) -> str | None:
    """Why a URL's host:port is out of reach of `entries`, or None if the egress lets it be dialled: the host:port
    must match an entry and, when the host is an address, be a global one or one an entry names itself (a name's
    addresses are checked when it is dialled)."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or {"https": 443, "http": 80}.get(parts.scheme)
    except ValueError as exc:
        return f"'{url}' is not a URL ({exc})"
    if not host or port is None:
        return f"'{url}' is not an http or https URL with a host"
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if not egress_allows(entries, host, port):
        return f"{shown} is not in its egress ({', '.join(entries) or 'none'})"
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host)
        if not is_global_address(host) and not names_address(entries, host, port):
            return (f"{shown} is an address of this machine or a private network, which an egress reaches only "
                    "when an entry names that address itself")
    return None
