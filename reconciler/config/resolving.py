"""Resolving each profile's selections: which interface version, on which binding.

A services key `ocr` takes the highest version of ocr that the binding's connector implements;
`ocr/v1` pins one. The org's `[defaults] services` fill in what a profile does not select. What
cannot be resolved is returned as a `Miss` (or a `Twice`), which `checks.tree.selections` words as
a finding; the loader keeps the resolved profile in the snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from reconciler.config.lines import KeyPath
from reconciler.config.snapshot import Profile, Selection, Snapshot, frozen_map

__all__ = ["Choice", "Miss", "Resolution", "Twice", "origin_of", "resolve_profile"]

Missing = Literal["interface", "version", "binding", "connector binding", "implementation"]


def origin_of(file: str) -> str:
    """Who chose: "profile" for a profile's own file, "org default" for org.toml's [defaults]."""
    return "profile" if file.startswith("config/profiles/") else "org default"


@dataclass(frozen=True, slots=True)
class Choice:
    """One services entry a profile resolves: its own, or an org default it falls back to."""

    interface: str  # "ocr"
    key: str  # as written: "ocr" or "ocr/v1"
    binding: str
    file: str  # where it is written
    at: KeyPath  # its key there


@dataclass(frozen=True, slots=True)
class Miss:
    """A choice that selects nothing, and what it lacks: the interface, the version, the binding,
    a binding that runs a connector, or a connector that implements the version."""

    choice: Choice
    missing: Missing
    connector: str = ""  # for "implementation": the connector that does not implement it...
    implements: tuple[str, ...] = ()  # ...and what it implements instead


@dataclass(frozen=True, slots=True)
class Twice:
    """Two keys of one profile select the same interface; the first one counts."""

    first: Choice
    again: Choice


@dataclass(frozen=True, slots=True)
class Resolution:
    profile: Profile  # with its selections filled in
    twice: tuple[Twice, ...]
    misses: tuple[Miss, ...]


def resolve_profile(snapshot: Snapshot, profile: Profile) -> Resolution:
    """The profile with its selections filled in, and what could not be resolved on the way.

    A broken org default is missed for every profile that falls back to it.
    """
    chosen, twice = _choose(snapshot, profile)
    selections: dict[str, Selection] = {}
    misses: list[Miss] = []
    for iface, choice in chosen.items():
        got = _resolve(snapshot, choice)
        if isinstance(got, Selection):
            selections[iface] = got
        elif got is not None:
            misses.append(got)
    return Resolution(replace(profile, selections=frozen_map(selections)), tuple(twice), tuple(misses))


def _choose(snapshot: Snapshot, profile: Profile) -> tuple[dict[str, Choice], list[Twice]]:
    """Interface name → the entry that selects it: the profile's first key for it, else the org default."""
    chosen: dict[str, Choice] = {}
    twice: list[Twice] = []
    for key, binding in profile.spec.services.items():
        choice = Choice(key.split("/")[0], key, binding, profile.file, ("services", key))
        if choice.interface in chosen:
            twice.append(Twice(chosen[choice.interface], choice))
        else:
            chosen[choice.interface] = choice
    defaults = snapshot.org.defaults.services if snapshot.org else {}
    for key, binding in defaults.items():
        iface = key.split("/")[0]
        if iface not in chosen:
            chosen[iface] = Choice(iface, key, binding, "config/org.toml", ("defaults", "services", key))
    return chosen, twice


def _resolve(snapshot: Snapshot, choice: Choice) -> Selection | Miss | None:
    """The selection `choice` makes, or why it makes none (None: its binding's connector is missing,
    which the binding's own check reports)."""
    iface, key = choice.interface, choice.key
    if iface not in snapshot.interface_versions:
        return Miss(choice, "interface")
    pinned = "/" in key
    if pinned and key not in snapshot.interfaces:
        return Miss(choice, "version")
    binding = snapshot.bindings.get(choice.binding)
    if binding is None:
        return Miss(choice, "binding")
    if binding.connector is None:
        return Miss(choice, "connector binding")
    connector = snapshot.connectors.get(binding.connector)
    if connector is None:
        return None
    origin = origin_of(choice.file)
    if pinned:
        if not connector.implements(key):
            return Miss(choice, "implementation", connector.name, tuple(connector.spec.implements))
        return Selection(iface, key, choice.binding, True, origin)
    offered = [
        int(k.split("/v")[1])
        for k in connector.spec.implements
        if k.split("/")[0] == iface and k in snapshot.interfaces
    ]
    if not offered:
        return Miss(choice, "implementation", connector.name, tuple(connector.spec.implements))
    return Selection(iface, f"{iface}/v{max(offered)}", choice.binding, False, origin)
