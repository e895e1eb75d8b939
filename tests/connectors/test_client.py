"""The stdio MCP client to a connector process: multiplexed calls, crashes, restarts, cancellation."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from reconciler.connectors.client import ConnectorProcess, LaunchSpec, _connect_unlinked
from reconciler.connectors.errors import (
    ConnectorCrashedError,
    ConnectorOutputTooLargeError,
    ConnectorReplyError,
    ConnectorStartError,
)
from tests.fixtures.echo_tree import CONNECTOR
from tests.fixtures.harness import run, short_dir


def spec(**extra: object) -> LaunchSpec:
    env = {"PATH": os.environ.get("PATH", ""), "ECHO_TOKEN": "t"}
    return LaunchSpec(name="echo-test", command=(sys.executable, str(CONNECTOR)), cwd=str(CONNECTOR.parent),
                      env=env, **extra)  # type: ignore[arg-type]


def test_concurrent_calls_share_one_process_and_match_their_replies() -> None:
    async def scenario() -> None:
        conn = ConnectorProcess(spec())
        try:
            slow = asyncio.create_task(conn.call_tool("echo_misbehave", {"mode": "sleep", "seconds": 0.3}))
            fast = [conn.call_tool("echo_say", {"text": str(n)}) for n in range(20)]
            results = await asyncio.gather(*fast)
            assert [r["structuredContent"]["text"] for r in results] == [str(n) for n in range(20)]
            assert not slow.done()
            assert (await slow)["structuredContent"] == {"text": "slept"}
            assert conn.server_info == {"name": "echo", "version": "1"}
        finally:
            await conn.stop()

    run(scenario())


def test_a_crash_fails_every_pending_call_and_the_next_call_restarts() -> None:
    async def scenario() -> None:
        conn = ConnectorProcess(spec())
        try:
            await conn.ensure_started()
            first_pid = conn.pid
            waiting = [asyncio.create_task(conn.call_tool("echo_misbehave", {"mode": "sleep", "seconds": 5}))
                       for _ in range(3)]
            await asyncio.sleep(0)
            with pytest.raises(ConnectorCrashedError):
                await conn.call_tool("echo_misbehave", {"mode": "die"})
            for task in waiting:
                with pytest.raises(ConnectorCrashedError):
                    await task
            again = await conn.call_tool("echo_say", {"text": "back"})
            assert again["structuredContent"] == {"text": "back"}
            assert conn.pid != first_pid
        finally:
            await conn.stop()

    run(scenario())


def test_a_jsonrpc_error_reply_is_a_reply_error() -> None:
    async def scenario() -> None:
        conn = ConnectorProcess(spec())
        try:
            with pytest.raises(ConnectorReplyError) as raised:
                await conn.call_tool("echo_misbehave", {"mode": "rpc_error"})
            assert raised.value.code == -32603
            assert raised.value.cause == "connector_error"
        finally:
            await conn.stop()

    run(scenario())


def test_a_cancelled_call_frees_its_slot_and_the_process_lives_on() -> None:
    async def scenario() -> None:
        conn = ConnectorProcess(spec())
        try:
            task = asyncio.create_task(conn.call_tool("echo_misbehave", {"mode": "sleep", "seconds": 5}))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert (await conn.call_tool("echo_say", {"text": "ok"}))["structuredContent"] == {"text": "ok"}
            assert conn.in_flight == 0
        finally:
            await conn.stop()

    run(scenario())


def test_a_command_that_cannot_start_is_a_start_error(tmp_path: Path) -> None:
    async def scenario() -> None:
        bad = LaunchSpec(name="ghost", command=(str(tmp_path / "no-such-program"),), cwd=str(tmp_path), env={})
        with pytest.raises(ConnectorStartError, match="could not start"):
            await ConnectorProcess(bad).call_tool("x", {})
        silent = LaunchSpec(name="mute", command=(sys.executable, "-c", "import sys; sys.stdin.read()"),
                            cwd=str(tmp_path), env={}, start_timeout=0.3)
        with pytest.raises(ConnectorStartError, match="did not answer initialize"):
            await ConnectorProcess(silent).call_tool("x", {})
        quits = LaunchSpec(name="quits", command=(sys.executable, "-c", "pass"), cwd=str(tmp_path), env={})
        with pytest.raises(ConnectorStartError, match="failed its handshake"):
            await ConnectorProcess(quits).call_tool("x", {})

    run(scenario())


def _slow_start(seconds: float, **extra: object) -> LaunchSpec:
    """The echo connector, which first spends `seconds` before it reads its input (a model loading)."""
    line = (f"import runpy, sys, time; time.sleep({seconds}); sys.argv = [{str(CONNECTOR)!r}]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    return dataclasses.replace(spec(**extra), command=(sys.executable, "-c", line))


def test_a_start_gets_the_seconds_its_connector_declares() -> None:
    async def scenario() -> None:
        with pytest.raises(ConnectorStartError, match=r"did not answer initialize within 0\.5 s"):
            await ConnectorProcess(_slow_start(2, start_timeout=0.5)).ensure_started()
        conn = ConnectorProcess(_slow_start(1, start_timeout=10))
        try:
            assert (await conn.call_tool("echo_say", {"text": "loaded"}))["structuredContent"] == {"text": "loaded"}
        finally:
            await conn.stop()

    run(scenario())


def test_a_stop_gives_up_a_long_start_at_once_and_its_waiting_call_is_told_why() -> None:
    async def scenario() -> None:
        conn = ConnectorProcess(_slow_start(300, start_timeout=600))
        waiting = asyncio.create_task(conn.call_tool("echo_say", {"text": "x"}))
        for _ in range(500):
            if conn.pid is not None:
                break
            await asyncio.sleep(0.01)
        pid = conn.pid
        assert pid is not None
        await asyncio.wait_for(conn.stop(grace=0.2), 10)  # not the 300 s the process would take to answer
        with pytest.raises(ConnectorStartError, match="stopped as it started"):
            await waiting
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    run(scenario())


def test_a_stop_while_the_process_spawns_closes_its_pipes_so_it_exits_on_its_own() -> None:
    """The stop lands in the spawn itself (a parked spare handing the process over): the process the spawn made
    is told to end by the end of its stdin, as after any start, rather than left to the kill after the grace."""
    spawned, release = threading.Event(), threading.Event()
    made: list[subprocess.Popen[bytes]] = []

    def slow_handoff(command: object, cwd: str, env: dict[str, str], pipes: bool) -> subprocess.Popen[bytes]:
        popen = subprocess.Popen([sys.executable, str(CONNECTOR)], cwd=cwd, env=env, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        made.append(popen)
        spawned.set()
        release.wait(30)
        return popen

    async def scenario() -> None:
        conn = ConnectorProcess(spec(handoff=slow_handoff))
        waiting = asyncio.create_task(conn.call_tool("echo_say", {"text": "x"}))
        assert await asyncio.to_thread(spawned.wait, 10)
        stopping = asyncio.create_task(conn.stop(grace=60))
        starting = conn._starting
        assert starting is not None
        for _ in range(1000):  # until the stop has given the start up; the spawn is still under way
            if starting.cancelling():
                break
            await asyncio.sleep(0.01)
        assert starting.cancelling()
        release.set()
        try:
            await asyncio.wait_for(stopping, 30)  # the old code waited out the 60 s grace, then killed it
        finally:
            for popen in made:  # so a failure here is a failure, not a hang on a process nothing ends
                if popen.poll() is None:
                    popen.kill()
        with pytest.raises(ConnectorStartError, match="stopped as it started"):
            await waiting

    run(scenario())
    (popen,) = made
    assert popen.returncode == 0  # it ended on its own at the end of its input, not by the kill (-9)
    assert popen.stdin is None or popen.stdin.closed
    assert popen.stdout is None or popen.stdout.closed


_CHATTY = """
import json, sys
for raw in sys.stdin:
    msg = json.loads(raw)
    if "id" not in msg:
        continue
    print("hello, I am not JSON; the token is " + sys.argv[1], flush=True)
    if msg["method"] == "initialize":
        result = {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "chatty"}}
    elif msg["params"]["arguments"].get("big"):
        result = {"content": [], "structuredContent": {"text": "z" * 5000}}
    else:
        result = {"content": [], "structuredContent": {"text": "ok"}}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
