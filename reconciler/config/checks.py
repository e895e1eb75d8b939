"""The cross-file save-time checks (design §5): do connectors, bindings, profiles and org agree?

One function per object; the loader runs each again only when the object or what it refers to
changed. Checks confined to one file live in `validity` and `schemas`.
"""

from __future__ import annotations

from collections.abc import Iterator

from reconciler.config.findings import Finding, did_you_mean
from reconciler.config.models import Limits, Routing, SecretRef
from reconciler.config.snapshot import RESHAPERS, Binding, Connector, Profile, Snapshot

__all__ = ["check_binding", "check_cases", "check_connector", "check_org", "check_profile"]


def _line(snapshot: Snapshot, file: str, *at: str | int) -> int:
    doc = snapshot.documents.get(file)
    return doc.line_of(*at) if doc else 1


def check_connector(snapshot: Snapshot, connector: Connector) -> Iterator[Finding]:
    file = f"{connector.folder}/connector.toml"
    for i, key in enumerate(connector.spec.implements):
        if key not in snapshot.interfaces:
            yield Finding(
                "N001",
                file,
                _line(snapshot, file, "implements", i),
                f"implements '{key}', which does not exist{did_you_mean(key, snapshot.interfaces)}",
                "an interface version of catalog/interfaces/, written name/vN",
                "correct the entry or add the interface version",
            )
    if connector.spec.wrap is not None:
        served = snapshot.tool_names(connector.spec.implements)
        for tool in connector.spec.wrap.tools:
            if tool not in served:
                yield Finding(
                    "N005",
                    file,
                    _line(snapshot, file, "wrap", "tools", tool),
                    f"[wrap] maps '{tool}', which no implemented interface defines{did_you_mean(tool, served)}",
                    f"one of: {', '.join(sorted(served)) or '(no tools)'}",
                    "correct the tool name",
                )
        wrap = connector.spec.wrap
        if wrap.reshape is not None and wrap.reshape not in RESHAPERS:
            yield Finding(
                "N006",
                file,
                _line(snapshot, file, "wrap", "reshape"),
                f"[wrap] reshape '{wrap.reshape}' is not a reshaper the router knows"
                f"{did_you_mean(wrap.reshape, RESHAPERS)}",
                f"one of: {', '.join(RESHAPERS)}",
                'reshape = "text" (text content as {"text": ...}), or omit it to pass structuredContent through',
            )
        codes: frozenset[str] = frozenset().union(
            *(iface.error_codes for k in connector.spec.implements if (iface := snapshot.interfaces.get(k)))
        )
        if wrap.error is not None and wrap.error not in codes:
            yield Finding(
                "N006",
                file,
                _line(snapshot, file, "wrap", "error"),
                f"[wrap] error '{wrap.error}' is not in the closed list of the interfaces it implements"
                f"{did_you_mean(wrap.error, codes)}",
                f"one of: {', '.join(sorted(codes))}",
                "name an error code of the interface, or omit it (unavailable)",
            )


