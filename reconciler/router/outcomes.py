"""The `CallToolResult` shapes of docs/architecture.md §6: executed, an interface error, a hold or a refusal.

Executed: `structuredContent` is the connector's validated output and `content` holds its JSON as
text; `_meta` carries `handler/status`, `handler/cost` and `handler/budget`. Every other outcome is
a tool result with `isError: true` and a `structuredContent` the agent can read; a router-made
`unavailable` says why in `_meta[meta_keys.CAUSE]`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from reconciler.governance.gate import Settlement
from reconciler.router.errors import ToolError
from reconciler.wire import meta as meta_keys

__all__ = ["EncodedResult", "error_result", "executed_result", "held_result"]


def _text(structured: Any) -> list[dict[str, str]]:
    return [{"type": "text", "text": orjson.dumps(structured).decode()}]


@dataclass(frozen=True, slots=True)
class EncodedResult:
    """An executed result with its output serialized once: `content`'s text and `structuredContent`
    are spliced from the same bytes rather than serializing the output twice (outputs can be large)."""

    structured: bytes
    meta: dict[str, Any]

    def to_json(self, stateless: bool) -> bytes:
        text = orjson.dumps(self.structured.decode())  # the output's JSON as a JSON string
        tail = b',"resultType":"complete"}' if stateless else b"}"
        return (b'{"content":[{"type":"text","text":' + text + b'}],"structuredContent":' + self.structured
                + b',"isError":false,"_meta":' + orjson.dumps(self.meta) + tail)


def executed_result(structured: dict[str, Any], settlement: Settlement | None) -> EncodedResult:
    meta: dict[str, Any] = {meta_keys.STATUS: "executed"}
    if settlement is not None:
        meta[meta_keys.COST] = settlement.charged
        meta[meta_keys.BUDGET] = settlement.remaining
    return EncodedResult(orjson.dumps(structured), meta)


def error_result(error: ToolError) -> dict[str, Any]:
    body = {"error": error.code, "message": error.message}
    meta: dict[str, Any] = {meta_keys.STATUS: "error"}
    if error.cause is not None:
        meta[meta_keys.CAUSE] = error.cause
    return {"content": _text(body), "structuredContent": body, "isError": True, "_meta": meta}


def held_result(body: dict[str, Any], status: str) -> dict[str, Any]:
    """A hold (`pending`, with its request_id) or a refusal (`blocked`)."""
    return {"content": _text(body), "structuredContent": body, "isError": True, "_meta": {meta_keys.STATUS: status}}
