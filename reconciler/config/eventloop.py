"""The event loop the service runs on: uvloop where it installs, asyncio's own loop elsewhere.

Called by `reconciler.app` (`handler serve`, `handler up`) and by the conformance harness, so a
connector is checked on the loop the router runs it on. It sits on the ground floor because both
stand on it and neither may import the other.

`LoopPipe` is how a pipe is handed to either loop's pipe transports (the agent's stdin and stdout, a
connector's pipes): a descriptor the transport owns from then on, closed exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["LoopPipe", "new_event_loop", "run_on_uvloop"]

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


class LoopPipe:
    """A pipe's descriptor for `connect_read_pipe` / `connect_write_pipe`, owned by the transport made of it.

    Never a file object: uvloop closes the descriptor itself (libuv) and then calls `close()` on the object
    it was given, so a file object closes the same number a second time — by then perhaps a file another
    thread just opened — and one whose transport was never made or closed closes it again when collected.
    asyncio's own transports close the pipe only through `close()`. So `close()` closes the descriptor
    only on asyncio's loop, and only once, and nothing closes it on collection. Once handed to a
    `connect_*` call the pipe is the loop's, whether the call succeeds or fails; one never handed over is
    closed with `discard()`.
    """

    __slots__ = ("_closes", "_fd")

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop) -> None:
        self._fd = fd
        self._closes = not type(loop).__module__.startswith("uvloop")

    @classmethod
    def taken_from(cls, file: Any, loop: asyncio.AbstractEventLoop) -> LoopPipe:
        """The pipe of a file object (a `Popen`'s stdin, say) on a descriptor of its own; the file object is closed."""
        try:
            return cls(os.dup(file.fileno()), loop)
        finally:
            file.close()

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        """The transport's close: the descriptor is closed once, by whichever loop runs."""
        if self._closes:
            self.discard()
        else:  # libuv has closed it already
            self._fd = -1

    def discard(self) -> None:
        """Close a pipe that was never handed to the loop."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
