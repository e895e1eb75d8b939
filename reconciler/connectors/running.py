"""What the pipeline calls: a running connector, a process of its own or served inside the router.

A connector process (`client.ConnectorProcess`) answers `RunningConnector` itself; a connector served inside the
router (the built-in llm, a wrap's renaming of a wrapped server's tools) is held by `InRouter`, which gives it the
call's deadline and counts its calls in flight as a process does. The supervisor of a binding's process
(`supervisor.Supervisor`) hands one out; the router's pipeline awaits its `call_tool`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from reconciler.connectors.wrapping import ToolCaller

__all__ = ["InRouter", "RunningConnector"]


class RunningConnector(Protocol):
    """What the pipeline calls: a running connector, in a process or inside the router."""

    @property
    def running(self) -> bool: ...

    @property
    def in_flight(self) -> int: ...

    def call_tool(self, name: str, arguments: Mapping[str, Any], meta: Mapping[str, Any] | None = None,
                  deadline: float | None = None,
                  on_progress: Callable[[Mapping[str, Any]], None] | None = None) -> Awaitable[dict[str, Any]]: ...

    async def stop(self) -> None: ...


class InRouter:
    """A connector served inside the router (the built-in llm, a wrap's renaming): deadline and count."""

    def __init__(self, inner: ToolCaller) -> None:
        self.inner = inner
        self.in_flight = 0

    @property
    def running(self) -> bool:
        return self.inner.running

    def call_tool(self, name: str, arguments: Mapping[str, Any], meta: Mapping[str, Any] | None = None,
                  deadline: float | None = None,
                  on_progress: Callable[[Mapping[str, Any]], None] | None = None) -> Awaitable[dict[str, Any]]:
        # Served inside the router, it reports no progress of its own: the router's own keeps the caller waiting.
        return self._call(name, arguments, meta, deadline)

    async def _call(self, name: str, arguments: Mapping[str, Any], meta: Mapping[str, Any] | None,
                    deadline: float | None) -> dict[str, Any]:
        self.in_flight += 1
        try:
            async with asyncio.timeout_at(deadline):
                return await self.inner.call_tool(name, arguments, meta)
        finally:
            self.in_flight -= 1

    async def stop(self) -> None:
        await self.inner.stop()
