"""Store work off the event loop: one small thread pool that the gate and the hold runner share.

The store's calls block (a transaction, a lock wait on SQLite), so the async side of governance runs
them here; the pool's size bounds how many store connections the router uses at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["StoreWorkers"]

T = TypeVar("T")


class StoreWorkers:
    def __init__(self, size: int = 8) -> None:
        self._pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="handler-store")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a worker thread; the caller awaits its result."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def shutdown(self) -> None:
        """Wait for the work under way, then stop the threads."""
        self._pool.shutdown(wait=True)
