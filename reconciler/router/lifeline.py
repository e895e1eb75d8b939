"""The bridge's side of a session it handed to the router: the session outlives the router (docs/router.md "Restarts").

`handler-service` keeps its own copies of the agent's stdin and stdout after the handoff, so the agent sees no
end of stream when the router goes away. `Lifeline.follow` reads what the router tells it over the socket
(`handoff`): the session's signed record (the calls in flight are on the bridge's own page, `openpage`). When
the socket closes without the router saying the session is over, the router has gone (a restart, an upgrade, a
crash): each call still open gets one JSON-RPC error naming the restart, the bridge waits for the next router
on the same socket path (at most `wait_seconds`, saying so on its stderr), and hands the session over again
with its record, so the agent's session goes on without a new `initialize`. When no router comes back in time,
each request the agent sent meanwhile gets an error saying so, and the bridge exits.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final, NamedTuple

import orjson

from reconciler.router.handoff import ACCEPTED, MAX_ATTACH_BYTES, attach_line, read_note
from reconciler.router.openpage import clear_page, read_open
from reconciler.wire.errors import INTERNAL_ERROR, JsonRpcError
from reconciler.wire.framing import DEFAULT_MAX_LINE_BYTES, LineFramer, Oversize
from reconciler.wire.messages import encode_error
from reconciler.wire.meta import RETRY, RETRY_LATER
from reconciler.wire.meta import STOPPING as STOPPING_NOTE

__all__ = ["DEFAULT_WAIT_SECONDS", "NOT_ATTACHED_STOPPING", "NOT_CONNECTED_STOPPING", "STOPPING", "Lifeline", "Refusal",
           "answer_restarted", "call_id", "next_router", "read_line", "refusal", "request_id", "write_out"]

DEFAULT_WAIT_SECONDS: Final = 120.0  # enough for an upgrade's restart, short enough not to leave a host hanging
_CHUNK: Final = 1 << 16
_RETRY_PAUSE: Final = 0.1
# What a model does with a call a router that went away left open, over stdio (`RESTARTED`) and over HTTP, where a
# resumed stream may come to another router (`LOST_CALL`, `streamable`).
_WHAT_TO_DO: Final = ("If it was held for approval, its pending result named a request_id: ask handler_status. "
                      "Otherwise call it again if running it twice does no harm; if it would, check its effect first.")
RESTARTED: Final = ("the router restarted while this call was running, so it may or may not have run (and been "
                    f"charged). {_WHAT_TO_DO} This session goes on: the next calls are served as soon as the router "
                    "is back.")
# A call a stopping router refuses (`streamable`: over HTTP, where the router cannot leave a request unread).
STOPPING: Final = ("the router is stopping (a restart or an upgrade), so this call was not run and nothing was "
                   "charged. Call it again in a few seconds, once the router is back; this session goes on.")
# What a router that is stopping answers a connection made meanwhile: a bridge's attach (it waits for the next router),
# and a plain line connection's requests (`transport.Listener`).
NOT_ATTACHED_STOPPING: Final = "the router is stopping (a restart or an upgrade); attach to the next one"
NOT_CONNECTED_STOPPING: Final = ("the router is stopping (a restart or an upgrade) and takes no new connection, so "
                                 "this request was not run and nothing was charged. Connect again in a few seconds, "
                                 "once the router is back.")
LOST_CALL: Final = ("the router that was running this call restarted (or this request reached another router), so its "
                    f"result is lost: it may or may not have run (and been charged). {_WHAT_TO_DO} This session goes "
                    "on.")


class Lifeline:
    """What the bridge keeps of a handed-over session, and its re-attach to the next router."""

    def __init__(self, path: Path, meta: Mapping[str, str], page: int,
                 wait_seconds: float = DEFAULT_WAIT_SECONDS) -> None:
        self.path = path
        self.meta = dict(meta)
        self.page = page  # where the router keeps the calls in flight (`openpage`), read once it is gone
        self.wait_seconds = wait_seconds
        self.record: str | None = None  # the session's signed record, once the router sent it

    def follow(self, sock: socket.socket) -> int:
        """Follow the session through its routers until it is over; the bridge's exit status."""
        while not self._read_until_closed(sock):
            sock.close()
            self._answer_open()
            found = next_router(self.path, self.wait_seconds, self.hand_over)
            if found is None:
                return 1
            sock = found
        sock.close()
        return 0

    def hand_over(self, sock: socket.socket) -> Refusal | None:
        """Hand the session to the router on `sock`: None when it took it, else its refusal."""
        socket.send_fds(sock, [attach_line(self.meta, self.record)], [0, 1, self.page])
        answer = read_line(sock)
        return None if answer == ACCEPTED else refusal(answer)

    def _read_until_closed(self, sock: socket.socket) -> bool:
        """Read the router's lines until the socket closes; True if it said the session is over."""
        framer = LineFramer(MAX_ATTACH_BYTES, oversize="pass")
        with contextlib.suppress(OSError):
            while data := sock.recv(_CHUNK):
                for line in framer.feed(data):
                    if isinstance(line, bytes) and self._heard(line):
                        return True
        return False

    def _heard(self, line: bytes) -> bool:
        """Take in one line of the router's; True if it says the session is over."""
        note = read_note(line)
        if note is None:
            return False
        self.record = note.record or self.record
        return note.ended

    def _answer_open(self) -> None:
        """One error for each call the router left unanswered."""
        with contextlib.suppress(OSError):  # the router wrote the agent's stdout non-blocking: the bridge blocks
            os.set_blocking(1, True)
        open_calls = read_open(self.page)
        clear_page(self.page)  # the next router starts from no open call
        if open_calls is None:
            print("handler-service: the router left more calls open than its page holds; they get no answer",
                  file=sys.stderr, flush=True)
            return
        answer_restarted(open_calls)


