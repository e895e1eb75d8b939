"""A connector process's stderr: masked, bounded, and logged without letting the connector flood the router.

The pool hands each chunk the process writes to `StderrLog.feed`, on the event loop. Each line, with
every secret value of the binding masked, goes to the log `handler.connector` and is appended to the
binding's own file (`connectors/<binding>.stderr.log`, 0600). A connector is not trusted to be quiet:

- what is logged is metered — a burst of `burst_bytes`, then `rate_bytes` a second. Past that, what it
  writes is read and dropped (so its writes never block and the router never buffers them); one line
  says when dropping starts and one how much was dropped once it slows down, or when the process ends,
  followed then by its last lines (the last `TAIL_BYTES` it wrote: most often why it stopped);
- the file is rotated at `file_bytes`: the full one becomes `<binding>.stderr.log.1` (replacing the
  one before), so a binding's stderr never takes more than twice that on disk.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from reconciler.places import open_private_file
from reconciler.wire.framing import LineFramer, Oversize

__all__ = ["StderrLog"]

log = logging.getLogger("handler.connector")

MAX_LINE = 4000  # characters of one line in the router's log
FILE_BYTES = 4 << 20  # a stderr log's size before it is rotated
BURST_BYTES = 1 << 20  # logged at once before the rate applies
RATE_BYTES = 64 << 10  # logged a second, after a burst
TAIL_BYTES = 4096  # of what was dropped, kept to be logged when the process ends


class StderrLog:
    """Receives a process's stderr in chunks and logs it line by line, secrets masked, within its budget."""

    def __init__(self, binding: str, secrets: Sequence[str], path: Path | None = None, *,
                 file_bytes: int = FILE_BYTES, burst_bytes: int = BURST_BYTES, rate_bytes: int = RATE_BYTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.binding = binding
        self.path = path  # also appended here (0600), masked the same: the binding's own stderr log
        # Longest first: a secret containing another is masked whole.
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._framer = LineFramer(MAX_LINE * 4, oversize="pass")
        self._file_bytes = file_bytes
        self._burst, self._rate = burst_bytes, rate_bytes
        self._allowed = float(burst_bytes)  # bytes it may write now
        self._clock = clock
        self._at = clock()
        self._dropped = 0  # bytes dropped since dropping started (0: not dropping)
        self._resync = False  # dropping cut a line: skip to the end of it before logging again
        self._tail = bytearray()  # the end of what was dropped
        self._unwritable = False  # the file could not be written last time (said once)

    def add_secrets(self, secrets: Sequence[str]) -> None:
        self._secrets = sorted({*self._secrets, *(s for s in secrets if s)}, key=len, reverse=True)

    def mask(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def feed(self, data: bytes) -> None:
        """One chunk of the process's stderr, as it came; b"" at its end."""
        if not data:
            self._end()
            return
        now = self._clock()
        self._allowed = min(float(self._burst), self._allowed + (now - self._at) * self._rate)
        self._at = now
        if len(data) > self._allowed:
            self._drop(data)
            return
        self._allowed -= len(data)
        if self._resync:
            end = data.find(b"\n")
            if end < 0:
                self._dropped += len(data)
                self._keep(data)
                return
            self._dropped += end + 1
            data, self._resync = data[end + 1:], False
        lines = self._dropped_note()
        # A line with no end is logged in pieces as it comes, never buffered past the limit.
        lines += self._texts(item.data if isinstance(item, Oversize) else item for item in self._framer.feed(data))
        self._emit(lines)

    def _end(self) -> None:
        """The stream ended: its unfinished last line, or what was dropped and the last lines of it."""
        if self._dropped:
            tail = bytes(self._tail)
            whole = tail[tail.find(b"\n") + 1:] if len(tail) == TAIL_BYTES else tail  # from its first whole line
            lines = self._dropped_note()
            if whole.strip():
                lines += ["[handler: the last lines it wrote, dropped above:]", *self._texts(whole.splitlines())]
            self._emit(lines)
        elif rest := self._framer.take_rest():
            self._emit(self._texts([rest]))
        self._framer.clear()
        self._resync = False

    def _dropped_note(self) -> list[str]:
        if not self._dropped:
            return []
        note = (f"[handler: {self._dropped:,} bytes of this connector's stderr were dropped, more than "
                f"{self._rate // 1024} KiB a second after a burst of {self._burst // 1024} KiB]")
        self._dropped = 0
        self._tail.clear()
        return [note]

    def _texts(self, raw_lines: Iterable[bytes]) -> list[str]:
        """The lines to log, masked, blank ones left out."""
        texts = (self.mask(raw.decode(errors="replace").rstrip("\r\n")) for raw in raw_lines)
        return [text for text in texts if text.strip()]

    def _drop(self, data: bytes) -> None:
        if not self._dropped:  # dropping starts: the line under way goes too
            cut = self._framer.take_rest()
            self._dropped = len(cut)
            self._keep(cut)
            self._emit([f"[handler: this connector writes more stderr than {self._rate // 1024} KiB a second; "
                        "what it writes is dropped until it slows down]"])
        self._dropped += len(data)
        self._resync = not data.endswith(b"\n")
        self._keep(data)

    def _keep(self, dropped: bytes) -> None:
        """Keep the end of what is dropped, for `_end`."""
        self._tail += dropped[-TAIL_BYTES:]
        del self._tail[:-TAIL_BYTES]

    def _emit(self, lines: list[str]) -> None:
        if not lines:
            return
        for text in lines:
            log.info("connector of binding '%s': %s", self.binding, text[:MAX_LINE])
        if self.path is not None:
            try:
                self._append(("\n".join(lines) + "\n").encode())
            except OSError as exc:  # a full disk, a state folder removed: the router's log still has the lines
                if not self._unwritable:
                    log.warning("cannot write %s (%s): the stderr of binding '%s' goes only to this log until it "
                                "can", self.path, exc.strerror or exc, self.binding)
                self._unwritable = True
            else:
                self._unwritable = False

    def _append(self, data: bytes) -> None:
        assert self.path is not None  # noqa: S101 - only called with a path
        fd = open_private_file(self.path)
        try:
            if os.fstat(fd).st_size + len(data) > self._file_bytes:
                self.path.replace(self.path.with_name(self.path.name + ".1"))
                os.close(fd)
                fd = open_private_file(self.path)
            os.write(fd, data)
        finally:
            os.close(fd)
