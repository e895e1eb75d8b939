"""What one call through the router gave: the tool result read the way the runner judges it.

A `Reply` wraps the `CallToolResult` the router sent (docs/architecture.md §6) with what the runner saw on the
connector side of the router during that call (`Dispatch`: the arguments the connector received
and its raw result), so a failure can show the connector's actual output, not only the router's
verdict on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler.wire import meta as meta_keys
from reconciler.wire.results import result_body

__all__ = ["Dispatch", "Reply"]


@dataclass(frozen=True)
class Dispatch:
    """One tools/call that reached the connector: the arguments it got and what it answered."""

    tool: str
    arguments: Mapping[str, Any]
    result: Mapping[str, Any] | None  # the raw CallToolResult, None when the call failed or was cut
    failure: str | None = None  # how the call failed on the connector side (crashed, cancelled, ...)


@dataclass(frozen=True)
class Reply:
    """The router's answer to one tools/call, and what reached the connector meanwhile."""

    result: Mapping[str, Any]
    seconds: float
    dispatched: tuple[Dispatch, ...] = field(default=())
    protocol_error: Mapping[str, Any] | None = None  # a JSON-RPC error instead of a result

    @property
    def is_error(self) -> bool:
        return self.protocol_error is not None or bool(self.result.get("isError"))

    @property
    def structured(self) -> Any:
        """The body: the output when executed, else the error, pending or blocked body (docs/router.md)."""
        return result_body(self.result) if self.result else None

    @property
    def output(self) -> Any:
        """The tool's output (valid against outputSchema, the router checked) when it succeeded."""
        return None if self.is_error else self.structured

    @property
    def meta(self) -> Mapping[str, Any]:
        meta = self.result.get("_meta")
        return meta if isinstance(meta, dict) else {}

    @property
    def error(self) -> str | None:
        """The error code of a failed call: an interface's code, `invalid_arguments`, `unavailable`."""
        if self.protocol_error is not None:
            return f"JSON-RPC {self.protocol_error.get('code')}"
        if not self.is_error:
            return None
        body = self.structured
        if isinstance(body, dict):
            if isinstance(body.get("error"), str):
                return str(body["error"])
            if isinstance(body.get("status"), str):
                return str(body["status"])  # a hold or a refusal: the harness's profile should allow all
        return "(no error code)"

    @property
    def message(self) -> str:
        if self.protocol_error is not None:
            return str(self.protocol_error.get("message", ""))
        body = self.structured
        return str(body.get("message", "")) if isinstance(body, dict) else ""

    @property
    def cause(self) -> str | None:
        """Why the router itself made the call `unavailable` (`_meta["handler/cause"]`), if it did."""
        cause = self.meta.get(meta_keys.CAUSE)
        return cause if isinstance(cause, str) else None

    @property
    def connector_output(self) -> Any:
        """The structuredContent the connector sent for the last dispatch, before the router judged it."""
        for dispatch in reversed(self.dispatched):
            if dispatch.result is not None:
                return dispatch.result.get("structuredContent")
        return None

    def describe_error(self) -> str:
        if self.protocol_error is not None:
            return f"a JSON-RPC error {self.protocol_error.get('code')}: {self.message}"
        text = f"the error '{self.error}'"
        if self.cause:
            text += f" (the router's cause: {self.cause})"
        return f"{text}: {self.message}" if self.message else text
