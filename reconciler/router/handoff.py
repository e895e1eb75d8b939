"""The bridge's handoff of an agent's stdio to the router: the few bytes both sides must agree on.

When the agent's stdin and stdout are pipes or sockets, `handler-service` does not relay them: it
sends the router both file descriptors (SCM_RIGHTS) with one line, `{"handler/attach": {meta}}`,
where meta holds the `_meta` keys the bridge would otherwise add to every request. The router
answers `{"handler/attached": true}` and from then on reads requests from the agent's stdin and
writes replies to its stdout itself, so each message crosses one process fewer. The socket stays
open as the session's lifeline: the router closes it when the session ends, and the bridge's exit
(or death) ends the session. A router that refuses the handoff answers `{"handler/attached":
false, "message": ...}` and the connection carries relayed lines as usual.
"""

from __future__ import annotations

import stat
from collections.abc import Mapping
from typing import Final

import orjson

from reconciler.wire.meta import ATTACH, ATTACHED

__all__ = ["ACCEPTED", "attach_line", "is_stream_fd", "parse_attach", "refused_line"]

ACCEPTED: Final = orjson.dumps({ATTACHED: True}, option=orjson.OPT_APPEND_NEWLINE)
MAX_ATTACH_BYTES: Final = 64 * 1024


def attach_line(meta: Mapping[str, str]) -> bytes:
    return orjson.dumps({ATTACH: dict(meta)}, option=orjson.OPT_APPEND_NEWLINE)


def parse_attach(data: bytes) -> dict[str, str] | None:
    """The meta of an attach line, or None if `data` is not exactly one well-formed attach line."""
    if not data.endswith(b"\n") or data.count(b"\n") != 1:
        return None
    try:
        msg = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    meta = msg.get(ATTACH) if isinstance(msg, dict) and len(msg) == 1 else None
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        return None
    return meta


def refused_line(message: str) -> bytes:
    return orjson.dumps({ATTACHED: False, "message": message}, option=orjson.OPT_APPEND_NEWLINE)


def is_stream_fd(mode: int) -> bool:
    """Whether an fd of this `st_mode` can be handed over: a pipe or a socket, which an event loop can watch."""
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)
