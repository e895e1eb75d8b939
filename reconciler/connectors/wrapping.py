"""Running an existing MCP server under an interface (a connector's `[wrap]`).

The server runs unmodified; the router renames the interface's tools and arguments to the server's,
and reshapes its results into the interface's output with a named reshaper (a connector cannot ship
code into the router). A tool error or a JSON-RPC error of the server becomes the interface error
named by `[wrap] error` (else `unavailable`), its message kept short.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import orjson

from reconciler.config.models import WrapSpec
from reconciler.config.snapshot import RESHAPERS
from reconciler.connectors.errors import ConnectorReplyError
from reconciler.connectors.llm import tool_error

__all__ = ["RESHAPE", "ToolCaller", "WrappedConnector"]


class ToolCaller(Protocol):
    @property
    def running(self) -> bool: ...

    async def ensure_started(self) -> None: ...

    async def stop(self) -> None: ...

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any], meta: Mapping[str, Any] | None = None
    ) -> dict[str, Any]: ...


def _texts(result: Mapping[str, Any]) -> list[str]:
    return [c.get("text", "") for c in result.get("content") or [] if isinstance(c, dict) and c.get("type") == "text"]


def _as_text(result: Mapping[str, Any]) -> dict[str, Any]:
    return {"text": "\n".join(_texts(result))}


def _as_json_text(result: Mapping[str, Any]) -> dict[str, Any]:
    texts = _texts(result)
    value = orjson.loads(texts[0]) if texts else None
    if not isinstance(value, dict):
        raise TypeError("the server's first text content is not a JSON object")
    return value


def _as_structured(result: Mapping[str, Any]) -> dict[str, Any]:
    value = result.get("structuredContent")
    if not isinstance(value, dict):
        raise TypeError("the server returned no structuredContent")
    return value


RESHAPE: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "text": _as_text,  # every text content, joined, as {"text": ...}
    "json-text": _as_json_text,  # the first text content parsed as the output object
    "structured": _as_structured,  # the server's structuredContent as it is
}
if set(RESHAPE) != set(RESHAPERS):  # the names the save-time check accepts are exactly these
    raise RuntimeError("reshapers and the names config accepts differ")


class WrappedConnector:
    """A connector speaking the interface's names in front of a server speaking its own."""

    def __init__(self, inner: ToolCaller, wrap: WrapSpec) -> None:
        self.inner = inner
        self.wrap = wrap
        self._reshape = RESHAPE[wrap.reshape or "structured"]

    @property
    def running(self) -> bool:
        return self.inner.running

    async def ensure_started(self) -> None:
        await self.inner.ensure_started()

    async def stop(self) -> None:
        await self.inner.stop()

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any], meta: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        renamed = {self.wrap.arguments.get(k, k): v for k, v in arguments.items()}
        code = self.wrap.error or "unavailable"
        try:
            result = await self.inner.call_tool(self.wrap.tools.get(name, name), renamed, meta)
        except ConnectorReplyError as exc:
            return tool_error(code, _short(exc.message))
        if result.get("isError"):
            return tool_error(code, _short(" ".join(_texts(result)) or "the wrapped server reported an error"))
        try:
            output = self._reshape(result)
        except (TypeError, ValueError) as exc:  # orjson's decode error is a ValueError
            return tool_error("unavailable", f"the wrapped server's result could not be reshaped: {exc}")
        out: dict[str, Any] = {
            "content": [{"type": "text", "text": orjson.dumps(output).decode()}],
            "structuredContent": output,
            "isError": False,
        }
        if "_meta" in result:
            out["_meta"] = result["_meta"]
        return out


def _short(message: str) -> str:
    return message if len(message) <= 500 else message[:497] + "..."
