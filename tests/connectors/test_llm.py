"""The built-in llm connector against local servers speaking each vendor's wire format: llm/v1's text turn, and
llm/v2's turn with tools in each vendor's own tool-calling format."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from reconciler.connectors.llm import LlmConnector, LlmSettings
from tests.fixtures.vendors import Reply, Vendor, anthropic_reply, openai_reply, serving_vendor

CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "system": "Be brief", "maxTokens": 20, "temperature": 0.2}


@pytest.fixture
def vendor() -> Iterator[Vendor]:
    with serving_vendor() as v:
        yield v


def _egress_of(settings: LlmSettings) -> list[str]:
    """An egress naming the stand-in's own address and port, as a binding of a local server must."""
    host_port = (settings.base_url or "").split("://", 1)[-1].rstrip("/")
    return [host_port]


def _call(settings: LlmSettings, arguments: dict[str, Any], egress: list[str] | None = None,
          tool: str = "llm_complete") -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        connector = LlmConnector(settings, egress if egress is not None else _egress_of(settings))
        try:
            return await connector.call_tool(tool, arguments)
        finally:
            await connector.stop()

    return asyncio.run(go())


def _openai(vendor: Vendor, **kw: Any) -> LlmSettings:
    return LlmSettings("openai-chat", "gpt-4o-mini", "sk-test-key", vendor.url, **kw)


def _anthropic(vendor: Vendor, **kw: Any) -> LlmSettings:
    return LlmSettings("anthropic", "claude-sonnet-4-5", "ant-test-key", vendor.url, **kw)


def test_openai_chat_request_and_answer(vendor: Vendor) -> None:
    vendor.replies.append(openai_reply("Hi!", finish="length"))
    result = _call(_openai(vendor), CHAT)
    assert result["isError"] is False
    assert result["structuredContent"] == {
        "text": "Hi!",
        "stopReason": "max_tokens",
        "usage": {"inputTokens": 12, "outputTokens": 5},
    }
    [sent] = vendor.requests
    assert sent["path"] == "/v1/chat/completions"
    assert sent["headers"]["authorization"] == "Bearer sk-test-key"
    assert sent["body"] == {
        "model": "gpt-4o-mini",
        "max_tokens": 20,
        "temperature": 0.2,
        "messages": [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Say hi"}],
    }


def test_anthropic_messages_request_and_answer(vendor: Vendor) -> None:
    vendor.replies.append(anthropic_reply("Hello.", stop="end_turn"))
    result = _call(_anthropic(vendor), {"messages": [{"role": "user", "content": "Say hi"}], "system": "Brief"})
    assert result["structuredContent"] == {
        "text": "Hello.",
        "stopReason": "end",
        "usage": {"inputTokens": 9, "outputTokens": 4},
    }
    [sent] = vendor.requests
    assert sent["path"] == "/v1/messages"
    assert sent["headers"]["x-api-key"] == "ant-test-key"
    assert sent["headers"]["anthropic-version"] == "2023-06-01"
    assert sent["body"] == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "system": "Brief",
        "messages": [{"role": "user", "content": "Say hi"}],
    }


@pytest.mark.parametrize(
    ("reply", "code", "words"),
    [
        (
            Reply(
                429,
                {
                    "error": {
                        "message": "Rate limit reached for gpt-4o-mini",
                        "type": "requests",
                        "code": "rate_limit_exceeded",
                    }
                },
            ),
            "limit",
            "Rate limit reached",
        ),
        (
            Reply(
                400,
                {
                    "error": {
                        "message": "Your request was rejected",
                        "type": "invalid_request_error",
                        "code": "content_policy_violation",
                    }
                },
            ),
            "refused",
            "rejected",
        ),
        (openai_reply("", refusal="I can't help with that."), "refused", "can't help"),
        (openai_reply("", finish="content_filter"), "refused", "content filter"),
        (Reply(503, {"error": {"message": "The engine is currently overloaded"}}), "unavailable", "HTTP 503"),
        (
            Reply(
                401,
                {
                    "error": {
                        "message": "Incorrect API key provided: sk-test-key",
                        "type": "invalid_request_error",
                        "code": "invalid_api_key",
                    }
                },
            ),
            "unavailable",
            "refused the binding's key",
        ),
        (Reply(200, b"<html>gateway error</html>"), "unavailable", "not JSON"),
        (Reply(200, {"choices": []}), "unavailable", "lacks choices"),
    ],
)
def test_openai_failures_map_onto_the_closed_list(vendor: Vendor, reply: Reply, code: str, words: str) -> None:
    vendor.replies.append(reply)
    result = _call(_openai(vendor), CHAT)
    assert result["isError"] is True
    assert result["structuredContent"]["error"] == code
    assert words in result["structuredContent"]["message"]
    assert "sk-test-key" not in result["structuredContent"]["message"]


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        (
            Reply(
                429,
                {
                    "type": "error",
                    "error": {
                        "type": "rate_limit_error",
                        "message": "Number of request tokens has exceeded your rate limit",
                    },
                },
            ),
            "limit",
        ),
        (Reply(529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}), "unavailable"),
        (
            Reply(500, {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}),
            "unavailable",
        ),
        (anthropic_reply("", stop="refusal"), "refused"),
    ],
)
def test_anthropic_failures_map_onto_the_closed_list(vendor: Vendor, reply: Reply, code: str) -> None:
    vendor.replies.append(reply)
    assert _call(_anthropic(vendor), CHAT)["structuredContent"]["error"] == code


