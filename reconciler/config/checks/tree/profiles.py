"""What a resolved profile names fits the tree: its template and group exist, its routing reaches
someone and agrees with its pins and rules, its rules and pins name services it uses, and it binds
what org.toml requires, and the agents it may run exist and can run.
P006, P008, P009, P012, P016-P018, O001; P004 and P005 come from `routing`, P007 from
`selections`. Run by `check_tree` for each profile once `selections` has resolved it.
"""

from __future__ import annotations

from collections.abc import Iterator

from reconciler.config.checks.tree.routing import check_routing
from reconciler.config.checks.tree.selections import check_template
from reconciler.config.findings import Finding, suggest
from reconciler.config.snapshot import Profile, Snapshot

__all__ = ["check_profile"]


def check_profile(snapshot: Snapshot, profile: Profile) -> Iterator[Finding]:
    """Every check of one profile whose selections are resolved (`selections.check_selections`)."""
    yield from check_template(snapshot, profile.file, ("template",), profile.spec.template)
    yield from _check_group(snapshot, profile)
    yield from _check_routing(snapshot, profile)
    services = _services_of(snapshot, profile)
    yield from _check_rules(snapshot, profile, services)
    yield from _check_pins(snapshot, profile, services)
    yield from _check_required(snapshot, profile, services)
    yield from _check_agents(snapshot, profile, services)


def _check_group(snapshot: Snapshot, profile: Profile) -> Iterator[Finding]:
    group, org = profile.spec.group, snapshot.org
    if group is not None and (org is None or group not in org.groups):
        hint = suggest(group, org.groups if org else {}, none="(no groups)")
        yield Finding(
            "P012",
            profile.file,
            snapshot.line_of(profile.file, "group"),
            f"group '{group}' is not declared in org.toml{hint.did_you_mean}",
            hint.one_of,
            f"add [groups.{group}] to config/org.toml or correct the name",
        )


def _check_routing(snapshot: Snapshot, profile: Profile) -> Iterator[Finding]:
    """The routing reaches someone; routing to none (full trust) leaves nothing to approve."""
    file, spec = profile.file, profile.spec
    if spec.routing is None:
        return
    yield from check_routing(snapshot, file, ("routing",), spec.routing)
    if spec.routing.to != "none":
        return
    if spec.pins:
        yield Finding(
            "P006",
            file,
            snapshot.line_of(file, "pins"),
            "routing to none (full trust) contradicts pins, which ask for approval",
            "either approvals (pins) or none",
            "remove pins or choose another routing",
        )
    for i, rule in enumerate(spec.rules):
        if rule.outcome == "approve":
            yield Finding(
                "P006",
                file,
                snapshot.line_of(file, "rules", i, "outcome"),
                "routing to none (full trust) contradicts a rule that asks for approval",
                "no approve rules with routing to none",
                'outcome = "allow" or "block", or another routing',
            )


def _check_rules(snapshot: Snapshot, profile: Profile, services: dict[str, str]) -> Iterator[Finding]:
    file = profile.file
    for i, rule in enumerate(profile.spec.rules):
        if rule.service is not None and rule.service not in services:
            hint = suggest(rule.service, sorted(services), none="(no services)")
            yield Finding(
                "P008",
                file,
                snapshot.line_of(file, "rules", i, "service"),
                f"rule names service '{rule.service}', which this profile does not use{hint.did_you_mean}",
                hint.one_of,
                "correct the service name",
            )
        if rule.action is not None:
            tools = snapshot.tool_names(services.values())
            if rule.action not in tools:
                hint = suggest(rule.action, sorted(tools), none="(no tools)")
                yield Finding(
                    "P008",
                    file,
                    snapshot.line_of(file, "rules", i, "action"),
                    f"rule names action '{rule.action}', which no service of this profile offers{hint.did_you_mean}",
                    hint.one_of,
                    "correct the tool name",
                )


def _check_pins(snapshot: Snapshot, profile: Profile, services: dict[str, str]) -> Iterator[Finding]:
    for i, pin in enumerate(profile.spec.pins):
        if pin not in services:
            hint = suggest(pin, sorted(services))
            yield Finding(
                "P009",
                profile.file,
                snapshot.line_of(profile.file, "pins", i),
                f"pin '{pin}' names a service this profile does not use{hint.did_you_mean}",
                hint.one_of,
                "correct the name or select the service",
            )


def _check_required(snapshot: Snapshot, profile: Profile, services: dict[str, str]) -> Iterator[Finding]:
    """Every interface org.toml `requires` is bound, at the required version when it names one."""
    if snapshot.org is None:
        return
    for i, required in enumerate(snapshot.org.requires):
        name = required.split("/")[0]
        if name not in services or (
            "/" in required and services[name] != required and not _implements(snapshot, profile, name, required)
        ):
            yield Finding(
                "O001",
                profile.file,
                snapshot.line_of(profile.file, "services"),
                f"profile '{profile.name}' does not bind '{required}', which org.toml requires "
                f"(line {snapshot.line_of('config/org.toml', 'requires', i)})",
                f"a binding for {required} in services or in org.toml [defaults] services",
                f'services = {{ {name} = "<binding>" }}',
            )


def _check_agents(snapshot: Snapshot, profile: Profile, services: dict[str, str]) -> Iterator[Finding]:
    """Each agent it may run is a profile with a runner; running any needs agent/v1 bound."""
    file, agents = profile.file, profile.spec.agents
    for i, agent in enumerate(agents):
        other = snapshot.profiles.get(agent)
        line = snapshot.line_of(file, "agents", i)
        if other is None:
            hint = suggest(agent, sorted(snapshot.profiles), none="(no profiles)")
            yield Finding("P016", file, line, f"agents names '{agent}', which is not a profile{hint.did_you_mean}",
                          hint.one_of, "correct the name, or add the profile under config/profiles/")
        elif other.spec.runner is None:
            yield Finding("P017", file, line, f"agent '{agent}' has no [runner], so agent_run cannot start it",
                          "a [runner] in the agent's profile", f'[runner] command = ["handler-agent"] in {other.file}')
    if agents and "agent" not in services:
        yield Finding("P018", file, snapshot.line_of(file, "agents"),
                      "agents lists agents this profile may run, but it does not bind agent/v1, so it has no agent_run",
                      "agent/v1 in services", 'services = { agent = "agents" }')


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
    """Whether the binding serving `name` (the profile's own, else the org's default) implements `required`."""
    for services in (profile.spec.services, snapshot.org.defaults.services if snapshot.org else {}):
        key = next((k for k in services if k.split("/")[0] == name), None)
        if key is not None:
            return _binding_implements(snapshot, services[key], required)
    return False


def _binding_implements(snapshot: Snapshot, name: str, required: str) -> bool:
    binding = snapshot.bindings.get(name)
    connector = snapshot.connectors.get(binding.connector or "") if binding else None
    return connector is not None and connector.implements(required)
