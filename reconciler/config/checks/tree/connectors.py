"""What a connector names exists: the interface versions it implements and, in `[wrap]`, their
tools, a reshaper the router knows and an error of their closed list. N001, N005, N006.

Run by `check_tree` for each connector, again only when the connector or an interface changed.
"""

from __future__ import annotations

from collections.abc import Iterator

from reconciler.config.findings import Finding, suggest
from reconciler.config.models import WrapSpec
from reconciler.config.snapshot import RESHAPERS, Connector, Snapshot

__all__ = ["check_connector"]


def check_connector(snapshot: Snapshot, connector: Connector) -> Iterator[Finding]:
    file = f"{connector.folder}/connector.toml"
    for i, key in enumerate(connector.spec.implements):
        if key not in snapshot.interfaces:
            yield Finding(
                "N001",
                file,
                snapshot.line_of(file, "implements", i),
                f"implements '{key}', which does not exist{suggest(key, snapshot.interfaces).did_you_mean}",
                "an interface version of catalog/interfaces/, written name/vN",
                "correct the entry or add the interface version",
            )
    if connector.spec.wrap is not None:
        yield from _check_wrap(snapshot, connector, connector.spec.wrap)


def _check_wrap(snapshot: Snapshot, connector: Connector, wrap: WrapSpec) -> Iterator[Finding]:
    file = f"{connector.folder}/connector.toml"
    served = snapshot.tool_names(connector.spec.implements)
    for tool in wrap.tools:
        if tool not in served:
            hint = suggest(tool, sorted(served), none="(no tools)")
            yield Finding(
                "N005",
                file,
                snapshot.line_of(file, "wrap", "tools", tool),
                f"[wrap] maps '{tool}', which no implemented interface defines{hint.did_you_mean}",
                hint.one_of,
                "correct the tool name",
            )
    if wrap.reshape is not None and wrap.reshape not in RESHAPERS:
        hint = suggest(wrap.reshape, RESHAPERS)
        yield Finding(
            "N006",
            file,
            snapshot.line_of(file, "wrap", "reshape"),
            f"[wrap] reshape '{wrap.reshape}' is not a reshaper the router knows{hint.did_you_mean}",
            hint.one_of,
            'reshape = "text" (text content as {"text": ...}), or omit it to pass structuredContent through',
        )
    codes: frozenset[str] = frozenset().union(
        *(iface.error_codes for k in connector.spec.implements if (iface := snapshot.interfaces.get(k)))
    )
    if wrap.error is not None and wrap.error not in codes:
        hint = suggest(wrap.error, sorted(codes))
        yield Finding(
            "N006",
            file,
            snapshot.line_of(file, "wrap", "error"),
            f"[wrap] error '{wrap.error}' is not in the closed list of the interfaces it implements{hint.did_you_mean}",
            hint.one_of,
            "name an error code of the interface, or omit it (unavailable)",
        )
