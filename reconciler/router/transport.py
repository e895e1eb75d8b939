"""Client connections of a profile's socket: lines in, lines out, and the bridge's handoff.

`Listener` accepts on one profile's socket and reads each new connection's first bytes itself, with
room for file descriptors. An attach line from `handler-service` carrying the agent's stdin and
stdout (see `handoff`) makes an attached connection: requests come from the agent's stdin, replies
go to its stdout, and the socket is kept as the session's lifeline, over which the bridge hears what it
needs to hand the session to the next router should this one go away: the session's signed record and
the session's end (see `handoff`); the calls opened and answered (each just before its reply) are kept on
the bridge's page of open calls (`openpage`). An attach line carrying a record resumes that session.
Anything else makes a line connection on the socket, fed those first bytes.

`Connection` holds what both kinds share: framing, the `Session`, flow control, and the ending. When
the input ends, the calls in flight finish and reply before the output closes; when the output
breaks (the client stopped reading) or the lifeline does (the bridge is gone), the session is
aborted and its calls cancelled. When the router stops (`stop_input`), a connection reads no further
request — never a byte past the last line it serves, so what the agent sends next waits for the next
router — and its calls in flight finish and reply; meanwhile the listener turns new connections away, a
bridge's attach as one to make to the next router.

What a connection holds is bounded and counted in the router's budget (`Hub.line_budget`): its
unfinished line, the lines read while its input was paused (one read at most: a read that comes
while paused pauses the transport again, whatever the loop did with the first pause), and its
replies left unsent past the transport's high-water mark. Past the budget, the connection holding
the most is ended (`_shed`).
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

from reconciler.config.eventloop import LoopPipe
from reconciler.router.handoff import (
    ACCEPTED,
    ATTACH_HEAD,
    ENDED_LINE,
    INPUT_ENDED_LINE,
    MAX_ATTACH_BYTES,
    NOTE_HEAD,
    PAUSED_LINE,
    PAUSES_LINE,
    STDIO_PRINCIPAL,
    STOPPING_LINE,
    is_stream_fd,
    parse_attach,
    refused_line,
    session_line,
)
from reconciler.router.hub import Hub
from reconciler.router.lifeline import NOT_ATTACHED_STOPPING, NOT_CONNECTED_STOPPING, cut_off, request_id
from reconciler.router.openpage import OpenCalls, page_problem
from reconciler.router.resumption import SessionRecord
from reconciler.router.sessions import Session
from reconciler.wire.errors import INVALID_REQUEST, SERVER_BUSY, JsonRpcError
from reconciler.wire.framing import LineFramer, Oversize
from reconciler.wire.messages import encode_error, oversize_error
from reconciler.wire.meta import INSTANCE, PARENT_INSTANCE, run_id_problem

__all__ = ["Connection", "Listener"]

_log = logging.getLogger("handler.router")
_BACKLOG = 128
_ACCEPTS_PER_WAKEUP = 64
_ACCEPT_PAUSE_SECONDS = 0.1
_MOST_UNREAD_NOTES = 1 << 20  # what a handed-over session's lifeline may hold unread: a bridge reads it all along
_MOST_TURNED_AWAY = 64  # requests answered in a connection turned away while the router stops
_PARTIAL_LINE_PAUSE = 0.002  # seconds between reads of a partial line's rest while the router stops, at first
_PARTIAL_LINE_MOST_PAUSE = 0.2  # and at most (doubling while nothing comes)


class Connection:
    """One session's byte streams: `reader` feeds it requests, `writer` takes its replies."""

    def __init__(self, router: Hub, profile: str, bound: Mapping[str, str] | None = None,
                 group: set[Connection] | None = None) -> None:
        self._router = router
        self._framer = LineFramer(router.bounds.max_line_bytes)
        self._max_calls = router.bounds.max_calls_in_flight
        self.session = Session(router, profile, self._write, bound, on_call_end=self._call_ended,
                               on_call_start=self._call_started, on_call_answer=self._call_answered)
        self.reader: asyncio.ReadTransport | None = None
        self.writer: asyncio.WriteTransport | None = None
        self.lifeline: asyncio.BaseTransport | None = None
        self._finishing: asyncio.Task[None] | None = None
        self._ended = False
        self._holds: set[str] = set()  # why its input is paused: "replies" unsent, "calls" in flight
        self._waiting: list[bytes | Oversize] = []  # lines read before a hold began: handled once it lifts
        self._waiting_bytes = 0  # their size, counted in the router's budget
        self._unsent_bytes = 0  # replies unsent while the client is behind, counted in the budget
        self._lifted: asyncio.Future[None] | None = None  # the input's end, waiting for the waiting lines
        self._group = group  # the connections of its profile's socket, which the listener counts
        self._unrecorded = False  # a handed-over session whose record its bridge has not had yet
        self._stopping = False  # the router is stopping: its input is read no further (`stop_input`)
        self._reading_rest = False  # the rest of a partial line is being read, the reader paused (`_read_rest_of_line`)
        self._stopped: asyncio.Future[None] | None = None  # done once its calls have finished, or it ended
        self.open_calls: OpenCalls | None = None  # a handed-over session's open calls, on its bridge's page
        self.relayed = False  # its bridge relays its lines (`relaying`), its notes among them
        self._pauses = False  # its relaying bridge sends nothing more once told the router stops (`PAUSES_LINE`)
        router.connections.add(self)
        if group is not None:
            group.add(self)

    @property
    def held_bytes(self) -> int:
        """What this connection holds of the router's budget now."""
        return self._framer.buffered + self._waiting_bytes + self._unsent_bytes

    def received(self, data: bytes) -> None:
        framer, budget = self._framer, self._router.line_budget
        held = framer.buffered
        items = framer.feed(data)
        if framer.buffered != held and not budget.change(framer.buffered - held):
            # All connections together hold too much: this one's unfinished line is dropped.
            budget.change(-framer.drop_partial())
            self._write(encode_error(None, JsonRpcError(INVALID_REQUEST, "the router holds too many unfinished "
                                                        "messages right now; this one was skipped, send it again")))
        if self._waiting or self._holds:
            self._keep_waiting(items)  # read before the hold began: handled, in order, once it lifts
            if self._holds:
                # A read while paused: the loop lost the pause (uvloop starts reading after connection_made, where
                # the first bytes may begin a hold), and the client would grow `_waiting` for ever.
                self._pause_reader()
        else:
            self._handle(items)
        if self._stopping and not self._reading_rest:  # read while paused (above): handled, the reader paused again
            self._pause_reader()

    def _handle(self, items: list[bytes | Oversize]) -> None:
        """Handle framed lines in order until a hold begins — the calls in flight at the bound, or replies the client
        leaves unread past the transport's high-water mark — and keep the rest waiting. A read holds thousands of
        short requests: answered all at once to a client that never reads, their replies grew the router by
        megabytes a connection."""
        for index, item in enumerate(items):
            if type(item) is bytes:
                if self.relayed and item.startswith(NOTE_HEAD):
                    self._noted(item)
                    continue
                self.session.handle(item)
                if self._unrecorded:
                    self._send_record()
                if len(self.session.tasks) >= self._max_calls:
                    self._hold("calls")
            else:
                self._write(encode_error(None, oversize_error(self._framer.max_line_bytes)))
            if self._holds or self._ended:  # ended: its replies took the router past its budget (`_shed`)
                self._keep_waiting(items[index + 1 :])
                return

    def _noted(self, line: bytes) -> None:
        """A note of its relaying bridge's: the agent closed its stdin; the bridge pauses when the router stops, or
        sends no more lines (the router is stopping)."""
        if line == INPUT_ENDED_LINE:
            self.input_ended()
        elif line == PAUSES_LINE:
            self._pauses = True
        elif line == PAUSED_LINE and self._stopped is not None:
            self._quiet()

    def _keep_waiting(self, items: list[bytes | Oversize]) -> None:
        size = sum(len(item) if isinstance(item, bytes) else len(item.data) for item in items)
        if not size or self._ended:
            return
        self._waiting.extend(items)
        self._waiting_bytes += size
        if not self._router.line_budget.change(size):
            self._shed()

    def _call_answered(self, call_id: int | str) -> None:
        if self.open_calls is not None:  # just before the reply: never after, which a crash could split
            self.open_calls.closed(call_id)

    def _call_ended(self) -> None:
        if "calls" in self._holds and len(self.session.tasks) < self._max_calls:
            self._release("calls")

    def handed_over(self, record: SessionRecord | None) -> None:
        """Its bridge holds the agent's stdio too: tell it the session's record and calls. `record`: the session
        the bridge re-attached, which goes on without `initialize`."""
        if record is None:
            self._unrecorded = True
        else:
            self.session.resume(record)

    def _send_record(self) -> None:
        record = self.session.record(STDIO_PRINCIPAL)
        if record is not None:
            self._unrecorded = False
            self._tell(session_line(self._router.signer.issue(record)))

    def _call_started(self, call_id: int | str) -> None:
        if self.open_calls is not None:
            self.open_calls.opened(call_id)

    def _tell(self, line: bytes) -> None:
        """A line for the bridge, on the lifeline. A peer that leaves them unread is no bridge (a bridge reads all
        along): past `_MOST_UNREAD_NOTES` its session ends, rather than the router holding its lines for ever."""
        lifeline = self.lifeline
        if lifeline is not None and not lifeline.is_closing():
            lifeline.write(line)  # type: ignore[attr-defined]  # a socket transport
            if lifeline.get_write_buffer_size() > _MOST_UNREAD_NOTES:  # type: ignore[attr-defined]
                _log.warning("profile %s: ended a handed-over session whose bridge left %d bytes of the "
                             "router's lines unread", self.session.profile, _MOST_UNREAD_NOTES)
                self.end(abort=True)

    def input_ended(self) -> None:
        """The client closed its sending side: finish the calls in flight, reply, then close the output."""
        if self._finishing is None and not self._ended:
            self._finishing = asyncio.get_running_loop().create_task(self._finish())

    async def _finish(self) -> None:
        await self._finish_calls()
        if self.writer is not None:
            self.writer.close()  # flushes what is buffered; its connection_lost then ends the rest

    async def _finish_calls(self) -> None:
        """Until the calls in flight, and those of the lines read and waiting, have finished and replied."""
        while not self._ended:
            await self.session.drain()
            if not self._waiting:
                break
            self._lifted = asyncio.get_running_loop().create_future()  # the lines still waiting are owed replies
            await self._lifted

    def stop_input(self) -> asyncio.Future[None]:
        """The router is stopping: read no further request, and let the calls in flight and the lines already read
        finish and reply; done when they have (the router then ends the connection, `end(over=False)`). A partial
        line is read to its end first, a byte at a time, so no byte after it is taken from the pipe. A relaying
        bridge that said it pauses is asked to stop sending first (`STOPPING_LINE`), and this connection reads on
        until it says it has (`PAUSED_LINE`)."""
        if self._stopped is not None:
            return self._stopped
        stopped = self._stopped = asyncio.get_running_loop().create_future()
        if self._ended:
            stopped.set_result(None)
        elif self._finishing is not None:  # its input has ended: it finishes, and closes, on its own
            self._finishing.add_done_callback(lambda _: _resolve(stopped))
        elif self._pauses:
            self._tell(STOPPING_LINE)
        else:
            self._quiet()
        return stopped

    def _quiet(self) -> None:
        """Stop reading, and finish what was read (`stop_input`)."""
        if self._stopping:
            return
        self._stopping = True
        self._pause_reader()
        task = asyncio.get_running_loop().create_task(self._finish_read())
        task.add_done_callback(lambda _: _resolve(self._stopped))

    async def _finish_read(self) -> None:
        if self._framer.buffered and not self._ended:
            await self._read_rest_of_line()
        await self._finish_calls()

    async def _read_rest_of_line(self) -> None:
        """The rest of the line begun when the input stopped, a byte at a time: a read of more would take the start
        of the next request from the pipe, which the next router must find whole."""
        fd, pause = _input_fd(self.reader), _PARTIAL_LINE_PAUSE
        self._reading_rest = True
        try:
            while fd is not None and self._framer.buffered and not self._ended:
                try:
                    byte = os.read(fd, 1)
                except (BlockingIOError, InterruptedError):
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, _PARTIAL_LINE_MOST_PAUSE)  # a client that never ends it costs little
                    continue
                except OSError:
                    return
                if not byte:
                    return
                pause = _PARTIAL_LINE_PAUSE
                self.received(byte)
        finally:
            self._reading_rest = False

    def end(self, *, abort: bool = False, over: bool = True) -> None:
        """Abort what still runs and close every stream (`abort`: dropping what they have not sent); safe to call
        more than once. `over`: the session is over, so its bridge exits; otherwise (the router is going away) the
        bridge answers the calls still open and hands the session to the next router."""
        if self._ended:
            return
        self._ended = True
        if self.lifeline is not None and over:
            self._tell(ENDED_LINE)
        self._router.connections.discard(self)
        if self._group is not None:
            self._group.discard(self)
        self._router.line_budget.change(-self._framer.drop_partial() - self._waiting_bytes - self._unsent_bytes)
        self._waiting, self._waiting_bytes, self._unsent_bytes = [], 0, 0
        self._wake_finish()
        self.session.abort()
        self.session.detach()
        self.close_streams(abort=abort)
        if self._stopped is not None:
            _resolve(self._stopped)

    @property
    def ended(self) -> bool:
        return self._ended

    def close_streams(self, *, abort: bool = False) -> None:
        if self.open_calls is not None:
            self.open_calls.close()
            self.open_calls = None
        for transport in (self.reader, self.writer, self.lifeline):
            if transport is not None and not transport.is_closing():
                if abort and isinstance(transport, asyncio.WriteTransport):
                    transport.abort()
                else:
                    transport.close()

    def _shed(self) -> None:
        """The router's clients hold more than its budget: end the connections holding the most until they do not.
        The biggest holder goes first, so a few clients cannot make everyone else's replies the ones dropped."""
        budget, connections = self._router.line_budget, self._router.connections
        while budget.held > budget.limit and connections:
            biggest = max(connections, key=lambda conn: conn.held_bytes)
            if not biggest.held_bytes:
                return
            _log.warning("clients hold %d bytes of the router's %d (unfinished lines, lines waiting, replies "
                         "unread): ended the connection holding the most (%d bytes)",
                         budget.held, budget.limit, biggest.held_bytes)
            biggest.end(abort=True)

    def pause_input(self) -> None:
        # The client is not reading its replies: stop reading its requests until it does.
        self._hold("replies")

    def resume_input(self) -> None:
        self._router.line_budget.change(-self._unsent_bytes)  # under the low-water mark again: not counted
        self._unsent_bytes = 0
        self._release("replies")

    def _hold(self, why: str) -> None:
        if not self._holds:
            self._pause_reader()
        self._holds.add(why)

    def _pause_reader(self) -> None:
        reader = self.reader
        if reader is None or reader.is_closing():
            return
        if not reader.is_reading():
            # Paused in the transport's eyes yet read from (a loop that registers its reader after connection_made
            # whatever a pause there said): it must be registered again for a pause to undo it.
            reader.resume_reading()
        reader.pause_reading()

    def _release(self, why: str) -> None:
        self._holds.discard(why)
        if self._holds:
            return
        if self._waiting:
            waiting, self._waiting = self._waiting, []
            self._router.line_budget.change(-self._waiting_bytes)
            self._waiting_bytes = 0
            self._handle(waiting)
            if self._holds:
                return
            self._wake_finish()
        if self.reader is not None and not self.reader.is_closing() and not self._stopping:
            self.reader.resume_reading()

    def _wake_finish(self) -> None:
        if self._lifted is not None and not self._lifted.done():
            self._lifted.set_result(None)

    def _write(self, data: bytes) -> None:
        writer = self.writer
        if writer is not None and not writer.is_closing():
            writer.write(data)
            if "replies" in self._holds:  # the client is behind: what waits for it is counted
                self._count_unsent(writer.get_write_buffer_size())

    def _count_unsent(self, size: int) -> None:
        grew, self._unsent_bytes = size - self._unsent_bytes, size
        if not self._router.line_budget.change(grew):
            self._shed()


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


