"""What a client that asked for progress hears while its call runs (docs/architecture.md §2, step 7).

A client that gives a `progressToken` in its `tools/call` `_meta` hears, under that token, the connector's own
`notifications/progress` for the call (the connector client gave the connector a token of its own and maps it
back: `relay`). Where the connector sends none, the router sends its own once the call has run
`FIRST_BEAT_SECONDS`, then every `BEAT_SECONDS`: a count that goes up and a message saying the call is still
running, often enough that a client resetting its timeout on progress (the TypeScript SDK's
`resetTimeoutOnProgress`) waits for the call up to the interface's `timeoutSeconds`. A connector that reports
progress is left to report it: the router's count would break the order of its numbers. A client that gave no
token hears nothing, and nothing is sent once the call has ended.

The session (`sessions`) makes one for each call that asks, inside the call's task; every message is written in
that task's context, so over Streamable HTTP it reaches that request's stream (`exchanges`), whoever sends it.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Mapping
from typing import Any, Final

from reconciler.wire.messages import encode_notification

__all__ = ["BEAT_SECONDS", "FIRST_BEAT_SECONDS", "Progress"]

FIRST_BEAT_SECONDS: Final = 5.0  # a call shorter than this hears nothing from the router
MAX_MESSAGE_CHARS: Final = 500  # of a connector's progress message: a line may hold megabytes
BEAT_SECONDS: Final = 15.0  # well inside the 60 s the TypeScript SDK waits between two messages by default


class Progress:
    """The progress of one call for the client that asked, under its token; `end` once the call has replied."""

    def __init__(self, token: str | int, write: Callable[[bytes], None]) -> None:
        self.token = token
        self._write = write
        self._every = BEAT_SECONDS
        self._loop = asyncio.get_running_loop()
        self._context = contextvars.copy_context()  # the call's task's: an HTTP request's exchange among it
        self._started = self._loop.time()
        self._beats = 0
        self._relayed = False
        self._ended = False
        self._timer = self._loop.call_later(FIRST_BEAT_SECONDS, self._beat, context=self._context)

    @classmethod
    def asked(cls, params: Mapping[str, Any] | None, write: Callable[[bytes], None]) -> Progress | None:
        """The progress of a `tools/call` with these params, None when they carry no `_meta.progressToken`."""
        meta = params.get("_meta") if params else None
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        if isinstance(token, str | int) and not isinstance(token, bool):
            return cls(token, write)
        return None

    def relay(self, params: Mapping[str, Any]) -> None:
        """The connector's progress for this call, passed on under the client's token (one without a number as its
        `progress` is dropped, as the protocol requires one)."""
        progress = params.get("progress")
        if self._ended or not _is_number(progress):
            return
        self._relayed = True
        note: dict[str, Any] = {"progressToken": self.token, "progress": progress}
        if _is_number(params.get("total")):
            note["total"] = params["total"]
        if isinstance(params.get("message"), str):  # the connector's words, which the client shows: kept short
            message = params["message"]
            note["message"] = message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS] + "…"
        # Written on the loop's next turn, in the call's context: this runs in the connector's stream's callbacks.
        # The call's reply, read after it on that stream, reaches the task later still, so the order holds.
        self._loop.call_soon(self._send, note, context=self._context)

    def end(self) -> None:
        """The call has replied: nothing more is sent."""
        self._ended = True
        self._timer.cancel()

    def _beat(self) -> None:
        if self._ended or self._relayed:
            return
        self._beats += 1
        seconds = self._loop.time() - self._started
        self._send({"progressToken": self.token, "progress": self._beats,
                    "message": f"the call is still running ({seconds:.0f} s so far)"})
        self._timer = self._loop.call_later(self._every, self._beat, context=self._context)

    def _send(self, params: dict[str, Any]) -> None:
        if not self._ended:
            self._write(encode_notification("notifications/progress", params))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
