"""The project's exception root and the JSON-RPC error that mirrors the wire (docs/architecture.md §6).

`HandlerError` is the root of every error the project raises on purpose. It lives here, on the
ground floor, because the wire's own errors derive from it and the wire imports nothing else of
ours; `reconciler.config` hands it on to the rooms above. `JsonRpcError(code, message, data)` is a
protocol fault: the router answers it as a JSON-RPC `error` object, and a line client raises it when
the peer answered a request with one.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = [
    "HEADER_MISMATCH",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "SERVER_BUSY",
    "UNSUPPORTED_PROTOCOL_VERSION",
    "HandlerError",
    "JsonRpcError",
    "LineClosedError",
]

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
HEADER_MISMATCH: Final = -32020  # 2026-07-28 over HTTP: a routing header disagrees with the body, or is missing
UNSUPPORTED_PROTOCOL_VERSION: Final = -32022
SERVER_BUSY: Final = -32000  # the range JSON-RPC leaves to servers: too many connections


class HandlerError(Exception):
    """The root of every error this project raises on purpose."""


class JsonRpcError(HandlerError):
    """A protocol fault, answered (or received) as a JSON-RPC `error` object."""

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

    @classmethod
    def from_wire(cls, error: Any) -> JsonRpcError:
        """The error a peer sent as `error`; a malformed one becomes an internal error saying so."""
        if not isinstance(error, dict):
            return cls(INTERNAL_ERROR, "the peer answered with an error that is not an object")
        code = error.get("code")
        return cls(code if isinstance(code, int) and not isinstance(code, bool) else INTERNAL_ERROR,
                   str(error.get("message", "")), error.get("data"))


class LineClosedError(HandlerError, ConnectionError):
    """The stream ended (or was found unusable) while requests still waited for their reply."""
