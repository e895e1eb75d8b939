"""The one line client against a real peer on a unix socket: replies matched by id, deadlines, failures."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
import pytest

from reconciler.wire.client import MOST_UNREAD_ANSWERS, LineClient
from reconciler.wire.errors import JsonRpcError, LineClosedError

Peer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _with_peer(peer: Peer, body: Callable[[LineClient, list[dict[str, object]]], Awaitable[None]],
                     max_line_bytes: int = 1 << 20) -> None:
    seen: list[dict[str, object]] = []
    done = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        recording = _Recording(reader, seen)
        try:
            await peer(recording, writer)  # type: ignore[arg-type]
            while await recording.readline():  # hold the line open until the client closes it
                pass
        finally:
            writer.close()
            done.set()

    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        path = Path(folder) / "peer.sock"
        server = await asyncio.start_unix_server(serve, str(path))
        try:
            client = await LineClient.connect_unix(path, name="the peer", max_line_bytes=max_line_bytes)
            try:
                await body(client, seen)
            finally:
                client.close()
            await asyncio.wait_for(done.wait(), 10)
        finally:
            server.close()


class _Recording:
    """A stream reader that also keeps every message it read."""

    def __init__(self, reader: asyncio.StreamReader, seen: list[dict[str, object]]) -> None:
        self._reader, self._seen = reader, seen

    async def readline(self) -> bytes:
        line = await self._reader.readline()
        if line:
            self._seen.append(orjson.loads(line))
        return line


async def _next_request(reader: asyncio.StreamReader) -> dict[str, object]:
    """The next request the client sent, past its notifications (a cancellation, say)."""
    while True:
        message: dict[str, object] = orjson.loads(await reader.readline())
        if "id" in message:
            return message


def _reply(msg_id: object, result: object) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": msg_id, "result": result}) + b"\n"


def test_replies_out_of_order_reach_their_own_requests() -> None:
    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first, second = orjson.loads(await reader.readline()), orjson.loads(await reader.readline())
        writer.write(_reply(second["id"], {"n": 2}) + _reply(first["id"], {"n": 1}))
        await writer.drain()

    async def body(client: LineClient, _seen: list[dict[str, object]]) -> None:
        one, two = await asyncio.gather(client.request("a"), client.request("b"))
        assert (one, two) == ({"n": 1}, {"n": 2})
        assert client.in_flight == 0

    asyncio.run(_with_peer(peer, body))


def test_an_error_reply_is_a_json_rpc_error_and_a_server_ping_is_answered() -> None:
    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = orjson.loads(await reader.readline())
        writer.write(b'{"jsonrpc":"2.0","id":"p1","method":"ping"}\n')
        await writer.drain()
        await reader.readline()  # the client's answer to the ping
        writer.write(orjson.dumps({"jsonrpc": "2.0", "id": request["id"],
                                   "error": {"code": -32602, "message": "no such tool", "data": {"x": 1}}}) + b"\n")
        await writer.drain()

    async def body(client: LineClient, seen: list[dict[str, object]]) -> None:
        with pytest.raises(JsonRpcError) as raised:
            await client.request("tools/call", {"name": "nope"})
        assert (raised.value.code, raised.value.message, raised.value.data) == (-32602, "no such tool", {"x": 1})
        assert {"jsonrpc": "2.0", "id": "p1", "result": {}} in seen

    asyncio.run(_with_peer(peer, body))


def test_a_peer_flooding_requests_it_never_reads_the_answers_of_cannot_grow_the_client() -> None:
    pings = 300_000  # about 13 MB of requests, whose answers would be 11 MB

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = orjson.loads(await reader.readline())
        for start in range(0, pings, 10_000):  # it reads nothing while it writes
            writer.write(b"".join(b'{"jsonrpc":"2.0","id":%d,"method":"ping"}\n' % n
                                  for n in range(start, start + 10_000)))
            await writer.drain()
        writer.write(_reply(request["id"], {"after": "the flood"}))
        await writer.drain()

    read: list[list[dict[str, object]]] = []  # what the peer read, complete once the client has closed

    async def body(client: LineClient, seen: list[dict[str, object]]) -> None:
        assert await client.request("tools/call") == {"after": "the flood"}  # every line of the flood was read
        assert client.unsent <= MOST_UNREAD_ANSWERS + 64
        assert client.unanswered > pings // 2
        read.append(seen)

    asyncio.run(_with_peer(peer, body))
    seen = read[0]
    answered = [m for m in seen if m.get("result") == {}]
    assert 0 < len(answered) < pings // 2  # while it read, it was answered; not once it stopped


def test_a_late_request_times_out_and_the_peer_is_told_it_was_cancelled() -> None:
    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pass  # reads on (in `_with_peer`), never answers

    async def body(client: LineClient, seen: list[dict[str, object]]) -> None:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await client.request("slow", {}, loop.time() + 0.05)
        for _ in range(200):
            if any(m.get("method") == "notifications/cancelled" for m in seen):
                break
            await asyncio.sleep(0.01)
        cancel = next(m for m in seen if m.get("method") == "notifications/cancelled")
        assert cancel["params"]["requestId"] == seen[0]["id"]  # type: ignore[index]
        assert client.in_flight == 0

    asyncio.run(_with_peer(peer, body))


@pytest.mark.parametrize("ending", [b"", b"this is not json\n", b"x" * 2000 + b"\n"])
def test_a_peer_that_closes_or_writes_garbage_fails_what_is_pending(ending: bytes) -> None:
    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(ending)
        await writer.drain()
        writer.close()  # the end of the line: the client sees it, or garbage first

    async def body(client: LineClient, _seen: list[dict[str, object]]) -> None:
        with pytest.raises(LineClosedError):
            await client.request("anything")
        assert client.closed
        with pytest.raises(LineClosedError):
            await client.request("after the end")

    asyncio.run(_with_peer(peer, body, max_line_bytes=1000))


def test_an_oversize_reply_fails_only_its_own_request_and_a_late_one_is_dropped() -> None:
    big = b"z" * 5000

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = await _next_request(reader)  # given up on by the client (its deadline)
        second = await _next_request(reader)  # answered over the limit
        third = await _next_request(reader)  # answered as it should be
        for msg_id in (first["id"], second["id"]):
            writer.write(b'{"jsonrpc":"2.0","id":' + str(msg_id).encode() + b',"result":{"x":"' + big + b'"}}\n')
        writer.write(_reply(third["id"], {"n": 3}))
        await writer.drain()

    async def body(client: LineClient, _seen: list[dict[str, object]]) -> None:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await client.request("first", {}, loop.time() + 0.05)
        second = asyncio.create_task(client.request("second"))
        third = asyncio.create_task(client.request("third"))
        with pytest.raises(JsonRpcError, match="over 1000 bytes"):
            await second
        assert await third == {"n": 3}
        assert not client.closed

    asyncio.run(_with_peer(peer, body, max_line_bytes=1000))


def test_a_reply_that_is_not_json_fails_only_its_own_request_at_once_and_a_late_one_is_dropped() -> None:
    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        late = await _next_request(reader)  # given up on by the client (its deadline)
        nan, huge, deep, fine = [await _next_request(reader) for _ in range(4)]
        for msg_id, value in ((late["id"], b"NaN"), (nan["id"], b"NaN"), (huge["id"], b"1e400"),
                              (deep["id"], b"[" * 1100 + b"]" * 1100)):
            writer.write(b'{"jsonrpc":"2.0","id":%d,"result":{"x":%b}}\n' % (int(str(msg_id)), value))
        writer.write(_reply(fine["id"], {"n": 5}))
        await writer.drain()

    async def body(client: LineClient, _seen: list[dict[str, object]]) -> None:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await client.request("late", {}, loop.time() + 0.05)
        calls = [asyncio.create_task(client.request(name, {}, loop.time() + 30)) for name in ("nan", "huge", "deep")]
        fine = asyncio.create_task(client.request("fine"))
        for call, why in zip(calls, ("that is not JSON", "holding a number past a 64-bit float",
                                     "nested deeper than 1024 levels"), strict=True):
            with pytest.raises(JsonRpcError, match=f"^the peer answered with a reply {why}$"):
                await asyncio.wait_for(call, 5)  # at once, not at the request's deadline
        assert await fine == {"n": 5}
        assert not client.closed

    asyncio.run(_with_peer(peer, body))


def test_a_request_that_asks_for_progress_hears_its_own_and_no_other() -> None:
    """Its token is its id; the peer's progress under another token, or after the reply, reaches no one."""
    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = orjson.loads(await reader.readline())
        token = request["params"]["_meta"]["progressToken"]
        assert request["params"]["_meta"]["kept"] == "yes"  # the request's own _meta is kept beside it
        for params in ({"progressToken": token, "progress": 1, "message": "one"},
                       {"progressToken": token + 1000, "progress": 9},
                       {"progressToken": str(token), "progress": 9},
                       {"progressToken": token, "progress": 2, "total": 2}):
            writer.write(orjson.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": params}) + b"\n")
        writer.write(_reply(request["id"], {"done": True}))
        writer.write(orjson.dumps({"jsonrpc": "2.0", "method": "notifications/progress",
                                   "params": {"progressToken": token, "progress": 3}}) + b"\n")
        other = orjson.loads(await reader.readline())
        assert "_meta" not in (other.get("params") or {})  # a request that did not ask carries no token
        writer.write(_reply(other["id"], {}))
        await writer.drain()

    async def body(client: LineClient, _seen: list[dict[str, object]]) -> None:
        heard: list[object] = []
        assert await client.request("work", {"_meta": {"kept": "yes"}}, on_progress=heard.append) == {"done": True}
        assert await client.request("other", {}) == {}  # the late progress (3) was read by now, and dropped
        assert [(p["progress"], p.get("message"), p.get("total")) for p in heard] == [  # type: ignore[index,attr-defined]
            (1, "one", None), (2, None, 2)]

    asyncio.run(_with_peer(peer, body))
