"""What the dashboard's config pages show, read from the live snapshot and the catalog listing: pure functions
from them to plain data the templates render (docs/architecture.md §1: interface, connector, binding, profile).

- `catalog_view`: each interface with its tools, its connectors (the listing's tier and evidence, the last
  check, a failed one red), its bindings and the profiles each one serves;
- `profile_view`, `binding_view`, `connector_view`: one page each, linked profile → binding → connector →
  interface (an anchor of the catalog page), with what the edit forms offer: per interface of a profile,
  the bindings that can serve it; per connector, its secret slots and settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from reconciler.config.snapshot import Snapshot

__all__ = ["binding_view", "catalog_view", "connector_view", "profile_view", "read_listing"]


def read_listing(root: Path) -> Mapping[str, Any] | None:
    """The tree's catalog listing (`catalog/listing.json`, built by `handler catalog build`), or None when
    there is none to read (a git source's exported tree holds only the config folders)."""
    try:
        listing = orjson.loads((root / "catalog" / "listing.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return listing if isinstance(listing, dict) else None


def catalog_view(snapshot: Snapshot | None, listing: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Each interface with its tools, its connectors (what the listing says of each: its tier and evidence
    under that interface, none when not listed, and its last check) and its bindings, each with the profiles
    it serves that interface for."""
    if snapshot is None:
        return []
    out = []
    for key, iface in sorted(snapshot.interfaces.items()):
        connectors = [_conformance(listing, key, name)
                      for name in sorted(n for n, c in snapshot.connectors.items() if c.implements(key))]
        bindings = [{"name": name, "connector": b.connector, "used_by": _users(snapshot, key, name)}
                    for name, b in sorted(snapshot.bindings.items())
                    if (c := snapshot.connectors.get(b.connector or "")) is not None and c.implements(key)]
        out.append({"key": key, "name": iface.name, "description": iface.spec.description, "tools": iface.tools,
                    "connectors": connectors, "bindings": bindings})
    return out


def profile_view(snapshot: Snapshot, name: str) -> dict[str, Any] | None:
    """One profile: what serves each of its interfaces, and for each interface of the tree the bindings that
    could (None: no such profile)."""
    profile = snapshot.profiles.get(name)
    if profile is None:
        return None
    spec = profile.spec
    chosen = {s.interface: s for s in profile.selections.values()}
    interfaces = sorted({iface.name for iface in snapshot.interfaces.values()} | set(chosen))
    services = []
    for interface in interfaces:
        selection = chosen.get(interface)
        services.append({
            "interface": interface,
            "key": selection.key if selection else None,
            "binding": selection.binding if selection else "",
            "origin": selection.origin if selection else None,
            "pinned": selection.pinned if selection else False,
            "choices": _choices(snapshot, interface),
        })
    return {"name": name, "file": profile.file, "description": spec.description, "scope": spec.scope,
            "template": snapshot.template_for(profile).name, "group": spec.group,
            "routing": spec.routing.model_dump(exclude_none=True) if spec.routing else None,
            "caps": spec.caps.model_dump(exclude_none=True), "services": services,
            "governance": _governance(snapshot, name)}


def _governance(snapshot: Snapshot, name: str) -> dict[str, Any]:
    """What the profile page's governance forms offer: its rules and pins as its file writes them, the tools and
    interfaces a rule may name, the templates a new profile may start from, and its routing in the words of
    `handler routing set`."""
    profile = snapshot.profiles[name]
    spec = profile.spec
    served = {s.interface: snapshot.interfaces[s.key] for s in profile.selections.values()
              if s.key in snapshot.interfaces}
    routing = spec.routing
    said = "default" if routing is None else {"member": f"member:{routing.member}",
                                              "slack": f"slack:{routing.channel}"}.get(routing.to, routing.to)
    org_cap = snapshot.org.caps.monthly_usd if snapshot.org is not None else None
    return {"rules": [{"kind": "service" if r.service else "action", "target": r.service or r.action,
                       "outcome": r.outcome} for r in spec.rules],
            "pins": list(spec.pins),
            "interfaces": sorted(served),
            "tools": [(interface, [t.name for t in iface.tools]) for interface, iface in sorted(served.items())],
            "templates": sorted(snapshot.templates), "routing": said, "org_cap": org_cap}


def binding_view(snapshot: Snapshot, name: str) -> dict[str, Any] | None:
    """One binding: its connector, the references of its secrets (never a value: the file holds none), its
    settings, egress, prices and limits, and the profiles it serves (None: no such binding)."""
    binding = snapshot.bindings.get(name)
    if binding is None:
        return None
    spec = binding.spec
    secrets = []
    for slot, ref in sorted(spec.secrets.items()):
        if isinstance(ref, str):  # a literal: the save-time check refuses it, and the page does not show it
            secrets.append({"slot": slot, "kind": "a literal value (refused)", "target": ""})
        else:
            kind = next(k for k in ("env", "file", "command") if getattr(ref, k) is not None)
            target = getattr(ref, kind)
            secrets.append({"slot": slot, "kind": kind, "target": " ".join(target) if kind == "command" else target})
    used_by = sorted((p.name, s.key) for p in snapshot.profiles.values() for s in p.selections.values()
                     if s.binding == name)
    connector = snapshot.connectors.get(spec.connector or "")
    return {"name": name, "file": binding.file, "description": spec.description, "connector": spec.connector,
            "connector_known": connector is not None, "addon": spec.addon,
            "implements": list(connector.spec.implements) if connector else [],
            "secrets": secrets, "settings": dict(sorted(spec.settings.items())), "egress": spec.egress,
            "pricing": dict(sorted(spec.pricing.items())),
            "limits": spec.limits.model_dump(exclude_none=True) if spec.limits else {}, "used_by": used_by}


def connector_view(snapshot: Snapshot, name: str, listing: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """One connector: what it implements (with the listing's word on each), its egress, the secret slots and
    settings a binding fills, and its bindings (None: no such connector)."""
    connector = snapshot.connectors.get(name)
    if connector is None:
        return None
    spec = connector.spec
    slots = [{"name": slot, "env": s.env, "required": s.required, "description": s.description}
             for slot, s in sorted(spec.secretSlots.items())]
    settings = [{"name": key, "env": s.env, "required": s.required, "description": s.description,
                 "default": s.default} for key, s in sorted(spec.settings.items())]
    return {"name": name, "description": spec.description, "folder": connector.folder,
            "implements": [{**_conformance(listing, key, name), "key": key} for key in spec.implements],
            "egress": spec.egress, "slots": slots, "settings": settings,
            "transport": spec.run.builtin or spec.run.transport, "wraps": spec.wrap is not None,
            "bindings": sorted(n for n, b in snapshot.bindings.items() if b.connector == name)}


def _conformance(listing: Mapping[str, Any] | None, key: str, connector: str) -> dict[str, Any]:
    """What the listing says of `connector` under interface `key`, and of its last check (failed ones red)."""
    listing = listing or {}
    interfaces = listing.get("interfaces")
    entries = interfaces.get(key, []) if isinstance(interfaces, dict) else []
    entry = next((e for e in entries if isinstance(e, dict) and e.get("connector") == connector), {})
    checks = listing.get("connectors")
    last = (checks.get(connector) if isinstance(checks, dict) else None) or {}
    return {"name": connector, "tier": entry.get("tier"), "evidence": entry.get("evidence"),
            "checked": last.get("checked"), "passed": last.get("passed"), "last_evidence": last.get("evidence"),
            "current": last.get("current")}


def _users(snapshot: Snapshot, key: str, binding: str) -> list[str]:
    """The profiles whose interface `key` the binding serves."""
    return sorted(p.name for p in snapshot.profiles.values()
                  if any(s.key == key and s.binding == binding for s in p.selections.values()))


def _choices(snapshot: Snapshot, interface: str) -> list[dict[str, Any]]:
    """The bindings whose connector implements some version of `interface`, with those versions."""
    out = []
    for name, binding in sorted(snapshot.bindings.items()):
        connector = snapshot.connectors.get(binding.connector or "")
        versions = [k for k in (connector.spec.implements if connector else []) if k.partition("/")[0] == interface]
        if versions:
            out.append({"name": name, "connector": binding.connector, "versions": versions})
    return out