class _Relayed(_Lines):
    """A relaying bridge's socket: the agent's end of input comes as a note, so its closing is the bridge gone."""

    def eof_received(self) -> bool:
        self._conn.end()
        return False


class _AgentInput(_Reads):
    """The agent's stdin, handed over by the bridge."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Known before the first read (uvloop reads before connect_read_pipe returns), so a hold can pause it.
        self._conn.reader = transport  # type: ignore[assignment]  # a read pipe transport

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
        self._live: set[Connection] = set()  # its connections serving a session
        self._starting: set[asyncio.Task[Any]] = set()
        self._loop.add_reader(sock.fileno(), self._accept)

    def close(self) -> None:
        """Stop accepting; connections already made live on."""
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        for conn in list(self._unanswered):
            self._drop(conn)

    async def started(self) -> None:
        """Once the connections it accepted have been made (a connection made later is turned away if the router
        is stopping)."""
        await asyncio.gather(*self._starting, return_exceptions=True)

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
            if len(self._live) + len(self._unanswered) >= self._router.bounds.max_connections:
                self._refuse(conn)
                continue
            self._unanswered.add(conn)
            self._loop.add_reader(conn.fileno(), self._first_read, conn)

    def _refuse(self, conn: socket.socket) -> None:
        """One client too many: say why in one JSON-RPC error line, and close."""
        limit = self._router.bounds.max_connections
        _log.warning("profile %s: refused a connection, %d are open (the limit)", self._profile, limit)
        error = JsonRpcError(SERVER_BUSY, f"profile '{self._profile}' already has {limit} connections, the "
                             "router's limit; close one and connect again", {"maxConnections": limit})
        with contextlib.suppress(OSError):
            conn.send(encode_error(None, error))
        conn.close()

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
            data, fds, _flags, _ = socket.recv_fds(conn, MAX_ATTACH_BYTES, 3)
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
        if self._router.stopping:
            _close_fds(fds)
            self._turn_away(conn, data, attaching=bool(fds) or data.startswith(ATTACH_HEAD))
            return
        attach = parse_attach(data) if fds or data.startswith(ATTACH_HEAD) else None
        if attach is not None:
            problem = (_relay_problem(fds) if attach.relay else _handoff_problem(fds)) or _meta_problem(attach.meta)
            record = self._resumable(attach.session) if problem is None and attach.session is not None else None
            if problem is None and attach.session is not None and record is None:
                problem = ("the session the bridge re-attached is not one this router can resume (its record is "
                           "another state folder's, or another profile's); restart this MCP server in your host")
            if problem is None and attach.relay:
                self._start(self._relayed(conn, attach.meta, record), conn, [])
                return
            if problem is None:
                self._start(self._attach(conn, fds, attach.meta, record), conn, fds)
                return
            with contextlib.suppress(OSError):
                conn.send(refused_line(problem))
            data = b""  # the bridge relays lines on this connection instead
        _close_fds(fds)
        self._start(self._lines(conn, data), conn, [])

    def _turn_away(self, conn: socket.socket, data: bytes, *, attaching: bool) -> None:
        """A connection made while the router stops: a bridge's attach is refused as stopping (the bridge waits for
        the next router), and each request in a line connection's first bytes is answered that the router is
        stopping (or, if none is whole, one error with no id says so); then it closes."""
        if attaching:
            answer = refused_line(NOT_ATTACHED_STOPPING, stopping=True)
        else:
            ids: list[int | str | None] = [
                call_id for line in data.split(b"\n")[:-1] if (call_id := request_id(line)) is not None]
            # One send of what the socket takes: answers past a bound would be dropped by it anyway, after costing
            # the router their building (the first bytes hold up to thousands of short requests).
            answer = b"".join(cut_off(call_id, NOT_CONNECTED_STOPPING) for call_id in ids[:_MOST_TURNED_AWAY] or [None])
        with contextlib.suppress(OSError):
            conn.send(answer)
        conn.close()

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
        conn = Connection(self._router, self._profile, group=self._live)
        try:
            await self._loop.connect_accepted_socket(lambda: _Lines(conn, first), sock)
        except BaseException:
            conn.end()  # never made: it must not linger among the router's connections
            raise

    async def _relayed(self, sock: socket.socket, meta: Mapping[str, str], record: SessionRecord | None) -> None:
        """A session its bridge relays on `sock` (`relaying`): lines both ways, the bridge's notes among them."""
        conn = Connection(self._router, self._profile, meta, group=self._live)
        conn.handed_over(record)
        conn.relayed = True
        try:
            transport, _ = await self._loop.connect_accepted_socket(lambda: _Relayed(conn, b""), sock)
        except BaseException:
            conn.end()
            raise
        conn.lifeline = transport
        transport.write(ACCEPTED)  # before any reply: the bridge sends nothing until it has this

    def _resumable(self, session: str) -> SessionRecord | None:
        """The record of a session handed over on this profile's socket, read from what its bridge presents."""
        record = self._router.signer.read(session)
        if record is None or record.profile != self._profile or record.principal != STDIO_PRINCIPAL:
            return None
        return record

    async def _attach(self, sock: socket.socket, fds: list[int], meta: Mapping[str, str],
                      record: SessionRecord | None) -> None:
        conn = Connection(self._router, self._profile, meta, group=self._live)
        conn.handed_over(record)
        if len(fds) == 3:  # the bridge's page of open calls: mapped, so its descriptor is not needed after
            conn.open_calls = OpenCalls(fds[2])
            os.close(fds.pop())
        stdin, stdout = (LoopPipe(fd, self._loop) for fd in fds)  # each owned by its transport once handed over
        fds.clear()
        handed: set[LoopPipe] = set()
        try:
            lifeline, _ = await self._loop.connect_accepted_socket(lambda: _Lifeline(conn), sock)
            conn.lifeline = lifeline
            if not conn.ended:
                handed.add(stdout)
                conn.writer, _ = await self._loop.connect_write_pipe(lambda: _AgentOutput(conn), stdout)
            if not conn.ended:
                lifeline.write(ACCEPTED)
                handed.add(stdin)
                conn.reader, _ = await self._loop.connect_read_pipe(lambda: _AgentInput(conn), stdin)
        except BaseException:
            conn.end()
            raise
        finally:
            for pipe in {stdin, stdout} - handed:
                pipe.discard()
        if conn.ended:  # ended while its streams were being made (the bridge gone, the router closing)
            conn.close_streams()


