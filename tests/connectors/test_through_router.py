"""Connectors through the real router: the built-in llm with handler-llm, and a wrapped third-party
MCP server whose network is exactly its binding's egress."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli.llm import EXIT_CODES
from reconciler.governance.governed import GovernedGate
from reconciler.governance.ledger import spend_report
from reconciler.governance.store import open_store
from tests.fixtures.harness import RawClient, body, serving, shipped_tree, short_dir
from tests.fixtures.loopback import QuietHandler, serving_http
from tests.fixtures.vendors import Reply, anthropic_reply, let_llm_reach, openai_reply, serving_vendor
from tests.governance.governed import until


@pytest.fixture
def tree() -> Iterator[Path]:
    """The shipped config tree in a short folder (sockets live beside it)."""
    with shipped_tree() as root:
        yield root


def _set_binding(root: Path, name: str, text: str) -> None:
    (root / f"config/bindings/{name}.toml").write_text(text)


async def _handler_llm(run_dir: Path, *args: str) -> tuple[int, str, str]:
    # `python -m` runs the same main as the installed `handler-llm` script, whatever version installed it.
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reconciler.cli.llm",
        "--profile",
        "assistant",
        *args,
        env={**os.environ, "HANDLER_RUN_DIR": str(run_dir)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.parametrize("version", ["llm/v2", "llm/v1"])
def test_handler_llm_through_the_profiles_socket(tree: Path, monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    """`handler-llm` asks whichever version the profile serves: llm/v2, the highest, or llm/v1 where it is pinned."""
    monkeypatch.setenv("TEST_OPENAI_KEY", "sk-from-a-reference")
    if version == "llm/v1":
        profile = tree / "config/profiles/assistant.toml"
        profile.write_text(profile.read_text().replace("services = { ", 'services = { "llm/v1" = "llm-openai", '))
    with serving_vendor() as vendor, short_dir() as run_dir:
        entry = let_llm_reach(tree, vendor.url)
        _set_binding(
            tree,
            "llm-openai",
            (
                'apiVersion = "handler.binding/v1"\nname = "llm-openai"\nconnector = "llm"\n'
                'secrets = { api_key = { env = "TEST_OPENAI_KEY" } }\n'
                f'settings = {{ endpoint = "openai-chat", model = "gpt-4o-mini", base_url = "{vendor.url}" }}\n'
                f'egress = ["{entry}"]\n'
                "\n[pricing]\nllm_complete = 0.002\n"
            ),
        )
        vendor.replies += [
            openai_reply("Hi there."),
            Reply(429, {"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}}),
            openai_reply("Hi again."),
        ]

        async def scenario() -> list[tuple[int, str, str]]:
            async with serving(tree, run_dir):
                return [
                    await _handler_llm(run_dir, "Say", "hi", "--max-tokens", "20", "--system", "Be brief"),
                    await _handler_llm(run_dir, "again"),
                    await _handler_llm(run_dir, "once more", "--json"),
                ]

        (ok, out, _), (limited, _, err), (_, printed, _) = asyncio.run(scenario())
        assert (ok, out) == (0, "Hi there.\n")
        assert vendor.requests[0]["body"]["messages"] == [{"role": "system", "content": "Be brief"},
                                                          {"role": "user", "content": "Say hi"}]
        served = json.loads(printed)["structuredContent"]
        assert ("type" in served) is (version == "llm/v2")  # llm/v2's output says which kind of reply it is
        assert vendor.requests[0]["headers"]["authorization"] == "Bearer sk-from-a-reference"
        assert limited == EXIT_CODES["limit"]
        assert "limit" in err


WEATHER = {"name": "weather_now", "description": "The current weather in a city.",
           "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ASK = {"role": "user", "content": "What is the weather in Lyon?"}
SCRIPTS = {  # each vendor's own tool-calling answer, then its text answer
    "openai-chat": (openai_reply(None, finish="tool_calls", calls=[("call_7", "weather_now", '{"city": "Lyon"}')]),
                    openai_reply("17 degrees and light rain in Lyon.")),
    "anthropic": (anthropic_reply("", stop="tool_use", uses=[("toolu_7", "weather_now", {"city": "Lyon"})]),
                  anthropic_reply("17 degrees and light rain in Lyon.")),
}


def _llm_binding(endpoint: str, url: str, entry: str) -> str:
    return ('apiVersion = "handler.binding/v1"\nname = "llm-openai"\nconnector = "llm"\n'
            'secrets = { api_key = { env = "TEST_LLM_KEY" } }\n'
            f'settings = {{ endpoint = "{endpoint}", model = "m-1", base_url = "{url}" }}\n'
            f'egress = ["{entry}"]\n\n[pricing]\nllm_chat = 0.004\n')


def _uncap(tree: Path) -> None:
    """No caps, so no budget lease: what the profile's spend row counts is exactly what its calls were charged."""
    for name in ("config/org.toml", "config/profiles/assistant.toml"):
        path = tree / name
        path.write_text(path.read_text().split("[caps]")[0])