def check_binding(snapshot: Snapshot, binding: Binding) -> Iterator[Finding]:
    file, spec = binding.file, binding.spec
    if spec.connector is None:
        return
    connector = snapshot.connectors.get(spec.connector)
    if connector is None:
        yield Finding(
            "B001",
            file,
            _line(snapshot, file, "connector"),
            f"connector '{spec.connector}' does not exist{did_you_mean(spec.connector, snapshot.connectors)}",
            "a folder of catalog/connectors/ with a connector.toml",
            "correct the name or add the connector",
        )
        return
    slots = connector.spec.secretSlots
    for slot, decl in slots.items():
        if decl.required and slot not in spec.secrets:
            yield Finding(
                "B002",
                file,
                _line(snapshot, file, "secrets"),
                f"required secret slot '{slot}' of connector '{connector.name}' is not filled",
                f"secrets.{slot} as a reference",
                f'secrets = {{ {slot} = {{ env = "{decl.env}" }} }}',
            )
    for slot, ref in spec.secrets.items():
        if slot not in slots:
            yield Finding(
                "B004",
                file,
                _line(snapshot, file, "secrets", slot),
                f"secret slot '{slot}' is not declared by connector '{connector.name}'{did_you_mean(slot, slots)}",
                f"one of: {', '.join(slots) or '(it declares none)'}",
                f"remove '{slot}' or correct it",
            )
        elif not isinstance(ref, SecretRef):
            continue  # B003, reported with the file
    declared = connector.spec.settings
    for key in spec.settings:
        if key not in declared:
            yield Finding(
                "B005",
                file,
                _line(snapshot, file, "settings", key),
                f"setting '{key}' is not declared by connector '{connector.name}'{did_you_mean(key, declared)}",
                f"one of: {', '.join(declared) or '(it declares none)'}",
                f"remove '{key}' or correct it",
            )
    for key, setting in declared.items():
        if setting.required and setting.default is None and key not in spec.settings:
            yield Finding(
                "B009",
                file,
                _line(snapshot, file, "settings"),
                f"required setting '{key}' of connector '{connector.name}' is not filled",
                f"settings.{key}: {setting.description or 'a value'}",
                f'settings = {{ {key} = "..." }}',
            )
    for i, entry in enumerate(spec.egress or []):
        if not any(_covers(allowed, entry) for allowed in connector.spec.egress):
            yield Finding(
                "B006",
                file,
                _line(snapshot, file, "egress", i),
                f"egress '{entry}' is not among connector '{connector.name}''s",
                f"a subset of: {', '.join(connector.spec.egress) or '(none)'}",
                "remove the entry: a binding may only narrow its connector's egress",
            )
    yield from _check_binding_limits(snapshot, binding, connector)
    tools = snapshot.tool_names(connector.spec.implements)
    for tool in spec.pricing:
        if tool not in tools:
            yield Finding(
                "B008",
                file,
                _line(snapshot, file, "pricing", tool),
                f"pricing names '{tool}', which connector '{connector.name}' does not serve{did_you_mean(tool, tools)}",
                f"one of: {', '.join(sorted(tools)) or '(no tools)'}",
                "correct the tool name",
            )


def _covers(allowed: str, entry: str) -> bool:
    a_host, _, a_port = allowed.rpartition(":")
    e_host, _, e_port = entry.rpartition(":")
    return (a_host in ("*", e_host)) and (a_port in ("*", e_port))


def _check_binding_limits(snapshot: Snapshot, binding: Binding, connector: Connector) -> Iterator[Finding]:
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
                    _line(snapshot, binding.file, "limits", name),
                    f"limits.{name} = {mine} loosens {key}'s {theirs}",
                    f"a value at most {theirs}",
                    f"{name} = {theirs} (or remove it to keep the interface's)",
                )


