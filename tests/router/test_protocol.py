"""Raw-line exchanges on a profile's socket: the required fields of each era, and the era rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reconciler.wire.versions import HANDSHAKE_VERSIONS, MODERN_VERSIONS, SUPPORTED_VERSIONS
from tests.fixtures.echo_tree import SKILL, SKILL_DESCRIPTION
from tests.fixtures.harness import RawClient, run, serving

ENVELOPE = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"}}
INIT = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
CAPABILITIES = {"tools": {"listChanged": False}, "resources": {"subscribe": False, "listChanged": False},
                "prompts": {"listChanged": False}}


def modern(**extra: Any) -> dict[str, Any]:
    return {**ENVELOPE, "handler/interface": "echo", **extra}


def exchange(root: Path, run_dir: Path, script: Any) -> None:
    async def scenario() -> None:
        async with serving(root, run_dir) as router:
            client = await RawClient.connect(router.socket_path("tester"))
            try:
                await script(client)
            finally:
                await client.close()

    run(scenario())


@pytest.mark.parametrize("version", HANDSHAKE_VERSIONS)
def test_initialize_echoes_each_handshake_version(echo_root: Path, run_dir: Path, version: str) -> None:
    async def script(c: RawClient) -> None:
        reply = await c.request("initialize", {**INIT, "protocolVersion": version})
        result = reply["result"]
        assert result["protocolVersion"] == version
        assert result["capabilities"] == CAPABILITIES
        assert result["serverInfo"]["name"] == "handler"
        assert "resultType" not in result

    exchange(echo_root, run_dir, script)


def test_initialize_with_an_unknown_version_gets_the_newest_handshake_one(echo_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient) -> None:
        reply = await c.request("initialize", {**INIT, "protocolVersion": "2099-01-01"})
        assert reply["result"]["protocolVersion"] == HANDSHAKE_VERSIONS[-1]

    exchange(echo_root, run_dir, script)


def test_the_initialize_era_in_order(echo_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient) -> None:
        await c.request("initialize", INIT, handler__interface="echo")
        await c.send({"jsonrpc": "2.0", "method": "notifications/initialized"})  # no reply to a notification
        assert (await c.request("ping"))["result"] == {}
        listed = (await c.request("tools/list", {}, handler__interface="echo"))["result"]
        assert set(listed) == {"tools"}
        assert {t["name"] for t in listed["tools"]} >= {"echo_say", "handler_status", "handler_decide"}
        for tool in listed["tools"]:
            assert {"name", "description", "inputSchema", "outputSchema", "annotations"} <= set(tool)
        result = await c.call("echo_say", {"text": "a"})
        assert result["structuredContent"] == {"text": "a"}
        # the output's JSON, then what the priced call cost (the binding prices echo_say at $0.001)
        priced = "handler: executed; charged $0.001; no spending cap applies"
        assert result["content"] == [{"type": "text", "text": '{"text":"a"}'}, {"type": "text", "text": priced}]
        assert result["isError"] is False
        assert "resultType" not in result

    exchange(echo_root, run_dir, script)


def test_the_stateless_era_needs_no_handshake(echo_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient) -> None:
        found = (await c.request("server/discover", {"_meta": modern()}))["result"]
        assert found["supportedVersions"] == list(SUPPORTED_VERSIONS)
        assert found["capabilities"] == CAPABILITIES
        assert found["resultType"] == "complete"
        assert found["ttlMs"] >= 0
        assert found["cacheScope"] == "private"
        assert found["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "handler"
        listed = (await c.request("tools/list", {"_meta": modern()}))["result"]
        assert listed["resultType"] == "complete"
        assert listed["cacheScope"] == "private"
        assert isinstance(listed["ttlMs"], int)
        called = (await c.request("tools/call", {"name": "echo_say", "arguments": {"text": "b"},
                                                 "_meta": modern()}))["result"]
        assert called["resultType"] == "complete"
        assert called["structuredContent"] == {"text": "b"}
        refused = (await c.request("tools/call", {"name": "echo_say", "arguments": {}, "_meta": modern()}))["result"]
        assert refused["resultType"] == "complete"
        assert refused["isError"] is True

    exchange(echo_root, run_dir, script)


def test_an_unknown_version_gets_32022_with_the_supported_list(echo_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient) -> None:
        reply = await c.request("tools/list", {"_meta": modern(**{
            "io.modelcontextprotocol/protocolVersion": "2027-01-01"})})
        assert reply["error"]["code"] == -32022
        assert reply["error"]["data"] == {"supported": list(SUPPORTED_VERSIONS), "requested": "2027-01-01"}
        # A refused version settles nothing: the client may retry with one from the list.
        again = await c.request("tools/list", {"_meta": modern()})
        assert again["result"]["resultType"] == "complete"

    exchange(echo_root, run_dir, script)


def test_a_handshake_version_in_the_envelope_is_unsupported_there(echo_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient) -> None:
        reply = await c.request("server/discover", {"_meta": modern(**{
            "io.modelcontextprotocol/protocolVersion": "2025-11-25"})})
        assert reply["error"]["code"] == -32022

    exchange(echo_root, run_dir, script)


def test_a_half_envelope_is_invalid_params(echo_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient) -> None:
        meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
        reply = await c.request("tools/list", {"_meta": meta})
        assert reply["error"]["code"] == -32602
        assert "clientCapabilities" in reply["error"]["message"]
        reply = await c.request("server/discover", {})
        assert reply["error"]["code"] == -32602

    exchange(echo_root, run_dir, script)


def test_a_stateless_connection_refuses_initialize_and_bare_requests(echo_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient) -> None:
        await c.request("server/discover", {"_meta": modern()})
        init = await c.request("initialize", INIT)
        assert init["error"]["code"] == -32022
        assert init["error"]["data"]["supported"] == list(MODERN_VERSIONS)
        bare = await c.request("tools/list", {})
        assert bare["error"]["code"] == -32602
        ping = await c.request("ping", {"_meta": modern()})
        assert ping["error"]["code"] == -32601

    exchange(echo_root, run_dir, script)


def test_an_initialized_connection_refuses_the_envelope(echo_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient) -> None:
        await c.request("initialize", INIT)
        reply = await c.request("tools/list", {"_meta": modern()})
        assert reply["error"]["code"] == -32600
        assert (await c.request("ping"))["result"] == {}

    exchange(echo_root, run_dir, script)


def test_a_refused_request_settles_no_era(echo_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient) -> None:
        for method, params in (("completion/complete", {"_meta": modern()}), ("ping", {"_meta": modern()}),
                               ("tools/list", {"_meta": {**modern(), "handler/interface": "ocr"}})):
            assert "error" in await c.request(method, params)  # refused: the connection is still undecided
        assert (await c.request("initialize", INIT))["result"]["protocolVersion"] == "2025-11-25"

    exchange(echo_root, run_dir, script)


def test_an_interface_the_profile_does_not_use_is_refused(echo_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient) -> None:
        reply = await c.request("initialize", INIT, handler__interface="ocr")
        assert reply["error"]["code"] == -32602
        assert "uses: echo" in reply["error"]["message"]

    exchange(echo_root, run_dir, script)


def test_with_no_interface_named_the_whole_profile_is_served(echo_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient) -> None:
        listed = (await c.request("tools/list"))["result"]["tools"]
        assert [t["name"] for t in listed] == ["echo_say", "echo_token", "echo_read", "echo_write", "echo_misbehave",
                                               "handler_status", "handler_decide"]
        by_key = (await c.request("tools/list", {}, handler__interface="echo/v1"))["result"]["tools"]
        assert by_key == listed

    exchange(echo_root, run_dir, script)


def test_the_skill_is_a_resource_and_a_prompt_and_its_summary_is_in_the_instructions(echo_root: Path,
                                                                                     run_dir: Path) -> None:
    async def script(c: RawClient) -> None:
        init = (await c.request("initialize", INIT, handler__interface="echo"))["result"]
        assert SKILL_DESCRIPTION in init["instructions"]
        assert "the resource handler://skills/echo/v1 (resources/read), also the prompt echo-v1" in init["instructions"]
        listed = (await c.request("resources/list", {}, handler__interface="echo"))["result"]
        assert listed == {"resources": [{"uri": "handler://skills/echo/v1", "name": "echo-v1",
                                         "title": "The echo/v1 skill", "description": SKILL_DESCRIPTION,
                                         "mimeType": "text/markdown", "size": len(SKILL.encode())}]}
        read = (await c.request("resources/read", {"uri": "handler://skills/echo/v1"}))["result"]
        assert read == {"contents": [{"uri": "handler://skills/echo/v1", "mimeType": "text/markdown", "text": SKILL}]}
        missing = await c.request("resources/read", {"uri": "handler://skills/ocr/v1"})
        assert missing["error"]["code"] == -32602
        assert "this session serves: handler://skills/echo/v1" in missing["error"]["message"]
        prompts = (await c.request("prompts/list", {}))["result"]["prompts"]
        assert prompts == [{"name": "echo-v1", "title": "The echo/v1 skill", "description": SKILL_DESCRIPTION}]
        prompt = (await c.request("prompts/get", {"name": "echo-v1"}))["result"]
        assert prompt["messages"] == [{"role": "user", "content": {"type": "text", "text": SKILL}}]
        assert (await c.request("resources/templates/list", {}))["result"] == {"resourceTemplates": []}

    exchange(echo_root, run_dir, script)


def test_the_stateless_era_serves_the_skill_with_its_caching_fields(echo_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient) -> None:
        found = (await c.request("server/discover", {"_meta": modern()}))["result"]
        assert found["capabilities"] == CAPABILITIES
        assert SKILL_DESCRIPTION in found["instructions"]
        listed = (await c.request("resources/list", {"_meta": modern()}))["result"]
        assert (listed["resultType"], listed["ttlMs"], listed["cacheScope"]) == ("complete", 60_000, "private")
        assert [r["uri"] for r in listed["resources"]] == ["handler://skills/echo/v1"]
        read = (await c.request("resources/read", {"uri": "handler://skills/echo/v1", "_meta": modern()}))["result"]
        assert read["contents"][0]["text"] == SKILL
        assert read["resultType"] == "complete"
        prompt = (await c.request("prompts/get", {"name": "echo-v1", "_meta": modern()}))["result"]
        assert prompt["resultType"] == "complete"
        assert prompt["messages"][0]["content"]["text"] == SKILL

    exchange(echo_root, run_dir, script)


def test_a_session_told_the_built_ins_are_elsewhere_lists_and_runs_none(echo_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient) -> None:
        elsewhere = {"handler/interface": "echo", "handler/builtins": "elsewhere"}
        await c.request("initialize", INIT, **{k.replace("/", "__"): v for k, v in elsewhere.items()})
        listed = (await c.request("tools/list", {"_meta": elsewhere}))["result"]["tools"]
        assert [t["name"] for t in listed] == ["echo_say", "echo_token", "echo_read", "echo_write", "echo_misbehave"]
        status = (await c.request("tools/call", {"name": "handler_status", "arguments": {"request_id": "req_1"},
                                                 "_meta": elsewhere}))["result"]
        assert status["isError"] is True
        assert "unknown tool 'handler_status'" in status["content"][0]["text"]
        builtins = (await c.request("tools/list", {"_meta": {"handler/interface": "handler",
                                                             "handler/builtins": "elsewhere"}}))["result"]["tools"]
        assert [t["name"] for t in builtins] == ["handler_status", "handler_decide"]
        told = (await c.request("tools/list", {"_meta": {"handler/interface": "echo"}}))["result"]["tools"]
        assert [t["name"] for t in told][-2:] == ["handler_status", "handler_decide"]  # the old way: as before

    exchange(echo_root, run_dir, script)
