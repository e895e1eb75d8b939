"""One JSON-RPC message per line: the one framer every stream of the project is cut with.

The router's connections, the connector client, the bridge's relay and the reader of a connector's
stderr all feed the bytes they receive to a `LineFramer` and get whole lines back, each at most
`max_line_bytes` long (16 MiB by default, `DEFAULT_MAX_LINE_BYTES`). What happens to a longer line
is the framer's `oversize` mode:

- `"skip"` (a JSON-RPC peer): the line is reported once, as an `Oversize` holding only its first
  `HEAD_BYTES` (enough to read a reply's id), and dropped up to its newline, so the connection lives
  on and never buffers more than the limit;
- `"pass"` (a relay, a log): its bytes come out as they arrive, as `Oversize` pieces, so nothing is
  held back and nothing over the limit is buffered.
"""

from __future__ import annotations

from typing import Final, Literal

__all__ = ["DEFAULT_MAX_LINE_BYTES", "HEAD_BYTES", "OVERSIZE", "LineBudget", "LineFramer", "Oversize"]

DEFAULT_MAX_LINE_BYTES: Final = 16 * 1024 * 1024
HEAD_BYTES: Final = 256  # what "skip" mode keeps of an oversize line: its start, where a reply's id is
_NL: Final = b"\n"


class Oversize:
    """A line over the limit: in `"pass"` mode `data` holds the piece that arrived, in `"skip"` its start."""

    __slots__ = ("data",)

    def __init__(self, data: bytes = b"") -> None:
        self.data = data

    def __repr__(self) -> str:
        return f"Oversize({len(self.data)} bytes)" if self.data else "OVERSIZE"


OVERSIZE: Final = Oversize()


class LineFramer:
    """Buffers bytes and hands back whole lines (newline included), never holding more than the limit."""

    __slots__ = ("_buf", "_inside_oversize", "_pass", "max_line_bytes")

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, *,
                 oversize: Literal["skip", "pass"] = "skip") -> None:
        self.max_line_bytes = max_line_bytes
        self._pass = oversize == "pass"
        self._buf = bytearray()
        self._inside_oversize = False

    @property
    def buffered(self) -> int:
        """Bytes of an unfinished line held right now."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes | Oversize]:
        if not self._buf and not self._inside_oversize and data.endswith(_NL) and data.find(_NL) == len(data) - 1:
            # The common case: exactly one whole message in one read.
            return [data] if len(data) - 1 <= self.max_line_bytes else [self._oversize(data)]
        out: list[bytes | Oversize] = []
        if self._inside_oversize:
            data = self._finish_oversize(data, out)
            if self._inside_oversize:
                return out
        buf = self._buf
        buf += data
        pos = 0
        while (end := buf.find(_NL, pos)) >= 0:
            line = bytes(buf[pos : end + 1])
            out.append(line if end - pos <= self.max_line_bytes else self._oversize(line))
            pos = end + 1
        if pos:
            del buf[:pos]
        if len(buf) > self.max_line_bytes:
            # Answer now rather than buffer the rest of a line that can never be accepted.
            out.append(self._oversize(bytes(buf)))
            buf.clear()
            self._inside_oversize = True
        return out

    def _finish_oversize(self, data: bytes, out: list[bytes | Oversize]) -> bytes:
        """The part of `data` after the end of the oversize line under way (pieces passed on in "pass" mode)."""
        end = data.find(_NL)
        piece = data if end < 0 else data[: end + 1]
        if self._pass and piece:
            out.append(Oversize(piece))
        if end < 0:
            return b""
        self._inside_oversize = False
        return data[end + 1 :]

    def _oversize(self, data: bytes) -> Oversize:
        return Oversize(data if self._pass else data[:HEAD_BYTES])

    def drop_partial(self) -> int:
        """Forget the unfinished line held now and skip the rest of it; the bytes freed."""
        freed = len(self._buf)
        if freed:
            self._buf.clear()
            self._inside_oversize = True
        return freed

    def take_rest(self) -> bytes:
        """The unfinished line held at the end of the stream (without a newline), emptying the buffer."""
        rest = bytes(self._buf)
        self.clear()
        return rest

    def clear(self) -> None:
        """Drop what is buffered (the stream ended)."""
        self._buf.clear()
        self._inside_oversize = False


class LineBudget:
    """How many bytes of its clients' lines one server may hold together.

    Each framer is bounded by its line limit; this bounds their sum, so many connections each
    holding most of a long line cannot together exhaust the server's memory. The router counts in
    it the lines a connection read and keeps waiting, and the replies it has not sent yet.
    """

    __slots__ = ("held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def change(self, delta: int) -> bool:
        """Count `delta` more bytes held (or fewer, when negative); False once the sum is over the limit."""
        self.held += delta
        return self.held <= self.limit