def test_a_slow_provider_is_unavailable_after_the_timeout(vendor: Vendor) -> None:
    vendor.replies.append(Reply(200, {"choices": []}, delay=1.0))
    result = _call(_openai(vendor, timeout=0.2), CHAT)
    assert result["structuredContent"]["error"] == "unavailable"
    assert "did not answer" in result["structuredContent"]["message"]


def test_an_unreachable_provider_is_unavailable() -> None:
    result = _call(LlmSettings("openai-chat", "m", "k", "http://127.0.0.1:9"), CHAT)
    assert result["structuredContent"]["error"] == "unavailable"


def test_only_offered_models_may_be_named(vendor: Vendor) -> None:
    vendor.replies.append(openai_reply("ok"))
    assert _call(_openai(vendor, models=("gpt-4o",)), {**CHAT, "model": "gpt-4o"})["isError"] is False
    assert vendor.requests[-1]["body"]["model"] == "gpt-4o"
    refused = _call(_openai(vendor), {**CHAT, "model": "o3-pro"})
    assert refused["structuredContent"]["error"] == "refused"
    assert len(vendor.requests) == 1  # the refused call never left the router


def test_settings_from_the_connector_env() -> None:
    settings = LlmSettings.from_env(
        {
            "LLM_ENDPOINT": "anthropic",
            "LLM_MODEL": "claude-sonnet-4-5",
            "LLM_API_KEY": "k",
            "LLM_MODELS": "claude-haiku-4-5, claude-opus-4-1",
        }
    )
    assert settings.models == ("claude-haiku-4-5", "claude-opus-4-1")
    with pytest.raises(ValueError, match="not one of"):
        LlmSettings.from_env({"LLM_ENDPOINT": "cohere"})


def test_a_base_url_outside_the_bindings_egress_is_never_reached_and_the_key_never_sent(vendor: Vendor) -> None:
    """The built-in runs in the router, outside the sandbox's proxy: its binding's egress is applied all the same."""
    vendor.replies.append(openai_reply("leaked"))
    result = _call(_openai(vendor), CHAT, egress=["api.openai.com:443"])
    assert result["isError"] is True
    assert result["structuredContent"]["error"] == "unavailable"
    message = result["structuredContent"]["message"]
    assert vendor.url.split("://")[1].rstrip("/") in message  # names what it would have dialled
    assert "is not in its egress (api.openai.com:443)" in message
    assert "set its base_url to a host its egress names, or add that host:port to the binding's egress" in message
    assert vendor.requests == []  # the local server saw nothing: the key was never sent


def test_a_name_the_egress_allows_that_resolves_to_this_machine_is_not_dialled(vendor: Vendor) -> None:
    """DNS cannot point an allowed name at loopback: the address is checked as the egress proxy checks it."""
    port = vendor.url.rstrip("/").rsplit(":", 1)[1]
    settings = LlmSettings("openai-chat", "gpt-4o-mini", "sk-test-key", f"http://localhost:{port}")
    result = _call(settings, CHAT, egress=[f"localhost:{port}"])
    assert result["structuredContent"]["error"] == "unavailable"
    assert "resolves only to addresses of this machine or a private network" in result["structuredContent"]["message"]
    assert vendor.requests == []


@pytest.mark.parametrize("base", ["http://[64:ff9b::7f00:1]:{port}", "http://[::ffff:127.0.0.1]:{port}",
                                  "http://0.0.0.0:{port}"])
