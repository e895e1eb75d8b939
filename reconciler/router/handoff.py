"""The bridge's handoff of an agent's stdio to the router: the few bytes both sides must agree on.

When the agent's stdin and stdout are pipes or sockets, `handler-service` does not relay them: it
sends the router both file descriptors (SCM_RIGHTS) with one line, `{"handler/attach": {meta}}`,
where meta holds the `_meta` keys the bridge would otherwise add to every request. The router
answers `{"handler/attached": true}` and from then on reads requests from the agent's stdin and
writes replies to its stdout itself, so each message crosses one process fewer. The socket stays
open as the session's lifeline: the router closes it when the session ends, and the bridge's exit
(or death) ends the session. A router that refuses the handoff answers `{"handler/attached":
false, "message": ...}` and the connection carries relayed lines as usual.

The bridge keeps its own copies of both descriptors, so the session can outlive its router. With stdin and
stdout it sends a third descriptor, the page the router keeps the session's open calls on (`openpage`:
shared memory, written without a system call, read by the bridge only once its router is gone). Over the
lifeline the router tells the bridge the rest it needs to hand the session over again (docs/router.md
"Restarts"): the session's signed record once the session has settled (`{"handler/session": id}`, the
record `resumption` makes for Streamable HTTP too) and, when the session is over rather than the
router going away, `{"handler/ended": true}`. A bridge whose lifeline closes without that line
re-attaches to the next router with the record beside its meta (`{"handler/attach": {meta},
"handler/session": id}`), and the router resumes the session without a new `initialize`.

A bridge that relays (`relaying`) sends the same line with `"handler/relay": true` and no descriptor: the
socket then carries the session's lines both ways, the router's notes to the bridge among them, and the bridge's
`{"handler/inputEnded": true}` when the agent closed its stdin (the calls in flight then finish and reply). The
socket closing is the bridge gone, as a lifeline's: the session ends and its calls are cancelled.

A router that is stopping (docs/router.md "Stopping") lets the calls in flight finish before it goes. It reads no
more of a handed-over agent's stdin: what the agent sends next waits in the pipe for the next router. It tells a
relaying bridge `{"handler/stopping": true}`; the bridge keeps what the agent sends next for the next router and
answers `{"handler/paused": true}` after the last line it sent, and the router reads up to that note. A bridge says
it will with `{"handler/pauses": true}`, its first line to each router; the router reads no further from a bridge
that has not said so (one of an earlier version), which answers what it sent unread as cut off by a restart.
"""

from __future__ import annotations

import stat
from collections.abc import Mapping
from typing import Final, NamedTuple

import orjson

from reconciler.wire.meta import ATTACH, ATTACHED, ENDED, INPUT_ENDED, PAUSED, PAUSES, RELAY, SESSION, STOPPING

__all__ = [
    "ACCEPTED",
    "ATTACH_HEAD",
    "ENDED_LINE",
    "INPUT_ENDED_LINE",
    "NOTE_HEAD",
    "PAUSED_LINE",
    "PAUSES_LINE",
    "STDIO_PRINCIPAL",
    "STOPPING_LINE",
    "Attach",
    "Note",
    "attach_line",
    "is_stream_fd",
    "parse_attach",
    "read_note",
    "refused_line",
    "session_line",
]

ATTACH_HEAD: Final = b'{"' + ATTACH.encode() + b'"'  # how an attach line begins (`attach_line` puts it first)
NOTE_HEAD: Final = b'{"handler/'  # how a note between bridge and router begins; a JSON-RPC message never does
INPUT_ENDED_LINE: Final = orjson.dumps({INPUT_ENDED: True}, option=orjson.OPT_APPEND_NEWLINE)
ACCEPTED: Final = orjson.dumps({ATTACHED: True}, option=orjson.OPT_APPEND_NEWLINE)
ENDED_LINE: Final = orjson.dumps({ENDED: True}, option=orjson.OPT_APPEND_NEWLINE)
STOPPING_LINE: Final = orjson.dumps({STOPPING: True}, option=orjson.OPT_APPEND_NEWLINE)
PAUSED_LINE: Final = orjson.dumps({PAUSED: True}, option=orjson.OPT_APPEND_NEWLINE)
PAUSES_LINE: Final = orjson.dumps({PAUSES: True}, option=orjson.OPT_APPEND_NEWLINE)
MAX_ATTACH_BYTES: Final = 64 * 1024
# The principal of a session record made for a handed-over session: the socket is who it is, no credential. No
# credential has an empty name, so a record of an HTTP session is never resumed on a socket, nor one of these over HTTP.
STDIO_PRINCIPAL: Final = ""


class Attach(NamedTuple):
    meta: dict[str, str]
    session: str | None  # the signed record of the session to resume, when the bridge re-attaches
    relay: bool = False  # the bridge relays the session's lines on this socket (`relaying`), sending no descriptor


def attach_line(meta: Mapping[str, str], session: str | None = None, *, relay: bool = False) -> bytes:
    line: dict[str, object] = {ATTACH: dict(meta)}
    if session is not None:
        line[SESSION] = session
    if relay:
        line[RELAY] = True
    return orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)


def parse_attach(data: bytes) -> Attach | None:
    """What an attach line says, or None if `data` is not exactly one well-formed attach line."""
    if not data.endswith(b"\n") or data.count(b"\n") != 1:
        return None
    try:
        msg = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(msg, dict) or not set(msg) <= {ATTACH, SESSION, RELAY} or msg.get(RELAY, True) is not True:
        return None
    meta, session = msg.get(ATTACH), msg.get(SESSION)
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        return None
    if session is not None and not isinstance(session, str):
        return None
    return Attach(meta, session, RELAY in msg)


class Note(NamedTuple):
    """What a note of the router's to its bridge says: the session's record, that the session is over, or that the
    router is stopping."""

    record: str | None
    ended: bool
    stopping: bool = False


def read_note(line: bytes) -> Note | None:
    """The note `line` holds (`{"handler/session": ...}`, `{"handler/ended": true}`, `{"handler/stopping": true}`),
    or None if it holds none."""
    try:
        said = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(said, dict):
        return None
    record = said.get(SESSION)
    return Note(record if isinstance(record, str) else None, said.get(ENDED) is True, said.get(STOPPING) is True)


def session_line(session: str) -> bytes:
    return orjson.dumps({SESSION: session}, option=orjson.OPT_APPEND_NEWLINE)


def refused_line(message: str, *, stopping: bool = False) -> bytes:
    """The router's answer to an attach it does not take: why; `stopping` when only because it is stopping, so the
    bridge waits for the next router instead of giving up."""
    line: dict[str, object] = {ATTACHED: False, "message": message}
    if stopping:
        line[STOPPING] = True
    return orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)


def is_stream_fd(mode: int) -> bool:
    """Whether an fd of this `st_mode` can be handed over: a pipe or a socket, which an event loop can watch."""
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)