"""


def _chatty(tmp_path: Path) -> LaunchSpec:
    script = tmp_path / "chatty.py"
    script.write_text(_CHATTY)
    return LaunchSpec(name="chatty", command=(sys.executable, str(script), "s3cret"), cwd=str(tmp_path), env={},
                      start_timeout=5, max_line_bytes=1000, mask=lambda text: text.replace("s3cret", "***"))


def test_a_line_that_is_not_json_is_logged_masked_and_skipped(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        conn = ConnectorProcess(_chatty(tmp_path))
        try:
            for _ in range(3):
                assert (await conn.call_tool("x", {}))["structuredContent"] == {"text": "ok"}
            assert conn.running
        finally:
            await conn.stop()

    run(scenario())
    skipped = [r.getMessage() for r in caplog.records if "not JSON" in r.getMessage()]
    assert skipped, "the stray line was not logged"
    assert all("the token is ***" in m and "s3cret" not in m for m in skipped)


def test_a_stream_of_lines_that_are_not_json_is_logged_only_at_first(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        conn = ConnectorProcess(_chatty(tmp_path))
        try:
            for _ in range(40):  # 41 stray lines, the handshake's too
                assert (await conn.call_tool("x", {}))["structuredContent"] == {"text": "ok"}
        finally:
            await conn.stop()

    run(scenario())
    skipped = [r.getMessage() for r in caplog.records if "not JSON" in r.getMessage()]
    assert len(skipped) == 20
    assert skipped[-1].endswith("further such lines of this process are skipped without a word")


_PINGER = """
import json, sys
for raw in sys.stdin:
    msg = json.loads(raw)
    if "id" not in msg or "method" not in msg:  # a notification, or an answer to one of its pings
        continue
    if msg["method"] == "initialize":
        result = {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "pinger"}}
    else:  # before it answers, 300,000 requests of its own, reading none of the answers
        for start in range(0, 300_000, 10_000):
            sys.stdout.write("".join('{"jsonrpc":"2.0","id":%d,"method":"ping"}\\n' % n
                                     for n in range(start, start + 10_000)))
        result = {"content": [], "structuredContent": {"text": "ok"}}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
