"""JSON-RPC 2.0 messages on lines: parsing what arrives, encoding what goes out.

`parse_message` turns a line into a `Message` (None: nothing to answer) or raises the `JsonRpcError`
to answer: `-32700` for bytes that are not JSON (a blank line is answered nothing) and for JSON past the parser's
limits (nesting deeper than 1024 levels, a number past a 64-bit float), `-32600` for JSON
that is not a single request or notification (a batch, a missing `jsonrpc`, a request with no `id` or
a null one). The `encode_*` functions write one message as one line, newline included.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from reconciler.wire.errors import INVALID_REQUEST, PARSE_ERROR, JsonRpcError

__all__ = [
    "IdentifiedError",
    "Message",
    "encode_error",
    "encode_notification",
    "encode_raw_result",
    "encode_request",
    "encode_result",
    "oversize_error",
    "parse_message",
]

_DUMPS_OPTS: Final = orjson.OPT_APPEND_NEWLINE


@dataclass(frozen=True, slots=True)
class Message:
    """One parsed request (`id` present) or notification (`id` absent)."""

    method: str
    params: dict[str, Any] | None
    id: int | str | None
    is_request: bool


class IdentifiedError(JsonRpcError):
    """A JSON-RPC error about a message whose id could be read, so the reply carries that id."""

    def __init__(self, error: JsonRpcError, msg_id: int | str | None) -> None:
        super().__init__(error.code, error.message, error.data)
        self.msg_id = msg_id


def parse_message(line: bytes) -> Message | None:
    """The request or notification on `line`, or None for a response (a server sends no requests) and for a line of
    whitespace alone (some clients end lines with CRLF or send blank lines between messages: nothing to answer).

    Raises `JsonRpcError`; once the line is a JSON object its error is an `IdentifiedError` carrying
    the request's id when it has a usable one, so the client can match the reply.
    """
    try:
        msg = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        if not line.strip():
            return None
        if str(exc).startswith("depth limit"):
            raise JsonRpcError(PARSE_ERROR, "the message nests arrays or objects deeper than 1024 levels, more "
                               "than a JSON-RPC message may") from None
        if exc.msg.startswith("number is infinity"):  # valid JSON, past what a 64-bit float holds (about 1.8e308)
            raise JsonRpcError(PARSE_ERROR, f"the message holds a number out of range at column {exc.colno}: "
                               "its magnitude is past 1.8e308, the most a 64-bit float holds; send a smaller "
                               "number, or send it as a string") from None
        raise JsonRpcError(PARSE_ERROR, "the line is not valid JSON; send one JSON-RPC message per line") from None
    if not isinstance(msg, dict):
        what = "a batch (an array)" if isinstance(msg, list) else "not a JSON object"
        raise JsonRpcError(INVALID_REQUEST, f"the message is {what}; send one JSON-RPC object per line")
    try:
        return _check_message(msg)
    except JsonRpcError as exc:
        msg_id = msg.get("id")
        usable = isinstance(msg_id, int | str) and not isinstance(msg_id, bool)
        raise IdentifiedError(exc, msg_id if usable else None) from None


def _check_message(msg: dict[str, Any]) -> Message | None:
    method = msg.get("method")
    has_id = "id" in msg
    msg_id = msg.get("id")
    if method is None and has_id and ("result" in msg or "error" in msg):
        return None
    if msg.get("jsonrpc") != "2.0":
        raise JsonRpcError(INVALID_REQUEST, 'the message lacks "jsonrpc": "2.0"')
    if not isinstance(method, str):
        raise JsonRpcError(INVALID_REQUEST, "the message has no method, or its method is not a string")
    if has_id and (msg_id is None or isinstance(msg_id, bool) or not isinstance(msg_id, int | str)):
        raise JsonRpcError(INVALID_REQUEST, f"a request id must be a string or an integer; this one is {_kind(msg_id)}")
    params = msg.get("params")
    if params is not None and not isinstance(params, dict):
        raise JsonRpcError(INVALID_REQUEST, "params must be an object")
    if not has_id and not method.startswith("notifications/"):
        raise JsonRpcError(INVALID_REQUEST, f"'{method}' is a request and needs an id; only notifications/* "
                           "methods are sent without one")
    return Message(method, params, msg_id, has_id)


def _kind(value: Any) -> str:
    """What a JSON value is, said for an error message (a value that is not an id is never echoed whole)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float):
        return "a number with a fraction or beyond 64 bits"
    return "an object" if isinstance(value, dict) else "an array" if isinstance(value, list) else "not a JSON value"


def oversize_error(max_line_bytes: int) -> JsonRpcError:
    """The answer to a line over the limit, which was skipped to its end."""
    return JsonRpcError(INVALID_REQUEST, f"the message is longer than {max_line_bytes} bytes, the limit for one "
                        "line; it was skipped", {"maxLineBytes": max_line_bytes})


def encode_request(msg_id: int | str, method: str, params: Mapping[str, Any] | None = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
    if params is not None:
        message["params"] = params
    return orjson.dumps(message, option=_DUMPS_OPTS)


def encode_notification(method: str, params: Mapping[str, Any] | None = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    return orjson.dumps(message, option=_DUMPS_OPTS)


def encode_result(msg_id: int | str | None, result: Any) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": msg_id, "result": result}, option=_DUMPS_OPTS)


def encode_raw_result(msg_id: int | str | None, result_json: bytes) -> bytes:
    """A reply around a result serialized once ahead of time (the tools/list payloads)."""
    return b'{"jsonrpc":"2.0","id":' + orjson.dumps(msg_id) + b',"result":' + result_json + b"}\n"


def encode_error(msg_id: int | str | None, error: JsonRpcError) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": msg_id, "error": error.to_wire()}, option=_DUMPS_OPTS)
