"""Loading a revision of the config tree into a checked, resolved, immutable `Snapshot`.

`Loader` is what the CLI, the reconciler and the tests call. It keeps what it parsed keyed by each
file's path and content hash, so a reload after a one-file change parses and checks that file only;
the cross-file checks then run on the whole tree, which is cheap (dictionary look-ups).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from reconciler.config.cases import Case, CaseError, parse_case
from reconciler.config.checks import check_binding, check_cases, check_connector, check_org, check_profile
from reconciler.config.findings import Finding, sort_findings
from reconciler.config.models import (
    BindingFile,
    ConnectorFile,
    InterfaceFile,
    OrgFile,
    ProfileFile,
    TemplateFile,
    Tool,
)
from reconciler.config.parsing import Document, parse_document, validate_model
from reconciler.config.resolving import resolve_profile
from reconciler.config.schemas import check_tools
from reconciler.config.snapshot import (
    BUILTIN_TEMPLATES,
    Binding,
    Connector,
    InterfaceVersion,
    Profile,
    Snapshot,
    frozen_map,
)
from reconciler.config.sources import Blob, FolderSource, TreeSource
from reconciler.config.validity import (
    check_binding_file,
    check_connector_file,
    check_interface_file,
    check_named,
    check_profile_file,
    split_tool_text,
)

__all__ = ["Loader", "load_snapshot"]

_IFACE = re.compile(r"^catalog/interfaces/([^/]+)/([^/]+)/(.+)$")
_CONNECTOR = re.compile(r"^catalog/connectors/([^/]+)/(.+)$")
_CONFIG = re.compile(r"^config/(bindings|profiles|templates)/([^/]+)\.toml$")


@dataclass
class _Parsed:
    """What one file yielded: its document, its model (or tools, or cases) and its own findings."""

    doc: Document | None
    value: Any
    findings: list[Finding] = field(default_factory=list)


def load_snapshot(source: TreeSource | str) -> Snapshot:
    """Load one revision (a folder path or any `TreeSource`) with a fresh loader."""
    return Loader().load(FolderSource(source) if isinstance(source, str) else source)


class Loader:
    """Loads revisions; remembers parsed files by (path, content hash) between loads."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], _Parsed] = {}
        self._next: dict[tuple[str, str], _Parsed] = {}
        self._cross_cache: dict[tuple[object, ...], Any] = {}

    def load(self, source: TreeSource) -> Snapshot:
        revision, files = source.read()
        self._next = {}
        try:
            return self._assemble(revision, files)
        finally:
            self._cache = self._next  # forget files that left the tree

    def _parse(self, blob: Blob, build: Any) -> _Parsed:
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

    def _assemble(self, revision: str, files: Mapping[str, Blob]) -> Snapshot:
        findings: list[Finding] = []
        documents: dict[str, Document] = {}

        def take(blob: Blob, build: Any) -> Any:
            parsed = self._parse(blob, build)
            findings.extend(parsed.findings)
            if parsed.doc is not None:
                documents[blob.path] = parsed.doc
            return parsed.value

        iface_files: dict[tuple[str, str], dict[str, Blob]] = {}
        connector_files: dict[str, dict[str, Blob]] = {}
        bindings: dict[str, Binding] = {}
        profiles: dict[str, ProfileFile] = {}
        profile_files: dict[str, str] = {}
        templates: dict[str, TemplateFile] = dict(BUILTIN_TEMPLATES)
        org: OrgFile | None = None

        for path, blob in files.items():
            if m := _IFACE.match(path):
                iface_files.setdefault((m[1], m[2]), {})[m[3]] = blob
            elif m := _CONNECTOR.match(path):
                connector_files.setdefault(m[1], {})[m[2]] = blob
            elif m := _CONFIG.match(path):
                kind, name = m[1], m[2]
                if kind == "bindings":
                    model = take(blob, lambda d, v, n=name: _model(d, v, BindingFile, check_binding_file, n))
                    if model is not None:
                        bindings[name] = Binding(name, model, path, blob.sha)
                elif kind == "profiles":
                    model = take(blob, lambda d, v, n=name: _model(d, v, ProfileFile, check_profile_file, n))
                    if model is not None:
                        profiles[name], profile_files[name] = model, path
                else:
                    model = take(blob, lambda d, v, n=name: _model(d, v, TemplateFile, check_named, n))
                    if model is not None:
                        templates[name] = model
            elif path == "config/org.toml":
                org = take(blob, lambda d, v: _model(d, v, OrgFile, None, None))
            elif not path.startswith("catalog/"):
                findings.append(
                    Finding(
                        "F005",
                        path,
                        1,
                        "this file is not part of any config kind and is ignored",
                        "config/org.toml, config/bindings/*.toml, config/profiles/*.toml or config/templates/*.toml",
                        "move or remove the file",
                    )
                )

        interfaces: dict[str, InterfaceVersion] = {}
        for (name, folder), group in sorted(iface_files.items()):
            iface = self._interface(name, folder, group, take, findings)
            if iface is not None:
                interfaces[iface.key] = iface

        connectors: dict[str, Connector] = {}
        for name, group in sorted(connector_files.items()):
            folder = f"catalog/connectors/{name}"
            manifest = group.get("connector.toml")
            if manifest is None:
                continue  # a folder of shared code, not a connector
            spec = take(manifest, lambda d, v, n=name: _connector(d, v, n))
            if spec is not None:
                connectors[name] = Connector(spec, folder, _folder_hash(group))

        partial = Snapshot(
            revision=revision,
            interfaces=frozen_map(interfaces),
            connectors=frozen_map(connectors),
            bindings=frozen_map(bindings),
            profiles=frozen_map({n: Profile(n, p, profile_files[n]) for n, p in profiles.items()}),
            templates=frozen_map(templates),
            org=org,
            documents=frozen_map(documents),
        )
        resolved = self._cross_check(partial, findings)
        return replace(partial, profiles=frozen_map(resolved), findings=tuple(sort_findings(findings)))

    def _cross_check(self, snapshot: Snapshot, findings: list[Finding]) -> dict[str, Profile]:
        """Resolve profiles and run the cross-file checks, reusing results whose inputs did not change.

        Each object's result is keyed by its own content and the content of what it refers to, so a
        one-binding change re-checks that binding and the profiles selecting it, not the whole tree.
        """
        docs = snapshot.documents
        interfaces_id = _digest(f"{k}:{i.content_hash}" for k, i in sorted(snapshot.interfaces.items()))
        world = _digest(
            [
                interfaces_id,
                docs["config/org.toml"].sha if "config/org.toml" in docs else "-",
                *sorted(f"{p}:{d.sha}" for p, d in docs.items() if p.startswith("config/templates/")),
            ]
        )
        cache, self._cross_cache = self._cross_cache, {}

        def cached(key: tuple[object, ...], compute: Any) -> Any:
            value = cache[key] if key in cache else compute()
            self._cross_cache[key] = value
            return value

        binding_ids = {
            name: f"{b.content_hash}:{c.content_hash if (c := snapshot.connectors.get(b.connector or '')) else '-'}"
            for name, b in snapshot.bindings.items()
        }

        for connector in snapshot.connectors.values():
            key: tuple[object, ...] = ("connector", connector.name, connector.content_hash, interfaces_id)
            findings.extend(cached(key, lambda c=connector: list(check_connector(snapshot, c))))
        for binding in snapshot.bindings.values():
            key = ("binding", binding.name, binding_ids[binding.name], interfaces_id)
            findings.extend(cached(key, lambda b=binding: list(check_binding(snapshot, b))))
        resolved: dict[str, Profile] = {}
        once: dict[tuple[str, int, str], Finding] = {}  # a broken org default is reported once, not per profile
        # org.toml (defaults included) is part of `world`; its default bindings' content is added here.
        world = _digest([world, *(binding_ids.get(b, "-") for b in _default_bindings(snapshot))])
        for name, profile in snapshot.profiles.items():
            deps = tuple([binding_ids.get(b, "-") for b in profile.spec.services.values()])
            key = ("profile", name, docs[profile.file].sha, deps, world)
            done, found = cached(key, lambda p=profile: _resolve_and_check(snapshot, p))
            resolved[name] = done
            for f in found:
                once[(f.file, f.line, f.code)] = f
        findings.extend(once.values())
        # The org's checks read the resolved profiles (policy scopes name profiles).
        findings.extend(check_org(replace(snapshot, profiles=frozen_map(resolved))))
        for iface in snapshot.interfaces:
            findings.extend(check_cases(snapshot, iface))
        return resolved

    def _interface(
        self, name: str, folder: str, group: dict[str, Blob], take: Any, findings: list[Finding]
    ) -> InterfaceVersion | None:
        where = f"catalog/interfaces/{name}/{folder}"
        spec_blob, tools_blob = group.get("interface.toml"), group.get("tools.json")
        if spec_blob is None or tools_blob is None:
            missing = "interface.toml" if spec_blob is None else "tools.json"
            findings.append(
                Finding(
                    "I014",
                    f"{where}/{missing}",
                    1,
                    f"interface version {name}/{folder} has no {missing}",
                    "interface.toml and tools.json in every version folder",
                    f"add {where}/{missing}",
                )
            )
            return None
        spec = take(spec_blob, lambda d, v: _model(d, v, InterfaceFile, check_interface_file, (name, folder)))
        tools = take(tools_blob, lambda d, v: _tools(d, v, name))
        if spec is None or tools is None:
            return None
        cases: tuple[Case, ...] = ()
        if cases_blob := group.get("conformance/cases.toml"):
            cases = take(cases_blob, _cases) or ()
        fixtures = {
            p.removeprefix("conformance/"): b.data
            for p, b in group.items()
            if p.startswith("conformance/") and p != "conformance/cases.toml"
        }
        skills = tuple(sorted({p.split("/")[1] for p in group if p.startswith("skills/") and p.count("/") >= 2}))
        contract = {
            p: b.sha for p, b in group.items() if p in ("interface.toml", "tools.json") or p.startswith("skills/")
        }
        return InterfaceVersion(
            key=f"{spec.name}/v{spec.version}",
            spec=spec,
            tools=tuple(tools),
            folder=where,
            skills=skills,
            cases=cases,
            fixtures=frozen_map(fixtures),
            content_hash=_folder_hash(group),
            contract_files=frozen_map(contract),
        )


