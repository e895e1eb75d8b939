"""The plan: what changes for each profile between two revisions (`handler plan`, the PR summary).

Each profile is described as plain data — its selections (interface → binding and version), the
outcome of every tool by template, rules and pins, its routing and caps — and the plan is the
difference of two descriptions, so it reads the same in text and JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import tomlkit

from reconciler.config.models import ActionClass
from reconciler.config.posture import tool_posture
from reconciler.config.snapshot import Profile, Snapshot
from reconciler.config.sources import short_revision

__all__ = ["Plan", "ProfilePlan", "describe_profile", "needs_changed", "plan_changes", "recheck_needed", "toml_value"]


@dataclass(frozen=True)
class ProfilePlan:
    profile: str
    status: str  # "added", "removed", "changed"
    changes: tuple[str, ...]
    before: dict[str, Any] | None
    after: dict[str, Any] | None


@dataclass(frozen=True)
class Plan:
    base: str | None
    head: str
    profiles: tuple[ProfilePlan, ...]
    recheck: dict[str, list[str]] = field(default_factory=dict)  # interface version → connectors
    needs: dict[str, list[str]] = field(default_factory=dict)  # connector → its [needs], when new or changed

    @property
    def empty(self) -> bool:
        return not self.profiles and not self.recheck and not self.needs

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "head": self.head,
            "changed": not self.empty,
            "profiles": [
                {
                    "profile": p.profile,
                    "status": p.status,
                    "changes": list(p.changes),
                    "before": p.before,
                    "after": p.after,
                }
                for p in self.profiles
            ],
            "recheck": self.recheck,
            "needs": self.needs,
        }

    def render_text(self) -> str:
        base, head = short_revision(self.base) if self.base else "(empty tree)", short_revision(self.head)
        if self.empty:
            return f"No changes ({base} → {head})."
        lines = [f"Plan {base} → {head}:"]
        for p in self.profiles:
            lines.append(f"  profile {p.profile} ({p.status})")
            lines.extend(f"    {c}" for c in p.changes)
        for name, needs in self.needs.items():  # run by `handler connector install`: reviewed like code
            lines.append(f"  connector {name} needs (what `handler connector install` builds and runs):")
            lines.extend(f"    {line}" for line in needs)
        for key, connectors in self.recheck.items():
            lines.append(f"  conformance of {key} changed: re-check {', '.join(connectors) or '(no connector)'}")
        return "\n".join(lines)


def describe_profile(snapshot: Snapshot, profile: Profile) -> dict[str, Any]:
    """A profile as plain data: what it resolves to and what each tool's calls would get."""
    template = snapshot.template_for(profile)
    services: dict[str, Any] = {}
    for name, sel in sorted(profile.selections.items()):
        iface = snapshot.interfaces[sel.key]
        tools = {
            t.name: tool_posture(snapshot, profile, name, t.name, t.action_class).outcome.value for t in iface.tools
        }
        services[name] = {"interface": sel.key, "binding": sel.binding, "from": sel.origin, "tools": tools}
    routing = profile.spec.routing.model_dump(exclude_none=True) if profile.spec.routing else None
    return {
        "scope": profile.spec.scope,
        "template": template.name,
        "classes": {c.value: template.outcome_for(c).value for c in ActionClass},
        "services": services,
        "pins": list(profile.spec.pins),
        "rules": [f"{'service' if r.service else 'action'} {r.service or r.action} {r.outcome}"
                  for r in profile.spec.rules],
        "routing": routing,
        "caps": profile.spec.caps.model_dump(exclude_none=True),
    }


def plan_changes(base: Snapshot | None, head: Snapshot) -> Plan:
    """What differs for each profile from `base` (None: an empty tree) to `head`."""
    # A profile object carried over unchanged by the loader's cache had the same inputs in both
    # revisions (its file, its bindings, the interfaces, org and templates): nothing to describe.
    kept = {n for n, p in head.profiles.items() if base is not None and base.profiles.get(n) is p}
    before = {n: describe_profile(base, p) for n, p in base.profiles.items() if n not in kept} if base else {}
    after = {n: describe_profile(head, p) for n, p in head.profiles.items() if n not in kept}
    plans: list[ProfilePlan] = []
    for name in sorted({*before, *after}):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        status = "added" if old is None else "removed" if new is None else "changed"
        plans.append(ProfilePlan(name, status, tuple(_changes(old or {}, new or {})), old, new))
    return Plan(
        base.revision if base else None, head.revision, tuple(plans), recheck_needed(base, head) if base else {},
        needs_changed(base, head),
    )


