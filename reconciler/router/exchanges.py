"""What the router sends back on one HTTP request of the MCP transport: a JSON body, or an SSE stream.

`streamable` makes an `Exchange` for each POSTed request and marks it current (`CURRENT`) while the session handles
the request. A context variable is copied into the task a `tools/call` runs in, so whatever the session writes for
that request — notifications, then its one reply — lands in its exchange, with no change to what a session is
(`sessions.Session` writes lines, as on a socket). `answer` then sends the exchange: JSON when the reply comes first
and soon, else an SSE stream that carries each message as it comes, with keep-alive comments while a long call runs
(so a proxy's idle timeout does not cut it), ending with the reply. A session's GET stream is an exchange too, with
no reply, keeping its last events for a client that lost it (`keep`, `stream_session`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from contextvars import ContextVar
from typing import Any, Final

import orjson

__all__ = ["CURRENT", "Exchange", "Receive", "Scope", "Send", "answer", "resume", "send_body", "send_json_error",
           "stream_session"]

# ASGI, as the specification of that interface names its parts (the web room's server runs it).
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_REPLY: Final = b'{"jsonrpc":"2.0","id":'  # how every reply a session writes begins (wire.messages)
_RETRY: Final = b"retry: 100\n\n"  # a stream ended for polling: resume at once (the SDK waits 1 s without it)
# A stream cut off otherwise (its router stopped): resume after 2 s, time for a router restarted to be back, which
# then answers a call the restart cut off (`streamable`); the SDKs try twice, a second or so apart, without it.
_RESUME_AFTER: Final = b"retry: 2000\n"
_SSE_HEADERS: Final = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache, no-transform"),
                       (b"x-accel-buffering", b"no")]


class Exchange:
    """The messages written for one request: notifications as they come, then the reply.

    An exchange with a `stream_id` is resumable: its stream's events carry ids (`<stream_id>/<n>`), `log` keeps
    them, and a client that loses the stream does not close it: what still comes is kept for a GET with
    `Last-Event-ID` (`resume`). A session's GET stream (`keep`) has no reply: each message becomes an event as it
    comes, and only its last `keep` events are kept (`dropped` counts the others)."""

    def __init__(self, stream_id: str | None = None, keep: int | None = None) -> None:
        self.notes: list[bytes] = []
        self.reply: bytes | None = None
        self.closed = False  # the client went away (or the session ended): what still comes is dropped
        self.stream_id = stream_id
        self.keep = keep
        self.log: list[bytes] = []  # the stream's events kept, the reply's last once it came
        self.dropped = 0  # events before `log`'s first, no longer kept (a GET stream past `keep`)
        self.delivered = False  # the reply went out whole on some connection: nothing is left to resume
        self.replied = False  # the reply is in `log`, the stream's last event
        self.connections = 0  # connections that sent its stream so far: the last one sends, an older one stops
        self._arrived = asyncio.Event()

    def put(self, data: bytes) -> None:
        if self.closed:
            return
        if self.keep is not None:  # a session's GET stream, which carries no response (the specification's rule)
            if not data.startswith(_REPLY):
                self._append(self._event(data))
                self._arrived.set()
            return
        if data.startswith(_REPLY):
            self.reply = data
        else:
            self.notes.append(data)
        self._arrived.set()

    def close(self) -> None:
        """The client or the session is gone: stop, and wake whoever waits."""
        self.closed = True
        self._arrived.set()

    def wake(self) -> None:
        self._arrived.set()

    async def wait(self, seconds: float | None) -> None:
        """Until something arrives (or `seconds` pass)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._arrived.wait()
        self._arrived.clear()

    def take_notes(self) -> list[bytes]:
        notes, self.notes = self.notes, []
        return notes

    def record(self) -> None:
        """Move what arrived into `log` as events, the reply last."""
        for note in self.take_notes():
            self._append(self._event(note))
        if self.reply is not None and not self.replied:
            self._append(self._event(self.reply))
            self.replied = True

    def prime(self) -> None:
        """An event with an id and no data (2025-11-25): a client resumes from it before any message came, after the
        pause it names (`retry`)."""
        self._append(self._event(b"", _RESUME_AFTER))

    @property
    def count(self) -> int:
        """The stream's events so far, kept or dropped: the number of its last."""
        return self.dropped + len(self.log)

    def after(self, seen: int) -> bytes | None:
        """The stream's events after its `seen`-th, as sent; None when some of them are no longer kept."""
        return None if seen < self.dropped else b"".join(self.log[seen - self.dropped:])

    def _append(self, event: bytes) -> None:
        self.log.append(event)
        if self.keep is not None and len(self.log) > self.keep:
            self.dropped += len(self.log) - self.keep
            del self.log[:len(self.log) - self.keep]

    def _event(self, message: bytes, fields: bytes = b"") -> bytes:
        if self.stream_id is None:
            return fields + b"event: message\n" + _data(message)
        return b"id: %s/%d\n%sevent: message\n%s" % (self.stream_id.encode(), self.count + 1, fields, _data(message))

    def resumes_after(self, last_event_id: str) -> int | None:
        """The number of the event a client that saw `last_event_id` saw last; None when it is not this stream's,
        or when events after it are no longer kept."""
        stream, _, seen = last_event_id.strip().rpartition("/")
        if stream != self.stream_id or not (seen.isascii() and seen.isdigit()) \
                or not self.dropped <= int(seen) <= self.count:
            return None
        return int(seen)


