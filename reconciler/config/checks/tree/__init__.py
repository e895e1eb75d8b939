"""What the whole tree shows: do connectors, bindings, profiles, org and conformance cases agree?

`check_tree` resolves every profile's selections and runs each cross-file check, one function per
object (docs/architecture.md §5). Each result is keyed by the content of its object and of what it
refers to, so with a `memo` kept between loads a one-binding change re-checks that binding and the
profiles selecting it, not the whole tree.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import partial
from typing import Any, Protocol, TypeVar

from reconciler.config.checks.cases import check_cases
from reconciler.config.checks.tree.bindings import check_binding
from reconciler.config.checks.tree.connectors import check_connector
from reconciler.config.checks.tree.org import check_org
from reconciler.config.checks.tree.profiles import check_profile
from reconciler.config.checks.tree.selections import check_selections
from reconciler.config.findings import Finding
from reconciler.config.snapshot import Profile, Snapshot, frozen_map

__all__ = ["Memo", "check_tree"]

_T = TypeVar("_T")


class Memo(Protocol):
    """The result stored under `key` by an earlier load, else `compute()`'s."""

    def __call__(self, key: tuple[object, ...], compute: Callable[[], _T]) -> _T: ...


def _compute(key: tuple[object, ...], compute: Callable[[], _T]) -> _T:
    return compute()


def check_tree(snapshot: Snapshot, memo: Memo = _compute) -> tuple[dict[str, Profile], list[Finding]]:
    """Every profile with its selections resolved, and every finding of the cross-file checks."""
    interfaces_id = _digest(f"{k}:{i.content_hash}" for k, i in sorted(snapshot.interfaces.items()))
    binding_ids = {
        name: f"{b.content_hash}:{c.content_hash if (c := snapshot.connectors.get(b.connector or '')) else '-'}"
        for name, b in snapshot.bindings.items()
    }
    findings: list[Finding] = []
    for connector in snapshot.connectors.values():
        key: tuple[object, ...] = ("connector", connector.name, connector.content_hash, interfaces_id)
        findings.extend(memo(key, partial(_listed, check_connector, snapshot, connector)))
    for binding in snapshot.bindings.values():
        key = ("binding", binding.name, binding_ids[binding.name], interfaces_id)
        findings.extend(memo(key, partial(_listed, check_binding, snapshot, binding)))
    profiles, found = _check_profiles(snapshot, memo, _world(snapshot, interfaces_id, binding_ids), binding_ids)
    findings.extend(found)
    # The org's checks read the resolved profiles (policy scopes name profiles).
    findings.extend(check_org(replace(snapshot, profiles=frozen_map(profiles))))
    for iface in snapshot.interfaces:
        findings.extend(check_cases(snapshot, iface))
    return profiles, findings


def _check_profiles(
    snapshot: Snapshot, memo: Memo, world: str, binding_ids: dict[str, str]
) -> tuple[dict[str, Profile], list[Finding]]:
    """Resolve and check each profile; `world` identifies what every profile reads beyond its bindings."""
    resolved: dict[str, Profile] = {}
    once: dict[tuple[str, int, str], Finding] = {}  # a broken org default is reported once, not per profile
    for name, profile in snapshot.profiles.items():
        deps = tuple([binding_ids.get(b, "-") for b in profile.spec.services.values()])
        key = ("profile", name, snapshot.documents[profile.file].sha, deps, world)
        done, found = memo(key, partial(_resolve_and_check, snapshot, profile))
        resolved[name] = done
        for f in found:
            once[(f.file, f.line, f.code)] = f
    return resolved, list(once.values())


def _listed(check: Callable[..., Iterable[Finding]], *args: Any) -> list[Finding]:
    return list(check(*args))


def _resolve_and_check(snapshot: Snapshot, profile: Profile) -> tuple[Profile, list[Finding]]:
    done, findings = check_selections(snapshot, profile)
    return done, [*findings, *check_profile(snapshot, done)]


def _world(snapshot: Snapshot, interfaces_id: str, binding_ids: dict[str, str]) -> str:
    """The identity of what every profile's checks read: interfaces, org.toml (its defaults too),
    templates and the bindings org.toml's defaults select."""
    docs = snapshot.documents
    defaults = snapshot.org.defaults.services.values() if snapshot.org else []
    world = _digest(
        [
            interfaces_id,
            docs["config/org.toml"].sha if "config/org.toml" in docs else "-",
            *sorted(f"{p}:{d.sha}" for p, d in docs.items() if p.startswith("config/templates/")),
        ]
    )
    return _digest([world, *(binding_ids.get(b, "-") for b in defaults)])


def _digest(parts: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()
