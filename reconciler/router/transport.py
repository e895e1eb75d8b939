"""Client connections of a profile's socket: lines in, lines out, and the bridge's handoff.

`Listener` accepts on one profile's socket and reads each new connection's first bytes itself, with
room for file descriptors. An attach line from `handler-service` carrying the agent's stdin and
stdout (see `handoff`) makes an attached connection: requests come from the agent's stdin, replies
go to its stdout, and the socket is kept only as the session's lifeline. Anything else makes a line
connection on the socket, fed those first bytes.

`Connection` holds what both kinds share: framing, the `Session`, flow control, and the ending. When
the input ends, the calls in flight finish and reply before the output closes; when the output
breaks (the client stopped reading) or the lifeline does (the bridge is gone), the session is
aborted and its calls cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reconciler.router.handoff import ACCEPTED, MAX_ATTACH_BYTES, is_stream_fd, parse_attach, refused_line
from reconciler.router.hub import Hub
from reconciler.router.sessions import Session
from reconciler.wire.framing import LineFramer
from reconciler.wire.messages import encode_error, oversize_error

__all__ = ["Connection", "Listener"]

_log = logging.getLogger("handler.router")
_BACKLOG = 128
_ACCEPTS_PER_WAKEUP = 64
_ACCEPT_PAUSE_SECONDS = 0.1


class Connection:
    """One session's byte streams: `reader` feeds it requests, `writer` takes its replies."""

    def __init__(self, router: Hub, profile: str, bound: Mapping[str, str] | None = None) -> None:
        self._router = router
        self._framer = LineFramer(router.max_line_bytes)
        self.session = Session(router, profile, self._write, bound)
        self.reader: asyncio.ReadTransport | None = None
        self.writer: asyncio.WriteTransport | None = None
        self.lifeline: asyncio.BaseTransport | None = None
        self._finishing: asyncio.Task[None] | None = None
        self._ended = False
        router.connections.add(self)

    def received(self, data: bytes) -> None:
        for item in self._framer.feed(data):
            if type(item) is bytes:
                self.session.handle(item)
            else:
                self._write(encode_error(None, oversize_error(self._framer.max_line_bytes)))

    def input_ended(self) -> None:
        """The client closed its sending side: finish the calls in flight, reply, then close the output."""
        if self._finishing is None and not self._ended:
            self._finishing = asyncio.get_running_loop().create_task(self._finish())

    async def _finish(self) -> None:
        await self.session.drain()
        if self.writer is not None:
            self.writer.close()  # flushes what is buffered; its connection_lost then ends the rest

    def end(self) -> None:
        """Abort what still runs and close every stream; safe to call more than once."""
        if self._ended:
            return
        self._ended = True
        self._router.connections.discard(self)
        self.session.abort()
        for transport in (self.reader, self.writer, self.lifeline):
            if transport is not None and not transport.is_closing():
                transport.close()

    def pause_input(self) -> None:
        # The client is not reading its replies: stop reading its requests until it does.
        if self.reader is not None and not self.reader.is_closing():
            self.reader.pause_reading()

    def resume_input(self) -> None:
        if self.reader is not None and not self.reader.is_closing():
            self.reader.resume_reading()

    def _write(self, data: bytes) -> None:
        writer = self.writer
        if writer is not None and not writer.is_closing():
            writer.write(data)


class _Reads(asyncio.Protocol):
    """Requests coming in: framed and handled; their end lets the calls in flight finish and reply."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def data_received(self, data: bytes) -> None:
        self._conn.received(data)

    def eof_received(self) -> bool:
        self._conn.input_ended()
        return True  # keep the output open to send the replies still owed


class _Writes(asyncio.BaseProtocol):
    """Replies going out: a client that stops reading pauses its input; losing the output ends the session."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def connection_lost(self, exc: Exception | None) -> None:
        self._conn.end()

    def pause_writing(self) -> None:
        self._conn.pause_input()

    def resume_writing(self) -> None:
        self._conn.resume_input()


class _Lines(_Reads, _Writes):
    """A line connection: the socket carries requests and replies both ways."""

    def __init__(self, conn: Connection, first: bytes) -> None:
        super().__init__(conn)
        self._first = first

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._conn.reader = self._conn.writer = transport  # type: ignore[assignment]  # a stream transport
        if self._first:
            self._conn.received(self._first)


class _AgentInput(_Reads):
    """The agent's stdin, handed over by the bridge."""

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:  # after its end (None) the session finishes its calls; an error ends it
            self._conn.end()


class _AgentOutput(_Writes):
    """The agent's stdout, handed over by the bridge; it is lost when the agent stops reading or we close it."""