CURRENT: ContextVar[Exchange | None] = ContextVar("handler_http_exchange", default=None)


def error_code(reply: bytes) -> int | None:
    """The JSON-RPC error code of `reply`, None for a result. A string id holds no unescaped `"`, so the first
    `,"result":` or `,"error":` after the id is the member's."""
    error, result = reply.find(b',"error":', len(_REPLY)), reply.find(b',"result":', len(_REPLY))
    if error == -1 or -1 < result < error:
        return None
    code = orjson.loads(reply).get("error", {}).get("code")
    return code if isinstance(code, int) else None


async def answer(exchange: Exchange, receive: Receive, send: Send, *, stream: bool, stream_after: float,
                 keepalive: float, status_of: Callable[[int | None], int], headers: Mapping[str, str],
                 on_gone: Callable[[], None], poll_after: float | None = None, prime: bool = False) -> None:
    """Send the exchange's reply as JSON, or as an SSE stream once a notification comes or the call runs past
    `stream_after` (when the client accepts one: `stream`). `on_gone` runs when the client disconnects first.
    `poll_after`: a resumable stream still open this long is ended after an event the client resumes from.
    `prime`: a resumable stream opens with an event with an id and no data (2025-11-25), so a client that loses
    it before any message came can still resume it."""
    if exchange.reply is not None and not exchange.notes:  # answered inline (ping, tools/list): nothing to watch
        exchange.delivered = True
        await send_body(send, status_of(error_code(exchange.reply)), exchange.reply,
                        {**headers, "content-type": "application/json"})
        return
    watcher = asyncio.create_task(_watch_disconnect(receive, exchange, on_gone))
    try:
        if exchange.reply is None and not exchange.notes:
            await exchange.wait(stream_after if stream else None)
        while not stream and exchange.reply is None and not exchange.closed:
            exchange.notes.clear()  # no stream to carry them: a JSON answer is the reply alone
            await exchange.wait(None)
        if exchange.closed or watcher.done():
            return
        if exchange.reply is not None and not exchange.notes:
            exchange.delivered = True
            await send_body(send, status_of(error_code(exchange.reply)), exchange.reply,
                            {**headers, "content-type": "application/json"})
            return
        if prime and exchange.stream_id is not None and not exchange.log:
            exchange.prime()
        await _stream(exchange, send, keepalive, headers, watcher, 0, poll_after)
    finally:
        watcher.cancel()


