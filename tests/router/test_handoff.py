"""The bridge hands the agent's stdio to the router, and falls back to relaying lines when it cannot.

Every test runs the installed `handler-service` as a real subprocess against a real router socket.
"""

from __future__ import annotations

import asyncio
import os
import pty
import signal
import socket
import subprocess
import tty
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from reconciler.router.handoff import attach_line
from reconciler.router.openpage import PAGE_BYTES
from reconciler.router.server import Router
from tests.fixtures.harness import BRIDGE, DEADLINE, log_lines, serving

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


def line(message: dict[str, Any]) -> bytes:
    return orjson.dumps(message) + b"\n"


def call(msg_id: int, tool: str, arguments: dict[str, Any]) -> bytes:
    params = {"name": tool, "arguments": arguments}
    return line({"jsonrpc": "2.0", "id": msg_id, "method": "tools/call", "params": params})


async def start_bridge(run_dir: Path, stdin: Any = subprocess.PIPE, *options: str,
                       **env: str) -> asyncio.subprocess.Process:
    """`handler-service` asked to hand its stdio over (`--handover`), unless `options` say `--relay`."""
    return await asyncio.create_subprocess_exec(
        BRIDGE, "echo", "--profile", "tester", "--handover", *options, stdin=stdin, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env={"HANDLER_RUN_DIR": str(run_dir), **env})


