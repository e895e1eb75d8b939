"""A fast connector's reply, read as it comes instead of slept for (docs/architecture.md §10).

When the router has sent a call to a connector and nothing else is in flight, its event loop would go
to sleep until the reply, and the kernel would wake it when the connector writes. On a host where a
process sleeping on another CPU takes tens of microseconds to wake (a virtual machine's idle CPU halts
and the host must wake it), that wake-up is most of what a fast connector's call costs the router. So
the router reads the connector's output without blocking for a short window after sending (`window_us`,
100 µs by default) and handles the reply there: the call goes on without the loop ever sleeping.

It is bounded three ways. Only the router's one call in flight waits so (`Polling.calls`): a window spent
on one call would delay every other. Only a router that may run on more than one CPU does it, since the
connector would otherwise wait for the CPU it spins on. And a connector whose replies miss the window
is left alone for 16 calls, then 32, up to 1,024 (one hit starts over), so a slow connector costs at
most one window per thousand calls. `HANDLER_REPLY_POLL_US=0` turns it off.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

__all__ = ["DEFAULT_WINDOW_US", "MAX_WINDOW_US", "Polling", "ReplyPoll", "window_from_env"]

DEFAULT_WINDOW_US: Final = 100
MAX_WINDOW_US: Final = 10_000
ENV: Final = "HANDLER_REPLY_POLL_US"
_FIRST_REST: Final = 16  # calls a connector is left alone after a miss; doubled at each miss in a row
_LONGEST_REST: Final = 1024


def window_from_env(environ: Mapping[str, str]) -> int:
    """The window in microseconds `HANDLER_REPLY_POLL_US` sets (unset: the default); ValueError saying what to write."""
    raw = environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT_WINDOW_US
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_WINDOW_US:
        raise ValueError(f"{ENV}={raw[:40]!r} is not a number of microseconds from 0 to {MAX_WINDOW_US}; "
                         f"unset it for the default ({DEFAULT_WINDOW_US}), or 0 to turn reply polling off")
    return int(raw)


class Polling:
    """The router's reply polling: its window, and how many connector calls it has in flight (all connectors)."""

    __slots__ = ("calls", "window_ns")

    def __init__(self, window_us: int = DEFAULT_WINDOW_US) -> None:
        several_cpus = len(os.sched_getaffinity(0)) > 1
        self.window_ns = window_us * 1000 if several_cpus else 0
        self.calls = 0

    @property
    def on(self) -> bool:
        return self.window_ns > 0


class ReplyPoll:
    """One connector line's polling: reads `fd` for `future`'s reply, feeding what comes to `feed`."""

    __slots__ = ("_fd", "_feed", "_next_rest", "_polling", "_rest")

    def __init__(self, polling: Polling, fd: int, feed: Callable[[bytes], None]) -> None:
        self._polling = polling
        self._fd = fd
        self._feed = feed
        self._rest = 0  # calls still to leave alone after a miss
        self._next_rest = _FIRST_REST

    def wait(self, future: asyncio.Future[Any]) -> None:
        """Called right after a request is written: its reply, handled here if it comes within the window."""
        polling = self._polling
        if polling.calls != 1 or future.done():
            return
        if self._rest:
            self._rest -= 1
            return
        fd, feed, clock = self._fd, self._feed, time.perf_counter_ns
        end = clock() + polling.window_ns
        while clock() < end:
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                return  # the stream broke: the loop's transport sees it and fails the call
            if not data:
                return  # the end of its output: the transport reads it again and ends the line
            feed(data)
            if future.done():
                self._next_rest = _FIRST_REST
                return
        self._rest, self._next_rest = self._next_rest, min(self._next_rest * 2, _LONGEST_REST)
