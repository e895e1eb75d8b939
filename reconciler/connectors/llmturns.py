"""One model turn in each vendor's wire format: llm/v2's conversation with tools, and llm/v1's as the same turn
without them; called by the built-in connector (`connectors/llm.py`), which sends the bodies and maps HTTP failures.

`check_turn` refuses, before a byte is sent, what neither vendor would take or what would reach it as something
else: a tool whose `inputSchema` is not a valid JSON Schema 2020-12 object schema (the message names the tool and
the keyword), two tools of one name, a system message after the start, a tool call left unanswered or a tool
message answering no call. `openai_body` / `read_openai` speak OpenAI's chat completions (`tools` of type
`function`, `tool_calls` whose `function.arguments` is a JSON string); `anthropic_body` / `read_anthropic` the
Messages API (`tools` with `input_schema`, `tool_use` and `tool_result` content blocks, system messages in
`system`). A reply is read into llm/v2's output: text, or the tool calls the model asks for, with its usage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from reconciler.config.errors import HandlerError
from reconciler.config.schemas import schema_errors, types_of

__all__ = ["LlmError", "anthropic_body", "check_turn", "openai_body", "read_anthropic", "read_openai"]

DEFAULT_MAX_TOKENS = 1024  # the Messages API requires one; llm/v1 and llm/v2 make it optional
_OPENAI_STOPS = {"stop": "end", "length": "max_tokens"}
_ANTHROPIC_STOPS = {"max_tokens": "max_tokens", "stop_sequence": "stop_sequence"}
_SHOWN = 300  # characters of a schema error's own words kept in a message


class LlmError(HandlerError):
    """A turn that ends with one of the interface's codes (or the router's `invalid_arguments`)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def check_turn(arguments: Mapping[str, Any]) -> None:
    """Raise `invalid_arguments` for a turn the inputSchema allows but no vendor would take as meant."""
    _check_tools(arguments.get("tools") or ())
    _check_order(arguments["messages"])


def _check_tools(tools: Sequence[Mapping[str, Any]]) -> None:
    seen: dict[str, int] = {}
    for index, tool in enumerate(tools):
        name, schema = tool["name"], tool["inputSchema"]
        if name in seen:
            raise LlmError("invalid_arguments", f"tools[{seen[name]}] and tools[{index}] are both named '{name}'; "
                           "give each tool a name of its own")
        seen[name] = index
        where = f"tool '{name}' (tools[{index}])"
        errors = schema_errors(schema)
        if errors:
            error = errors[0]
            at = "/".join(map(str, error.absolute_path)) or "(root)"
            raise LlmError("invalid_arguments", f"{where}: its inputSchema is not valid JSON Schema 2020-12 at "
                           f"'{at}': {error.message[:_SHOWN]}; correct that keyword (json-schema.org/draft/2020-12)")
        if types_of(schema) != {"object"}:
            raise LlmError("invalid_arguments", f"{where}: its inputSchema's root is not \"type\": \"object\"; "
                           "a tool's arguments are an object, as an MCP tool's inputSchema says")


def _check_order(messages: Sequence[Mapping[str, Any]]) -> None:
    """System messages first; every tool call answered by one tool message before the next turn, and no other."""
    pending: dict[str, int] = {}  # the last assistant message's calls not answered yet: id → that message's index
    for index, message in enumerate(messages):
        role = message["role"]
        if role == "system" and index and messages[index - 1]["role"] != "system":
            raise LlmError("invalid_arguments", f"messages[{index}] is a system message after the conversation "
                           "began; put every system message first")
        if role == "tool":
            call = message["toolCallId"]
            if pending.pop(call, None) is None:
                raise LlmError("invalid_arguments", f"messages[{index}] answers tool call '{call[:200]}', which is "
                               "not a call of the assistant message before it or was answered already; a tool "
                               "message's toolCallId repeats the id of a call it answers, once")
            continue
        _refuse_unanswered(pending, f"before messages[{index}]")
        if role == "assistant":
            ids = [call["id"] for call in message.get("toolCalls") or ()]
            if len(set(ids)) != len(ids):
                raise LlmError("invalid_arguments", f"messages[{index}] has two tool calls with one id; each "
                               "call's id is its own")
            pending = dict.fromkeys(ids, index)
    _refuse_unanswered(pending, "at the end")


def _refuse_unanswered(pending: Mapping[str, int], where: str) -> None:
    if pending:
        asked = next(iter(pending.values()))
        ids = ", ".join(f"'{call[:200]}'" for call in pending)
        raise LlmError("invalid_arguments", f"the tool calls {ids} of messages[{asked}] have no tool message "
                       f"{where}; add one per call (role tool, its toolCallId, the result as content) right "
                       "after that assistant message")


