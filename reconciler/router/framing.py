"""Step 1 of the call (design §2): one JSON-RPC message per line, and what to answer when a line is bad.

`LineFramer` cuts a byte stream into lines under a size cap (default 16 MiB): a line over the cap is
reported once as `OVERSIZE` and skipped up to its newline, so the connection lives on.
`parse_message` turns a line into a `Message` or raises the JSON-RPC error to answer: `-32700` for
bytes that are not JSON, `-32600` for JSON that is not a single request or notification (a batch, a
missing `jsonrpc`, a request with no `id` or a null one). `encode_*` write replies as lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson

from reconciler.router.errors import INVALID_REQUEST, PARSE_ERROR, JsonRpcError

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "OVERSIZE",
    "IdentifiedError",
    "LineFramer",
    "Message",
    "encode_error",
    "encode_raw_result",
    "encode_result",
    "parse_message",
]

DEFAULT_MAX_LINE_BYTES: Final = 16 * 1024 * 1024
_NL: Final = b"\n"
_DUMPS_OPTS: Final = orjson.OPT_APPEND_NEWLINE


class _Oversize:
    __slots__ = ()

    def __repr__(self) -> str:
        return "OVERSIZE"


OVERSIZE: Final = _Oversize()


class LineFramer:
    """Buffers bytes and yields whole lines; a line longer than `max_line_bytes` yields `OVERSIZE` once."""

    __slots__ = ("_buf", "_discarding", "max_line_bytes")

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self._buf = bytearray()
        self._discarding = False

    def feed(self, data: bytes) -> list[bytes | _Oversize]:
        if not self._buf and not self._discarding and data.endswith(_NL) and data.find(_NL) == len(data) - 1:
            # The common case: exactly one whole message in one read.
            return [data] if len(data) - 1 <= self.max_line_bytes else [OVERSIZE]
        out: list[bytes | _Oversize] = []
        start = 0
        if self._discarding:
            end = data.find(_NL)
            if end < 0:
                return out
            self._discarding = False
            start = end + 1
        buf = self._buf
        buf += data[start:] if start else data
        pos = 0
        while (end := buf.find(_NL, pos)) >= 0:
            out.append(bytes(buf[pos : end + 1]) if end - pos <= self.max_line_bytes else OVERSIZE)
            pos = end + 1
        if pos:
            del buf[:pos]
        if len(buf) > self.max_line_bytes:
            # Answer now rather than buffer the rest of a line that can never be accepted.
            buf.clear()
            self._discarding = True
            out.append(OVERSIZE)
        return out

    def oversize_error(self) -> JsonRpcError:
        return JsonRpcError(INVALID_REQUEST, f"the message is longer than {self.max_line_bytes} bytes, the "
                            "router's limit for one line; it was skipped", {"maxLineBytes": self.max_line_bytes})


@dataclass(frozen=True, slots=True)
class Message:
    """One parsed request (`id` present) or notification (`id` absent)."""

    method: str
    params: dict[str, Any] | None
    id: int | str | None
    is_request: bool


def parse_message(line: bytes) -> Message | None:
    """The message on `line`, or None for a response (the router sends no requests, so it ignores them).

    Raises `JsonRpcError`; once the line is a JSON object its error is an `IdentifiedError` carrying
    the request's id when it has a usable one, so the client can match the reply.
    """
    try:
        msg = orjson.loads(line)
    except orjson.JSONDecodeError:
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
        raise JsonRpcError(INVALID_REQUEST, "a request id must be a string or an integer, never null")
    params = msg.get("params")
    if params is not None and not isinstance(params, dict):
        raise JsonRpcError(INVALID_REQUEST, "params must be an object")
    if not has_id and not method.startswith("notifications/"):
        raise JsonRpcError(INVALID_REQUEST, f"'{method}' is a request and needs an id; only notifications/* "
                           "methods are sent without one")
    return Message(method, params, msg_id, has_id)


class IdentifiedError(JsonRpcError):
    """A JSON-RPC error about a message whose id could be read, so the reply carries that id."""

    def __init__(self, error: JsonRpcError, msg_id: int | str | None) -> None:
        super().__init__(error.code, error.message, error.data)
        self.msg_id = msg_id


def encode_result(msg_id: int | str | None, result: Any) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": msg_id, "result": result}, option=_DUMPS_OPTS)


def encode_raw_result(msg_id: int | str | None, result_json: bytes) -> bytes:
    """A reply around a result serialized once ahead of time (the tools/list payloads)."""
    return b'{"jsonrpc":"2.0","id":' + orjson.dumps(msg_id) + b',"result":' + result_json + b"}\n"


def encode_error(msg_id: int | str | None, error: JsonRpcError) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": msg_id, "error": error.to_wire()}, option=_DUMPS_OPTS)
