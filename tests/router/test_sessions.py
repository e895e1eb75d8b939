"""Sessions on a real socket: bad lines never end one, calls run concurrently, generations are pinned."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import orjson

from reconciler.wire.framing import DEFAULT_MAX_LINE_BYTES
from tests.fixtures.harness import RawClient, load, log_lines, log_text, run, serving


def test_bad_lines_get_their_error_and_the_connection_lives_on(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with serving(echo_root, run_dir, max_line_bytes=4096) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            cases: list[tuple[bytes, int, Any]] = [
                (b"{not json\n", -32700, None),
                (b"[1, 2]\n", -32600, None),
                (b'{"jsonrpc":"2.0","id":7,"method":"completion/complete"}\n', -32601, 7),
                (b'{"jsonrpc":"2.0","method":"tools/list"}\n', -32600, None),
                (b'{"jsonrpc":"2.0","id":null,"method":"tools/list"}\n', -32600, None),
                (b'{"id":8,"method":"tools/list"}\n', -32600, 8),
                (b'{"jsonrpc":"2.0","id":9,"method":"tools/call","params":[1]}\n', -32600, 9),
                (b'{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"arguments":{}}}\n', -32602, 10),
                (b'{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":7}}\n', -32602, 11),
                (b'{"jsonrpc":"2.0","id":12,"method":"x","params":{"a":"' + b"z" * 5000 + b'"}}\n', -32600, None),
            ]
            for line, code, reply_id in cases:
                await c.send_bytes(line)
                reply = await c.recv()
                assert reply["error"]["code"] == code, (line[:60], reply)
                assert reply["id"] == reply_id
                assert (await c.request("ping"))["result"] == {}  # still alive
            await c.close()

    run(scenario())


def test_a_run_id_that_is_not_a_string_is_refused_naming_its_key(echo_root: Path, run_dir: Path) -> None:
    """Ignored, the call ran as the connection's own run, outside the per-run limits the client meant to name."""
    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            for key, value in (("handler/instance", 7), ("handler/instance", {"id": "r"}),
                               ("handler/parentInstance", ["p"]), ("handler/parentInstance", True)):
                reply = await c.request("tools/call", {"name": "echo_say", "arguments": {"text": "x"},
                                                       "_meta": {key: value}})
                assert reply["error"]["code"] == -32602, reply
                assert reply["error"]["message"] == f"params._meta['{key}'] must be a string, an agent run's id"
            assert "echo_say" not in log_text(router)  # nothing ran
            done = await c.call("echo_say", {"text": "x"}, _meta={"handler/instance": "r-1"})
            assert done["isError"] is False
            assert log_lines(router)[-1]["instance"] == "r-1"
            await c.close()

    run(scenario())


def test_an_interface_that_is_not_a_string_or_a_meta_that_is_not_an_object_is_refused(echo_root: Path,
                                                                                      run_dir: Path) -> None:
    """Ignored, the request was served as if it named no interface (or no run) at all."""
    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            for meta, said in (({"handler/interface": 7}, "params._meta['handler/interface'] must be a string naming "
                                "an interface, such as ocr or ocr/v1"),
                               (["handler/instance", "r"], "params._meta must be an object, as MCP defines it; "
                                "send {} or leave it out")):
                for method, params in (("tools/list", {}), ("tools/call", {"name": "echo_say",
                                                                           "arguments": {"text": "x"}})):
                    reply = await c.request(method, {**params, "_meta": meta})
                    assert reply["error"]["code"] == -32602, reply
                    assert reply["error"]["message"] == said
            assert "echo_say" not in log_text(router)  # nothing ran
            assert (await c.call("echo_say", {"text": "x"}, _meta={"handler/interface": "echo"}))["isError"] is False
            await c.close()

    run(scenario())


