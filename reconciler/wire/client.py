"""The one JSON-RPC line client: requests multiplexed by id over one byte stream.

The connector client speaks it to a connector process (over its pipes or its socket), the
conformance harness and the command-line clients (`handler call`, `handler-llm`) speak it to a profile's socket.
Replies are matched to requests by id, so many calls share one stream. A request may carry a
deadline on the loop's clock: one sweeping timer per client fails the late ones with `TimeoutError`
(no timer per call), and a request given up on — late or cancelled — is reported to the peer with
`notifications/cancelled`, as MCP asks. A request may ask for the peer's progress (`on_progress`): it goes with a
`progressToken`, the request's own id, and each `notifications/progress` the peer sends under that token is
handed to the callback while the request is pending. When the stream ends, every pending request fails. A request
from the peer is answered (`ping`) or refused, unless the peer left more than `MOST_UNREAD_ANSWERS`
bytes of answers unread: a peer that floods requests and never reads cannot grow our memory.

A reply that is not JSON (NaN, a number past a 64-bit float, nesting past the parser's 1024 levels)
fails its own request at once when its id shows at its head, and is never shown; any other line that
is not JSON goes to `bad_line`.

What a failure looks like is the user's choice: a subclass overrides `closed_error`, `reply_error`,
`oversize_error` and `unreadable_error` to raise its own types, and `bad_line`, `oversize_line` and
`answer_request` to treat a peer's misbehaviour its own way.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, Self

import orjson

from reconciler.wire.errors import INTERNAL_ERROR, METHOD_NOT_FOUND, HandlerError, JsonRpcError, LineClosedError
from reconciler.wire.framing import DEFAULT_MAX_LINE_BYTES, HEAD_BYTES, LineFramer, Oversize
from reconciler.wire.messages import encode_error, encode_notification, encode_request, encode_result
from reconciler.wire.versions import LATEST_HANDSHAKE

__all__ = ["MOST_UNREAD_ANSWERS", "SWEEP_SECONDS", "LineClient", "with_progress_token"]

SWEEP_SECONDS: Final = 0.02  # how late past its deadline a request may be failed
MOST_UNREAD_ANSWERS: Final = 1 << 20  # bytes waiting to be written past which the peer's requests go unanswered


_REPLY_ID = re.compile(rb'^\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(\d{1,18})\s*[,}]')


def _reply_id(head: bytes) -> int | None:
    """The integer id at the start of a reply (ours are integers), if it shows there and the line is no request."""
    found = _REPLY_ID.match(head) if b'"method"' not in head else None
    return int(found.group(1)) if found else None


def with_progress_token(params: Mapping[str, Any] | None, token: int | str) -> dict[str, Any]:
    """`params` with `_meta.progressToken` set to `token`, the rest of its `_meta` kept (neither is changed)."""
    meta = (params or {}).get("_meta")
    return {**(params or {}), "_meta": {**(meta if isinstance(meta, dict) else {}), "progressToken": token}}


def _unreadable(exc: orjson.JSONDecodeError) -> str:
    """What keeps a line from parsing, named without quoting it."""
    if exc.msg.startswith("depth limit"):
        return "nested deeper than 1024 levels"
    if exc.msg.startswith("number is infinity"):  # valid JSON, past what a 64-bit float holds (about 1.8e308)
        return "holding a number past a 64-bit float"
    return "that is not JSON"  # NaN and Infinity among others, which Python's json module writes


class LineClient(asyncio.Protocol):
    """A JSON-RPC client on one stream; it is the reading side's protocol, and writes to `writer`.

    For a socket (`duplex=True`) the one transport reads and writes; for a process's pipes, give the
    write pipe with `set_writer` and connect the read pipe to this protocol.
    """

    def __init__(self, name: str = "the peer", *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
                 duplex: bool = False) -> None:
        self.name = name  # says whose stream it is in messages
        self.closed = False
        self._duplex = duplex
        self._framer = LineFramer(max_line_bytes)
        self._reader: asyncio.BaseTransport | None = None
        self._writer: asyncio.WriteTransport | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._deadlines: dict[int, float] = {}  # pending requests that must end by then (the loop's clock)
        self._progress: dict[int, Callable[[Mapping[str, Any]], None]] = {}  # by token: a pending request's id
        self._sweep: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.unanswered = 0  # the peer's requests left unanswered: it was not reading the answers

    @classmethod
    async def connect_unix(cls, path: str | Path, **options: Any) -> Self:
        """A client on a new connection to the unix socket at `path`."""
        loop = asyncio.get_running_loop()
        _, client = await loop.create_unix_connection(lambda: cls(duplex=True, **options), str(path))
        return client

    @property
    def in_flight(self) -> int:
        """How many requests wait for their reply."""
        return len(self._pending)

    @property
    def unsent(self) -> int:
        """Bytes written to the stream that the peer has not taken yet."""
        return self._writer.get_write_buffer_size() if self._writer is not None else 0

    # -- what a subclass may change --------------------------------------------------------------

    def closed_error(self, why: str) -> Exception:
        """The error pending requests fail with when the stream ends or breaks."""
        return LineClosedError(why)

    def reply_error(self, error: JsonRpcError) -> Exception:
        """The error a request fails with when the peer answers it with `error`."""
        return error

    def bad_line(self, line: bytes) -> None:
        """The peer wrote a line that is not JSON: by default the stream is unusable."""
        self.abort(self.closed_error(f"{self.name} wrote a line that is not JSON"))

    def oversize_line(self, head: bytes) -> None:
        """The peer wrote a line over the limit, which was skipped; `head` is its start.

        A reply whose id shows in its start fails only its own request (`oversize_error`), and one to
        a request already given up on is dropped like any late reply; a line whose id cannot be read
        leaves the stream unusable, since the request it answers cannot be told.
        """
        limit = self._framer.max_line_bytes
        msg_id = _reply_id(head)
        if msg_id is None:
            self.abort(self.closed_error(f"{self.name} wrote a message over {limit} bytes"))
            return
        future = self._pending.get(msg_id)
        if future is not None and not future.done():
            future.set_exception(self.oversize_error(f"{self.name} answered with a message over {limit} bytes"))

    def oversize_error(self, why: str) -> Exception:
        """The error a request fails with when its reply is over the line limit."""
        return JsonRpcError(INTERNAL_ERROR, why)

    def unreadable_error(self, why: str) -> Exception:
        """The error a request fails with when its reply does not parse: `why` says how, after "a reply" (`that is
        not JSON`, `nested deeper than 1024 levels`, `holding a number past a 64-bit float`)."""
        return JsonRpcError(INTERNAL_ERROR, f"{self.name} answered with a reply {why}")

    def answer_request(self, msg: Mapping[str, Any]) -> None:
        """A request from the peer: `ping` is answered; this client offers no other feature. None is answered while
        the peer leaves more than `MOST_UNREAD_ANSWERS` bytes unread (counted in `unanswered`)."""
        if self.unsent > MOST_UNREAD_ANSWERS:
            self.unanswered += 1
            return
        msg_id = msg["id"]
        with contextlib.suppress(HandlerError):
            if msg.get("method") == "ping":
                self.send(encode_result(msg_id, {}))
            else:
                self.send(encode_error(msg_id, JsonRpcError(METHOD_NOT_FOUND, "this client offers no client features")))

    # -- the stream ------------------------------------------------------------------------------

    def set_writer(self, transport: asyncio.WriteTransport) -> None:
        self._writer = transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._reader = transport
        if self._duplex:
            self._writer = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        for item in self._framer.feed(data):
            if isinstance(item, Oversize):
                self.oversize_line(item.data)
            else:
                self._on_line(item)

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        # Every reply written before the peer closed has been read by now; what is still pending is lost.
        self._fail_pending(self.closed_error(f"{self.name} closed its output"))
        self.closed = True

    def send(self, data: bytes) -> None:
        writer = self._writer
        if writer is None or self.closed or writer.is_closing():
            raise self.closed_error(f"{self.name} is not connected")
        writer.write(data)

    def close_writer(self) -> None:
        """Close the sending side: the peer reads its end (on a socket, the whole connection closes)."""
        if self._writer is not None and not self._writer.is_closing():
            self._writer.close()

    def abort(self, error: Exception) -> None:
        """Fail every pending request with `error` and close the stream."""
        self._fail_pending(error)
        self.close()

    def close(self) -> None:
        self.closed = True
        for transport in (self._writer, self._reader):
            if transport is not None and not transport.is_closing():
                transport.close()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None

    # -- requests --------------------------------------------------------------------------------

    async def request(self, method: str, params: Mapping[str, Any] | None = None,
                      deadline: float | None = None,
                      on_progress: Callable[[Mapping[str, Any]], None] | None = None) -> dict[str, Any]:
        """Send one request and wait for its result object (`deadline`: the loop's clock). With `on_progress`, the
        request carries a `progressToken` (its id) and the peer's progress notifications under it go there."""
        msg_id = next(self._ids)
        loop = self._loop or self._bind_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._pending[msg_id] = future
        if on_progress is not None:
            params = with_progress_token(params, msg_id)
            self._progress[msg_id] = on_progress
        if deadline is not None:
            self._deadlines[msg_id] = deadline
            if self._sweep is None:
                self._sweep = loop.call_later(SWEEP_SECONDS, self._expire_late)
        try:
            self.send(encode_request(msg_id, method, params))
            return await future
        except (asyncio.CancelledError, TimeoutError):
            # The caller gave up (its deadline or a cancellation): tell the peer to stop working on it.
            with contextlib.suppress(HandlerError):
                self.send(encode_notification("notifications/cancelled",
                                              {"requestId": msg_id, "reason": "cancelled by the client"}))
            raise
        finally:
            self._pending.pop(msg_id, None)
            self._deadlines.pop(msg_id, None)
            self._progress.pop(msg_id, None)

    def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        self.send(encode_notification(method, params))

    async def initialize(self, client_info: Mapping[str, Any], *, meta: Mapping[str, Any] | None = None,
                         deadline: float | None = None) -> dict[str, Any]:
        """The MCP handshake of the initialize era; the server's `initialize` result."""
        params: dict[str, Any] = {"protocolVersion": LATEST_HANDSHAKE, "capabilities": {},
                                  "clientInfo": dict(client_info)}
        if meta:
            params["_meta"] = dict(meta)
        result = await self.request("initialize", params, deadline)
        self.notify("notifications/initialized")
        return result

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        return self._loop

    def _on_line(self, line: bytes) -> None:
        try:
            msg = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            msg_id = _reply_id(line[:HEAD_BYTES])
            if msg_id is not None:  # a reply: it fails its request, or is dropped as any late reply
                future = self._pending.get(msg_id)
                if future is not None and not future.done():
                    future.set_exception(self.unreadable_error(_unreadable(exc)))
            elif line.strip():
                self.bad_line(line)
            return
        if not isinstance(msg, dict):
            return
        if "method" in msg:
            if "id" in msg:
                self.answer_request(msg)
            elif msg["method"] == "notifications/progress":
                self._on_progress(msg.get("params"))
            return
        msg_id = msg.get("id")
        future = self._pending.get(msg_id) if type(msg_id) is int else None
        if future is None or future.done():
            return  # a reply to a request already given up on
        self._progress.pop(msg_id, None)  # type: ignore[arg-type]  # an int, as its future was found; answered:
        # progress read after the reply, in this same read, is no one's
        result = msg.get("result")
        if "error" in msg:
            future.set_exception(self.reply_error(JsonRpcError.from_wire(msg["error"])))
        elif isinstance(result, dict):
            future.set_result(result)
        else:
            future.set_exception(self.reply_error(JsonRpcError(INTERNAL_ERROR, "the reply holds no result object")))

    def _on_progress(self, params: Any) -> None:
        """A progress notification: to its request's callback, when its token is a pending request's that asked."""
        token = params.get("progressToken") if isinstance(params, dict) else None
        callback = self._progress.get(token) if type(token) is int else None
        if callback is not None:
            callback(params)

    def _expire_late(self) -> None:
        """Fail the requests whose deadline passed; sweep again while requests with a deadline wait."""
        self._sweep = None
        loop = self._loop or asyncio.get_running_loop()
        now = loop.time()
        for msg_id, deadline in list(self._deadlines.items()):
            future = self._pending.get(msg_id)
            if deadline <= now and future is not None and not future.done():
                future.set_exception(TimeoutError())
        if self._deadlines and not self.closed:
            self._sweep = loop.call_later(SWEEP_SECONDS, self._expire_late)

    def _fail_pending(self, error: Exception) -> None:
        pending, self._pending = self._pending, {}
        self._deadlines, self._progress = {}, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
