"""What the router dials on a connector's behalf from its own process: only what the binding's egress allows.

The built-in llm connector runs inside the router, outside any sandbox and its egress proxy. Its HTTP
client dials through `EgressBackend`, which applies the proxy's own checks (docs/architecture.md §6):
the host:port must match the binding's effective egress, and the name is resolved and its address
checked (`egress.allowed_address`: loopback, private and other non-global addresses only when an
entry names that address itself) before the address that was checked, never the name again, is
dialled. TLS still verifies the certificate against the name. Called by `connectors/llm.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import httpcore
import httpx

from reconciler.config.errors import HandlerError
from reconciler.config.reach import egress_allows
from reconciler.connectors.egress import allowed_address

__all__ = ["EgressBackend", "EgressRefusedError", "egress_transport"]


class EgressRefusedError(HandlerError):
    """A destination the binding's egress does not allow; nothing was sent to it."""


class EgressBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network, narrowed to what `entries` allow `owner` (a binding) to reach."""

    def __init__(self, entries: Sequence[str], owner: str) -> None:
        self._entries = tuple(entries)
        self._owner = owner
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        if not egress_allows(self._entries, host, port):
            raise EgressRefusedError(f"binding '{self._owner}' may not reach {host}:{port}: it is not in its egress "
                                f"({', '.join(self._entries) or 'none'}); add it to the binding's egress or dial "
                                "a host its egress names")
        try:
            address = await allowed_address(self._entries, host, port)
        except OSError as exc:
            raise httpcore.ConnectError(f"{host} does not resolve ({exc})") from None
        if address is None:
            raise EgressRefusedError(f"binding '{self._owner}' may not reach {host}:{port}: the name resolves only to "
                                "addresses of this machine or a private network, which its egress reaches only "
                                "when an entry names that address itself")
        return await self._inner.connect_tcp(address, port, timeout=timeout, local_address=local_address,
                                             socket_options=socket_options)

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        raise EgressRefusedError(f"binding '{self._owner}' may not reach the unix socket {path}: an egress names "
                                 "host:port entries only")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _EgressTransport(httpx.AsyncHTTPTransport):
    """httpx's own transport on a connection pool that dials through an `EgressBackend`."""

    def __init__(self, backend: EgressBackend) -> None:
        super().__init__(trust_env=False)
        # httpx takes no network backend: its pool is made again with one (the same settings as its own, no proxy).
        self._pool = httpcore.AsyncConnectionPool(ssl_context=httpx.create_ssl_context(trust_env=False),
                                                  max_connections=100, max_keepalive_connections=20,
                                                  keepalive_expiry=5.0, network_backend=backend)


def egress_transport(entries: Sequence[str], owner: str) -> httpx.AsyncBaseTransport:
    """An httpx transport that reaches only what `entries` (a binding's effective egress) allow."""
    return _EgressTransport(EgressBackend(entries, owner))