def test_blank_lines_and_crlf_endings_are_not_answered(echo_root: Path, run_dir: Path) -> None:
    """Whitespace between messages is nothing to answer (a -32700 with no id would reach the client as a reply it
    never asked for), and a message ending in CRLF is read as it is."""
    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            await c.send_bytes(b"\n\r\n   \n\t\n")
            await c.send_bytes(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\r\n')
            assert await c.recv() == {"jsonrpc": "2.0", "id": 1, "result": {}}  # the first reply is the ping's
            await c.close()

    run(scenario())


def test_an_oversize_line_split_across_reads_is_skipped_whole(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with serving(echo_root, run_dir, max_line_bytes=1024) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            await c.send_bytes(b'{"jsonrpc":"2.0","id":1,"method":"ping","x":"' + b"a" * 3000)
            reply = await c.recv()
            assert reply["error"]["code"] == -32600
            assert reply["error"]["data"] == {"maxLineBytes": 1024}
            await c.send_bytes(b"b" * 3000 + b'"}\n{"jsonrpc":"2.0","id":2,"method":"ping"}\n')
            assert await c.recv() == {"jsonrpc": "2.0", "id": 2, "result": {}}
            await c.close()

    run(scenario())


def test_the_default_cap_refuses_a_line_over_16_mib_and_the_connection_lives_on(echo_root: Path,
                                                                                run_dir: Path) -> None:
    assert DEFAULT_MAX_LINE_BYTES == 16 * 1024 * 1024

    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            text = "x" * DEFAULT_MAX_LINE_BYTES
            big = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                "params": {"name": "echo_say", "arguments": {"text": text}}}) + b"\n"
            await c.send_bytes(big)
            reply = await c.recv()
            assert reply["error"]["code"] == -32600
            assert reply["error"]["data"] == {"maxLineBytes": DEFAULT_MAX_LINE_BYTES}
            assert (await c.request("ping"))["result"] == {}
            await c.close()

    run(scenario())


def test_calls_run_concurrently_and_replies_match_ids(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            await c.send({"jsonrpc": "2.0", "id": "slow", "method": "tools/call",
                          "params": {"name": "echo_misbehave", "arguments": {"mode": "sleep", "seconds": 1}}})
            await c.send({"jsonrpc": "2.0", "id": "fast", "method": "tools/call",
                          "params": {"name": "echo_say", "arguments": {"text": "now"}}})
            first, second = await c.recv(), await c.recv()
            assert (first["id"], second["id"]) == ("fast", "slow")
            assert second["result"]["structuredContent"] == {"text": "slept"}
            await c.close()

    run(scenario())


def test_a_cancelled_call_gets_no_reply_and_is_logged(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            await c.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                          "params": {"name": "echo_misbehave", "arguments": {"mode": "sleep", "seconds": 5},
                                     "_meta": {"handler/instance": "i-cancel"}}})
            await _wait_for(lambda: router.services.limits.running(("tester", "i-cancel", "echo/v1")))
            await c.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}})
            assert (await c.request("ping"))["result"] == {}  # the next reply is the ping's, not the call's
            await c.close()
            await _wait_for(lambda: '"cancelled"' in log_text(router))

    run(scenario())


def test_a_call_cancelled_in_the_same_read_as_its_request_is_logged_and_frees_its_id(echo_root: Path,
                                                                                      run_dir: Path) -> None:
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "echo_misbehave", "arguments": {"mode": "sleep", "seconds": 5},
                       "_meta": {"handler/instance": "i-early"}}}
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}

    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            await c.send_bytes(orjson.dumps(call) + b"\n" + orjson.dumps(cancel) + b"\n")  # before its task starts
            assert (await c.request("ping"))["result"] == {}
            await _wait_for(lambda: '"cancelled"' in log_text(router))
            await c.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                          "params": {"name": "echo_say", "arguments": {"text": "again"}}})
            again = await c.recv()
            assert again["result"]["structuredContent"] == {"text": "again"}, again  # its id was freed
            await c.close()

    run(scenario())