def test_a_wildcard_egress_does_not_let_the_llm_reach_this_machine(vendor: Vendor, base: str) -> None:
    port = vendor.url.rstrip("/").rsplit(":", 1)[1]
    settings = LlmSettings("openai-chat", "gpt-4o-mini", "sk-test-key", base.format(port=port))
    result = _call(settings, CHAT, egress=["*:*"])
    assert result["structuredContent"]["error"] == "unavailable"
    assert "an address of this machine or a private network" in result["structuredContent"]["message"]
    assert vendor.requests == []


# --- llm/v2: tools -------------------------------------------------------------------------------------------------

WEATHER = {"name": "weather_now", "description": "The current weather in a city.",
           "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ASKED = {"role": "user", "content": "Weather in Lyon?"}
CALLED = {"role": "assistant", "content": "Let me look.",
          "toolCalls": [{"id": "call_1", "name": "weather_now", "arguments": {"city": "Lyon"}}]}
ANSWERED = {"role": "tool", "toolCallId": "call_1", "content": '{"temperatureC": 17}'}
USAGE_OPENAI, USAGE_ANTHROPIC = {"inputTokens": 12, "outputTokens": 5}, {"inputTokens": 9, "outputTokens": 4}


def _chat(settings: LlmSettings, arguments: dict[str, Any]) -> dict[str, Any]:
    return _call(settings, arguments, tool="llm_chat")


def test_openai_asks_for_a_tool_then_answers_from_its_result(vendor: Vendor) -> None:
    vendor.replies += [openai_reply(None, finish="tool_calls", calls=[("call_1", "weather_now", '{"city": "Lyon"}')]),
                       openai_reply("17 degrees in Lyon.")]
    system = {"role": "system", "content": "Be brief"}
    asked = _chat(_openai(vendor), {"messages": [system, ASKED], "tools": [WEATHER], "maxTokens": 50})
    assert asked["structuredContent"] == {
        "type": "tool_calls", "toolCalls": [{"id": "call_1", "name": "weather_now", "arguments": {"city": "Lyon"}}],
        "text": "", "stopReason": "tool_calls", "usage": USAGE_OPENAI}
    answered = _chat(_openai(vendor), {"messages": [system, ASKED, CALLED, ANSWERED], "tools": [WEATHER]})
    assert answered["structuredContent"] == {"type": "text", "text": "17 degrees in Lyon.", "stopReason": "end",
                                             "usage": USAGE_OPENAI}
    first, second = (request["body"] for request in vendor.requests)
    tool = {"type": "function", "function": {"name": "weather_now", "description": "The current weather in a city.",
                                             "parameters": WEATHER["inputSchema"]}}
    assert first == {"model": "gpt-4o-mini", "max_tokens": 50, "tools": [tool],
                     "messages": [{"role": "system", "content": "Be brief"}, ASKED]}
    assert second["messages"][2:] == [
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather_now", "arguments": '{"city":"Lyon"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperatureC": 17}'}]


def test_anthropic_asks_for_a_tool_then_answers_from_its_result(vendor: Vendor) -> None:
    vendor.replies += [anthropic_reply("Let me look.", stop="tool_use", uses=[("toolu_1", "weather_now",
                                                                              {"city": "Lyon"})]),
                       anthropic_reply("17 degrees in Lyon.")]
    system = {"role": "system", "content": "Be brief"}
    asked = _chat(_anthropic(vendor), {"messages": [system, ASKED], "tools": [WEATHER], "temperature": 1.5})
    assert asked["structuredContent"] == {
        "type": "tool_calls", "toolCalls": [{"id": "toolu_1", "name": "weather_now", "arguments": {"city": "Lyon"}}],
        "text": "Let me look.", "stopReason": "tool_calls", "usage": USAGE_ANTHROPIC}
    then = {"role": "user", "content": "And tomorrow?"}
    answered = _chat(_anthropic(vendor), {"messages": [system, ASKED, CALLED, ANSWERED, then], "tools": [WEATHER]})
    assert answered["structuredContent"]["type"] == "text"
    first, second = (request["body"] for request in vendor.requests)
    assert first == {"model": "claude-sonnet-4-5", "max_tokens": 1024, "system": "Be brief", "temperature": 1.0,
                     "tools": [{"name": "weather_now", "description": "The current weather in a city.",
                                "input_schema": WEATHER["inputSchema"]}],
                     "messages": [ASKED]}
    assert second["messages"][1:] == [
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                          {"type": "tool_use", "id": "call_1", "name": "weather_now",
                                           "input": {"city": "Lyon"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_1", "content": '{"temperatureC": 17}'},
            {"type": "text", "text": "And tomorrow?"}]}]


@pytest.mark.parametrize("settings", [_openai, _anthropic])
def test_a_reply_cut_at_max_tokens_is_text_never_half_a_call(vendor: Vendor, settings: Any) -> None:
    vendor.replies += [openai_reply("Let me", finish="length", calls=[("c", "weather_now", '{"ci')]),
                       anthropic_reply("Let me", stop="max_tokens", uses=[("c", "weather_now", {})])]
    if settings is _anthropic:
        vendor.replies.pop(0)
    result = _chat(settings(vendor), {"messages": [ASKED], "tools": [WEATHER], "maxTokens": 3})
    assert result["structuredContent"]["type"] == "text"
    assert result["structuredContent"]["stopReason"] == "max_tokens"
    assert result["structuredContent"]["text"] == "Let me"


@pytest.mark.parametrize("arguments", ['{"city": ', '["Lyon"]', "null"])
def test_tool_arguments_that_are_not_an_object_are_invalid_tool_call(vendor: Vendor, arguments: str) -> None:
    vendor.replies.append(openai_reply(None, finish="tool_calls", calls=[("c1", "weather_now", arguments)]))
    result = _chat(_openai(vendor), {"messages": [ASKED], "tools": [WEATHER]})
    assert result["structuredContent"]["error"] == "invalid_tool_call"
    assert "tool 'weather_now'" in result["structuredContent"]["message"]
    assert "call again" in result["structuredContent"]["message"]
    assert result["_meta"] == {"handler/retry": "later"}


def test_empty_openai_arguments_are_an_empty_object(vendor: Vendor) -> None:
    vendor.replies.append(openai_reply(None, finish="tool_calls", calls=[("c1", "weather_now", "")]))
    result = _chat(_openai(vendor), {"messages": [ASKED], "tools": [WEATHER]})
    assert result["structuredContent"]["toolCalls"] == [{"id": "c1", "name": "weather_now", "arguments": {}}]


@pytest.mark.parametrize(("tools", "messages", "says"), [
    ([{**WEATHER, "inputSchema": {"type": "object", "properties": {"city": {"type": 42}}}}], [ASKED],
     "tool 'weather_now' (tools[0]): its inputSchema is not valid JSON Schema 2020-12 at 'properties/city/type'"),
    ([{**WEATHER, "inputSchema": {"type": "object", "required": "city"}}], [ASKED],
     "at 'required': 'city' is not of type 'array'"),
    ([{**WEATHER, "inputSchema": {"type": "string"}}], [ASKED],
     "tool 'weather_now' (tools[0]): its inputSchema's root is not \"type\": \"object\""),
    ([WEATHER, WEATHER], [ASKED], "tools[0] and tools[1] are both named 'weather_now'"),
    ([WEATHER], [ASKED, {"role": "system", "content": "late"}], "messages[1] is a system message after"),
    ([WEATHER], [ASKED, CALLED], "the tool calls 'call_1' of messages[1] have no tool message at the end"),
    ([WEATHER], [ASKED, CALLED, {"role": "user", "content": "well?"}],
     "the tool calls 'call_1' of messages[1] have no tool message before messages[2]"),
    ([WEATHER], [ASKED, ANSWERED], "messages[1] answers tool call 'call_1', which is not a call of the assistant"),
    ([WEATHER], [ASKED, CALLED, ANSWERED, ANSWERED], "messages[3] answers tool call 'call_1'"),
    ([WEATHER], [ASKED, {**CALLED, "toolCalls": CALLED["toolCalls"] * 2}], "two tool calls with one id"),
])
@pytest.mark.parametrize("settings", [_openai, _anthropic])
def test_a_turn_no_vendor_would_take_is_invalid_arguments_and_never_sent(
        vendor: Vendor, settings: Any, tools: list[dict[str, Any]], messages: list[dict[str, Any]], says: str) -> None:
    result = _chat(settings(vendor), {"messages": messages, "tools": tools})
    assert result["structuredContent"]["error"] == "invalid_arguments"
    assert says in result["structuredContent"]["message"]
    assert vendor.requests == []


def test_a_v1_call_is_the_same_turn_without_tools(vendor: Vendor) -> None:
    """llm/v1 stays as it was: no tools sent, no `type` in its output, a tool call it could not ask for refused."""
    vendor.replies += [openai_reply("Hi!"), openai_reply(None, finish="tool_calls", calls=[("c", "x", "{}")])]
    assert "type" not in _call(_openai(vendor), CHAT)["structuredContent"]
    assert "tools" not in vendor.requests[0]["body"]
    assert _call(_openai(vendor), CHAT)["structuredContent"]["error"] == "unavailable"