def _resolve(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


def _input_fd(reader: asyncio.ReadTransport | None) -> int | None:
    """The descriptor a connection reads its requests from (the agent's stdin, or its socket), or None."""
    if reader is None or reader.is_closing():
        return None
    source = reader.get_extra_info("pipe") or reader.get_extra_info("socket")
    return source.fileno() if source is not None else None


def _handoff_problem(fds: list[int]) -> str | None:
    """Why these descriptors cannot serve as the agent's stdin and stdout (and its bridge's page of open calls,
    `openpage`, when there is a third), or None if they can."""
    if len(fds) not in (2, 3):
        return (f"the attach line must carry stdin, stdout and the open-calls page (2 or 3 descriptors), not "
                f"{len(fds)}; a bridge that relays the session's lines says \"handler/relay\": true and sends none")
    if len(fds) == 3 and (problem := page_problem(fds[2])) is not None:
        return problem
    return _stdio_problem(fds[0], "stdin", (os.O_RDONLY, os.O_RDWR)) \
        or _stdio_problem(fds[1], "stdout", (os.O_WRONLY, os.O_RDWR)) or _one_socket_problem(fds[0], fds[1])


def _relay_problem(fds: list[int]) -> str | None:
    """Why a relaying bridge's attach line cannot be taken, or None: it carries no descriptor (those it sent are
    closed with the refusal, as a refused handoff's are)."""
    return "a relaying bridge sends no descriptor with its attach line" if fds else None


def _stdio_problem(fd: int, name: str, wanted: tuple[int, ...]) -> str | None:
    try:
        mode = os.fstat(fd).st_mode
        access = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError as exc:
        return f"the agent's {name} cannot be inspected ({exc.strerror})"
    if not is_stream_fd(mode):
        return f"the agent's {name} is not a pipe or a socket"
    if access not in wanted:
        return f"the agent's {name} is not open for {'reading' if name == 'stdin' else 'writing'}"
    return None


def _one_socket_problem(stdin: int, stdout: int) -> str | None:
    first, second = os.fstat(stdin), os.fstat(stdout)
    if (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino):
        return "the agent's stdin and stdout are one socket; relay its lines instead"
    return None


def _meta_problem(meta: Mapping[str, str]) -> str | None:
    """Why the run ids an attach line binds to its session cannot be kept, or None if they can."""
    for key in (INSTANCE, PARENT_INSTANCE):
        problem = run_id_problem(meta[key]) if meta.get(key) else None
        if problem is not None:
            return f"the attach line's {key} {problem}"
    return None


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)

