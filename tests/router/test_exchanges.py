"""One request's answer over HTTP (`reconciler/router/exchanges.py`): JSON when the reply comes first, an SSE stream
carrying each notification, keep-alives while a long call runs and the reply last otherwise, and a client that
leaves is noticed. Driven through the ASGI callables a server would hand it."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

from reconciler.router.exchanges import Exchange, answer

REPLY = b'{"jsonrpc":"2.0","id":7,"result":{"content":[]}}\n'
ERROR = b'{"jsonrpc":"2.0","id":"a,\\"result\\":","error":{"code":-32601,"message":"no"}}\n'
NOTE = b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":50}}\n'


class Wire:
    """What a server's `receive` and `send` would be: a client that never disconnects unless told to."""

    def __init__(self) -> None:
        self.sent: list[MutableMapping[str, Any]] = []
        self.gone = asyncio.Event()

    async def receive(self) -> MutableMapping[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: MutableMapping[str, Any]) -> None:
        self.sent.append(message)

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0]["headers"])


async def run(exchange: Exchange, wire: Wire, *, stream: bool = True, after: float = 5.0,
              keepalive: float = 15.0, gone: list[str] | None = None) -> None:
    await answer(exchange, wire.receive, wire.send, stream=stream, stream_after=after, keepalive=keepalive,
                 status_of=lambda code: 404 if code == -32601 else 200, headers={},
                 on_gone=lambda: None if gone is None else gone.append("gone"))


def test_a_reply_that_comes_first_is_json_with_the_status_of_its_error_code() -> None:
    async def scenario() -> None:
        wire, exchange = Wire(), Exchange()
        exchange.put(ERROR)  # an id holding what looks like a member name does not fool the code's reading
        await run(exchange, wire)
        assert wire.sent[0]["status"] == 404
        assert wire.headers[b"content-type"] == b"application/json"
        assert wire.body == ERROR

        wire, exchange = Wire(), Exchange()
        asyncio.get_running_loop().call_later(0.05, exchange.put, REPLY)
        await run(exchange, wire)
        assert (wire.sent[0]["status"], wire.body) == (200, REPLY)

    asyncio.run(scenario())


def test_a_notification_opens_a_stream_that_carries_it_then_the_reply() -> None:
    async def scenario() -> None:
        wire, exchange = Wire(), Exchange()
        loop = asyncio.get_running_loop()
        loop.call_later(0.02, exchange.put, NOTE)
        loop.call_later(0.1, exchange.put, REPLY)
        await run(exchange, wire)
        assert wire.headers[b"content-type"] == b"text/event-stream"
        assert wire.body == b"event: message\ndata: " + NOTE.strip() + b"\n\nevent: message\ndata: " + REPLY.strip() \
            + b"\n\n"
        assert wire.sent[-1]["more_body"] is False

    asyncio.run(scenario())


def test_a_long_call_streams_keep_alives_and_a_client_without_sse_gets_json() -> None:
    async def scenario() -> None:
        wire, exchange = Wire(), Exchange()
        asyncio.get_running_loop().call_later(0.3, exchange.put, REPLY)
        await run(exchange, wire, after=0.05, keepalive=0.05)
        assert wire.body.count(b": keep-alive\n\n") >= 2
        assert wire.body.endswith(b"data: " + REPLY.strip() + b"\n\n")

        wire, exchange = Wire(), Exchange()
        loop = asyncio.get_running_loop()
        loop.call_later(0.02, exchange.put, NOTE)
        loop.call_later(0.1, exchange.put, REPLY)
        await run(exchange, wire, stream=False)
        assert (wire.headers[b"content-type"], wire.body) == (b"application/json", REPLY)

    asyncio.run(scenario())


def test_a_client_that_leaves_is_noticed_and_sent_nothing() -> None:
    async def scenario() -> None:
        wire, exchange, gone = Wire(), Exchange(), []
        asyncio.get_running_loop().call_later(0.05, wire.gone.set)
        await run(exchange, wire, gone=gone)
        assert gone == ["gone"]
        assert wire.sent == []
        exchange.put(REPLY)  # the call's late reply goes nowhere
        assert exchange.reply is None

    asyncio.run(scenario())