"""


def test_a_connector_flooding_requests_without_reading_the_answers_is_not_answered_past_a_bound(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    script = tmp_path / "pinger.py"
    script.write_text(_PINGER)
    spec = LaunchSpec(name="pinger", command=(sys.executable, str(script)), cwd=str(tmp_path), env={},
                      start_timeout=5)

    async def scenario() -> None:
        conn = ConnectorProcess(spec)
        try:
            assert (await conn.call_tool("x", {}))["structuredContent"] == {"text": "ok"}
            assert (await conn.call_tool("x", {}))["structuredContent"] == {"text": "ok"}
        finally:
            await conn.stop()

    run(scenario())
    warned = [r.getMessage() for r in caplog.records if "does not read the answers" in r.getMessage()]
    assert len(warned) == 1, warned  # once a process, not once a request
    assert "connector of binding 'pinger' sends requests" in warned[0]


def test_a_reply_over_the_line_limit_fails_its_own_call_and_the_process_lives_on(tmp_path: Path) -> None:
    async def scenario() -> None:
        conn = ConnectorProcess(_chatty(tmp_path))
        try:
            assert (await conn.call_tool("x", {}))["structuredContent"] == {"text": "ok"}
            pid = conn.pid
            with pytest.raises(ConnectorOutputTooLargeError, match="over 1000 bytes") as raised:
                await conn.call_tool("x", {"big": True})
            assert raised.value.cause == "output_too_large"
            assert (await conn.call_tool("x", {}))["structuredContent"] == {"text": "ok"}
            assert conn.pid == pid  # the same process: nothing was restarted
        finally:
            await conn.stop()

    run(scenario())


def test_a_connectors_socket_is_reached_only_as_itself_never_through_a_link() -> None:
    """A connector owns the folder of its socket: a link put there to another socket of this machine is refused."""
    async def scenario(folder: Path) -> tuple[bool, str]:
        accepted = asyncio.Event()
        def met(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.set()
            writer.close()

        server = await asyncio.start_unix_server(met, path=str(folder / "other.sock"))
        (folder / "mcp.sock").symlink_to(folder / "other.sock")
        loop = asyncio.get_running_loop()
        try:
            await _connect_unlinked(loop, asyncio.Protocol(), str(folder / "mcp.sock"))
            refused = ""
        except ConnectionRefusedError as exc:
            refused = str(exc)
        transport = await _connect_unlinked(loop, asyncio.Protocol(), str(folder / "other.sock"))  # itself: fine
        await asyncio.wait_for(accepted.wait(), 5)
        transport.close()
        server.close()
        await server.wait_closed()
        return accepted.is_set(), refused

    with short_dir() as folder:
        reached, refused = asyncio.run(scenario(folder))
    assert reached
    assert refused.endswith("mcp.sock is not a socket")


_LEAVES_A_CHILD = """
import json, os, sys, time
from pathlib import Path
first = not Path(sys.argv[1]).exists()
Path(sys.argv[1]).touch()
for raw in sys.stdin:
    msg = json.loads(raw)
    if "id" not in msg:
        continue
    if msg["method"] == "initialize":
        result = {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "forks"}}
    elif first:  # exits, leaving a process in a session of its own that holds its stdout
        if os.fork() == 0:
            os.setsid()
            Path(sys.argv[2]).write_text(str(os.getpid()))
            time.sleep(60)
            os._exit(0)
        while not Path(sys.argv[2]).exists():
            time.sleep(0.01)
        os._exit(7)
    else:
        result = {"content": [], "structuredContent": {"text": "ok"}}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
"""


def test_a_process_that_exits_while_a_child_holds_its_output_is_restarted(tmp_path: Path) -> None:
    script, ran, child = tmp_path / "forks.py", tmp_path / "ran", tmp_path / "child.pid"
    script.write_text(_LEAVES_A_CHILD)
    forks = LaunchSpec(name="forks", command=(sys.executable, str(script), str(ran), str(child)), cwd=str(tmp_path),
                       env={}, start_timeout=5)

    async def scenario() -> None:
        conn = ConnectorProcess(forks)
        try:
            with pytest.raises(ConnectorCrashedError, match="exited"):
                await asyncio.wait_for(conn.call_tool("any", {}), 10)  # the old code waited for the child's end
            assert not conn.running
            assert (await conn.call_tool("any", {}))["structuredContent"] == {"text": "ok"}
        finally:
            await conn.stop()

    try:
        run(scenario())
    finally:
        if child.exists():
            os.kill(int(child.read_text()), 9)
