"""`handler-agent INPUT`: the runner that works with nothing else installed (docs/agents.md).

A small loop on the official MCP SDK client: it opens every server of the profile's MCP configuration
(`HANDLER_MCP_CONFIG`, which the router hands a run), offers the model every tool but the model's own, calls the
profile's `llm_chat` (llm/v2) with the input, runs each tool call the model asks for through the router, answers it
with the tool's result, and prints the model's last text as one line: the run's result. Its calls are governed like
any agent's: a held call's pending result is what the model reads. Run by the agent service as a profile's
`[runner]`; the `handler-agent` entry point of pyproject.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult

__all__ = ["main"]

MODEL_TOOL = "llm_chat"
MAX_TURNS = int(os.environ.get("HANDLER_AGENT_MAX_TURNS", "20"))
SYSTEM = ("You are an agent working through the tools offered. Use them to do the task; when it is done, answer "
          "with the result alone.")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or not args[0].strip():
        print("handler-agent: give the task as one argument: handler-agent \"read scans/a.pdf and give its total\"",
              file=sys.stderr)
        return 2
    config = os.environ.get("HANDLER_MCP_CONFIG")
    if not config:
        print("handler-agent: HANDLER_MCP_CONFIG is not set; it runs as a profile's [runner], which sets it",
              file=sys.stderr)
        return 2
    try:
        answer = asyncio.run(_run(Path(config), args[0]))
    except AgentError as exc:
        print(f"handler-agent: {exc}", file=sys.stderr)
        return 1
    print(" ".join(answer.split()))
    return 0


class AgentError(Exception):
    """The loop cannot go on: no model tool, a model error, too many turns."""


async def _run(config: Path, task: str) -> str:
    servers = json.loads(config.read_text())["mcpServers"]
    async with contextlib.AsyncExitStack() as stack:
        owners: dict[str, ClientSession] = {}
        offered: list[dict[str, Any]] = []
        for entry in servers.values():
            read, write = await stack.enter_async_context(stdio_client(StdioServerParameters(**entry)))
            session = await stack.enter_async_context(ClientSession(read, write))
            await session.initialize()
            for tool in (await session.list_tools()).tools:
                owners.setdefault(tool.name, session)
                if not tool.name.startswith("llm_") and tool.name not in {t["name"] for t in offered}:
                    offered.append({"name": tool.name, "description": tool.description or tool.name,
                                    "inputSchema": tool.input_schema})
        if MODEL_TOOL not in owners:
            raise AgentError(f"the profile serves no {MODEL_TOOL} (llm/v2): bind llm to a binding implementing it")
        return await _loop(owners, offered, task)


async def _loop(owners: dict[str, ClientSession], offered: list[dict[str, Any]], task: str) -> str:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    for _ in range(MAX_TURNS):
        reply = _body(await owners[MODEL_TOOL].call_tool(MODEL_TOOL, {"messages": messages, "tools": offered}))
        if "error" in reply or reply.get("status") in ("pending", "blocked"):
            raise AgentError(f"the model call did not answer: {reply.get('message') or reply}")
        if reply.get("type") != "tool_calls":
            return str(reply.get("text", ""))
        calls = reply["toolCalls"]
        turn: dict[str, Any] = {"role": "assistant", "toolCalls": calls}
        if reply.get("text"):
            turn["content"] = reply["text"]
        messages.append(turn)
        for call in calls:
            messages.append({"role": "tool", "toolCallId": call["id"], "content": await _tool(owners, call)})
    raise AgentError(f"the model still asked for tools after {MAX_TURNS} turns (HANDLER_AGENT_MAX_TURNS)")


async def _tool(owners: dict[str, ClientSession], call: dict[str, Any]) -> str:
    """The tool's result as the model reads it: its JSON text, or its error; an unknown tool says which exist."""
    session = owners.get(call["name"])
    if session is None or call["name"].startswith("llm_"):
        return json.dumps({"error": "invalid_arguments", "message": f"no tool '{call['name']}' is offered"})
    result = await session.call_tool(call["name"], call.get("arguments") or {})
    return json.dumps(_body(result))[:400000]


def _body(result: CallToolResult) -> dict[str, Any]:
    raw = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    if isinstance(raw.get("structuredContent"), dict) and not raw.get("isError"):
        return dict(raw["structuredContent"])
    text = "".join(block.get("text", "") for block in raw.get("content") or [] if isinstance(block, dict))
    try:
        parsed = json.loads(text)
    except ValueError:
        return {"error": "unavailable", "message": text}
    return parsed if isinstance(parsed, dict) else {"text": text}
