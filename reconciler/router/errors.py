"""The two ways a request ends badly: a JSON-RPC error (a protocol fault) or a tool error (an interface error).

`JsonRpcError` mirrors the wire (`code`, `message`, `data`) and becomes an `error` response.
`ToolError` carries an interface's closed error code and becomes a tool result with `isError: true`
and `structuredContent: {"error", "message"}` (design §6), so the model can read it and correct
itself. When the router itself turns a call into `unavailable`, `cause` says why.
"""

from __future__ import annotations

from typing import Any

from reconciler.config.errors import HandlerError

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "UNSUPPORTED_PROTOCOL_VERSION",
    "JsonRpcError",
    "ToolError",
]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
UNSUPPORTED_PROTOCOL_VERSION = -32022


class JsonRpcError(HandlerError):
    """A protocol fault, answered as a JSON-RPC `error` object."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_wire(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class ToolError(HandlerError):
    """A call that ends with one of the interface's error codes (or the router's own two)."""

    def __init__(self, code: str, message: str, *, cause: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.cause = cause  # why the router made it `unavailable`: timeout, crashed, output_invalid, ...
        self.field = field  # for output_invalid: where the output broke the schema (a path, never a value)


def unavailable(cause: str, message: str, field: str | None = None) -> ToolError:
    """The router's own `unavailable`, with the cause the log and the conformance runner read."""
    return ToolError("unavailable", message, cause=cause, field=field)


def invalid_arguments(message: str) -> ToolError:
    return ToolError("invalid_arguments", message)