def _default_bindings(snapshot: Snapshot) -> list[str]:
    return list(snapshot.org.defaults.services.values()) if snapshot.org else []


def _resolve_and_check(snapshot: Snapshot, profile: Profile) -> tuple[Profile, list[Finding]]:
    done, findings = resolve_profile(snapshot, profile)
    return done, [*findings, *check_profile(snapshot, done)]


def _model(doc: Document, value: Any, model: type[Any], check: Any, context: Any) -> _Parsed:
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


def _tools(doc: Document, value: Any, interface: str) -> _Parsed:
    tools: list[Tool]
    tools, findings = check_tools(doc, value, interface)
    return _Parsed(doc, tools, findings)


def _cases(doc: Document, value: Any) -> _Parsed:
    raw = value.get("case", [])
    findings: list[Finding] = []
    cases: list[Case] = []
    unknown = [k for k in value if k != "case"]
    for key in unknown:
        findings.append(
            Finding(
                "I013",
                doc.path,
                doc.line_of(key),
                f"unknown key '{key}' in cases.toml",
                "only [[case]] tables",
                "write each case as a [[case]] table",
            )
        )
    for index, item in enumerate(raw if isinstance(raw, list) else []):
        try:
            cases.append(parse_case(item))
        except CaseError as exc:
            findings.append(
                Finding(
                    "I013",
                    doc.path,
                    doc.line_of("case", index, *exc.key),
                    str(exc),
                    "a case in the grammar of docs/conformance.md",
                    "see docs/conformance.md for every assertion with an example",
                )
            )
    return _Parsed(doc, tuple(cases), findings)


def _digest(parts: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _folder_hash(files: Mapping[str, Blob]) -> str:
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(f"{path}\0{files[path].sha}\n".encode())
    return digest.hexdigest()
