"""No client can exhaust the router: calls in flight, connections and unfinished lines are bounded."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from reconciler.router.handoff import attach_line
from reconciler.router.hub import ConnectionBounds
from tests.fixtures.flood import flood_lines
from tests.fixtures.harness import DEADLINE, RawClient, run, serving


def _call_line(msg_id: int, seconds: float) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": msg_id, "method": "tools/call", "params": {
        "name": "echo_misbehave", "arguments": {"mode": "sleep", "seconds": seconds}}}) + b"\n"


def test_a_connection_with_its_calls_in_flight_at_the_bound_reads_nothing_more(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> list[object]:
        async with serving(echo_root, run_dir, bounds=ConnectionBounds(max_calls_in_flight=3)) as router:
            client = await RawClient.connect(router.socket_path("tester"))
            # Three slow calls fill the bound; the ping behind them waits until one of them is answered.
            await client.send_bytes(b"".join(_call_line(i, 0.5) for i in (1, 2, 3)))
            await client.send({"jsonrpc": "2.0", "id": "p", "method": "ping"})
            order = [(await client.recv())["id"] for _ in range(4)]
            await client.close()
            return order

    order = run(scenario())
    assert order.index("p") > 0, order  # not answered before a call finished
    assert sorted(order, key=str) == sorted([1, 2, 3, "p"], key=str)


def test_without_the_bound_the_same_ping_is_answered_at_once(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> object:
        async with serving(echo_root, run_dir) as router:
            client = await RawClient.connect(router.socket_path("tester"))
            await client.send_bytes(b"".join(_call_line(i, 0.5) for i in (1, 2, 3)))
            await client.send({"jsonrpc": "2.0", "id": "p", "method": "ping"})
            first = (await client.recv())["id"]
            for _ in range(3):
                await client.recv()
            await client.close()
            return first

    assert run(scenario()) == "p"


def test_a_profile_socket_refuses_a_client_over_its_connection_bound(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with serving(echo_root, run_dir, bounds=ConnectionBounds(max_connections=2)) as router:
            path = router.socket_path("tester")
            first, second = await RawClient.connect(path), await RawClient.connect(path)
            for client in (first, second):
                assert (await client.request("ping"))["result"] == {}
            third = await RawClient.connect(path)
            refused = await third.recv()
            assert refused["error"]["code"] == -32000
            assert "2 connections" in refused["error"]["message"]
            assert await asyncio.wait_for(third.reader.read(), DEADLINE) == b""  # and closed
            await third.close()
            await first.close()
            # Once one is gone, a new client is served (the router sees the close a moment later).
            for _ in range(100):
                fourth = await RawClient.connect(path)
                if await _served(fourth):
                    assert (await fourth.request("ping"))["result"] == {}
                    await fourth.close()
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("no client was served after one of the two closed")
            await second.close()

    run(scenario())


async def _served(client: RawClient) -> bool:
    """Whether the router kept this connection (a refused one gets an error line and its end)."""
    try:
        await client.send({"jsonrpc": "2.0", "id": "probe", "method": "ping"})
        served = "result" in await client.recv()
    except (ConnectionError, AssertionError):
        served = False
    if not served:
        await client.close()
    return served


def test_unfinished_lines_of_all_connections_stay_under_the_budget_and_are_freed_on_close(
        echo_root: Path, run_dir: Path) -> None:
    bounds = ConnectionBounds(max_line_bytes=800, held_bytes=1000)

    async def scenario() -> None:
        async with serving(echo_root, run_dir, bounds=bounds) as router:
            path = router.socket_path("tester")
            holder, latecomer = await RawClient.connect(path), await RawClient.connect(path)
            await holder.send_bytes(b'{"pad":"' + b"x" * 600)  # held: under the budget
            assert (await latecomer.request("ping"))["result"] == {}  # the router has read the first by now
            await latecomer.send_bytes(b'{"pad":"' + b"y" * 600)
            refused = await latecomer.recv()
            assert refused["error"]["code"] == -32600
            assert "too many unfinished" in refused["error"]["message"]
            assert router.line_budget.held <= bounds.held_bytes
            await latecomer.send_bytes(b'"}\n')  # the end of the dropped line is skipped, the session lives on
            assert (await latecomer.request("ping"))["result"] == {}
            await holder.close()
            for _ in range(100):
                if router.line_budget.held == 0:
                    break
                await asyncio.sleep(0.02)
            assert router.line_budget.held == 0
            await latecomer.close()

    run(scenario())


def test_a_closed_connection_is_freed_at_once_not_at_the_next_full_collection(echo_root: Path, run_dir: Path) -> None:
    """A client that connects and leaves over and over: each ended connection is gone when it ends, without waiting
    for the collector (which the router runs rarely: `gc.freeze` and its thresholds)."""
    async def scenario() -> list[bool]:
        gc.disable()
        try:
            async with serving(echo_root, run_dir) as router:
                left = []
                for _ in range(3):
                    client = await RawClient.connect(router.socket_path("tester"))
                    reply = await client.request("tools/call", {"name": "echo_say", "arguments": {"text": "hi"}})
                    assert reply["result"]["isError"] is False
                    (conn,) = router.connections
                    gone = weakref.ref(conn)
                    del conn
                    await client.close()
                    async with asyncio.timeout(DEADLINE):
                        while router.connections:
                            await asyncio.sleep(0.01)
                    for _ in range(5):  # the loop's callbacks of the closed transport run
                        await asyncio.sleep(0)
                    left.append(gone() is None)
                return left
        finally:
            gc.enable()

    assert run(scenario()) == [True, True, True]


def test_a_client_that_never_reads_holds_the_router_to_a_bounded_buffer_and_loses_no_reply(
        echo_root: Path, run_dir: Path) -> None:
    count = 4000  # about 200 KB of requests in one write: each reply (the tool list) is ~90 times its request
    lines = b"".join(orjson.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/list"}) + b"\n" for i in range(count))

    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(router.socket_path("tester")))
            await asyncio.to_thread(sock.sendall, lines)  # and reads nothing yet
            await asyncio.sleep(0.5)
            (conn,) = router.connections
            assert conn.writer is not None
            held = conn.writer.get_write_buffer_size()
            assert held < 1 << 20, held  # answering all 4,000 at once held ~16 MB for this one client
            sock.setblocking(False)
            reader, writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 20)
            async with asyncio.timeout(DEADLINE):
                ids = [orjson.loads(await reader.readline())["id"] for _ in range(count)]
            assert ids == list(range(count))  # every reply, in order, once the client reads
            writer.close()

    run(scenario())


def _on_loop(loop: str, scenario: Callable[[], Any]) -> None:
    import uvloop

    (uvloop.run if loop == "uvloop" else asyncio.run)(asyncio.wait_for(scenario(), 60))


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_client_that_floods_from_its_first_byte_is_paused_on_either_loop(
        echo_root: Path, run_dir: Path, loop: str) -> None:
    """The first read can begin a hold inside connection_made, before the transport reads: uvloop started reading
    after it anyway, and the router read ~30 MB/s of requests it could not answer into its memory."""
    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(str(router.socket_path("tester")))
                sock.setblocking(False)
                sent = await asyncio.to_thread(flood_lines, sock.send, 1.5)
                (conn,) = router.connections
                assert sent < 2 << 20, f"the router took {sent} bytes from a client that reads nothing"
                assert conn.held_bytes < 1 << 20, conn.held_bytes
                assert router.line_budget.held == conn.held_bytes > 0  # what it holds is counted
            await _until(lambda: not router.connections)
            assert router.line_budget.held == 0  # and freed when it goes
            good = await RawClient.connect(router.socket_path("tester"))
            assert (await good.request("ping"))["result"] == {}
            await good.close()

    _on_loop(loop, scenario)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_an_attached_agent_that_floods_from_its_first_byte_is_paused_on_either_loop(
        echo_root: Path, run_dir: Path, loop: str) -> None:
    """The handed-over stdin was known to the connection only once connect_read_pipe returned, after uvloop's first
    reads: a hold begun by them paused nothing."""
    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            router_in, agent_in = os.pipe()
            agent_out, router_out = os.pipe()
            os.set_blocking(agent_in, False)
            flood_lines(lambda data: os.write(agent_in, data), 0.1)  # the agent writes before the bridge hands over
            with socket.socket(socket.AF_UNIX) as lifeline:
                lifeline.connect(str(router.socket_path("tester")))
                socket.send_fds(lifeline, [attach_line({"handler/interface": "echo"})], [router_in, router_out])
                os.close(router_in)
                os.close(router_out)
                try:
                    sent = await asyncio.to_thread(flood_lines, lambda data: os.write(agent_in, data), 1.5)
                    (conn,) = router.connections
                    assert sent < 2 << 20, f"the router took {sent} bytes from an agent that reads nothing"
                    assert conn.held_bytes < 1 << 20, conn.held_bytes
                finally:
                    os.close(agent_in)
                    os.close(agent_out)
            await _until(lambda: not router.connections)
            assert router.line_budget.held == 0

    _on_loop(loop, scenario)


def test_past_the_budget_the_connection_holding_the_most_is_ended_and_the_others_are_served(
        echo_root: Path, run_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A client that reads nothing holds its unsent replies (past the transport's 64 KiB high-water mark, or it
    would not be paused) and lines waiting: counted, and over a budget smaller than that, it is the one ended."""
    async def scenario() -> None:
        async with serving(echo_root, run_dir, bounds=ConnectionBounds(held_bytes=60_000)) as router:
            path = router.socket_path("tester")
            good = await RawClient.connect(path)
            assert (await good.request("ping"))["result"] == {}
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as hog:
                hog.connect(str(path))
                hog.setblocking(False)
                await asyncio.to_thread(flood_lines, hog.send, 0.5)
                await _until(lambda: len(router.connections) == 1)
                assert router.line_budget.held <= 60_000
                assert (await good.request("ping"))["result"] == {}  # the good client lives on
            await good.close()
            await _until(lambda: router.line_budget.held == 0)

    with caplog.at_level(logging.WARNING, logger="handler.router"):
        run(scenario())
    assert "ended the connection holding the most" in caplog.text


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(DEADLINE):
        while not condition():
            await asyncio.sleep(0.01)
