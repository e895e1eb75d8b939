"""What the router sends back on one HTTP request of the MCP transport: a JSON body, or an SSE stream.

`streamable` makes an `Exchange` for each POSTed request (and one for a session's GET stream) and marks it
current (`CURRENT`) while the session handles the request. A context variable is copied into the task a
`tools/call` runs in, so whatever the session writes for that request — notifications, then its one reply —
lands in its exchange, with no change to what a session is (`sessions.Session` writes lines, as on a socket).
`answer` then sends the exchange: JSON when the reply comes first and soon, else an SSE stream that carries
each message as it comes, with keep-alive comments while a long call runs (so a proxy's idle timeout does not
cut it), ending with the reply.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from contextvars import ContextVar
from typing import Any, Final

import orjson

__all__ = ["CURRENT", "Exchange", "Receive", "Scope", "Send", "answer", "send_body", "send_json_error",
           "stream_session"]

# ASGI, as the specification of that interface names its parts (the web room's server runs it).
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_REPLY: Final = b'{"jsonrpc":"2.0","id":'  # how every reply a session writes begins (wire.messages)
_SSE_HEADERS: Final = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache, no-transform"),
                       (b"x-accel-buffering", b"no")]


class Exchange:
    """The messages written for one request: notifications as they come, then the reply."""

    def __init__(self) -> None:
        self.notes: list[bytes] = []
        self.reply: bytes | None = None
        self.closed = False  # the client went away: what still comes is dropped
        self._arrived = asyncio.Event()

    def put(self, data: bytes) -> None:
        if self.closed:
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

    async def wait(self, seconds: float | None) -> None:
        """Until something arrives (or `seconds` pass)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._arrived.wait()
        self._arrived.clear()

    def take_notes(self) -> list[bytes]:
        notes, self.notes = self.notes, []
        return notes


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
                 on_gone: Callable[[], None]) -> None:
    """Send the exchange's reply as JSON, or as an SSE stream once a notification comes or the call runs past
    `stream_after` (when the client accepts one: `stream`). `on_gone` runs when the client disconnects first."""
    if exchange.reply is not None and not exchange.notes:  # answered inline (ping, tools/list): nothing to watch
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
        if exchange.closed:
            return
        if exchange.reply is not None and not exchange.notes:
            await send_body(send, status_of(error_code(exchange.reply)), exchange.reply,
                            {**headers, "content-type": "application/json"})
            return
        await _stream(exchange, send, keepalive, headers)
    finally:
        watcher.cancel()


async def _stream(exchange: Exchange, send: Send, keepalive: float, headers: Mapping[str, str]) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [*_SSE_HEADERS, *((k.encode(), v.encode()) for k, v in headers.items())]})
    while not exchange.closed:
        events = b"".join(_event(note) for note in exchange.take_notes())
        if exchange.reply is not None:
            await send({"type": "http.response.body", "body": events + _event(exchange.reply), "more_body": False})
            return
        await send({"type": "http.response.body", "body": events or b": keep-alive\n\n", "more_body": True})
        await exchange.wait(keepalive)


async def stream_session(exchange: Exchange, receive: Receive, send: Send, keepalive: float,
                         headers: Mapping[str, str]) -> None:
    """A session's GET stream: what its session writes outside any request, until the client or the session
    ends it (`exchange.closed`)."""
    watcher = asyncio.create_task(_watch_disconnect(receive, exchange, lambda: None))
    try:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*_SSE_HEADERS, *((k.encode(), v.encode()) for k, v in headers.items())]})
        await send({"type": "http.response.body", "body": b": stream open\n\n", "more_body": True})
        while not exchange.closed:
            await exchange.wait(keepalive)
            events = b"".join(_event(note) for note in exchange.take_notes())
            await send({"type": "http.response.body", "body": events or b": keep-alive\n\n", "more_body": True})
        with contextlib.suppress(OSError):
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        watcher.cancel()


async def _watch_disconnect(receive: Receive, exchange: Exchange, on_gone: Callable[[], None]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    exchange.close()
    on_gone()


def _event(message: bytes) -> bytes:
    return b"event: message\ndata: " + message.rstrip(b"\n") + b"\n\n"


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