def test_a_call_of_a_client_that_disconnects_is_finished_and_logged(echo_root: Path, run_dir: Path) -> None:
    # On a unix socket a vanished client and one that closed its sending side look the same (EOF):
    # the calls in flight finish, as for `echo ... | handler-service`; cancelling is the client's
    # notifications/cancelled.
    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            await c.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                          "params": {"name": "echo_misbehave", "arguments": {"mode": "sleep", "seconds": 0.3},
                                     "_meta": {"handler/instance": "i-gone"}}})
            await _wait_for(lambda: router.services.limits.running(("tester", "i-gone", "echo/v1")))
            c.writer.transport.abort()  # the agent vanishes without a word
            await _wait_for(lambda: '"instance":"i-gone"' in log_text(router))
            assert log_lines(router)[-1]["outcome"] == "executed"
            await _wait_for(lambda: not router.connections)
            other = await RawClient.connect(router.socket_path("tester"))
            assert (await other.call("echo_say", {"text": "still up"}))["structuredContent"] == {"text": "still up"}
            await other.close()

    run(scenario())


def test_a_session_keeps_its_generation_across_a_swap(echo_root: Path, run_dir: Path, tmp_path: Path) -> None:
    changed = tmp_path / "t2"
    shutil.copytree(echo_root, changed)
    binding = changed / "config/bindings/echo-local.toml"
    binding.write_text(binding.read_text().replace("echo_say = 0.001", "echo_say = 0.5"))

    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            old = await RawClient.connect(router.socket_path("tester"))
            assert (await old.call("echo_say", {"text": "x"}))["_meta"]["handler/cost"] == 0.001
            await old.send({"jsonrpc": "2.0", "id": "inflight", "method": "tools/call",
                            "params": {"name": "echo_misbehave", "arguments": {"mode": "sleep", "seconds": 0.5}}})
            generation = await router.swap(load(changed))
            assert generation.number == 2
            new = await RawClient.connect(router.socket_path("tester"))
            assert (await new.call("echo_say", {"text": "y"}))["_meta"]["handler/cost"] == 0.5
            inflight = await old.recv()
            assert inflight["id"] == "inflight"
            assert inflight["result"]["structuredContent"] == {"text": "slept"}
            assert (await old.call("echo_say", {"text": "z"}))["_meta"]["handler/cost"] == 0.001
            await old.close()
            await new.close()
            lines = log_lines(router)
            # The in-flight call and the new session's first (which starts the new process) may end in either order.
            assert sorted((x["tool"], x["generation"]) for x in lines) == sorted([
                ("echo_say", 1), ("echo_say", 2), ("echo_misbehave", 1), ("echo_say", 1)])

    run(scenario())


def test_a_swap_opens_and_closes_profile_sockets(echo_root: Path, run_dir: Path, tmp_path: Path) -> None:
    renamed = tmp_path / "t2"
    shutil.copytree(echo_root, renamed)
    (renamed / "config/profiles/tester.toml").rename(renamed / "config/profiles/other.toml")
    text = (renamed / "config/profiles/other.toml").read_text().replace('"tester"', '"other"')
    (renamed / "config/profiles/other.toml").write_text(text)

    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            kept = await RawClient.connect(router.socket_path("tester"))
            assert (await kept.request("ping"))["result"] == {}
            await router.swap(load(renamed))
            assert not router.socket_path("tester").exists()
            assert router.socket_path("other").exists()
            # A session of a removed profile lives on with its generation until it ends.
            assert (await kept.call("echo_say", {"text": "still"}))["structuredContent"] == {"text": "still"}
            await kept.close()

    run(scenario())


async def _wait_for(predicate: Any, deadline: float = 10.0) -> None:
    """Poll a condition the router exposes no event for, under a deadline (no fixed sleep)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not predicate():
        assert loop.time() < end, "condition not met before the deadline"
        await asyncio.sleep(0.005)
