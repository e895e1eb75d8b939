"""The listening socket a service manager passed the service, for `--http` (systemd's socket activation).

Under a socket unit (docs/scaling.md, "systemd"), systemd holds the HTTP port itself and passes it to the
service it starts: `LISTEN_PID` names that process, `LISTEN_FDS` how many sockets follow from descriptor 3 on.
The kernel queues a connection made while no service runs (a restart's gap), and the next service accepts it:
no client meets a closed port. `inherited_socket` takes the one of those sockets listening on the `--http`
address, so that address stays what the guards and the dashboard's exposure check read; a passed socket on
another address is an error that names both, not one served silently. The variables are removed from the
environment once read, and the sockets made non-inheritable, so no connector started later sees them as its own.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections.abc import MutableMapping
from typing import Final

__all__ = ["ActivationError", "inherited_socket"]

FIRST_FD: Final = 3  # SD_LISTEN_FDS_START
_VARIABLES: Final = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


class ActivationError(Exception):
    """Sockets were passed, and none is the one `--http` names."""


def inherited_socket(host: str, port: int, environ: MutableMapping[str, str] = os.environ) -> socket.socket | None:
    """The listening TCP socket passed to this process on `host`:`port` (any port when `port` is 0), or None when
    none was passed; `ActivationError` when sockets were passed but none on that address."""
    if environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    try:
        count = int(environ.get("LISTEN_FDS", "0"))
    except ValueError:
        count = 0
    for name in _VARIABLES:
        environ.pop(name, None)
    found: socket.socket | None = None
    seen: list[str] = []
    for fd in range(FIRST_FD, FIRST_FD + max(count, 0)):
        with contextlib.suppress(OSError):
            os.set_inheritable(fd, False)
        address = _listening_address(fd)
        if address is None:
            continue
        seen.append(f"{_show(address[0])}:{address[1]}")
        if found is None and _same(address, host, port):
            found = socket.socket(fileno=fd)
    if found is None and count > 0:
        passed = ", ".join(seen) or "none listening over TCP"
        raise ActivationError(f"the service manager passed {count} socket(s) ({passed}) and none listens on --http "
                              f"{host}:{port}; make --http name the socket unit's ListenStream address")
    return found


def _listening_address(fd: int) -> tuple[str, int] | None:
    """The address a passed descriptor listens on over TCP, or None if it is no such socket."""
    try:
        probe = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    with probe:
        try:
            listening = probe.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            name = probe.getsockname()
        except OSError:
            return None
        if not listening or probe.type != socket.SOCK_STREAM or probe.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        return str(name[0]), int(name[1])


def _same(address: tuple[str, int], host: str, port: int) -> bool:
    if port and address[1] != port:
        return False
    try:
        wanted = {ipaddress.ip_address(host.strip("[]"))}
    except ValueError:  # a name: what it resolves to here
        try:
            wanted = {ipaddress.ip_address(info[4][0]) for info in socket.getaddrinfo(host, None)}
        except (OSError, ValueError):
            return False
    return ipaddress.ip_address(address[0]) in wanted


def _show(host: str) -> str:
    return f"[{host}]" if ":" in host else host
