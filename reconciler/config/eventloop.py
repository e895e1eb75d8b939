"""The event loop the service runs on: uvloop where it installs, asyncio's own loop elsewhere.

Called by `reconciler.app` (`handler serve`, `handler up`) and by the conformance harness, so a
connector is checked on the loop the router runs it on. It sits on the ground floor because both
stand on it and neither may import the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["new_event_loop", "run_on_uvloop"]

_T = TypeVar("_T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new uvloop loop, or asyncio's own where uvloop does not install."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it installs
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_on_uvloop(main: Coroutine[Any, Any, _T]) -> _T:
    """Run `main` to completion on a fresh loop from `new_event_loop`, as `asyncio.run` does."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