def needs_changed(base: Snapshot | None, head: Snapshot) -> dict[str, list[str]]:
    """Each connector whose `[needs]` is new or changed since `base`, with what it declares, a line per kind."""
    out: dict[str, list[str]] = {}
    for name, connector in sorted(head.connectors.items()):
        needs = connector.spec.needs
        old = base.connectors.get(name) if base is not None else None
        if old is not None and old.spec.needs == needs:
            continue
        lines = [f"python = {toml_value(needs.python)}"] if needs.python else []
        lines += [f"setup = {toml_value(needs.setup)}"] if needs.setup else []
        lines += [f"debian = {toml_value(needs.debian)}"] if needs.debian else []
        lines += [f"programs = {toml_value(needs.programs)}"] if needs.programs else []
        if lines or old is not None:
            out[name] = lines or ["(none now)"]
    return out


def recheck_needed(base: Snapshot, head: Snapshot) -> dict[str, list[str]]:
    """Interface versions whose conformance folder changed → connectors that must be checked again."""
    out: dict[str, list[str]] = {}
    for key, new in head.interfaces.items():
        old = base.interfaces.get(key)
        if old is not None and (old.cases != new.cases or dict(old.fixtures) != dict(new.fixtures)):
            out[key] = sorted(c.name for c in head.connectors.values() if c.implements(key))
    return out


def _listed(items: list[str] | None) -> str:
    return "; ".join(items) if items else "(none)"


def _changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if old.get("scope") != new.get("scope"):  # where the agent's handler-file paths reach
        scopes = [toml_value(d["scope"]) if "scope" in d else "(none)" for d in (old, new)]
        out.append(f"scope: {scopes[0]} → {scopes[1]}")
    if old.get("template") != new.get("template") or old.get("classes") != new.get("classes"):
        out.append(f"template: {_template(old)} → {_template(new)}")
    out.extend(_service_changes(old.get("services", {}), new.get("services", {})))
    if (old.get("pins") or []) != (new.get("pins") or []):
        out.append(f"pins: {toml_value(old.get('pins') or [])} → {toml_value(new.get('pins') or [])}")
    if (old.get("rules") or []) != (new.get("rules") or []):  # a rule the pin or a cap still overrides shows too
        out.append(f"rules: {_listed(old.get('rules'))} → {_listed(new.get('rules'))}")
    if old.get("routing") != new.get("routing"):
        out.append(f"routing: {_routing(old.get('routing'))} → {_routing(new.get('routing'))}")
    if (old.get("caps") or {}) != (new.get("caps") or {}):
        out.append(f"caps: {toml_value(old.get('caps') or {})} → {toml_value(new.get('caps') or {})}")
    return out


def _service_changes(old_s: dict[str, Any], new_s: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for name in sorted({*old_s, *new_s}):
        a, b = old_s.get(name), new_s.get(name)
        if a == b:
            continue
        if a is None:
            out.append(f"{name}: + {_selection(new_s[name])}")
        elif b is None:
            out.append(f"{name}: - {_selection(old_s[name])}")
        else:
            if (a["binding"], a["interface"]) != (b["binding"], b["interface"]):
                out.append(f"{name}: {_selection(a)} → {_selection(b)}")
            for tool in sorted({*a["tools"], *b["tools"]}):
                x, y = a["tools"].get(tool), b["tools"].get(tool)
                if x != y:
                    out.append(f"{name}: {tool} {x or '(none)'} → {y or '(none)'}")
    return out


def toml_value(value: Any) -> str:
    """`value` written as in a TOML file, inline: `{ monthly_usd = 100.0 }`, `["send-email"]`, `"x"`."""
    if isinstance(value, dict):
        inner = ", ".join(f"{tomlkit.key(str(k)).as_string()} = {toml_value(v)}" for k, v in value.items())
        return f"{{ {inner} }}" if inner else "{}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return str(tomlkit.item(value).as_string())


def _template(d: dict[str, Any]) -> str:
    if not d:
        return "(none)"
    classes = ", ".join(f"{k} {v}" for k, v in d["classes"].items())
    return f"{d['template']} ({classes})"


def _selection(s: dict[str, Any]) -> str:
    tools = ", ".join(f"{t} {o}" for t, o in s["tools"].items())
    return f"{s['binding']} ({s['interface']}; {tools})"


def _routing(r: dict[str, Any] | None) -> str:
    if not r:
        return "default (policies, else owners)"
    return toml_value(r)
