"""The official `mcp` SDK client through the real `handler-service` bridge and the real socket, in each mode."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from reconciler.router.relaying import reply_id
from reconciler.wire.errors import JsonRpcError
from reconciler.wire.messages import encode_error, encode_notification, encode_raw_result, encode_request, encode_result
from tests.fixtures.echo_tree import SKILL
from tests.fixtures.harness import BRIDGE, bridge_params, log_lines, run, sdk_body, serving


@pytest.mark.parametrize(("mode", "era"), [("legacy", "2025-11-25"), ("auto", "2026-07-28"),
                                           ("2026-07-28", "2026-07-28")])
def test_the_sdk_client_lists_and_calls_through_the_bridge(echo_root: Path, run_dir: Path, mode: str, era: str) -> None:
    async def scenario() -> None:
        async with serving(echo_root, run_dir), Client(bridge_params(run_dir, "tester", "echo"), mode=mode) as client:
            assert client.session.protocol_version == era
            listed = await client.list_tools()
            names = [t.name for t in listed.tools]
            assert names == ["echo_say", "echo_token", "echo_read", "echo_write", "echo_misbehave",
                             "handler_status", "handler_decide"]
            # call_tool re-validates structuredContent against the listed outputSchema itself.
            result = await client.call_tool("echo_say", {"text": "hello", "upper": True})
            assert not result.is_error
            assert result.structured_content == {"text": "HELLO"}
            assert result.meta is not None
            assert result.meta["handler/status"] == "executed"
            refused = await client.call_tool("echo_say", {"text": 3})
            assert refused.is_error
            assert refused.structured_content is None
            assert sdk_body(refused)["error"] == "invalid_arguments"

    run(scenario())


def test_the_bridge_serves_only_its_interface_and_the_builtins(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with serving(echo_root, run_dir), Client(bridge_params(run_dir, "tester", "handler"),
                                                       mode="legacy") as client:
            listed = await client.list_tools()
            assert [t.name for t in listed.tools] == ["handler_status", "handler_decide"]
            status = await client.call_tool("handler_status", {"request_id": "nope"})
            assert status.structured_content is not None
            assert status.structured_content["status"] == "unknown"

    run(scenario())


def test_the_agents_instance_reaches_the_router_through_the_bridge(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        params = bridge_params(run_dir, "tester", "echo", HANDLER_INSTANCE="run-42", HANDLER_PARENT_INSTANCE="run-1")
        async with serving(echo_root, run_dir) as router, Client(params, mode="auto") as client:
            await client.call_tool("echo_say", {"text": "who"})
            line = log_lines(router)[-1]
            assert (line["profile"], line["instance"], line["interface"]) == ("tester", "run-42", "echo/v1")

    run(scenario())


@pytest.mark.parametrize("call_id", [7, 0, -3, "req-1", 'a,"result":b', "ü", ""])
def test_a_relaying_bridge_reads_which_request_each_reply_answers(call_id: int | str) -> None:
    """What the relay counts as answered: replies of the router's encoder read from their head, any other
    reply parsed whole; a request or a notification of the router's answers nothing."""
    for line in (encode_result(call_id, {"content": []}), encode_error(call_id, JsonRpcError(-32602, "no")),
                 encode_raw_result(call_id, b'{"tools":[]}'),
                 orjson.dumps({"result": {}, "id": call_id, "jsonrpc": "2.0"}) + b"\n"):
        assert reply_id(line) == call_id, line
    for line in (encode_request(call_id, "sampling/createMessage", {}),
                 encode_notification("notifications/progress", {"progress": 1}),
                 orjson.dumps({"jsonrpc": "2.0", "id": True, "result": {}}) + b"\n", b"not json\n"):
        assert reply_id(line) is None, line


