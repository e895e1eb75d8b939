"""The built-in llm connector under `handler connector check`, against a scripted model behind the vendors' stand-in:
llm/v1's and llm/v2's cases and schema fuzzing pass for each vendor's wire format, tool calls included.

The stand-in (`tests/fixtures/vendors.py`) speaks OpenAI's chat completions and Anthropic's Messages API; here it
answers from a script that reads the request as its vendor sends it and plays a model just well enough for the
cases: it calls the first tool it is offered with the city the user named, reads a tool's result back, follows
the PONG instruction, knows one capital and one remembered number, and stops at a small `max_tokens`. A check
against it proves the wire and the connector, never a model's quality.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.harness import short_dir
from tests.fixtures.vendor_trees import egress_of, passing_check, write_tree
from tests.fixtures.vendors import Reply, anthropic_reply, openai_reply, serving_vendor

pytestmark = pytest.mark.timeout(300)  # one check runs llm/v1's items and llm/v2's

BINDING = """apiVersion = "handler.binding/v1"
name = "llm-test"
connector = "llm"
secrets = {{ api_key = {{ env = "TEST_LLM_KEY" }} }}
settings = {{ endpoint = "{endpoint}", model = "stand-in-1", base_url = "{url}" }}
egress = ["{egress}"]  # the stand-in's exact address

[pricing]
llm_complete = 0.001
llm_chat = 0.001
"""


def _texts(content: Any) -> str:
    """A message's text as either vendor sends it: a string, or blocks (text, and a tool result's content)."""
    if isinstance(content, str):
        return content
    return " ".join(str(b.get("text") or b.get("content") or "") for b in content or () if isinstance(b, dict))


def _read(body: dict[str, Any]) -> tuple[str, list[tuple[str, str]], list[dict[str, Any]], int]:
    """The request as the script reads it: system text, (role, text) turns, tools, max tokens; a tool result's
    turn has the role `tool` (OpenAI's tool message, Anthropic's user turn of tool_result blocks)."""
    system = body.get("system") or ""
    turns: list[tuple[str, str]] = []
    for message in body.get("messages") or ():
        role, content = message["role"], message.get("content")
        if role == "system":
            system += _texts(content)
            continue
        answers_tool = isinstance(content, list) and any(b.get("type") == "tool_result" for b in content)
        turns.append(("tool" if answers_tool else role, _texts(content)))
    tools = [t.get("function", t) for t in body.get("tools") or ()]
    return system, turns, tools, int(body.get("max_tokens") or 1024)


def _answer(system: str, turns: list[tuple[str, str]], tools: list[dict[str, Any]]) -> str | dict[str, Any]:
    """What the scripted model says: a text, or the arguments of a call to the first tool offered."""
    role, last = turns[-1] if turns else ("user", "")
    if role == "tool":
        return f"The tool answered: {last}"
    if tools:
        city = re.search(r"\bin ([A-Z][a-z]+)", last)
        return {"city": city.group(1) if city else "Paris"}
    if "PONG" in system:
        return "PONG"
    if "capital of France" in last:
        return "Paris"
    if "remember" in last.lower():
        number = re.search(r"\d+", " ".join(text for who, text in turns if who == "user"))
        return number.group(0) if number else "I do not know."
    return f"I read: {last[:40]}"


def script(path: str, body: Any) -> Reply:
    """The stand-in's answer to a request of its vendor's shape."""
    anthropic = path == "/v1/messages"
    system, turns, tools, most = _read(body)
    said = _answer(system, turns, tools)
    if most <= 5 and isinstance(said, str):  # cut short, as a model would be at so few tokens
        reply = anthropic_reply("1, 2", stop="max_tokens") if anthropic else openai_reply("1, 2", finish="length")
        usage = reply.body["usage"]
        usage["output_tokens" if anthropic else "completion_tokens"] = most
        return reply
    if isinstance(said, str):
        return anthropic_reply(said) if anthropic else openai_reply(said)
    name = tools[0]["name"]
    if anthropic:
        return anthropic_reply("", stop="tool_use", uses=[("toolu_1", name, said)])
    return openai_reply(None, finish="tool_calls", calls=[("call_1", name, json.dumps(said))])


@pytest.fixture(params=["openai-chat", "anthropic"])
def llm_tree(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A config tree whose binding `llm-test` points the built-in llm at the scripted stand-in, speaking one
    vendor's format; the connector's egress names the stand-in too (a binding may only narrow it)."""
    monkeypatch.setenv("TEST_LLM_KEY", "key-for-the-stand-in")
    with serving_vendor() as vendor, short_dir() as folder:
        vendor.script = script
        entry = egress_of(vendor.url)
        text = BINDING.format(endpoint=request.param, url=vendor.url, egress=entry)
        root = write_tree(folder / "t", "llm-test", text, "llm")
        manifest = root / "catalog/connectors/llm/connector.toml"
        manifest.write_text(manifest.read_text().replace('"api.anthropic.com:443"]',
                                                         f'"api.anthropic.com:443", "{entry}"]'))
        yield root


def test_connector_check_passes_against_the_stand_in(llm_tree: Path, tmp_path: Path,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    # Not recorded in catalog/results: the catalog workflow checks no built-in connector (it has no process).
    summary = passing_check("llm", "llm-test", llm_tree, "llm/v2", examples=10, seed=3,
                            result=tmp_path / "result.json", capfd=capfd)
    assert summary["cases"]["passed"] == 6
    assert summary["fuzzing_pass"]
