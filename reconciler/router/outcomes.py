"""The `CallToolResult` shapes of design §6: executed, an interface error, a hold or a refusal.

Executed: `structuredContent` is the connector's validated output and `content` holds its JSON as
text; `_meta` carries `handler/status`, `handler/cost` and `handler/budget`. Every other outcome is
a tool result with `isError: true` and a `structuredContent` the agent can read; a router-made
`unavailable` says why in `_meta["handler/cause"]`.
"""

from __future__ import annotations

from typing import Any

import orjson

from reconciler.governance.gate import Settlement
from reconciler.router.errors import ToolError

__all__ = ["error_result", "executed_result", "held_result"]


def _text(structured: Any) -> list[dict[str, str]]:
    return [{"type": "text", "text": orjson.dumps(structured).decode()}]


def executed_result(structured: dict[str, Any], settlement: Settlement | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"handler/status": "executed"}
    if settlement is not None:
        meta["handler/cost"] = settlement.charged
        meta["handler/budget"] = settlement.remaining
    return {"content": _text(structured), "structuredContent": structured, "isError": False, "_meta": meta}


def error_result(error: ToolError) -> dict[str, Any]:
    body = {"error": error.code, "message": error.message}
    meta: dict[str, Any] = {"handler/status": "error"}
    if error.cause is not None:
        meta["handler/cause"] = error.cause
    return {"content": _text(body), "structuredContent": body, "isError": True, "_meta": meta}


def held_result(body: dict[str, Any], status: str) -> dict[str, Any]:
    """A hold (`pending`, with its request_id) or a refusal (`blocked`)."""
    return {"content": _text(body), "structuredContent": body, "isError": True, "_meta": {"handler/status": status}}
