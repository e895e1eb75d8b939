"""Step 6 of the call (docs/architecture.md §2): concurrency per instance and calls per run, counted per interface.

Limits come from the interface, tightened by the binding (`config.effective_limits`), and count per
agent run: the key is (profile, instance, interface version). A call over `maxConcurrent` waits for
a slot within its own timeout, handed over in arrival order; a call over `maxCallsPerRun` ends with
`unavailable` at once (cause `calls_per_run`). The per-call timeout itself wraps the wait and the
dispatch in the pipeline.

An agent names its run (`handler/instance`), so a client may name a new one on every call: the calls
made are kept for the latest `RUNS_KEPT` runs, in two generations. When the current one is full it
becomes the previous one and the previous one is forgotten; a run found in the previous one moves to
the current with its count. So memory stays bounded whatever a client sends, and a run is forgotten
(its next call counts from nought) only when it made no call while `RUNS_KEPT` others did.
"""

from __future__ import annotations

import asyncio
from collections import deque

from reconciler.router.errors import ToolError, unavailable
from reconciler.wire.meta import RETRY_NEVER

__all__ = ["DEFAULT_TIMEOUT_SECONDS", "LimitBook", "LimitKey"]

DEFAULT_TIMEOUT_SECONDS = 300.0  # for an interface that states no timeoutSeconds: never wait forever
RUNS_KEPT = 65_536  # runs (and interfaces) a generation of the calls-made count holds: 15 MB for both at most

LimitKey = tuple[str, str, str]  # (profile, instance, interface key)


class LimitBook:
    """The router's counters: calls running and calls made, per instance and interface."""

    def __init__(self, runs_kept: int = RUNS_KEPT) -> None:
        self._running: dict[LimitKey, int] = {}
        self._waiting: dict[LimitKey, deque[asyncio.Future[None]]] = {}
        self._runs_kept = runs_kept
        self._made: dict[LimitKey, int] = {}  # this generation's runs → calls made
        self._made_before: dict[LimitKey, int] = {}  # the previous generation's

    def count_call(self, key: LimitKey, max_calls: int | None) -> None:
        """Count one call of this run, or refuse it when the run has made `max_calls` already."""
        made = self._made.get(key)
        if made is None:  # a run new to this generation: its count from the previous one, if any
            made = self._made_before.pop(key, 0)
            if len(self._made) >= self._runs_kept:
                self._made_before, self._made = self._made, {}
        if max_calls is not None and made >= max_calls:
            self._made[key] = made
            raise calls_per_run_error(max_calls, key[2])
        self._made[key] = made + 1

    def calls_made(self, key: LimitKey) -> int:
        found = self._made.get(key)
        return found if found is not None else self._made_before.get(key, 0)

    def runs_counted(self) -> int:
        """How many runs' calls are counted now (both generations)."""
        return len(self._made) + len(self._made_before)

    def running(self, key: LimitKey) -> int:
        return self._running.get(key, 0)

    def try_acquire(self, key: LimitKey, limit: int | None) -> bool | None:
        """Take a slot if one is free: True (release it after); False with no limit; None when full."""
        if limit is None:
            return False
        running = self._running.get(key, 0)
        if running < limit and not self._waiting.get(key):
            self._running[key] = running + 1
            return True
        return None

    async def acquire(self, key: LimitKey, limit: int | None) -> bool:
        """Take a slot, waiting if `limit` are taken; True when a slot was taken (release it after)."""
        taken = self.try_acquire(key, limit)
        if taken is not None:
            return taken
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, deque()).append(future)
        try:
            await future  # release() hands its slot over: the running count stays as it is
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(key)  # the slot arrived as we were cancelled: pass it on
            else:
                waiting = self._waiting.get(key)
                if waiting is not None and future in waiting:
                    waiting.remove(future)
            raise
        return True

    def release(self, key: LimitKey) -> None:
        queue = self._waiting.get(key)
        while queue:
            future = queue.popleft()
            if not future.done():
                future.set_result(None)
                return
        if queue is not None:
            del self._waiting[key]
        left = self._running.get(key, 1) - 1
        if left > 0:
            self._running[key] = left
        else:
            self._running.pop(key, None)


def calls_per_run_error(max_calls: int, interface: str) -> ToolError:
    return unavailable("calls_per_run", f"this agent run has made its {max_calls} calls of {interface} "
                       "(maxCallsPerRun); a new run starts a new count", retry=RETRY_NEVER)


def concurrency_error(limit: int, timeout: float) -> ToolError:
    return unavailable("concurrency", f"{limit} calls of this agent run were running for the whole "
                       f"{timeout:g} s timeout (maxConcurrent {limit}); wait for one to finish")


def timeout_error(timeout: float) -> ToolError:
    return unavailable("timeout", f"the service did not answer within {timeout:g} s; retrying later may work")