def cut_off(call_id: int | str | None, message: str = RESTARTED) -> bytes:
    """The one reply of a request a router that went away left open: -32603, `message` (what happened, what to do),
    `handler/retry: later`."""
    return encode_error(call_id, JsonRpcError(INTERNAL_ERROR, message, {RETRY: RETRY_LATER}))


def answer_restarted(call_ids: Iterable[int | str]) -> None:
    """One error for each of these requests, left open by a router that went away: what happened, what to do."""
    write_out(b"".join(cut_off(call_id) for call_id in call_ids))


class Refusal(NamedTuple):
    """A router's answer that did not take a session: why, and whether only because it is stopping (the next router
    will take it)."""

    message: str
    stopping: bool = False


def next_router(path: Path, wait_seconds: float, attach: Callable[[socket.socket], Refusal | None], *,
                first: bool = False) -> socket.socket | None:
    """The socket of the next router at `path`, the session opened there by `attach` (None: taken, else the
    router's refusal), saying so on stderr; None when none took it within `wait_seconds`. A router that is
    stopping is one to wait past, as is a path where none listens yet. `first`: the session has not begun, the
    router it first reached being one that stops."""
    waiting = "the router is stopping (a restart or an upgrade)" if first else "the router went away"
    print(f"handler-service: {waiting}; waiting up to {wait_seconds:g} s for it to come back at {path}",
          file=sys.stderr, flush=True)
    deadline = time.monotonic() + wait_seconds
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
            refused = attach(sock)
        except OSError:
            refused = Refusal("no router answered", stopping=True)
        if refused is None:
            print(f"handler-service: the router is back; the session {'begins' if first else 'goes on'}",
                  file=sys.stderr, flush=True)
            return sock
        sock.close()
        if not refused.stopping:
            give_up(f"the router did not take the session{'' if first else ' back'}: {refused.message}")
            return None
        if time.monotonic() >= deadline:
            give_up(f"no router came back at {path} within {wait_seconds:g} s")
            return None
        time.sleep(_RETRY_PAUSE)


def give_up(why: str) -> None:
    """Answer what the agent sent while the bridge waited, say why on stderr; the bridge then exits."""
    message = f"{why}; this MCP server has stopped: restart it in your host (or start the router: handler up)"
    write_out(b"".join(encode_error(call_id, JsonRpcError(INTERNAL_ERROR, message, {RETRY: RETRY_LATER}))
                       for call_id in _waiting_requests()))
    print(f"handler-service: {message}", file=sys.stderr, flush=True)


def read_line(sock: socket.socket) -> bytes:
    """One line from the socket, read a byte at a time so nothing after it is taken from what follows."""
    line = bytearray()
    while len(line) <= MAX_ATTACH_BYTES and (byte := sock.recv(1)):
        line += byte
        if byte == b"\n":
            break
    return bytes(line)


def refusal(answer: bytes) -> Refusal:
    """What a router's answer to an attach line that is not `ACCEPTED` says."""
    with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
        said = orjson.loads(answer)
        return Refusal(str(said.get("message") or "no reason given"), said.get(STOPPING_NOTE) is True)
    return Refusal("its answer was not a handoff answer")


def _waiting_requests() -> list[int | str]:
    """The ids of the requests waiting on stdin (what the agent sent since the router went away)."""
    os.set_blocking(0, False)
    framer, ids = LineFramer(DEFAULT_MAX_LINE_BYTES, oversize="pass"), []
    with contextlib.suppress(OSError):
        while chunk := os.read(0, _CHUNK):
            for line in framer.feed(chunk):
                if not isinstance(line, Oversize) and (call_id := request_id(line)) is not None:
                    ids.append(call_id)
    return ids


def request_id(line: bytes) -> int | str | None:
    """The id of the request `line` is, or None if it is none (a notification, a reply, not JSON)."""
    try:
        msg: Any = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return call_id(msg.get("id")) if isinstance(msg, dict) and "method" in msg else None


def call_id(value: object) -> int | str | None:
    """`value` if it can be a JSON-RPC request's id (a string or a number that is no boolean), else None."""
    return value if isinstance(value, int | str) and not isinstance(value, bool) else None


def write_out(data: bytes) -> None:
    """Bytes to the agent's stdout (blocking), whole."""
    if not data:
        return
    with contextlib.suppress(OSError):  # the agent has gone: nobody is left to tell
        view = memoryview(data)
        while view:
            view = view[os.write(1, view):]
