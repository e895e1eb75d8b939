"""Loading a revision of the config tree into a checked, resolved, immutable `Snapshot`.

`Loader` is what the CLI, the reconciler and the tests call. It keeps what it parsed keyed by each
file's path and content hash, so a reload after a one-file change parses and checks that file only;
the cross-file checks (`checks.check_tree`) then run on the whole tree, reusing each object's
result when neither it nor what it refers to changed.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypeVar

from reconciler.config.cases import Case
from reconciler.config.checks import (
    check_binding_file,
    check_connector_file,
    check_interface_file,
    check_named,
    check_profile_file,
    check_tools,
    check_tree,
    linked_file,
    missing_file,
    oversize_file,
    parse_document,
    read_cases,
    split_tool_text,
    stray_file,
    undecodable_file,
    undecodable_name,
    validate_model,
)
from reconciler.config.documents import Document
from reconciler.config.findings import Finding, sort_findings
from reconciler.config.models import (
    BindingFile,
    ConnectorFile,
    InterfaceFile,
    OrgFile,
    ProfileFile,
    TemplateFile,
)
from reconciler.config.skills import read_skill
from reconciler.config.snapshot import (
    BUILTIN_TEMPLATES,
    Binding,
    Connector,
    InterfaceVersion,
    Profile,
    Snapshot,
    frozen_map,
)
from reconciler.config.sources import MAX_FILE_BYTES, Blob, FolderSource, TreeSource
from reconciler.places import KIT_PACKAGE, kit_hash

__all__ = ["Loader", "load_snapshot"]

_IFACE = re.compile(r"^catalog/interfaces/([^/]+)/([^/]+)/(.+)$")
_CONNECTOR = re.compile(r"^catalog/connectors/([^/]+)/(.+)$")
_CONFIG = re.compile(r"^config/(bindings|profiles|templates)/([^/]+)\.toml$")

_T = TypeVar("_T")


@dataclass
class _Parsed:
    """What one file yielded: its document, its model (or tools, or cases) and its own findings."""

    doc: Document | None
    value: Any
    findings: list[Finding] = field(default_factory=list)


Build = Callable[[Document, Any], _Parsed]


@dataclass
class _Gathered:
    """What one load gathers from the files before the snapshot is assembled."""

    findings: list[Finding] = field(default_factory=list)
    documents: dict[str, Document] = field(default_factory=dict)
    interface_files: dict[tuple[str, str], dict[str, Blob]] = field(default_factory=dict)  # (name, vN) → files
    connector_files: dict[str, dict[str, Blob]] = field(default_factory=dict)
    bindings: dict[str, Binding] = field(default_factory=dict)
    profiles: dict[str, Profile] = field(default_factory=dict)
    templates: dict[str, TemplateFile] = field(default_factory=lambda: dict(BUILTIN_TEMPLATES))
    org: OrgFile | None = None


class _Memo:
    """The cross-file checks' results of the last load, carried into the next while their keys recur."""

    def __init__(self) -> None:
        self._last: dict[tuple[object, ...], Any] = {}
        self._now: dict[tuple[object, ...], Any] = {}

    def start(self) -> None:
        self._last, self._now = self._now, {}

    def __call__(self, key: tuple[object, ...], compute: Callable[[], _T]) -> _T:
        value: _T = self._last[key] if key in self._last else compute()
        self._now[key] = value
        return value


def load_snapshot(source: TreeSource | str) -> Snapshot:
    """Load one revision (a folder path or any `TreeSource`) with a fresh loader."""
    return Loader().load(FolderSource(source) if isinstance(source, str) else source)


