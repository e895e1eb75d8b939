"""The immutable view of one revision of the config tree that every other room reads.

A `Snapshot` is built once per revision by `loading.load_snapshot` and never changed: the router
swaps whole snapshots. Selections are resolved here (a profile's `ocr` → `ocr/v1` on a binding),
so nothing downstream re-derives them per call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

from reconciler.config.cases import Case
from reconciler.config.documents import Document
from reconciler.config.findings import Finding
from reconciler.config.models import (
    BindingFile,
    ConnectorFile,
    InterfaceFile,
    Limits,
    OrgFile,
    Outcome,
    ProfileFile,
    TemplateFile,
    Tool,
)
from reconciler.config.skills import Skill

__all__ = [
    "BUILTIN_TEMPLATES",
    "DEFAULT_TEMPLATE",
    "RESHAPERS",
    "ROUTER_ERRORS",
    "Binding",
    "Connector",
    "InterfaceVersion",
    "Profile",
    "Selection",
    "Snapshot",
    "effective_limits",
    "frozen_map",
]

# The result reshapers a `[wrap]` may name; the router implements them (connectors.wrapping).
RESHAPERS = ("text", "json-text", "structured")

# The router's own codes, valid for every interface (docs/architecture.md §6).
ROUTER_ERRORS = MappingProxyType(
    {
        "invalid_arguments": "the arguments do not match the tool's inputSchema; the message says where and why",
        "unavailable": "the service is down, timed out or misbehaved; retrying later may work",
    }
)


def _template(name: str, description: str, read: str, write: str, destructive: str) -> TemplateFile:
    return TemplateFile(
        apiVersion="handler.template/v1",
        name=name,
        description=description,
        read=Outcome(read),
        write=Outcome(write),
        destructive=Outcome(destructive),
    )


BUILTIN_TEMPLATES: Mapping[str, TemplateFile] = MappingProxyType(
    {
        "permissive": _template("permissive", "everything auto-approves", "auto", "auto", "auto"),
        "balanced": _template(
            "balanced", "reads run; writes and destructive actions wait for approval", "auto", "approve", "approve"
        ),
        "restrictive": _template(
            "restrictive", "reads run; writes and destructive actions are refused", "auto", "block", "block"
        ),
    }
)
DEFAULT_TEMPLATE = "balanced"


def frozen_map(items: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(items))


@dataclass(frozen=True)
class InterfaceVersion:
    """One published contract, e.g. ocr/v1: its metadata, tools, skills, cases and fixtures."""

    key: str  # "ocr/v1"
    spec: InterfaceFile
    tools: tuple[Tool, ...]
    folder: str  # "catalog/interfaces/ocr/v1"
    skills: tuple[str, ...] = ()
    skill: Skill | None = None  # the one its agents are served (None only in a tree with an I016 or I017 finding)
    cases: tuple[Case, ...] = ()
    fixtures: Mapping[str, bytes] = field(default_factory=lambda: MappingProxyType({}))
    content_hash: str = ""  # every file of the folder
    # interface.toml, tools.json and skills/ (path in the folder → blob hash): what publishing freezes
    contract_files: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def version(self) -> int:
        return self.spec.version

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    @property
    def error_codes(self) -> frozenset[str]:
        """The closed list: the interface's errors plus the router's own."""
        return frozenset(self.spec.errors) | frozenset(ROUTER_ERRORS)


@dataclass(frozen=True)
class Connector:
    spec: ConnectorFile
    folder: str  # "catalog/connectors/<name>"
    content_hash: str = ""
    files: frozenset[str] = frozenset()  # every file of its folder, relative to it ("main.py")

    @property
    def name(self) -> str:
        return self.spec.name

    def implements(self, key: str) -> bool:
        return key in self.spec.implements


@dataclass(frozen=True)
class Binding:
    name: str
    spec: BindingFile
    file: str
    content_hash: str = ""

    @property
    def connector(self) -> str | None:
        return self.spec.connector


@dataclass(frozen=True)
class Selection:
    """What one interface of a profile resolves to."""

    interface: str  # "ocr"
    key: str  # "ocr/v1"
    binding: str
    pinned: bool  # the profile (or default) named the version
    origin: str  # "profile" or "org default"


@dataclass(frozen=True)
class Profile:
    name: str
    spec: ProfileFile
    file: str
    selections: Mapping[str, Selection] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Snapshot:
    """One revision of the config tree, loaded, checked and resolved. Never mutated.

    Two snapshots are equal when they hold the same config, whatever revision they came from.
    """

    revision: str = field(compare=False)
    interfaces: Mapping[str, InterfaceVersion]
    connectors: Mapping[str, Connector]
    bindings: Mapping[str, Binding]
    profiles: Mapping[str, Profile]
    templates: Mapping[str, TemplateFile]
    org: OrgFile | None
    findings: tuple[Finding, ...] = field(default=(), compare=False)
    documents: Mapping[str, Document] = field(default_factory=lambda: MappingProxyType({}), compare=False, repr=False)

    @property
    def ok(self) -> bool:
        """True when no finding is an error: the revision may be applied."""
        return not any(f.is_error for f in self.findings)

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.is_error)

    @cached_property
    def interface_versions(self) -> Mapping[str, tuple[int, ...]]:
        """Interface name → its versions, ascending."""
        index: dict[str, list[int]] = {}
        for iface in self.interfaces.values():
            index.setdefault(iface.name, []).append(iface.version)
        return MappingProxyType({name: tuple(sorted(v)) for name, v in index.items()})

    def versions_of(self, name: str) -> list[int]:
        return list(self.interface_versions.get(name, ()))

    def template_for(self, profile: Profile) -> TemplateFile:
        """The profile's template, else the org default, else Balanced."""
        name = profile.spec.template or (self.org.defaults.template if self.org else None) or DEFAULT_TEMPLATE
        return self.templates.get(name) or BUILTIN_TEMPLATES[DEFAULT_TEMPLATE]

    def line_of(self, file: str, *at: str | int) -> int:
        """The line of key path `at` in `file` (see `Document.line_of`); 1 for a file not read."""
        doc = self.documents.get(file)
        return doc.line_of(*at) if doc else 1

    def tool_names(self, keys: Iterable[str]) -> set[str]:
        """The tools of the interface versions named by `keys` (unknown keys are skipped)."""
        return {t.name for k in keys if (iface := self.interfaces.get(k)) for t in iface.tools}


def effective_limits(interface: InterfaceFile, binding: BindingFile | None) -> Limits:
    """The interface's limits, tightened (never loosened) by the binding's."""
    if binding is None or binding.limits is None:
        return interface.limits
    merged: dict[str, Any] = {}
    for name in Limits.model_fields:
        a, b = getattr(interface.limits, name), getattr(binding.limits, name)
        merged[name] = b if a is None else a if b is None else min(a, b)
    return Limits(**merged)