def check_profile(snapshot: Snapshot, profile: Profile) -> Iterator[Finding]:
    file, spec, org = profile.file, profile.spec, snapshot.org
    if spec.template is not None and spec.template not in snapshot.templates:
        yield Finding(
            "P007",
            file,
            _line(snapshot, file, "template"),
            f"template '{spec.template}' does not exist{did_you_mean(spec.template, snapshot.templates)}",
            f"one of: {', '.join(sorted(snapshot.templates))}",
            "correct it or add config/templates/<name>.toml",
        )
    if spec.group is not None and (org is None or spec.group not in org.groups):
        groups = org.groups if org else {}
        yield Finding(
            "P012",
            file,
            _line(snapshot, file, "group"),
            f"group '{spec.group}' is not declared in org.toml{did_you_mean(spec.group, groups)}",
            f"one of: {', '.join(groups) or '(no groups)'}",
            f"add [groups.{spec.group}] to config/org.toml or correct the name",
        )
    if spec.routing is not None:
        yield from _check_routing(snapshot, file, ("routing",), spec.routing)
        if spec.routing.to == "none":
            if spec.pins:
                yield Finding(
                    "P006",
                    file,
                    _line(snapshot, file, "pins"),
                    "routing to none (full trust) contradicts pins, which ask for approval",
                    "either approvals (pins) or none",
                    "remove pins or choose another routing",
                )
            for i, rule in enumerate(spec.rules):
                if rule.outcome == "approve":
                    yield Finding(
                        "P006",
                        file,
                        _line(snapshot, file, "rules", i, "outcome"),
                        "routing to none (full trust) contradicts a rule that asks for approval",
                        "no approve rules with routing to none",
                        'outcome = "allow" or "block", or another routing',
                    )
    services = _services_of(snapshot, profile)
    for i, rule in enumerate(spec.rules):
        if rule.service is not None and rule.service not in services:
            yield Finding(
                "P008",
                file,
                _line(snapshot, file, "rules", i, "service"),
                f"rule names service "
                f"'{rule.service}', which this profile does not use{did_you_mean(rule.service, services)}",
                f"one of: {', '.join(sorted(services)) or '(no services)'}",
                "correct the service name",
            )
        if rule.action is not None:
            tools = snapshot.tool_names(services.values())
            if rule.action not in tools:
                yield Finding(
                    "P008",
                    file,
                    _line(snapshot, file, "rules", i, "action"),
                    f"rule names action "
                    f"'{rule.action}', which no service of this profile offers{did_you_mean(rule.action, tools)}",
                    f"one of: {', '.join(sorted(tools)) or '(no tools)'}",
                    "correct the tool name",
                )
    for i, pin in enumerate(spec.pins):
        if pin not in services:
            yield Finding(
                "P009",
                file,
                _line(snapshot, file, "pins", i),
                f"pin '{pin}' names a service this profile does not use{did_you_mean(pin, services)}",
                f"one of: {', '.join(sorted(services))}",
                "correct the name or select the service",
            )
    if org is not None:
        for i, required in enumerate(org.requires):
            name = required.split("/")[0]
            if name not in services or (
                "/" in required and services[name] != required and not _implements(snapshot, profile, name, required)
            ):
                yield Finding(
                    "O001",
                    file,
                    _line(snapshot, file, "services"),
                    f"profile '{profile.name}' does not bind "
                    f"'{required}', which org.toml requires (line {_line(snapshot, 'config/org.toml', 'requires', i)})",
                    f"a binding for {required} in services or in org.toml [defaults] services",
                    f'services = {{ {name} = "<binding>" }}',
                )


def _services_of(snapshot: Snapshot, profile: Profile) -> dict[str, str]:
    """Interface name → the key it resolves to ('ocr' → 'ocr/v1'), with org defaults; unresolved keep their key."""
    out: dict[str, str] = {}
    defaults = snapshot.org.defaults.services if snapshot.org else {}
    for key in [*profile.spec.services, *defaults]:
        name = key.split("/")[0]
        if name in out:
            continue
        selected = profile.selections.get(name)
        if selected is not None:
            out[name] = selected.key
        else:
            versions = snapshot.versions_of(name)
            out[name] = key if "/" in key else f"{name}/v{versions[-1]}" if versions else key
    return out


def _implements(snapshot: Snapshot, profile: Profile, name: str, required: str) -> bool:
    key = next((k for k in profile.spec.services if k.split("/")[0] == name), None)
    binding = snapshot.bindings.get(profile.spec.services[key]) if key else None
    connector = snapshot.connectors.get(binding.connector or "") if binding else None
    return connector is not None and connector.implements(required)


def _check_routing(snapshot: Snapshot, file: str, at: tuple[str | int, ...], routing: Routing) -> Iterator[Finding]:
    org = snapshot.org
    members = org.members if org else {}
    channels = org.slack.channels if org else []
    if routing.to == "member" and routing.member not in members:
        code = "P004" if file.startswith("config/profiles/") else "O003"
        yield Finding(
            code,
            file,
            _line(snapshot, file, *at, "member"),
            f"routing names member '{routing.member}', "
            f"who is not in org.toml{did_you_mean(routing.member or '', members)}",
            f"one of: {', '.join(members) or '(no members)'}",
            f"add [members.{routing.member}] to org.toml",
        )
    if routing.to == "slack" and routing.channel not in channels:
        code = "P005" if file.startswith("config/profiles/") else "O003"
        yield Finding(
            code,
            file,
            _line(snapshot, file, *at, "channel"),
            f"routing names Slack channel "
            f"'{routing.channel}', which is not allow-listed{did_you_mean(routing.channel or '', channels)}",
            f"one of org.toml [slack] channels: {', '.join(channels) or '(none)'}",
            f'add "{routing.channel}" to [slack] channels in org.toml',
        )