class _Lifeline(asyncio.Protocol):
    """The bridge's socket after the handoff: when it closes, the bridge has exited and the session ends."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def data_received(self, data: bytes) -> None:
        pass  # the bridge sends nothing after its attach line

    def eof_received(self) -> bool:
        self._conn.end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._conn.end()


class Listener:
    """Accepts connections on one profile's socket (bound and listening from construction)."""

    def __init__(self, router: Hub, profile: str, path: Path) -> None:
        self._router = router
        self._profile = profile
        self._loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket is born 0600: no moment where others could connect
        try:
            sock.bind(str(path))
        except OSError:
            sock.close()
            raise
        finally:
            os.umask(old)
        sock.listen(_BACKLOG)
        sock.setblocking(False)
        self._sock = sock
        self._unanswered: set[socket.socket] = set()  # accepted, first bytes not read yet
        self._starting: set[asyncio.Task[Any]] = set()
        self._loop.add_reader(sock.fileno(), self._accept)

    def close(self) -> None:
        """Stop accepting; connections already made live on."""
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        for conn in list(self._unanswered):
            self._drop(conn)

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_WAKEUP):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, most likely: pause rather than spin
                _log.warning("profile %s: cannot accept a connection (%s); retrying in %.1f s",
                             self._profile, exc.strerror, _ACCEPT_PAUSE_SECONDS)
                self._loop.remove_reader(self._sock.fileno())
                self._loop.call_later(_ACCEPT_PAUSE_SECONDS, self._resume_accepting)
                return
            conn.setblocking(False)
            self._unanswered.add(conn)
            self._loop.add_reader(conn.fileno(), self._first_read, conn)

    def _resume_accepting(self) -> None:
        if self._sock.fileno() >= 0:
            self._loop.add_reader(self._sock.fileno(), self._accept)

    def _drop(self, conn: socket.socket) -> None:
        self._unanswered.discard(conn)
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(conn.fileno())
        conn.close()

    def _first_read(self, conn: socket.socket) -> None:
        try:
            data, fds, _flags, _ = socket.recv_fds(conn, MAX_ATTACH_BYTES, 2)
        except (BlockingIOError, InterruptedError):
            return  # spurious wakeup: the reader stays registered
        except OSError:
            self._drop(conn)
            return
        self._unanswered.discard(conn)
        self._loop.remove_reader(conn.fileno())
        if not data:
            _close_fds(fds)
            conn.close()  # connected and left without a word
            return
        meta = parse_attach(data) if fds else None
        if meta is not None:
            problem = _handoff_problem(fds)
            if problem is None:
                self._start(self._attach(conn, fds, meta), conn, fds)
                return
            with contextlib.suppress(OSError):
                conn.send(refused_line(problem))
            data = b""  # the bridge relays lines on this connection instead
        _close_fds(fds)
        self._start(self._lines(conn, data), conn, [])

    def _start(self, coro: Any, conn: socket.socket, fds: list[int]) -> None:
        task = self._loop.create_task(coro)
        self._starting.add(task)

        def done(task: asyncio.Task[Any]) -> None:
            self._starting.discard(task)
            if not task.cancelled() and task.exception() is not None:
                _log.warning("profile %s: a connection failed to start: %s", self._profile, task.exception())
                _close_fds(fds)
                conn.close()

        task.add_done_callback(done)

    async def _lines(self, sock: socket.socket, first: bytes) -> None:
        conn = Connection(self._router, self._profile)
        try:
            await self._loop.connect_accepted_socket(lambda: _Lines(conn, first), sock)
        except BaseException:
            conn.end()  # never made: it must not linger among the router's connections
            raise

    async def _attach(self, sock: socket.socket, fds: list[int], meta: Mapping[str, str]) -> None:
        conn = Connection(self._router, self._profile, meta)
        stdin = os.fdopen(fds[0], "rb", buffering=0)  # the read transport owns and closes it
        stdout = os.fdopen(fds[1], "wb", buffering=0)  # the write transport owns and closes it
        fds.clear()
        try:
            lifeline, _ = await self._loop.connect_accepted_socket(lambda: _Lifeline(conn), sock)
            conn.lifeline = lifeline
            conn.writer, _ = await self._loop.connect_write_pipe(lambda: _AgentOutput(conn), stdout)
            lifeline.write(ACCEPTED)
            conn.reader, _ = await self._loop.connect_read_pipe(lambda: _AgentInput(conn), stdin)
        except BaseException:
            conn.end()
            for pipe in (stdin, stdout):
                pipe.close()
            raise


def _handoff_problem(fds: list[int]) -> str | None:
    """Why these descriptors cannot serve as the agent's stdin and stdout, or None if they can."""
    if len(fds) != 2:
        return f"the attach line must carry 2 descriptors (stdin, stdout), not {len(fds)}"
    for fd, name, wanted in ((fds[0], "stdin", (os.O_RDONLY, os.O_RDWR)), (fds[1], "stdout", (os.O_WRONLY, os.O_RDWR))):
        try:
            mode = os.fstat(fd).st_mode
            access = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        except OSError as exc:
            return f"the agent's {name} cannot be inspected ({exc.strerror})"
        if not is_stream_fd(mode):
            return f"the agent's {name} is not a pipe or a socket"
        if access not in wanted:
            return f"the agent's {name} is not open for {'reading' if name == 'stdin' else 'writing'}"
    first, second = os.fstat(fds[0]), os.fstat(fds[1])
    if (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino):
        return "the agent's stdin and stdout are one socket; relay its lines instead"
    return None


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)

