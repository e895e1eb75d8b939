"""Tool drift: a connector's own `tools/list` held against the interfaces it claims, when its process starts.

The supervisor of a binding's process calls `check_tools` once per start (`find_tool_drift` for a connector,
`wrapping.check_wrap` for a wrap). A tool of a claimed interface that the connector does not offer fails the
start (every call of it would fail). A tool whose description or schemas differ from the interface's is drift:
logged and kept in the binding's status, never shown to agents, who see only the interface's `tools.json` (S1).
A connector on the connector kit lists the interface's own `tools.json` and cannot drift; the check is for the
others: a wrapped server, a connector written without the kit or in another language.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from reconciler.config.snapshot import Connector, Snapshot
from reconciler.connectors.client import ConnectorProcess
from reconciler.connectors.errors import ConnectorError, ConnectorReplyError, ConnectorStartError
from reconciler.connectors.wrapping import check_wrap

__all__ = ["check_tools", "find_tool_drift"]

log = logging.getLogger("handler.connectors")


def find_tool_drift(binding: str, offered: Sequence[Mapping[str, Any]] | None, snapshot: Snapshot,
                  connector: Connector) -> tuple[str, ...]:
    """The drift between `offered` (the connector's tools/list) and its claimed interfaces' tools.

    Raises `ConnectorStartError` naming the binding, the interface and the missing tools. With
    `offered` None (the connector answered tools/list with an error) nothing can be compared: that
    is reported as the drift.
    """
    if offered is None:
        note = f"connector '{connector.name}' does not answer tools/list; its tools were not compared"
        log.warning("binding '%s': %s", binding, note)
        return (note,)
    by_name = {t.get("name"): t for t in offered}
    drift: list[str] = []
    missing: list[str] = []
    for key in connector.spec.implements:
        iface = snapshot.interfaces.get(key)
        if iface is None:
            continue
        for tool in iface.tools:
            own = by_name.get(tool.name)
            if own is None:
                missing.append(f"{key} {tool.name}")
                continue
            if own.get("description") != tool.description:
                drift.append(f"{key} {tool.name}: description differs")
            if own.get("inputSchema") != tool.inputSchema:
                drift.append(f"{key} {tool.name}: inputSchema differs")
            if "outputSchema" in own and own.get("outputSchema") != tool.outputSchema:
                drift.append(f"{key} {tool.name}: outputSchema differs")
    if missing:
        raise ConnectorStartError(f"binding '{binding}': connector '{connector.name}' does not offer "
                                  f"{', '.join(missing)}, which it claims to implement")
    for line in drift:
        log.warning("binding '%s': connector '%s' drifts from its interface: %s (agents see the interface's)",
                    binding, connector.name, line)
    return tuple(drift)


async def check_tools(process: ConnectorProcess, snapshot: Snapshot, binding_name: str) -> tuple[str, ...]:
    """Hold the tools a process just started lists against its interfaces (`find_tool_drift`: the drift returned)
    or its [wrap] (`check_wrap`); a tool it no longer offers refuses the start. At every start: a restart
    after a crash may run other code (a connector updated in place, a server that changed)."""
    connector = snapshot.connectors[snapshot.bindings[binding_name].connector or ""]
    tools = await list_tools_within(process, binding_name)
    wrap = connector.spec.wrap
    if wrap is None:
        return find_tool_drift(binding_name, tools, snapshot, connector)  # raises on a missing tool
    if tools is None:
        raise ConnectorStartError(f"binding '{binding_name}': the server connector '{connector.name}' wraps "
                                  "does not answer tools/list, so its [wrap] cannot be checked")
    takes = {tool.name: set(tool.inputSchema.get("properties") or ()) for key in connector.spec.implements
             if (iface := snapshot.interfaces.get(key)) for tool in iface.tools}
    check_wrap(binding_name, wrap, takes, tools)
    return ()


async def list_tools_within(process: ConnectorProcess, binding_name: str) -> list[dict[str, Any]] | None:
    """The tools `process` lists, None when it answers tools/list with an error; within its `startSeconds`, which a
    process that never answers would otherwise hold its binding's start (and the router's shutdown) on for good."""
    seconds = process.spec.start_timeout
    try:
        async with asyncio.timeout(seconds):
            return await process.list_tools()
    except ConnectorReplyError:
        return None  # it does not list its tools: nothing to compare
    except TimeoutError:
        raise ConnectorStartError(f"connector of binding '{binding_name}' did not answer tools/list within "
                                  f"{seconds:g} s") from None
    except ConnectorError as exc:  # it died or closed its output instead
        raise ConnectorStartError(f"connector of binding '{binding_name}' failed its tools/list: "
                                  f"{exc.message}") from None