async def read_reply(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    assert proc.stdout is not None
    got = await asyncio.wait_for(proc.stdout.readline(), DEADLINE)
    assert got, "the agent's stdout ended"
    reply: dict[str, Any] = orjson.loads(got)
    return reply


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(DEADLINE):
        while not condition():
            await asyncio.sleep(0.01)


def held_by_bridge(pid: int) -> list[str]:
    """Where the bridge's fds 0 and 1 point."""
    return [str(Path(f"/proc/{pid}/fd/{fd}").readlink()) for fd in (0, 1)]


def on_both_loops(scenario: Callable[[], Any]) -> None:
    """Run the scenario on uvloop (as `handler serve` runs) and on asyncio's own loop: their pipes differ."""
    import uvloop

    for runner in (uvloop.run, asyncio.run):
        runner(asyncio.wait_for(scenario(), 60))


def on_uvloop(scenario: Callable[[], Any]) -> Any:
    import uvloop

    return uvloop.run(asyncio.wait_for(scenario(), 60))


def test_the_bridge_hands_the_agents_stdio_to_the_router(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            proc = await start_bridge(run_dir, HANDLER_INSTANCE="run-7")
            assert proc.stdin is not None
            assert proc.stdout is not None
            proc.stdin.write(line(INIT) + line({"jsonrpc": "2.0", "method": "notifications/initialized"})
                             + call(2, "echo_say", {"text": "hi"}))
            assert (await read_reply(proc))["result"]["protocolVersion"] == "2025-11-25"
            assert (await read_reply(proc))["result"]["structuredContent"] == {"text": "hi"}
            # The router reads and writes the agent's pipes itself; the bridge keeps its own copies, to answer for
            # the session and hand it over again should the router go away (test_restart).
            assert all(fd.startswith(("pipe:", "socket:")) for fd in held_by_bridge(proc.pid))
            assert log_lines(router)[-1]["instance"] == "run-7"
            proc.stdin.close()  # the agent is done: the session ends, the router closes, the bridge exits
            assert await asyncio.wait_for(proc.stdout.read(), DEADLINE) == b""
            assert await asyncio.wait_for(proc.wait(), DEADLINE) == 0
            await until(lambda: not router.connections)

    on_both_loops(scenario)


def test_calls_in_flight_still_reply_after_the_agent_closes_stdin(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> bytes:
        async with serving(echo_root, run_dir):
            proc = await start_bridge(run_dir)
            out, _ = await asyncio.wait_for(proc.communicate(
                line(INIT) + call(2, "echo_misbehave", {"mode": "sleep", "seconds": 0.3})), DEADLINE)
            assert proc.returncode == 0
            return out

    replies = [orjson.loads(reply) for reply in on_uvloop(scenario).splitlines()]
    assert [r["id"] for r in replies] == [1, 2]
    assert replies[1]["result"]["structuredContent"] == {"text": "slept"}


def test_when_the_bridge_dies_the_session_ends_and_the_agent_sees_the_end(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            proc = await start_bridge(run_dir)
            assert proc.stdin is not None
            assert proc.stdout is not None
            proc.stdin.write(line(INIT) + call(2, "echo_misbehave", {"mode": "sleep", "seconds": 30}))
            await read_reply(proc)
            await until(lambda: bool(router.connections))
            proc.send_signal(signal.SIGKILL)
            await asyncio.wait_for(proc.wait(), DEADLINE)
            # The router let go of the agent's stdout (no reply is coming) and cancelled the call.
            assert await asyncio.wait_for(proc.stdout.read(), DEADLINE) == b""
            await until(lambda: not router.connections)
            await until(lambda: any(entry.get("tool") == "echo_misbehave" for entry in log_lines(router)))
            assert log_lines(router)[-1]["outcome"] == "cancelled"

    on_both_loops(scenario)


def test_an_agent_that_stops_reading_ends_its_session(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            proc = await start_bridge(run_dir)
            assert proc.stdin is not None
            proc.stdin.write(line(INIT))
            await read_reply(proc)
            proc._transport.get_pipe_transport(1).close()  # type: ignore[attr-defined]  # the agent's read end
            proc.stdin.write(call(2, "echo_say", {"text": "into the void"}))
            assert await asyncio.wait_for(proc.wait(), DEADLINE) == 0
            await until(lambda: not router.connections)

    on_uvloop(scenario)


def test_an_oversize_line_from_an_attached_agent_is_refused_and_the_session_lives_on(echo_root: Path,
                                                                                      run_dir: Path) -> None:
    async def scenario() -> None:
        async with serving(echo_root, run_dir, max_line_bytes=1024):
            proc = await start_bridge(run_dir)
            assert proc.stdin is not None
            proc.stdin.write(line(INIT) + b'{"pad":"' + b"x" * 3000 + b'"}\n' + call(2, "echo_say", {"text": "ok"}))
            assert (await read_reply(proc))["id"] == 1
            refused = await read_reply(proc)
            assert refused["error"]["code"] == -32600
            assert refused["error"]["data"] == {"maxLineBytes": 1024}
            assert (await read_reply(proc))["result"]["structuredContent"] == {"text": "ok"}
            proc.stdin.close()
            assert await asyncio.wait_for(proc.wait(), DEADLINE) == 0

    on_uvloop(scenario)


def test_the_bridge_relays_lines_when_stdin_is_a_file(echo_root: Path, run_dir: Path, tmp_path: Path) -> None:
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(line(INIT) + call(2, "echo_say", {"text": "from a file"}))

    async def scenario() -> tuple[bytes, list[dict[str, Any]]]:
        async with serving(echo_root, run_dir) as router:
            with requests.open("rb") as stdin:
                proc = await start_bridge(run_dir, stdin=stdin, HANDLER_INSTANCE="run-9")
                out, err = await asyncio.wait_for(proc.communicate(), DEADLINE)
            assert proc.returncode == 0, err
            return out, log_lines(router)

    out, log = on_uvloop(scenario)
    replies = [orjson.loads(reply) for reply in out.splitlines()]
    assert [r["id"] for r in replies] == [1, 2]
    assert replies[1]["result"]["structuredContent"] == {"text": "from a file"}
    assert log[-1]["instance"] == "run-9"  # the relay tags each request with the agent's instance


def test_a_relaying_bridge_answers_the_call_in_flight_once_and_goes_on_with_the_next_router(
        echo_root: Path, run_dir: Path) -> None:
    """A terminal as stdin cannot be handed over: the bridge relays. The router goes away under a call: the bridge
    answers that call once, waits for the next router, and the session goes on there, without `initialize`."""
    async def scenario() -> None:
        controller, terminal = pty.openpty()
        tty.setraw(terminal)
        try:
            async with serving(echo_root, run_dir) as router:
                proc = await start_bridge(run_dir, stdin=terminal)
                os.write(controller, line(INIT) + line({"jsonrpc": "2.0", "method": "notifications/initialized"}))
                assert (await read_reply(proc))["id"] == 1
                os.write(controller, call(2, "echo_misbehave", {"mode": "sleep", "seconds": 30}))
                assert held_by_bridge(proc.pid)[0].startswith("/dev/pts/")
                await asyncio.sleep(1)  # the call reaches the connector
                await router.aclose()
                cut = await read_reply(proc)
            assert cut["id"] == 2
            assert "the router restarted while this call was running" in cut["error"]["message"]
            async with serving(echo_root, run_dir):
                os.write(controller, call(3, "echo_say", {"text": "again"}))
                again = await read_reply(proc)
                assert again["id"] == 3
                assert again["result"]["structuredContent"] == {"text": "again"}
            assert proc.stderr is not None
            proc.kill()
            said = (await proc.stderr.read()).decode()
            assert proc.stdout is not None
            await proc.stdout.read()  # to its end, and the process reaped: the loop closes with no pipe of it open
            await proc.wait()
            assert "handler-service: the router is back; the session goes on" in said
        finally:
            os.close(controller)
            os.close(terminal)

    on_uvloop(scenario)


@pytest.mark.parametrize("kind", ["file", "one-socket", "run-id", "unsealed-page", "none", "relay-with-fds"])
def test_a_handoff_the_router_cannot_take_is_refused_and_the_connection_carries_lines(
        echo_root: Path, run_dir: Path, tmp_path: Path, kind: str) -> None:
    """Also a handoff binding a run id the store cannot hold ("run-id"): a handed-over session's run ids are bound for
    its whole life, so they are checked once, at the handoff. And a page of open calls its sender could shrink under
    the router's mapping ("unsealed-page"), which would kill the router with SIGBUS at its next write."""
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    meta = {"handler/interface": "echo"}
    if kind == "run-id":
        meta["handler/instance"] = "run\x00one"

    async def scenario(router: Router) -> None:
        with socket.socket(socket.AF_UNIX) as sock, plain.open("rb") as reading, plain.open("wb") as writing:
            sock.connect(str(router.socket_path("tester")))
            sock.settimeout(DEADLINE)
            loop = asyncio.get_running_loop()
            both, other = socket.socketpair()
            unsealed = os.memfd_create("page")
            os.ftruncate(unsealed, PAGE_BYTES)
            fds = {"file": [reading.fileno(), writing.fileno()], "one-socket": [both.fileno()] * 2,
                   "run-id": [other.fileno(), both.fileno()],
                   "unsealed-page": [other.fileno(), both.fileno(), unsealed],
                   "relay-with-fds": [other.fileno()]}.get(kind, [])
            attach = attach_line(meta, relay=kind == "relay-with-fds")
            await loop.run_in_executor(None, socket.send_fds, sock, [attach], fds)
            answer = orjson.loads(await loop.run_in_executor(None, recv_line, sock))
            if kind == "relay-with-fds":  # the router closed the copy it was sent: its peer sees the end
                other.close()
                both.settimeout(DEADLINE)
                assert await loop.run_in_executor(None, both.recv, 1) == b""
            both.close()
            other.close()
            os.close(unsealed)
            if kind == "file":
                assert answer == {"handler/attached": False, "message": "the agent's stdin is not a pipe or a socket"}
            elif kind == "one-socket":
                assert answer["handler/attached"] is False
                assert "one socket" in answer["message"]
            elif kind == "run-id":
                assert answer == {"handler/attached": False, "message": "the attach line's handler/instance holds a "
                                  "control character; an agent run's id is printable text"}
            elif kind == "unsealed-page":
                assert answer["handler/attached"] is False
                assert "sealed against shrinking and growing" in answer["message"]
            elif kind == "relay-with-fds":
                assert answer == {"handler/attached": False,
                                  "message": "a relaying bridge sends no descriptor with its attach line"}
            else:  # no descriptors and no relay: neither a handoff nor a relayed session
                assert answer["handler/attached"] is False
                assert "not 0; a bridge that relays the session's lines says" in answer["message"]
            await loop.run_in_executor(None, sock.sendall, line({"jsonrpc": "2.0", "id": 5, "method": "ping"}))
            assert orjson.loads(await loop.run_in_executor(None, recv_line, sock))["id"] == 5

    async def outer() -> None:
        async with serving(echo_root, run_dir) as router:
            await scenario(router)

    on_uvloop(outer)


def recv_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(1)
        assert chunk, "the router closed the connection"
        data += chunk
    return data


def test_one_socket_as_both_stdin_and_stdout_is_relayed(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        agent, server = socket.socketpair()
        with agent, server:
            async with serving(echo_root, run_dir):
                proc = await asyncio.create_subprocess_exec(
                    BRIDGE, "echo", "--profile", "tester", "--handover", stdin=server, stdout=server,
                    env={"HANDLER_RUN_DIR": str(run_dir)})
                agent.settimeout(DEADLINE)
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(None, agent.sendall, line(INIT) + call(2, "echo_say", {"text": "one"}))
                first = orjson.loads(await loop.run_in_executor(None, recv_line, agent))
                second = orjson.loads(await loop.run_in_executor(None, recv_line, agent))
                assert [first["id"], second["id"]] == [1, 2]
                assert second["result"]["structuredContent"] == {"text": "one"}
                assert held_by_bridge(proc.pid)[0].startswith("socket:")  # it kept the socket: it relays
                agent.shutdown(socket.SHUT_WR)
                assert await asyncio.wait_for(proc.wait(), DEADLINE) == 0

    on_uvloop(scenario)


def test_relay_can_be_asked_for(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            proc = await start_bridge(run_dir, subprocess.PIPE, "--relay", HANDLER_INSTANCE="run-r")
            assert proc.stdin is not None
            proc.stdin.write(line(INIT) + call(2, "echo_say", {"text": "relayed"}))
            assert (await read_reply(proc))["id"] == 1
            assert (await read_reply(proc))["result"]["structuredContent"] == {"text": "relayed"}
            assert held_by_bridge(proc.pid)[0].startswith(("pipe:", "socket:"))  # it kept its stdio
            assert log_lines(router)[-1]["instance"] == "run-r"  # tagged on each request instead
            proc.stdin.close()
            assert await asyncio.wait_for(proc.wait(), DEADLINE) == 0

    on_uvloop(scenario)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_bridge_gone_while_the_router_takes_its_pipes_leaves_none_of_them_open(
        echo_root: Path, run_dir: Path, loop: str) -> None:
    """The bridge hands over the agent's pipes and dies at once: whichever step the router is at, it lets go of
    both, so the agent's stdout ends and nothing of the handoff is left to close later (a descriptor closed
    after its number was reused closes someone else's file)."""
    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            for _ in range(20):
                agent_in, router_in = os.pipe()[::-1]  # the router reads the agent's stdin from router_in
                router_out, agent_out = os.pipe()[::-1]  # ... and writes its stdout to router_out
                with socket.socket(socket.AF_UNIX) as sock:
                    sock.connect(str(router.socket_path("tester")))
                    socket.send_fds(sock, [attach_line({"handler/interface": "echo"})], [router_in, router_out])
                os.close(router_in)
                os.close(router_out)
                await until(lambda: not router.connections)
                os.set_blocking(agent_out, False)
                async with asyncio.timeout(DEADLINE):
                    while True:  # the agent's stdout ends once the router closed its end: EOF, not EAGAIN
                        try:
                            assert os.read(agent_out, 1) == b"", "the router wrote to an agent whose bridge is gone"
                            break
                        except BlockingIOError:
                            await asyncio.sleep(0.01)
                os.close(agent_out)
                os.close(agent_in)

    on_uvloop(scenario) if loop == "uvloop" else asyncio.run(asyncio.wait_for(scenario(), 60))
