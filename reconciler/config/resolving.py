"""Resolving each profile's selections: which interface version, on which binding.

A services key `ocr` takes the highest version of ocr that the binding's connector implements;
`ocr/v1` pins one. The org's `[defaults] services` fill in what a profile does not select.
"""

from __future__ import annotations

from dataclasses import replace

from reconciler.config.findings import Finding, did_you_mean
from reconciler.config.snapshot import Profile, Selection, Snapshot, frozen_map

__all__ = ["resolve_profile"]


def resolve_profile(snapshot: Snapshot, profile: Profile) -> tuple[Profile, list[Finding]]:
    """The profile with its selections filled in, and the findings met on the way.

    A broken org default yields the same finding for every profile; callers keep one per place.
    """
    findings: list[Finding] = []
    defaults = snapshot.org.defaults.services if snapshot.org else {}
    chosen: dict[str, tuple[str, str, str, tuple[str | int, ...]]] = {}  # iface → (key, binding, file, at)
    for key, binding in profile.spec.services.items():
        iface = key.split("/")[0]
        if iface in chosen:
            findings.append(
                Finding(
                    "P003",
                    profile.file,
                    snapshot.documents[profile.file].line_of("services", key),
                    f"interface '{iface}' is selected twice ('{chosen[iface][0]}' and '{key}')",
                    "one binding per interface in a profile",
                    f"keep one of the keys '{chosen[iface][0]}' and '{key}'",
                )
            )
            continue
        chosen[iface] = (key, binding, profile.file, ("services", key))
    for key, binding in defaults.items():
        iface = key.split("/")[0]
        if iface not in chosen:
            chosen[iface] = (key, binding, "config/org.toml", ("defaults", "services", key))
    selections: dict[str, Selection] = {}
    for iface, (key, binding, file, at) in chosen.items():
        selection, finding = _resolve(snapshot, iface, key, binding, file, at)
        if finding is not None:
            findings.append(finding)
        if selection is not None:
            selections[iface] = selection
    return replace(profile, selections=frozen_map(selections)), findings


def _resolve(
    snapshot: Snapshot, iface: str, key: str, binding_name: str, file: str, at: tuple[str | int, ...]
) -> tuple[Selection | None, Finding | None]:
    doc = snapshot.documents.get(file)

    def line() -> int:  # looked up only for a finding: scanning a file costs more than parsing it
        return doc.line_of(*at) if doc else 1

    origin = "profile" if file.startswith("config/profiles/") else "org default"
    versions = snapshot.interface_versions
    if iface not in versions:
        known = sorted(versions)
        code = "P010" if origin == "profile" else "O006"
        return None, Finding(
            code,
            file,
            line(),
            f"'{key}' names no interface{did_you_mean(iface, known)}",
            f"one of: {', '.join(known)}",
            "correct the key or add the interface to the catalog",
        )
    pinned = "/" in key
    if pinned and key not in snapshot.interfaces:
        existing = ", ".join(f"{iface}/v{v}" for v in snapshot.versions_of(iface))
        code = "P010" if origin == "profile" else "O006"
        return None, Finding(
            code,
            file,
            line(),
            f"interface version '{key}' does not exist",
            f"one of: {existing}",
            f"select '{iface}' (the highest version) or one of: {existing}",
        )
    binding = snapshot.bindings.get(binding_name)
    if binding is None:
        code = "P001" if origin == "profile" else "O006"
        return None, Finding(
            code,
            file,
            line(),
            f"binding '{binding_name}' does not exist{did_you_mean(binding_name, snapshot.bindings)}",
            "the name of a file in config/bindings/ (without .toml)",
            f"create config/bindings/{binding_name}.toml or name an existing binding",
        )
    if binding.connector is None:
        return None, Finding(
            "P011",
            file,
            line(),
            f"binding '{binding_name}' is not a connector binding (it names an addon)",
            'a binding with connector = "..."',
            "select a connector binding",
        )
    connector = snapshot.connectors.get(binding.connector)
    if connector is None:
        return None, None  # B001 on the binding says it
    if pinned:
        if not connector.implements(key):
            return None, _not_implemented(file, line(), key, binding_name, connector.name, connector.spec.implements)
        return Selection(iface, key, binding_name, True, origin), None
    offered = [
        int(k.split("/v")[1])
        for k in connector.spec.implements
        if k.split("/")[0] == iface and k in snapshot.interfaces
    ]
    if not offered:
        return None, _not_implemented(file, line(), key, binding_name, connector.name, connector.spec.implements)
    return Selection(iface, f"{iface}/v{max(offered)}", binding_name, False, origin), None


def _not_implemented(file: str, line: int, key: str, binding: str, connector: str, implements: list[str]) -> Finding:
    return Finding(
        "P002",
        file,
        line,
        f"binding '{binding}' runs connector '{connector}', which does not implement '{key}'",
        f"a binding whose connector implements {key} (it implements: {', '.join(implements) or 'nothing'})",
        f"select a binding of a connector that implements {key}",
    )