@pytest.mark.parametrize("endpoint", ["openai-chat", "anthropic"])
def test_llm_v2_tool_round_trip_through_the_governed_router(tree: Path, monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path, endpoint: str) -> None:
    """The model asks for a tool, the caller sends its result, the model answers in text; both turns are charged
    to the profile's spend, and a tool whose schema is broken is refused before the vendor sees it, free."""
    monkeypatch.setenv("TEST_LLM_KEY", "key-from-a-reference")
    _uncap(tree)
    store = open_store(f"sqlite:///{tmp_path / 'handler.db'}")
    broken = {**WEATHER, "inputSchema": {"type": "object", "properties": {"city": {"type": "town"}}}}
    with serving_vendor() as vendor, short_dir() as run_dir:
        _set_binding(tree, "llm-openai", _llm_binding(endpoint, vendor.url, let_llm_reach(tree, vendor.url)))
        vendor.replies += SCRIPTS[endpoint]

        async def scenario() -> list[dict[str, Any]]:
            governor = GovernedGate(store, owns_store=False)
            try:
                async with serving(tree, run_dir, gate=governor) as router:
                    client = await RawClient.connect(router.socket_path("assistant"))
                    asked = await client.call("llm_chat", {"messages": [ASK], "tools": [WEATHER]})
                    [call] = asked["structuredContent"]["toolCalls"]
                    turn = [ASK, {"role": "assistant", "toolCalls": [call]},
                            {"role": "tool", "toolCallId": call["id"], "content": '{"temperatureC": 17}'}]
                    answered = await client.call("llm_chat", {"messages": turn, "tools": [WEATHER]})
                    refused = await client.call("llm_chat", {"messages": [ASK], "tools": [broken]})
                    await client.close()

                    async def charged() -> bool:
                        return await asyncio.to_thread(_spent, store) == 8000

                    await until(charged, 10.0)
                    return [asked, answered, refused]
            finally:
                await governor.aclose()

        try:
            asked, answered, refused = asyncio.run(asyncio.wait_for(scenario(), 60))
        finally:
            store.close()
    assert asked["structuredContent"]["type"] == "tool_calls", asked
    assert asked["structuredContent"]["toolCalls"][0]["arguments"] == {"city": "Lyon"}
    assert answered["structuredContent"]["type"] == "text"
    assert answered["structuredContent"]["text"] == "17 degrees and light rain in Lyon."
    assert answered["structuredContent"]["usage"]["inputTokens"] > 0
    assert [r["_meta"]["handler/cost"] for r in (asked, answered)] == [0.004, 0.004]
    assert body(refused)["error"] == "invalid_arguments"
    assert "tool 'weather_now' (tools[0]): its inputSchema is not valid JSON Schema" in body(refused)["message"]
    assert len(vendor.requests) == 2  # the broken schema never left the router
    assert "tools" in vendor.requests[1]["body"]


def _spent(store: Any) -> int:
    return sum(r["micros"] for r in spend_report(store) if r["scope"] == "profile:assistant")


def test_a_wrapped_server_reaches_its_egress_and_nothing_else(tree: Path) -> None:
    # The manifest runs `python3 -m mcp_server_fetch`: the router gives connectors its own Python first.
    class Page(QuietHandler):
        def do_GET(self) -> None:
            self.send_body(200, b"<html><body><p>The total is 50.00 EUR.</p></body></html>", "text/html")

    with serving_http(Page) as allowed, serving_http(Page) as elsewhere, short_dir() as run_dir:
        port = allowed.rsplit(":", 1)[1]
        _set_binding(
            tree,
            "fetch-local",
            (
                'apiVersion = "handler.binding/v1"\nname = "fetch-local"\nconnector = "web-fetch-mcp"\n'
                f'egress = ["127.0.0.1:{port}"]\n'
            ),
        )
        profile = tree / "config/profiles/researcher.toml"
        profile.write_text(profile.read_text().replace('web-fetch = "web-fetch-public"', 'web-fetch = "fetch-local"'))

        async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
            async with serving(tree, run_dir) as router:
                client = await RawClient.connect(router.socket_path("researcher"))
                reached = await client.call("web_fetch_get", {"url": f"{allowed}/invoice"})
                refused = await client.call("web_fetch_get", {"url": f"{elsewhere}/invoice"})
                await client.close()
                return reached, refused

        reached, refused = asyncio.run(asyncio.wait_for(scenario(), 90))
    assert reached.get("isError") is not True, reached
    assert "50.00 EUR" in reached["structuredContent"]["text"]
    assert refused["isError"] is True
    assert body(refused)["error"] == "fetch_failed"


@pytest.mark.skipif(not (shutil.which("tesseract") and shutil.which("pdftoppm")),
                    reason="tesseract-ocr and poppler-utils are not installed (.ci/run installs them)")
def test_ocr_tesseract_through_the_router_reads_honours_languages_and_size(tree: Path) -> None:
    scope = tree / "work/auditor"
    scope.mkdir(parents=True)
    shutil.copy(tree / "catalog/interfaces/ocr/v1/conformance/invoice.pdf", scope / "invoice.pdf")
    (scope / "big.pdf").write_bytes((scope / "invoice.pdf").read_bytes() + b"%" + b" " * 2000)
    binding = tree / "config/bindings/ocr-local.toml"
    binding.write_text(binding.read_text() + "\n[limits]\nmaxFileBytes = 2000\n")

    async def scenario() -> list[dict[str, Any]]:
        with short_dir() as run_dir:
            async with serving(tree, run_dir) as router:
                client = await RawClient.connect(router.socket_path("auditor"))
                results = [await client.call("ocr_extract", {"path": "invoice.pdf", "languages": ["en"]}),
                           await client.call("ocr_extract", {"path": "big.pdf"})]
                await client.close()
                return results

    read, too_big = asyncio.run(asyncio.wait_for(scenario(), 90))
    assert read.get("isError") is not True, read
    text = " ".join(page["text"] for page in read["structuredContent"]["pages"])
    assert "INV-2024-0042" in text
    assert read["structuredContent"]["pages"][0]["blocks"][0]["bbox"]
    assert too_big["isError"] is True
    assert body(too_big)["error"] == "too_large"
