"""The bridge relaying a session's lines: every request answered exactly once, whatever happens to the router.

When `handler-service` relays (`--relay`, `HANDLER_RELAY=1`, a terminal or a file for stdio, a router that
refuses the handoff; docs/router.md "Relay"), it reads each line the agent sends and each line the router sends,
so it knows which requests the router has not answered. It opens the session with one line,
`{"handler/attach": {meta}, "handler/relay": true}` (and the session's signed record when it re-attaches),
no descriptors: the router binds the meta to the session, answers `{"handler/attached": true}`, and the socket
carries the session's lines both ways, with the router's notes to the bridge among them (the session's record,
`{"handler/ended": true}`), which the agent never sees.

Only whole lines reach the agent: a reply the router had written in part when it died is dropped. When the socket
closes without the router saying the session is over, the bridge writes each reply that reached it, answers
every request still open once (the restart error of `lifeline`), waits for the next router and goes on with the
session's record; requests the agent sends meanwhile wait in the pipe. A router that is stopping says so
(`{"handler/stopping": true}`) and finishes the calls it has: the bridge then sends it nothing more, answers
`{"handler/paused": true}` once it has sent its last line, and keeps what the agent sends next for the next router,
so nothing is cut off (its first line to each router, `{"handler/pauses": true}`, says it will). Exactly once
costs a process in the middle of every message: `benchmarks/router.py` prints what it adds over the handoff.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import orjson

from reconciler.router.handoff import (
    ACCEPTED,
    INPUT_ENDED_LINE,
    NOTE_HEAD,
    PAUSED_LINE,
    PAUSES_LINE,
    attach_line,
    read_note,
)
from reconciler.router.lifeline import (
    Refusal,
    answer_restarted,
    call_id,
    next_router,
    read_line,
    refusal,
    request_id,
    write_out,
)
from reconciler.wire.framing import LineFramer, Oversize

__all__ = ["Relay", "reply_id"]

_CHUNK: Final = 1 << 16
_RETRY_PAUSE: Final = 0.1
_REPLY_HEAD: Final = b'{"jsonrpc":"2.0","id":'  # how the router's encoder begins a reply (`wire.messages`)
_MOST_REPLY_BYTES: Final = 1 << 30  # a longer reply passes in pieces, its id unread
_MOST_UNSENT: Final = 1 << 20  # what the agent sent that may wait for the router before the bridge stops reading it


class Relay:
    """One relayed session, through the routers that serve it in turn."""

    def __init__(self, path: Path, meta: Mapping[str, str], wait_seconds: float, max_line: int) -> None:
        self.path = path
        self.meta = dict(meta)
        self.wait_seconds = wait_seconds
        self.record: str | None = None  # the session's signed record, once the router sent it
        self.open: dict[int | str, None] = {}  # requests sent to the router and not answered, in order
        self._from_agent = LineFramer(max_line, oversize="pass")
        self._input_over = False  # the agent closed its stdin
        self._ended = False  # the router said the session is over
        self._gone = False  # the agent stopped reading its stdout
        self._unsent = bytearray()  # what the agent sent that the router has not taken yet
        # The router is stopping: what the agent sends from then on is kept for the next router, with its requests
        # (`open` holds those the router was sent), and the paused note is owed once `_unsent` has gone out.
        self._stopping = False
        self._paused = False
        self._kept = bytearray()
        self._kept_open: dict[int | str, None] = {}

    def attach(self, sock: socket.socket) -> Refusal | None:
        """Open (or resume) the session on `sock`; None when the router took it, else its refusal."""
        sock.sendall(attach_line(self.meta, self.record, relay=True))
        answer = read_line(sock)
        return None if answer == ACCEPTED else refusal(answer)

    def follow(self, sock: socket.socket) -> int:
        """Relay through each router until the session is over; the bridge's exit status."""
        with contextlib.suppress(OSError):  # written whole, waiting when the agent is behind (`write_out`)
            os.set_blocking(1, True)
        while True:
            self._relay(sock)
            sock.close()
            if self._gone:
                return 0
            answer_restarted(self.open)
            self.open.clear()
            if self._ended or (self._input_over and not self._kept):
                return 0
            found = next_router(self.path, self.wait_seconds, self.attach)
            if found is None:
                return 1
            sock = found

    def _relay(self, sock: socket.socket) -> None:
        """Move lines both ways until the router's side closes. What goes to the router waits in `_unsent` while the
        router is not reading (its calls at their bound), and the bridge reads its replies all the while: a bridge
        blocked sending would leave them unread, and a router whose replies go unread stops reading."""
        from_router = LineFramer(_MOST_REPLY_BYTES, oversize="pass")
        sock.setblocking(False)
        # First that this bridge pauses when the router stops, then what the last router, stopping, left to this one.
        self._unsent, self._kept = bytearray(PAUSES_LINE) + self._kept, bytearray()
        self.open, self._kept_open = self._kept_open, {}
        self._stopping = self._paused = False
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        poller.register(1, 0)  # its errors alone: the agent closed its end of stdout
        reading_agent = False
        while True:
            wanted = not self._input_over and len(self._kept if self._stopping else self._unsent) < _MOST_UNSENT
            if wanted != reading_agent:  # the agent waits while the router has not taken what it sent
                if wanted:
                    poller.register(0, select.POLLIN)
                else:
                    poller.unregister(0)
                reading_agent = wanted
            poller.modify(sock, select.POLLIN | (select.POLLOUT if self._unsent else 0))
            for fd, _ in poller.poll():
                if fd == 1:  # nobody reads the replies: the session is over, its calls cancelled with it
                    self._input_over = self._gone = True
                    return
                if fd == 0:
                    self._from_agent_read()
                elif not self._from_router_read(sock, from_router):
                    return
            self._send_some(sock)

    def _from_agent_read(self) -> None:
        """Take what the agent wrote, for the router; at its end, the note that no more requests come."""
        try:
            chunk = os.read(0, _CHUNK)
        except OSError:
            chunk = b""
        to, opened = (self._kept, self._kept_open) if self._stopping else (self._unsent, self.open)
        if not chunk:
            self._input_over = True  # the calls in flight finish and reply; the router then closes
            to += INPUT_ENDED_LINE
            return
        for item in self._from_agent.feed(chunk):
            if isinstance(item, Oversize):
                to += item.data  # passed on in pieces as it comes: the router refuses it
            elif item.startswith(NOTE_HEAD):
                to += b" " + item  # the agent's, not a note of the bridge's: the router answers it as a line
            else:
                if (call_id := request_id(item)) is not None:
                    opened[call_id] = None
                to += item

    def _send_some(self, sock: socket.socket) -> None:
        """Send what the router will take now of what waits for it; the paused note after the last of it, when the
        router is stopping."""
        if self._stopping and not self._paused and not self._unsent:
            self._unsent += PAUSED_LINE
            self._paused = True
        if not self._unsent:
            return
        try:
            sent = sock.send(self._unsent)
        except BlockingIOError:
            return
        except OSError:  # the router is gone: what it missed is answered as open once its socket has closed
            self._unsent.clear()
            return
        del self._unsent[:sent]

    def _from_router_read(self, sock: socket.socket, framer: LineFramer) -> bool:
        """Write the router's whole lines to the agent and take in its notes; False once the socket closed."""
        try:
            data = sock.recv(_CHUNK)
        except BlockingIOError:
            return True
        except OSError:
            data = b""
        if not data:
            return False
        out = []
        for item in framer.feed(data):
            if isinstance(item, Oversize):
                out.append(item.data)
            elif item.startswith(NOTE_HEAD):
                self._heard(item)
            else:
                if (call_id := reply_id(item)) is not None:
                    self.open.pop(call_id, None)
                out.append(item)
        write_out(b"".join(out))
        return True

    def _heard(self, line: bytes) -> None:
        if (note := read_note(line)) is not None:
            self.record = note.record or self.record
            self._ended = self._ended or note.ended
            self._stopping = self._stopping or note.stopping


def reply_id(line: bytes) -> int | str | None:
    """The id of the request `line` answers, or None if it answers none (a notification, a request of the
    router's). The router's own replies begin alike, so their id is read from the head alone."""
    if line.startswith(_REPLY_HEAD):
        end = line.find(b',"', len(_REPLY_HEAD))  # a string id holds no bare quote: the first ," ends it
        if line.startswith((b',"result":', b',"error":'), end):
            with contextlib.suppress(orjson.JSONDecodeError):
                return call_id(orjson.loads(line[len(_REPLY_HEAD):end]))
        return None
    try:
        msg: Any = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if isinstance(msg, dict) and "method" not in msg and ("result" in msg or "error" in msg):
        return call_id(msg.get("id"))
    return None
