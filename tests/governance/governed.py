"""What the governed gate's tests share: an executor that records, a deadline wait, the callers, a run helper."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from reconciler.governance.gate import CallRequest, CallResult
from reconciler.governance.governed import GovernedGate
from reconciler.governance.store import Store
from tests.governance.builders import priced_call

__all__ = ["PARENT", "STRANGER", "Recorder", "mail", "run", "until"]


class Recorder:
    """An executor that records every call it runs and can be told to fail (or to raise)."""

    def __init__(self, ok: bool = True, *, raises: bool = False) -> None:
        self.calls: list[CallRequest] = []
        self.ok = ok
        self.raises = raises
        self.ran = asyncio.Event()

    async def __call__(self, call: CallRequest) -> CallResult:
        self.calls.append(call)
        self.ran.set()
        if self.raises:
            raise RuntimeError("the router is gone")
        if self.ok:
            return CallResult(True, {"sent": call.arguments.get("to")}, cost=0.004)
        # As the router's pipeline fails a call: advice for a live call to the agent, the cause for people.
        return CallResult(False, {"error": "unavailable", "message": "the service failed; retrying later may work"},
                          cause="unavailable (crashed): mail-b exited with status 3")


async def until(check: Callable[[], Awaitable[bool]], seconds: float = 15.0) -> None:
    """Wait for `check()` to hold, up to a deadline (no fixed sleep: it returns as soon as it holds)."""
    deadline = time.monotonic() + seconds
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail("the condition did not hold before the deadline")
        await asyncio.sleep(0.01)


def mail(instance: str = "child", **args: Any) -> CallRequest:
    """A `mail_send` on profile `h` of `cap_snapshot()`: always held, routed to the caller."""
    return priced_call(instance, profile="h", tool="mail_send", to="ceo@example.org", **args)


# The instance that started `mail()`'s agent, proven by its run's secret (as the router proves a session's run).
PARENT = dataclasses.replace(priced_call("parent-1", profile="p"), proven=True)
STRANGER = priced_call("someone-else", profile="p")


def run(scenario: Callable[[GovernedGate], Awaitable[None]], store: Store) -> None:
    """Run `scenario` with a governor on `store` (polling fast), closed after."""
    async def main() -> None:
        governor = GovernedGate(store, owns_store=False, poll_seconds=0.05)
        try:
            await scenario(governor)
        finally:
            await governor.aclose()

    asyncio.run(main())