class Loader:
    """Loads revisions; remembers parsed files by (path, content hash) between loads."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], _Parsed] = {}
        self._next: dict[tuple[str, str], _Parsed] = {}
        self._memo = _Memo()

    def load(self, source: TreeSource) -> Snapshot:
        revision, files = source.read()
        self._next = {}
        try:
            return self._assemble(revision, files)
        finally:
            self._cache = self._next  # forget files that left the tree

    def _parse(self, blob: Blob, build: Build) -> _Parsed:
        key = (blob.path, blob.sha)
        parsed = self._cache.get(key) or self._next.get(key)
        if parsed is None:
            doc, value, finding = parse_document(blob.path, blob.sha, blob.data)
            if finding is not None or doc is None:
                parsed = _Parsed(doc, None, [finding] if finding else [])
            else:
                parsed = build(doc, value)
        self._next[key] = parsed
        return parsed

    def _take(self, gathered: _Gathered, blob: Blob, build: Build) -> Any:
        """The value `build` makes of `blob` (None when it did not load); its findings and document are kept."""
        parsed = self._parse(blob, build)
        gathered.findings.extend(parsed.findings)
        if parsed.doc is not None:
            gathered.documents[blob.path] = parsed.doc
        return parsed.value

    def _assemble(self, revision: str, files: Mapping[str, Blob]) -> Snapshot:
        gathered = _Gathered()
        for path, blob in files.items():
            self._sort_file(gathered, path, blob)
        interfaces = self._read_interfaces(gathered)
        connectors = self._read_connectors(gathered)
        partial = Snapshot(
            revision=revision,
            interfaces=frozen_map(interfaces),
            connectors=frozen_map(connectors),
            bindings=frozen_map(gathered.bindings),
            profiles=frozen_map(gathered.profiles),
            templates=frozen_map(gathered.templates),
            org=gathered.org,
            documents=frozen_map(gathered.documents),
        )
        self._memo.start()
        profiles, findings = check_tree(partial, self._memo)
        everything = sort_findings([*gathered.findings, *findings])
        return replace(partial, profiles=frozen_map(profiles), findings=tuple(everything))

    def _sort_file(self, gathered: _Gathered, path: str, blob: Blob) -> None:
        """Read a config file now; set catalog files aside by folder, to be read a folder at a time."""
        if (escaped := undecodable_name(path)) is not None:
            gathered.findings.append(undecodable_file(escaped))
        elif blob.oversize:
            gathered.findings.append(oversize_file(path, blob.oversize, MAX_FILE_BYTES))
        elif blob.link:
            gathered.findings.append(linked_file(path, blob.data))
        elif m := _IFACE.match(path):
            gathered.interface_files.setdefault((m[1], m[2]), {})[m[3]] = blob
        elif m := _CONNECTOR.match(path):
            gathered.connector_files.setdefault(m[1], {})[m[2]] = blob
        elif m := _CONFIG.match(path):
            self._read_config(gathered, m[1], m[2], blob)
        elif path == "config/org.toml":
            gathered.org = self._take(gathered, blob, lambda d, v: _model(d, v, OrgFile, None, None))
        elif not path.startswith("catalog/"):
            gathered.findings.append(stray_file(path))

    def _read_config(self, gathered: _Gathered, kind: str, name: str, blob: Blob) -> None:
        """A file of config/bindings, config/profiles or config/templates."""
        if kind == "bindings":
            model = self._take(gathered, blob, lambda d, v: _model(d, v, BindingFile, check_binding_file, name))
            if model is not None:
                gathered.bindings[name] = Binding(name, model, blob.path, blob.sha)
        elif kind == "profiles":
            model = self._take(gathered, blob, lambda d, v: _model(d, v, ProfileFile, check_profile_file, name))
            if model is not None:
                gathered.profiles[name] = Profile(name, model, blob.path)
        else:
            model = self._take(gathered, blob, lambda d, v: _model(d, v, TemplateFile, check_named, name))
            if model is not None:
                gathered.templates[name] = model

    def _read_interfaces(self, gathered: _Gathered) -> dict[str, InterfaceVersion]:
        interfaces: dict[str, InterfaceVersion] = {}
        for (name, folder), group in sorted(gathered.interface_files.items()):
            iface = self._read_interface(gathered, name, folder, group)
            if iface is not None:
                interfaces[iface.key] = iface
        return interfaces

    def _read_interface(
        self, gathered: _Gathered, name: str, folder: str, group: dict[str, Blob]
    ) -> InterfaceVersion | None:
        spec_blob, tools_blob = group.get("interface.toml"), group.get("tools.json")
        if spec_blob is None or tools_blob is None:
            missing = "interface.toml" if spec_blob is None else "tools.json"
            gathered.findings.append(missing_file(name, folder, missing))
            return None
        where = (name, folder)
        spec = self._take(gathered, spec_blob, lambda d, v: _model(d, v, InterfaceFile, check_interface_file, where))
        tools = self._take(gathered, tools_blob, lambda d, v: _Parsed(d, *check_tools(d, v, name)))
        if spec is None or tools is None:
            return None
        cases: tuple[Case, ...] = ()
        if cases_blob := group.get("conformance/cases.toml"):
            cases = self._take(gathered, cases_blob, lambda d, v: _Parsed(d, *read_cases(d, v))) or ()
        fixtures = {
            p.removeprefix("conformance/"): b.data
            for p, b in group.items()
            if p.startswith("conformance/") and p != "conformance/cases.toml"
        }
        skills = tuple(sorted({p.split("/")[1] for p in group if p.startswith("skills/") and p.count("/") >= 2}))
        skill, found = read_skill(f"catalog/interfaces/{name}/{folder}", {p: b.data for p, b in group.items()
                                                                          if p.startswith("skills/")})
        gathered.findings.extend(found)
        contract = {
            p: b.sha for p, b in group.items() if p in ("interface.toml", "tools.json") or p.startswith("skills/")
        }
        return InterfaceVersion(
            key=f"{spec.name}/v{spec.version}",
            spec=spec,
            tools=tuple(tools),
            folder=f"catalog/interfaces/{name}/{folder}",
            skills=skills,
            skill=skill,
            cases=cases,
            fixtures=frozen_map(fixtures),
            content_hash=_folder_hash(group),
            contract_files=frozen_map(contract),
        )

    def _read_connectors(self, gathered: _Gathered) -> dict[str, Connector]:
        connectors: dict[str, Connector] = {}
        for name, group in sorted(gathered.connector_files.items()):
            manifest = group.get("connector.toml")
            if manifest is None:
                continue  # a folder of shared code, not a connector
            spec = self._take(gathered, manifest, partial(_connector, name=name))
            if spec is not None:
                connectors[name] = Connector(spec, f"catalog/connectors/{name}", _connector_hash(group),
                                             frozenset(group))
        return connectors


def _model(doc: Document, value: Any, model: type[Any], check: Any, context: Any) -> _Parsed:
    """`value` as `model` (F002, F004), then `check`'s rules for that kind of file."""
    api = model.model_fields["apiVersion"].annotation.__args__[0]
    spec, findings = validate_model(doc, value, model, api)
    if spec is not None and check is not None:
        findings.extend(check(doc, spec, context))
    return _Parsed(doc, spec, findings)


def _connector(doc: Document, value: Any, name: str) -> _Parsed:
    value, s1 = split_tool_text(doc, value)
    parsed = _model(doc, value, ConnectorFile, check_connector_file, name)
    parsed.findings[:0] = s1
    return parsed


def _connector_hash(files: Mapping[str, Blob]) -> str:
    """A connector folder's hash; for one written on the connector kit, the kit's version too, so a conformance
    result (which names this hash) covers the kit it ran on."""
    on_kit = any(path.endswith(".py") and KIT_PACKAGE.encode() in blob.data for path, blob in files.items())
    folder = _folder_hash(files)
    return hashlib.sha256(f"{folder}:kit:{kit_hash()}".encode()).hexdigest() if on_kit else folder


def _folder_hash(files: Mapping[str, Blob]) -> str:
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(f"{path}\0{files[path].sha}\n".encode())
    return digest.hexdigest()
