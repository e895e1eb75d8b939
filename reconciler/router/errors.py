"""A call that ends with an interface error: the tool result the model reads (docs/architecture.md §6).

`ToolError` carries an interface's closed error code and becomes a tool result with `isError: true`
carrying `{"error", "message"}`, so the model can read it and correct itself. When the router
itself turns a call into `unavailable`, `cause` says why. `retry` says whether calling again can help
(`_meta["handler/retry"]`): what the connector said of a declared error, else `later` for `unavailable`
(unless its cause is for good) and `limit` (the catalog's rate limits), `never` for every other code,
which asks the model to change the call. Protocol faults are `JsonRpcError`s, which
belong to the wire (`reconciler.wire.errors`).
"""

from __future__ import annotations

from reconciler.config.errors import HandlerError
from reconciler.wire.meta import RETRY_LATER, RETRY_NEVER

__all__ = ["LATER_CODES", "ToolError", "invalid_arguments", "unavailable"]

# The codes a call may succeed with later, as it is: a service down, a rate limit waited out (every shipped
# interface's `limit` is one). A connector may say otherwise of its own error (`_meta["handler/retry"]`).
LATER_CODES = frozenset({"unavailable", "limit"})


class ToolError(HandlerError):
    """A call that ends with one of the interface's error codes (or the router's own two)."""

    def __init__(self, code: str, message: str, *, cause: str | None = None, field: str | None = None,
                 detail: str | None = None, retry: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        # Whether the same call can succeed later: other codes are about the call itself (its file, its recipient).
        self.retry = retry or (RETRY_LATER if code in LATER_CODES else RETRY_NEVER)
        self.message = message
        self.cause = cause  # why the router made it `unavailable`: timeout, crashed, output_invalid, ...
        self.field = field  # for output_invalid: where the output broke the schema (a path, never a value)
        self.detail = detail  # what the operator is told (the log; a held call's cause), never the model

    def operator_text(self) -> str:
        """The error as the people running the service read it: code, cause, field and detail."""
        why = ", ".join(filter(None, (self.cause, f"at {self.field}" if self.field else None)))
        return f"{self.code}{f' ({why})' if why else ''}: {self.detail or self.message}"


def unavailable(cause: str, message: str, field: str | None = None, detail: str | None = None,
                retry: str = RETRY_LATER) -> ToolError:
    """The router's own `unavailable`, with the cause the log and the conformance runner read."""
    return ToolError("unavailable", message, cause=cause, field=field, detail=detail, retry=retry)


def invalid_arguments(message: str) -> ToolError:
    return ToolError("invalid_arguments", message)