def test_the_bridge_exits_cleanly_when_stdin_closes_after_its_requests(echo_root: Path, run_dir: Path) -> None:
    requests = b"".join(orjson.dumps(m) + b"\n" for m in (
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo_say", "arguments": {"text": "x"}}},
    ))

    async def scenario() -> subprocess.CompletedProcess[bytes]:
        import asyncio

        async with serving(echo_root, run_dir):
            proc = await asyncio.create_subprocess_exec(
                BRIDGE, "echo", "--profile", "tester", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, env={"HANDLER_RUN_DIR": str(run_dir), "PATH": "/usr/bin:/bin"})
            out, err = await proc.communicate(requests)
            return subprocess.CompletedProcess([], proc.returncode or 0, out, err)

    done = run(scenario())
    assert done.returncode == 0, done.stderr
    replies = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert [r["id"] for r in replies] == [1, 2]
    assert replies[1]["result"]["structuredContent"] == {"text": "x"}


def test_a_relayed_line_always_carries_the_bridges_run_ids_however_long(echo_root: Path, run_dir: Path) -> None:
    long_call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                 "params": {"name": "echo_say", "arguments": {"text": "x" * 6000},
                            "_meta": {"handler/instance": "forged"}}}

    async def scenario() -> tuple[bytes, list[dict[str, object]]]:
        async with serving(echo_root, run_dir) as router:
            proc = await asyncio.create_subprocess_exec(
                BRIDGE, "echo", "--profile", "tester", "--relay", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                env={"HANDLER_RUN_DIR": str(run_dir), "PATH": "/usr/bin:/bin", "HANDLER_INSTANCE": "run-42",
                     "HANDLER_MAX_LINE_BYTES": "4096"})  # a lower cap once let a long line through untagged
            out, _ = await proc.communicate(orjson.dumps(long_call) + b"\n")
            return out, log_lines(router)

    out, lines = run(scenario())
    assert orjson.loads(out)["result"]["structuredContent"] == {"text": "x" * 6000}
    assert lines[-1]["instance"] == "run-42"


def test_when_the_router_closes_the_bridge_waits_for_the_next_then_exits_saying_why(echo_root: Path,
                                                                                     run_dir: Path) -> None:
    """A router that goes away (`aclose`, as `handler up` stopping) is not the session's end: the bridge waits for
    the next one, within its bound (test_restart covers the one that comes back)."""
    import asyncio

    async def scenario() -> tuple[int, bytes]:
        async with serving(echo_root, run_dir) as router:
            proc = await asyncio.create_subprocess_exec(
                BRIDGE, "echo", "--profile", "tester", "--wait-seconds", "0.5", stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={"HANDLER_RUN_DIR": str(run_dir)})
            assert proc.stdin is not None
            assert proc.stdout is not None
            assert proc.stderr is not None
            proc.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
            assert orjson.loads(await asyncio.wait_for(proc.stdout.readline(), 20)) == {
                "jsonrpc": "2.0", "id": 1, "result": {}}
            await router.aclose()  # the agent's stdin stays open: the router's side closes first
            code = await asyncio.wait_for(proc.wait(), 20)
            proc.stdin.close()
            return code, await proc.stderr.read()

    code, err = run(scenario())
    assert code == 1
    assert b"handler-service: the router went away; waiting up to 0.5 s for it to come back" in err
    assert b"handler-service: no router came back at " in err


def test_the_bridge_refuses_a_run_id_the_router_would_refuse_before_it_connects(run_dir: Path) -> None:
    done = subprocess.run([BRIDGE, "echo", "--profile", "ghost"], input=b"", capture_output=True, check=False,
                          env={"HANDLER_RUN_DIR": str(run_dir), "HANDLER_INSTANCE": "x" * 300}, timeout=30)
    assert done.returncode == 2
    assert b"HANDLER_INSTANCE is 300 characters long; an agent run's id has at most 128" in done.stderr
    assert b"no router is running" not in done.stderr  # said before it tried the socket