def openai_body(model: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The chat-completions request for a turn (`max_tokens` and `temperature` only when given)."""
    body: dict[str, Any] = {"model": model, "messages": [_openai_message(m) for m in arguments["messages"]]}
    if arguments.get("tools"):
        body["tools"] = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                           "parameters": t["inputSchema"]}}
                         for t in arguments["tools"]]
    if "maxTokens" in arguments:
        body["max_tokens"] = arguments["maxTokens"]
    if "temperature" in arguments:
        body["temperature"] = arguments["temperature"]
    return body


def _openai_message(message: Mapping[str, Any]) -> dict[str, Any]:
    if message["role"] == "tool":
        return {"role": "tool", "tool_call_id": message["toolCallId"], "content": message["content"]}
    out: dict[str, Any] = {"role": message["role"]}
    if "content" in message:
        out["content"] = message["content"]
    if message.get("toolCalls"):
        out["tool_calls"] = [{"id": c["id"], "type": "function",
                              "function": {"name": c["name"], "arguments": orjson.dumps(c["arguments"]).decode()}}
                             for c in message["toolCalls"]]
    return out


def read_openai(data: Mapping[str, Any]) -> dict[str, Any]:
    """A chat-completions answer as llm/v2's output; a refusal or a content filter is `refused`."""
    try:
        choice = data["choices"][0]
        message = choice["message"]
        if message.get("refusal") or choice.get("finish_reason") == "content_filter":
            raise LlmError("refused", message.get("refusal") or "the provider's content filter stopped the reply")
        finish = choice.get("finish_reason") or "stop"
        usage = _usage(data, "prompt_tokens", "completion_tokens")
        text = message.get("content") or ""
        calls = [] if finish == "length" else message.get("tool_calls") or []  # calls cut short are not sent on
        if calls:
            return _calls_reply([_openai_call(c) for c in calls], text, usage)
        return _text_reply(text, _OPENAI_STOPS.get(finish, "end"), usage)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        raise LlmError("unavailable", "the provider's answer lacks choices[0].message") from None


def _openai_call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call["function"]
    raw = function.get("arguments") or "{}"
    try:
        arguments = orjson.loads(raw) if isinstance(raw, str) else raw
    except orjson.JSONDecodeError:
        arguments = None
    return _call(str(call["id"]), str(function["name"]), arguments)


def anthropic_body(model: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The Messages API request for a turn: system messages joined into `system`, tool results in user turns."""
    messages = arguments["messages"]
    body: dict[str, Any] = {"model": model, "max_tokens": arguments.get("maxTokens", DEFAULT_MAX_TOKENS),
                            "messages": _anthropic_messages(m for m in messages if m["role"] != "system")}
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    if system:
        body["system"] = system
    if arguments.get("tools"):
        body["tools"] = [{"name": t["name"], "description": t["description"], "input_schema": t["inputSchema"]}
                         for t in arguments["tools"]]
    if "temperature" in arguments:
        body["temperature"] = min(float(arguments["temperature"]), 1.0)  # the Messages API caps it at 1
    return body


def _anthropic_messages(messages: Any) -> list[dict[str, Any]]:
    """The turns, a tool message becoming a `tool_result` block of a user turn; turns of one role in a row
    merged into one, so tool results come first in the user turn that carries them, as the API requires."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role, content = _anthropic_turn(message)
        if out and out[-1]["role"] == role:
            out[-1]["content"] = _blocks(out[-1]["content"]) + _blocks(content)
        else:
            out.append({"role": role, "content": content})
    return out


def _anthropic_turn(message: Mapping[str, Any]) -> tuple[str, str | list[dict[str, Any]]]:
    if message["role"] == "tool":
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message["toolCallId"]}
        if message["content"]:
            block["content"] = message["content"]
        return "user", [block]
    if not message.get("toolCalls"):
        return message["role"], message["content"]
    blocks = _blocks(message["content"]) if "content" in message else []
    blocks += [{"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["arguments"]}
               for c in message["toolCalls"]]
    return "assistant", blocks


def _blocks(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def read_anthropic(data: Mapping[str, Any]) -> dict[str, Any]:
    """A Messages API answer as llm/v2's output; a `refusal` stop is `refused`."""
    try:
        stop = data.get("stop_reason") or "end_turn"
        if stop == "refusal":
            raise LlmError("refused", "the model declined to answer")
        blocks = data["content"]
        text = "".join(block.get("text", "") for block in blocks if block.get("type") == "text")
        usage = _usage(data, "input_tokens", "output_tokens")
        calls = [] if stop == "max_tokens" else [b for b in blocks if b.get("type") == "tool_use"]
        if calls:
            return _calls_reply([_call(str(b["id"]), str(b["name"]), b.get("input")) for b in calls], text, usage)
        return _text_reply(text, _ANTHROPIC_STOPS.get(stop, "end"), usage)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise LlmError("unavailable", "the provider's answer lacks its content blocks") from None


def _call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    if not isinstance(arguments, dict):
        raise LlmError("invalid_tool_call", f"the model asked for tool '{name[:64]}' with arguments that are not "
                       "a JSON object; call again the same way, and if it happens again simplify that tool's "
                       "inputSchema or the request")
    return {"id": call_id, "name": name, "arguments": arguments}


def _usage(data: Mapping[str, Any], given: str, made: str) -> dict[str, int]:
    usage = data.get("usage") or {}
    return {"inputTokens": int(usage.get(given, 0)), "outputTokens": int(usage.get(made, 0))}


def _text_reply(text: str, stop: str, usage: dict[str, int]) -> dict[str, Any]:
    return {"type": "text", "text": text, "stopReason": stop, "usage": usage}


def _calls_reply(calls: list[dict[str, Any]], text: str, usage: dict[str, int]) -> dict[str, Any]:
    return {"type": "tool_calls", "toolCalls": calls, "text": text, "stopReason": "tool_calls", "usage": usage}
