"""Running an existing MCP server under an interface (a connector's `[wrap]`, docs/config.md).

The server runs unmodified; the router renames the interface's tools and arguments to the server's,
adds the fixed arguments, and reshapes its results into the interface's output with a named
reshaper (a connector cannot ship code into the router). When the process starts, the pool calls
`check_wrap` with the server's `tools/list`: a mapped tool it does not offer, or an argument its
schema lacks, fails the start with both names, so a wrong mapping never reaches a call.

Errors: a JSON-RPC error of the server is `unavailable` (cause `connector_error`), as for any
connector. A tool error becomes an interface error only where the wrap maps it — the tool's
`errors` patterns, searched in the server's text, then `[wrap] error` — and else `unavailable`
too. The model reads the interface's own text for the code (its `[errors]` entry), never the
server's wording, which goes nowhere: it may quote arguments.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from reconciler.config.models import WrapSpec, WrapTool
from reconciler.config.snapshot import RESHAPERS
from reconciler.connectors.errors import ConnectorError, ConnectorStartError
from reconciler.connectors.llm import tool_error

__all__ = ["RESHAPE", "ToolCaller", "WrappedConnector", "check_wrap"]


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


@dataclass(frozen=True, slots=True)
class _Route:
    """One interface tool as the server takes it, compiled once."""

    spec: WrapTool
    reshape: Callable[[Mapping[str, Any]], dict[str, Any]]
    errors: tuple[tuple[re.Pattern[str], str], ...]
    drop: tuple[re.Pattern[str], ...]


class WrappedConnector:
    """A connector speaking the interface's names in front of a server speaking its own.

    `texts` holds the interface's error texts (code → the `[errors]` entry) the model reads.
    """

    def __init__(self, inner: ToolCaller, wrap: WrapSpec, texts: Mapping[str, str] | None = None) -> None:
        self.inner = inner
        self.wrap = wrap
        self._texts = dict(texts or {})
        self._routes: dict[str, _Route] = {}

    @property
    def running(self) -> bool:
        return self.inner.running

    async def ensure_started(self) -> None:
        await self.inner.ensure_started()

    async def stop(self) -> None:
        await self.inner.stop()

    def _route(self, name: str) -> _Route:
        route = self._routes.get(name)
        if route is None:
            spec = self.wrap.tool(name)
            catch_all = () if self.wrap.error is None else ((re.compile(""), self.wrap.error),)
            route = self._routes[name] = _Route(spec, RESHAPE[spec.reshape or "structured"], (
                *((re.compile(e.match), e.error) for e in spec.errors), *catch_all),
                tuple(re.compile(p, re.S) for p in spec.drop))
        return route

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any], meta: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        route = self._route(name)
        renamed = {route.spec.arguments.get(k, k): v for k, v in arguments.items()}
        renamed.update(route.spec.fixed)
        # A JSON-RPC error (ConnectorReplyError) goes up as it is: the pipeline makes it unavailable.
        result = await self.inner.call_tool(route.spec.tool, renamed, meta)
        if result.get("isError"):
            said = " ".join(_texts(result))
            code = next((code for pattern, code in route.errors if pattern.search(said)), None)
            if code is None:
                raise ConnectorError(f"the wrapped server's tool '{route.spec.tool}' reported an error that "
                                     f"[wrap] maps to no error of the interface ({len(said)} characters, not logged)")
            return tool_error(code, self._texts.get(code, code))
        if route.drop:
            result = _without(result, route.drop)
        try:
            output = route.reshape(result)
        except (TypeError, ValueError) as exc:  # orjson's decode error is a ValueError
            raise ConnectorError(f"the wrapped server's result could not be reshaped: {exc}") from None
        out: dict[str, Any] = {
            "content": [{"type": "text", "text": orjson.dumps(output).decode()}],
            "structuredContent": output,
            "isError": False,
        }
        if "_meta" in result:
            out["_meta"] = result["_meta"]
        return out


def _without(result: Mapping[str, Any], drop: Sequence[re.Pattern[str]]) -> dict[str, Any]:
    """`result` with every match of `drop` cut out of its text contents."""
    content = []
    for item in result.get("content") or []:
        if isinstance(item, dict) and item.get("type") == "text" and isinstance(item.get("text"), str):
            text = item["text"]
            for pattern in drop:
                text = pattern.sub("", text)
            content.append({**item, "text": text})
        else:
            content.append(item)
    return {**result, "content": content}


def check_wrap(binding: str, wrap: WrapSpec, tools: Mapping[str, Collection[str]],
               offered: Sequence[Mapping[str, Any]]) -> None:
    """Hold the wrap of `tools` (each interface tool it serves → its arguments) against the server's `tools/list`.

    Raises `ConnectorStartError` naming the interface's side and the server's: a tool the server
    does not offer, or a renamed or fixed argument its `inputSchema` does not have. A rename of
    `[wrap]` itself (for every tool) counts only for the tools that have the argument.
    """
    by_name = {t.get("name"): t for t in offered if isinstance(t, Mapping)}
    offers = ", ".join(sorted(str(n) for n in by_name)) or "no tools"
    problems: list[str] = []
    for name, takes in tools.items():
        spec = wrap.tool(name)
        server_tool = by_name.get(spec.tool)
        if server_tool is None:
            problems.append(f"'{name}' maps to the server's tool '{spec.tool}', which it does not offer "
                            f"(it offers: {offers})")
            continue
        schema = server_tool.get("inputSchema")
        known = set((schema.get("properties") or {}) if isinstance(schema, Mapping) else ())
        said = ", ".join(sorted(known)) or "none"
        own = wrap.tools.get(name)
        for ours, theirs in spec.arguments.items():
            shared = not (isinstance(own, WrapTool) and ours in own.arguments)
            if theirs not in known and not (shared and ours not in takes):
                problems.append(f"'{name}' renames its argument '{ours}' to '{theirs}', which the server's "
                                f"'{spec.tool}' does not take (its arguments: {said})")
        for theirs in spec.fixed:
            if theirs not in known:
                problems.append(f"'{name}' fixes the argument '{theirs}', which the server's '{spec.tool}' "
                                f"does not take (its arguments: {said})")
    if problems:
        raise ConnectorStartError(f"binding '{binding}': [wrap] does not fit the wrapped server: "
                                  + "; ".join(problems))