async def resume(exchange: Exchange, after: int, receive: Receive, send: Send, keepalive: float,
                 headers: Mapping[str, str], poll_after: float | None = None) -> None:
    """A GET with `Last-Event-ID`: the events of `exchange`'s stream after the `after`-th, then the rest of it."""
    watcher = asyncio.create_task(_watch_disconnect(receive, exchange, lambda: None))
    try:
        await _stream(exchange, send, keepalive, headers, watcher, after, poll_after)
    finally:
        watcher.cancel()


async def _stream(exchange: Exchange, send: Send, keepalive: float, headers: Mapping[str, str],
                  gone: asyncio.Task[None], sent: int, poll_after: float | None, opening: bytes = b"") -> None:
    """Send the stream's events after its `sent`-th, as they come (after `opening`, a comment), until the reply
    went out, the client left (`gone`), a newer connection took the stream over, or (`poll_after`) the stream was
    ended for the client to resume. A connection that fell behind what is kept ends: its client's resume is told."""
    await send({"type": "http.response.start", "status": 200,
                "headers": [*_SSE_HEADERS, *((k.encode(), v.encode()) for k, v in headers.items())]})
    loop = asyncio.get_running_loop()
    until = None if poll_after is None else loop.time() + poll_after
    exchange.connections += 1
    mine = exchange.connections
    last_sent = loop.time()
    exchange.wake()  # a connection the client gave up on, not yet seen gone, stops sending
    while not exchange.closed and not gone.done() and exchange.connections == mine:
        exchange.record()
        events, sent = exchange.after(sent), exchange.count
        if events is None:
            await send({"type": "http.response.body", "body": opening, "more_body": False})
            return
        events, opening = opening + events, b""
        if exchange.replied:
            await send({"type": "http.response.body", "body": events, "more_body": False})
            exchange.delivered = True
            return
        if until is not None and loop.time() >= until:
            if not exchange.log:
                exchange.prime()
                events += exchange.log[-1]
            await send({"type": "http.response.body", "body": events + _RETRY, "more_body": False})
            return
        if events or loop.time() - last_sent >= keepalive:  # a wake with nothing new sends nothing
            await send({"type": "http.response.body", "body": events or b": keep-alive\n\n", "more_body": True})
            last_sent = loop.time()
        await exchange.wait(keepalive if until is None else min(keepalive, max(until - loop.time(), 0.0)))


async def stream_session(exchange: Exchange, after: int, receive: Receive, send: Send, keepalive: float,
                         headers: Mapping[str, str]) -> None:
    """A session's GET stream (an exchange that `keep`s its events): what its session writes outside any request,
    from the event after the `after`-th (a GET with `Last-Event-ID`; 0 opens it), until the client leaves, the
    session ends (`exchange.closed`) or a newer connection takes the stream over."""
    watcher = asyncio.create_task(_watch_disconnect(receive, exchange, lambda: None))
    try:
        await _stream(exchange, send, keepalive, headers, watcher, after, None, b": stream open\n\n")
        if not watcher.done():
            with contextlib.suppress(OSError):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        watcher.cancel()


async def _watch_disconnect(receive: Receive, exchange: Exchange, on_gone: Callable[[], None]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    if exchange.stream_id is None:
        exchange.close()
    else:  # the sender stops; what still comes is kept for the client's GET with Last-Event-ID
        exchange.wake()
    on_gone()


def _data(message: bytes) -> bytes:
    return b"data: " + message.rstrip(b"\n") + b"\n\n"


async def send_body(send: Send, status: int, body: bytes, headers: Mapping[str, str]) -> None:
    pairs = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    pairs.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": pairs})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json_error(send: Send, status: int, code: int, message: str, msg_id: int | str | None = None,
                          headers: Mapping[str, str] | None = None) -> None:
    """A refusal as the JSON-RPC error clients read, with the HTTP status the transport names for it."""
    body = orjson.dumps({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}})
    await send_body(send, status, body, {**(headers or {}), "content-type": "application/json"})
