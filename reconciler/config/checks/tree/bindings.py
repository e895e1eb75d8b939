"""What a binding asks of its connector fits it: the connector exists, its secret slots and settings
are filled and declared, egress, limits and pricing stay within what the connector and its
interfaces allow, and the service its `base_url` names is one its egress reaches. B001, B002,
B004-B009, B011 (B003 and B010 need the binding file only: `checks.files`).

Run by `check_tree` for each binding, again only when the binding, its connector or an interface changed.
"""

from __future__ import annotations

from collections.abc import Iterator

from reconciler.config.findings import Finding, suggest
from reconciler.config.models import Limits
from reconciler.config.reach import url_reach_problem
from reconciler.config.snapshot import Binding, Connector, Snapshot

__all__ = ["check_binding"]


def check_binding(snapshot: Snapshot, binding: Binding) -> Iterator[Finding]:
    spec = binding.spec
    if spec.connector is None:
        return  # an addon binding: nothing of a connector's to fit
    connector = snapshot.connectors.get(spec.connector)
    if connector is None:
        yield Finding(
            "B001",
            binding.file,
            snapshot.line_of(binding.file, "connector"),
            f"connector '{spec.connector}' does not exist{suggest(spec.connector, snapshot.connectors).did_you_mean}",
            "a folder of catalog/connectors/ with a connector.toml",
            "correct the name or add the connector",
        )
        return
    yield from _check_secrets(snapshot, binding, connector)
    yield from _check_settings(snapshot, binding, connector)
    yield from _check_egress(snapshot, binding, connector)
    yield from _check_base_url(snapshot, binding, connector)
    yield from _check_limits(snapshot, binding, connector)
    yield from _check_pricing(snapshot, binding, connector)


def _check_secrets(snapshot: Snapshot, binding: Binding, connector: Connector) -> Iterator[Finding]:
    file, secrets, slots = binding.file, binding.spec.secrets, connector.spec.secretSlots
    for slot, decl in slots.items():
        if decl.required and slot not in secrets:
            yield Finding(
                "B002",
                file,
                snapshot.line_of(file, "secrets"),
                f"required secret slot '{slot}' of connector '{connector.name}' is not filled",
                f"secrets.{slot} as a reference",
                f'secrets = {{ {slot} = {{ env = "{decl.env}" }} }}',
            )
    for slot in secrets:  # a literal value in a declared slot is B003, reported with the file
        if slot not in slots:
            hint = suggest(slot, slots, none="(it declares none)")
            yield Finding(
                "B004",
                file,
                snapshot.line_of(file, "secrets", slot),
                f"secret slot '{slot}' is not declared by connector '{connector.name}'{hint.did_you_mean}",
                hint.one_of,
                f"remove '{slot}' or correct it",
            )


def _check_settings(snapshot: Snapshot, binding: Binding, connector: Connector) -> Iterator[Finding]:
    file, settings, declared = binding.file, binding.spec.settings, connector.spec.settings
    for key in settings:
        if key not in declared:
            hint = suggest(key, declared, none="(it declares none)")
            yield Finding(
                "B005",
                file,
                snapshot.line_of(file, "settings", key),
                f"setting '{key}' is not declared by connector '{connector.name}'{hint.did_you_mean}",
                hint.one_of,
                f"remove '{key}' or correct it",
            )
    for key, setting in declared.items():
        if setting.required and setting.default is None and key not in settings:
            yield Finding(
                "B009",
                file,
                snapshot.line_of(file, "settings"),
                f"required setting '{key}' of connector '{connector.name}' is not filled",
                f"settings.{key}: {setting.description or 'a value'}",
                f'settings = {{ {key} = "..." }}',
            )


def _check_egress(snapshot: Snapshot, binding: Binding, connector: Connector) -> Iterator[Finding]:
    for i, entry in enumerate(binding.spec.egress or []):
        if not any(_covers(allowed, entry) for allowed in connector.spec.egress):
            yield Finding(
                "B006",
                binding.file,
                snapshot.line_of(binding.file, "egress", i),
                f"egress '{entry}' is not among connector '{connector.name}''s",
                f"a subset of: {', '.join(connector.spec.egress) or '(none)'}",
                "remove the entry: a binding may only narrow its connector's egress",
            )


def _check_base_url(snapshot: Snapshot, binding: Binding, connector: Connector) -> Iterator[Finding]:
    """B011: a `base_url` (the built-in llm's, a gateway's) names a host:port the binding's effective egress reaches,
    as the egress proxy and the built-in's own dialling check it at each call."""
    declared = connector.spec.settings.get("base_url")
    url = binding.spec.settings.get("base_url", declared.default if declared is not None else None)
    if declared is None or not isinstance(url, str) or not url:
        return
    egress = binding.spec.egress if binding.spec.egress is not None else connector.spec.egress
    problem = url_reach_problem(egress, url)
    if problem is None:
        return
    file = binding.file
    set_here = "base_url" in binding.spec.settings
    yield Finding(
        "B011",
        file,
        snapshot.line_of(file, "settings", "base_url") if set_here else snapshot.line_of(file, "connector"),
        f"base_url '{url}'{'' if set_here else ' (the connector default)'} cannot be reached: {problem}",
        f"a base_url whose host:port the binding's egress allows ({', '.join(egress) or 'none'})",
        "set base_url to a host its egress names, or add that host:port to the binding's egress (within connector "
        f"'{connector.name}''s: {', '.join(connector.spec.egress) or 'none'})",
    )


def _covers(allowed: str, entry: str) -> bool:
    a_host, _, a_port = allowed.rpartition(":")
    e_host, _, e_port = entry.rpartition(":")
    return (a_host in ("*", e_host)) and (a_port in ("*", e_port))


def _check_limits(snapshot: Snapshot, binding: Binding, connector: Connector) -> Iterator[Finding]:
    limits = binding.spec.limits
    if limits is None:
        return
    for key in connector.spec.implements:
        iface = snapshot.interfaces.get(key)
        if iface is None:
            continue
        for name in Limits.model_fields:
            mine, theirs = getattr(limits, name), getattr(iface.spec.limits, name)
            if mine is not None and theirs is not None and mine > theirs:
                yield Finding(
                    "B007",
                    binding.file,
                    snapshot.line_of(binding.file, "limits", name),
                    f"limits.{name} = {mine} loosens {key}'s {theirs}",
                    f"a value at most {theirs}",
                    f"{name} = {theirs} (or remove it to keep the interface's)",
                )


def _check_pricing(snapshot: Snapshot, binding: Binding, connector: Connector) -> Iterator[Finding]:
    tools = snapshot.tool_names(connector.spec.implements)
    for tool in binding.spec.pricing:
        if tool not in tools:
            hint = suggest(tool, sorted(tools), none="(no tools)")
            yield Finding(
                "B008",
                binding.file,
                snapshot.line_of(binding.file, "pricing", tool),
                f"pricing names '{tool}', which connector '{connector.name}' does not serve{hint.did_you_mean}",
                hint.one_of,
                "correct the tool name",
            )
