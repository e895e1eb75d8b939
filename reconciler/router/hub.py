"""What a connection and its session need of the router that accepted them (docs/architecture.md §6).

`Hub` is that much of `Router` as a Protocol, so the router's rooms import one way — the server
builds connections (`transport`), a connection runs its session (`sessions`), and neither reaches
back up to the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from reconciler.router.generation import Generation
from reconciler.router.pipeline import Services
from reconciler.router.resumption import SessionSigner
from reconciler.wire.framing import DEFAULT_MAX_LINE_BYTES, LineBudget

__all__ = ["ConnectionBounds", "Hub"]


@dataclass(frozen=True)
class ConnectionBounds:
    """What one client may hold of the router (docs/architecture.md §6): no client can exhaust it.

    A connection reads no further requests while it has `max_calls_in_flight` calls running or its
    unsent replies are over the transport's high-water mark; a profile's socket takes at most
    `max_connections` clients; what all connections hold together stays under `held_bytes`: their
    unfinished lines, the lines they read while paused, and their replies left unsent past the
    high-water mark (`transport.Connection`).
    """

    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    max_calls_in_flight: int = 256
    max_connections: int = 512
    held_bytes: int = 64 * 1024 * 1024


class Hub(Protocol):
    """The live generation and the shared services, the bounds on clients, the set of open connections, and the
    signer of session records (`resumption`)."""

    services: Services
    bounds: ConnectionBounds
    line_budget: LineBudget
    connections: set[Any]
    stopping: bool  # the router is stopping: a new connection is turned away (docs/router.md "Stopping")

    @property
    def live(self) -> Generation: ...

    @property
    def signer(self) -> SessionSigner: ...