def check_org(snapshot: Snapshot) -> Iterator[Finding]:
    org, file = snapshot.org, "config/org.toml"
    if org is None:
        if "config/org.toml" not in snapshot.documents:
            yield Finding(
                "O007",
                file,
                1,
                "config/org.toml is missing",
                "an org.toml naming the org and its owners",
                'apiVersion = "handler.org/v1"\nname = "<org>"\n[members.<id>]\nowner = true',
            )
        return
    if org.defaults.template is not None and org.defaults.template not in snapshot.templates:
        yield Finding(
            "O006",
            file,
            _line(snapshot, file, "defaults", "template"),
            f"default template "
            f"'{org.defaults.template}' does not exist{did_you_mean(org.defaults.template, snapshot.templates)}",
            f"one of: {', '.join(sorted(snapshot.templates))}",
            "correct the name",
        )
    for group, spec in org.groups.items():
        for i, member in enumerate(spec.members):
            if member not in org.members:
                yield Finding(
                    "O004",
                    file,
                    _line(snapshot, file, "groups", group, "members", i),
                    f"group '{group}' lists '{member}', who is not a member{did_you_mean(member, org.members)}",
                    f"one of: {', '.join(org.members) or '(no members)'}",
                    f"add [members.{member}]",
                )
    if not any(m.owner for m in org.members.values()):
        yield Finding(
            "O005",
            file,
            _line(snapshot, file, "members"),
            "no member has owner = true, so holds that no routing or policy sends anywhere have no approver",
            "at least one owner",
            "[members.<id>]\nowner = true",
        )
    tools = snapshot.tool_names(snapshot.interfaces)
    names = {
        "action": tools,
        "service": {i.name for i in snapshot.interfaces.values()},
        "profile": set(snapshot.profiles),
        "group": set(org.groups),
    }
    for i, policy in enumerate(org.policies):
        kind = policy.scope.kind
        value = getattr(policy.scope, kind)
        if kind != "org" and value not in names[kind]:
            yield Finding(
                "O002",
                file,
                _line(snapshot, file, "policies", i, "scope"),
                f"policy '{policy.name}' scopes "
                f"{kind} '{value}', which does not exist{did_you_mean(str(value), names[kind])}",
                f"an existing {kind}",
                "correct the scope",
            )
        if policy.approver is not None:
            if policy.approver.to == "none":
                yield Finding(
                    "O003",
                    file,
                    _line(snapshot, file, "policies", i, "approver"),
                    f"policy '{policy.name}' routes to none, which names no approver",
                    "to = member, slack or caller",
                    'approver = { to = "member", member = "<id>" }',
                )
            yield from _check_routing(snapshot, file, ("policies", i, "approver"), policy.approver)


def check_cases(snapshot: Snapshot, key: str) -> Iterator[Finding]:
    iface = snapshot.interfaces[key]
    file = f"{iface.folder}/conformance/cases.toml"
    tools = {t.name: t for t in iface.tools}
    for i, case in enumerate(iface.cases):
        tool = tools.get(case.tool)
        if tool is None:
            yield Finding(
                "I013",
                file,
                _line(snapshot, file, "case", i, "tool"),
                f"case '{case.name}' calls '{case.tool}', which {key} does not define{did_you_mean(case.tool, tools)}",
                f"one of: {', '.join(tools)}",
                "correct the tool name",
            )
            continue
        if case.error is not None and case.error not in iface.error_codes:
            yield Finding(
                "I013",
                file,
                _line(snapshot, file, "case", i, "expect", "error"),
                f"case '{case.name}' "
                f"expects error '{case.error}', which is not in {key}'s list"
                f"{did_you_mean(case.error, iface.error_codes)}",
                f"one of: {', '.join(sorted(iface.error_codes))}",
                "correct the code",
            )
        props = tool.inputSchema.get("properties", {})
        for arg, value in case.input.items():
            prop = props.get(arg)
            if isinstance(prop, dict) and prop.get("format") == "handler-file" and value not in iface.fixtures:
                yield Finding(
                    "I013",
                    file,
                    _line(snapshot, file, "case", i, "input", arg),
                    f"case '{case.name}' reads '{value}', which is not in {iface.folder}/conformance/",
                    "a fixture file beside cases.toml",
                    f"add {iface.folder}/conformance/{value}",
                )
