"""The page of a handed-over session's open calls: shared memory the bridge makes and the router writes.

A bridge needs to know which calls its router left unanswered only once that router is gone
(docs/router.md "Restarts"). Told over the lifeline, a line a call woke the bridge twice a call, on a
2-core host about 100 µs of the SDK client's call (benchmarks/README.md); this page costs the router a
memory write a call and the bridge nothing until it reads the page, after the lifeline closed.

The bridge makes the page (`make_page`: a memfd sealed against shrinking and growing, so a page the
router maps can never be cut under it, which would kill the router with SIGBUS) and sends it with stdin
and stdout. The router (`OpenCalls`) writes the open request ids, as a JSON list, into the half not in
use, then the header naming that half and the list's length: a router killed midway leaves the header on
the previous, whole list. A call is written closed just before its reply, never after, so the bridge
never answers a call whose reply the agent may have read. The router only writes the page, never reads
it: what the agent's process writes there is the agent's own business.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import stat
import struct
from typing import Final

import orjson

__all__ = ["PAGE_BYTES", "OpenCalls", "clear_page", "make_page", "page_problem", "read_open"]

PAGE_BYTES: Final = 1 << 16
_HEADER: Final = struct.Struct("<II")  # the half in use (0 or 1), the length of its list
_HALF: Final = (PAGE_BYTES - _HEADER.size) // 2
_TOO_MANY: Final = 0xFFFFFFFF  # the length when the open ids did not fit in a half: they are not known
_SEALS: Final = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


def make_page() -> int:
    """A new, empty page's descriptor (the bridge's), sealed at its size."""
    fd = os.memfd_create("handler-open-calls", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, PAGE_BYTES)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS | fcntl.F_SEAL_SEAL)
    return fd


def page_problem(fd: int) -> str | None:
    """Why `fd` is not a page the router can map and write safely, or None if it is."""
    try:
        st = os.fstat(fd)
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        access = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError as exc:
        return f"the open-calls page cannot be inspected ({exc.strerror}); send a sealed memfd"
    if not stat.S_ISREG(st.st_mode) or st.st_size != PAGE_BYTES or seals & _SEALS != _SEALS \
            or access != os.O_RDWR:
        return (f"the third descriptor must be the open-calls page: a memfd of {PAGE_BYTES} bytes, open for "
                "reading and writing, sealed against shrinking and growing")
    return None


class OpenCalls:
    """The router's side: the open request ids of one handed-over session, kept on its bridge's page."""

    def __init__(self, fd: int) -> None:
        self._map = mmap.mmap(fd, PAGE_BYTES)  # shared: the bridge reads what is written here
        self._open: dict[int | str, None] = {}
        self._half = 0

    def opened(self, call_id: int | str) -> None:
        self._open[call_id] = None
        self._write()

    def closed(self, call_id: int | str) -> None:
        if self._open.pop(call_id, 0) is None:
            self._write()

    def _write(self) -> None:
        data = orjson.dumps(list(self._open))
        half = 1 - self._half
        if len(data) > _HALF:
            self._map[: _HEADER.size] = _HEADER.pack(self._half, _TOO_MANY)
            return
        start = _HEADER.size + half * _HALF
        self._map[start:start + len(data)] = data
        self._map[: _HEADER.size] = _HEADER.pack(half, len(data))  # the list is whole before the header names it
        self._half = half

    def close(self) -> None:
        with contextlib.suppress(BufferError):
            self._map.close()


def read_open(fd: int) -> list[int | str] | None:
    """The bridge's side, once its router is gone: the calls it left open, in the order they began; None when
    they are not known (more than a half of the page holds, or a page written by something else)."""
    half, length = _HEADER.unpack(os.pread(fd, _HEADER.size, 0))
    if length == 0:
        return []
    if half > 1 or length > _HALF:
        return None
    try:
        ids = orjson.loads(os.pread(fd, length, _HEADER.size + half * _HALF))
    except orjson.JSONDecodeError:
        return None
    if not isinstance(ids, list) or not all(isinstance(i, (int, str)) and not isinstance(i, bool) for i in ids):
        return None
    return ids


def clear_page(fd: int) -> None:
    """Empty the page (the bridge's, before it hands the session to the next router)."""
    os.pwrite(fd, bytes(_HEADER.size), 0)