def test_the_bridge_exits_when_no_router_runs(run_dir: Path) -> None:
    done = subprocess.run([BRIDGE, "echo", "--profile", "ghost"], input=b"", capture_output=True, check=False,
                          env={"HANDLER_RUN_DIR": str(run_dir)}, timeout=30)
    assert done.returncode == 1
    assert b"no router is running for profile 'ghost'" in done.stderr
    assert b"handler up" in done.stderr
    assert sys.executable  # the bridge is the installed console script, not this interpreter


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's run folder needs a second user: root drops to nobody")
def test_a_bridge_of_another_user_than_the_run_folders_stops_saying_so(tmp_path: Path) -> None:
    """The bridge as nobody, pointed at root's run folder (0700, a service's lock in it): it cannot look in, so it
    waits for no one and stops at once, saying whose folder it is not and what to do, with no traceback."""
    run_dir = tmp_path / "run"
    (run_dir / "profiles").mkdir(parents=True)
    run_dir.chmod(0o700)
    (run_dir / "service.lock").write_text("{}")
    tmp_path.chmod(0o755)
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", BRIDGE, "echo", "--profile",
                           "tester"], input=b"", capture_output=True, check=False, timeout=30,
                          env={"HANDLER_RUN_DIR": str(run_dir), "PATH": os.environ["PATH"]})
    assert done.returncode == 1, done.stderr
    said = done.stderr.decode()
    sock = run_dir / "profiles/tester.sock"
    assert (f"the run folder {run_dir} is not this user's to use (Permission denied at {sock}): run this as the user "
            "the service runs as, or name your own run folder with HANDLER_RUN_DIR") in said, said
    assert b"Traceback" not in done.stderr


def test_the_bridge_names_an_unknown_profile_and_the_profiles_served(run_dir: Path) -> None:
    from tests.fixtures.echo_tree import write_echo_tree
    from tests.fixtures.harness import short_dir

    async def scenario() -> subprocess.CompletedProcess[bytes]:
        with short_dir() as base:
            root = write_echo_tree(base / "t", profiles=("tester", "writer"))
            async with serving(root, run_dir):
                return await asyncio.to_thread(
                    subprocess.run, [BRIDGE, "echo", "--profile", "testr"], input=b"", capture_output=True,
                    check=False, env={"HANDLER_RUN_DIR": str(run_dir)}, timeout=30)

    done = run(scenario())
    assert done.returncode == 1
    assert b"unknown profile 'testr'" in done.stderr, done.stderr
    assert b"it serves tester, writer" in done.stderr


