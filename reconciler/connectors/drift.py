"""Tool drift: a connector's own `tools/list` held against the interfaces it claims, when its process starts.

The pool calls `find_tool_drift` once per start. A tool of a claimed interface that the connector
does not offer fails the start (every call of it would fail). A tool whose description or schemas
differ from the interface's is drift: logged and kept in the binding's status, never shown to
agents, who see only the interface's `tools.json` (S1).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from reconciler.config.snapshot import Connector, Snapshot
from reconciler.connectors.errors import ConnectorStartError

__all__ = ["find_tool_drift"]

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
