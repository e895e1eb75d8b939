"""What a connection and its session need of the router that accepted them (docs/architecture.md §6).

`Hub` is that much of `Router` as a Protocol, so the router's rooms import one way — the server
builds connections (`transport`), a connection runs its session (`sessions`), and neither reaches
back up to the server.
"""

from __future__ import annotations

from typing import Any, Protocol

from reconciler.router.generation import Generation
from reconciler.router.pipeline import Services

__all__ = ["Hub"]


class Hub(Protocol):
    """The live generation and the shared services, the line limit, and the set of open connections."""

    services: Services
    max_line_bytes: int
    connections: set[Any]

    @property
    def live(self) -> Generation: ...