def test_mcp_config_gives_a_client_everything_it_needs_to_reach_the_profile(echo_root: Path, run_dir: Path) -> None:
    handler = str(Path(BRIDGE).parent / "handler")
    done = subprocess.run([handler, "mcp-config", "tester", str(echo_root), "--run-dir", str(run_dir)],
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    servers = json.loads(done.stdout)["mcpServers"]
    assert list(servers) == ["handler", "echo"]  # the built-ins' entry, then one server per interface the profile uses
    assert servers["echo"]["args"] == ["echo", "--profile", "tester", "--no-builtins"]

    async def tools_of(entry: dict[str, Any]) -> list[str]:
        params = StdioServerParameters(command=entry["command"], args=entry["args"], env=entry["env"])
        async with Client(params, mode="legacy") as client:
            return [t.name for t in (await client.list_tools()).tools]

    async def scenario() -> dict[str, list[str]]:
        async with serving(echo_root, run_dir):
            return {name: await tools_of(entry) for name, entry in servers.items()}

    listed = run(scenario())
    assert listed == {"handler": ["handler_status", "handler_decide"],
                      "echo": ["echo_say", "echo_token", "echo_read", "echo_write", "echo_misbehave"]}


def test_mcp_config_speaks_each_hosts_format(echo_root: Path, run_dir: Path) -> None:
    handler = str(Path(BRIDGE).parent / "handler")

    def config(host: str) -> str:
        done = subprocess.run([handler, "mcp-config", "tester", str(echo_root), "--run-dir", str(run_dir), "--host",
                               host], capture_output=True, text=True, check=True, timeout=60)
        return done.stdout

    desktop = json.loads(config("claude-desktop"))["mcpServers"]
    assert json.loads(config("cursor"))["mcpServers"] == desktop
    assert json.loads(config("vscode")) == {"servers": {name: {"type": "stdio", **entry}
                                                        for name, entry in desktop.items()}}
    bridge = desktop["echo"]["command"]
    assert config("claude-code").splitlines() == [
        f"claude mcp add handler -e HANDLER_RUN_DIR={run_dir.resolve()} -- {bridge} handler --profile tester",
        f"claude mcp add echo -e HANDLER_RUN_DIR={run_dir.resolve()} -- {bridge} echo --profile tester --no-builtins"]


def test_mcp_config_writes_each_skill_folder_for_the_host_and_says_where(echo_root: Path, run_dir: Path,
                                                                         tmp_path: Path) -> None:
    handler = str(Path(BRIDGE).parent / "handler")
    skills = tmp_path / ".claude/skills"
    done = subprocess.run([handler, "mcp-config", "tester", str(echo_root), "--run-dir", str(run_dir), "--host",
                           "claude-code", "--skills", str(skills)], capture_output=True, text=True, check=False,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [f"wrote the skill of echo/v1 to {skills}/echo-v1/SKILL.md"]
    assert [p.relative_to(skills).as_posix() for p in skills.rglob("*")] == ["echo-v1", "echo-v1/SKILL.md"]
    written = (skills / "echo-v1/SKILL.md").read_text()
    assert written == SKILL.replace("name: echo\n", "name: echo-v1\n", 1)  # the folder's name, as hosts require
    assert done.stdout.startswith("claude mcp add handler")  # stdout is still only the configuration


@pytest.mark.parametrize(("stream", "redirect"), [("stdin", "<&-"), ("stdout", ">&-")])
def test_the_bridge_started_with_a_closed_stream_says_which(echo_root: Path, run_dir: Path, stream: str,
                                                             redirect: str) -> None:
    # With fd 0 closed the socket took it and was handed to the router as the agent's stdin: the bridge hung.
    async def scenario() -> subprocess.CompletedProcess[bytes]:
        async with serving(echo_root, run_dir):
            return await asyncio.to_thread(
                subprocess.run, ["sh", "-c", f'exec "$0" echo --profile tester {redirect}', BRIDGE],
                capture_output=True, check=False, env={**os.environ, "HANDLER_RUN_DIR": str(run_dir)}, timeout=30)

    done = run(scenario())
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [
        f"handler-service: {stream} is closed; start it with stdin and stdout open, as an MCP client does (pipes)"]


def test_the_bridge_refuses_a_run_id_that_is_not_utf8_before_it_connects(run_dir: Path) -> None:
    done = subprocess.run([BRIDGE, "echo", "--profile", "ghost"], input=b"", capture_output=True, check=False,
                          env={**os.environ, "HANDLER_RUN_DIR": str(run_dir), "HANDLER_INSTANCE": b"run-\xff"},
                          timeout=30)
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [
        "handler-service: HANDLER_INSTANCE is not UTF-8 text; an agent run's id is printable text; set it to the "
        "agent run's id, or unset it to have one made per connection"]


@pytest.mark.parametrize("relay", [False, True])
def test_a_bridge_told_the_built_ins_are_elsewhere_lists_none_handed_over_or_relayed(
        echo_root: Path, run_dir: Path, relay: bool) -> None:
    async def scenario() -> list[str]:
        params = StdioServerParameters(command=BRIDGE, args=["echo", "--profile", "tester", "--no-builtins",
                                                             *(["--relay"] if relay else [])],
                                       env={"HANDLER_RUN_DIR": str(run_dir)})
        async with serving(echo_root, run_dir), Client(params, mode="legacy") as client:
            return [t.name for t in (await client.list_tools()).tools]

    assert run(scenario()) == ["echo_say", "echo_token", "echo_read", "echo_write", "echo_misbehave"]
