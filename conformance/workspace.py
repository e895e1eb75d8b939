"""The throw-away config tree a check serves from: the connector, its binding, a profile per interface.

`load_subject` reads the user's tree and finds what the check is about (the connector, the binding,
the interface versions the connector implements), with "did you mean" for a misspelt name.
`build_workspace` writes a small tree in a temp folder — the interface version folders, the
connector's manifest, the binding, a minimal org, and for each interface version a permissive
profile whose scope is a work folder holding that version's fixture files; beside them, the local
transcriber a case hears speech back with (`Helper`: its interface version, connector and binding, and
a profile on the same work folder, so it reads what the connector wrote) — and loads it with the
project's own `Loader`, so the router serves it exactly as it would serve the user's tree. The
connector process itself runs from its real folder (the router is given the user's root), so the
code checked is the code in the tree and relative secret references resolve as in production.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from conformance.errors import CheckError
from reconciler.config import Binding, Connector, FolderSource, InterfaceVersion, Loader, Snapshot, did_you_mean

__all__ = ["Helper", "Subject", "Workspace", "build_workspace", "find_helpers", "load_subject", "profile_name"]

_SKIP = shutil.ignore_patterns(".*", "__pycache__")


@dataclass(frozen=True)
class Helper:
    """A local connector a case calls to judge the output (a transcriber hearing speech back), for `user`."""

    iface: InterfaceVersion
    connector: Connector
    binding: Binding
    user: str  # the interface version whose cases call it; the helper's profile shares its work folder


@dataclass(frozen=True)
class Subject:
    """What a check is about, read from the user's tree."""

    root: Path
    source: Snapshot
    connector: Connector
    binding: Binding
    interfaces: tuple[InterfaceVersion, ...]  # every version the connector implements, in order
    helpers: tuple[Helper, ...] = ()


@dataclass(frozen=True)
class Workspace:
    """The tree written for one router: where it is, its snapshot, and a profile per interface version."""

    folder: Path
    snapshot: Snapshot
    profiles: MappingProxyType[str, str]  # interface key ("ocr/v1") → profile name
    scopes: MappingProxyType[str, Path]  # interface key → the profile's work folder


def load_subject(root: Path, connector: str, binding: str) -> Subject:
    """Read `root` and resolve the connector and binding; `CheckError` says what is wrong and what exists."""
    source = Loader().load(FolderSource(root))
    found = source.connectors.get(connector)
    if found is None:
        raise CheckError(f"no connector '{connector}' in {root}/catalog/connectors"
                         f"{did_you_mean(connector, source.connectors)}")
    chosen = source.bindings.get(binding)
    own = sorted(name for name, b in source.bindings.items() if b.connector == connector)
    if chosen is None:
        hint = did_you_mean(binding, own or list(source.bindings))
        known = f"; bindings of '{connector}': {', '.join(own)}" if own else f"; no binding names '{connector}' yet"
        raise CheckError(f"no binding '{binding}' in {root}/config/bindings{hint}{known}")
    if chosen.connector != connector:
        raise CheckError(f"binding '{binding}' configures connector '{chosen.connector}', not '{connector}'"
                         + (f"; bindings of '{connector}': {', '.join(own)}" if own else ""))
    missing = [key for key in found.spec.implements if key not in source.interfaces]
    if missing:
        raise CheckError(f"connector '{connector}' implements {', '.join(missing)}, which "
                         f"{'is' if len(missing) == 1 else 'are'} not in {root}/catalog/interfaces")
    folders = [found.folder, *(source.interfaces[key].folder for key in found.spec.implements)]
    problems = [f for f in source.errors if _concerns(f.file, folders, chosen)]
    if problems:
        shown = "\n".join(f.render_text() for f in problems)
        raise CheckError(f"the files of '{connector}' or '{binding}' hold errors; fix them first:\n{shown}")
    interfaces = tuple(source.interfaces[key] for key in found.spec.implements)
    return Subject(root, source, found, chosen, interfaces, find_helpers(source, interfaces))


def find_helpers(source: Snapshot, interfaces: tuple[InterfaceVersion, ...]) -> tuple[Helper, ...]:
    """For each transcriber the cases name (`spokenWordErrorRate`), the tree's first binding (by name) of a
    connector that implements it and reaches no network: the judge runs here, offline. None found: the
    case fails saying so."""
    helpers: list[Helper] = []
    for iface in interfaces:
        wanted = sorted({a.value["transcriber"] for case in iface.cases for a in case.assertions
                         if a.op == "spokenWordErrorRate"})
        for key in wanted:
            judge = source.interfaces.get(key)
            local = sorted((name, c) for name, b in source.bindings.items()
                           if (c := source.connectors.get(b.connector or "")) is not None
                           and key in c.spec.implements and not c.spec.egress and not c.spec.run.builtin)
            if judge is not None and local:
                name, connector = local[0]
                helpers.append(Helper(judge, connector, source.bindings[name], iface.key))
    return tuple(helpers)


def profile_name(key: str) -> str:
    """The profile serving interface version `key` in a workspace: ocr/v1 → ocr-v1."""
    return key.replace("/", "-")


def build_workspace(subject: Subject, folder: Path) -> Workspace:
    """Write the tree under `folder` (created) and load it; raises `CheckError` if it does not load clean."""
    root = subject.root
    for iface in subject.interfaces:
        shutil.copytree(root / iface.folder, folder / iface.folder, ignore=_SKIP)
    # The whole folder, hidden files included, as the loader reads and hashes it and checks that its [run] names
    # code that is there (N007); the process itself still runs from the real folder.
    shutil.copytree(root / subject.connector.folder, folder / subject.connector.folder)
    (folder / "config/bindings").mkdir(parents=True)
    shutil.copyfile(root / subject.binding.file, folder / "config/bindings" / Path(subject.binding.file).name)
    for helper in subject.helpers:
        for part in (helper.iface.folder, helper.connector.folder):
            if not (folder / part).exists():
                shutil.copytree(root / part, folder / part, ignore=_SKIP)
        shutil.copyfile(root / helper.binding.file, folder / "config/bindings" / Path(helper.binding.file).name)
    (folder / "config/org.toml").write_text('apiVersion = "handler.org/v1"\nname = "conformance"\n')
    profiles: dict[str, str] = {}
    scopes: dict[str, Path] = {}
    (folder / "config/profiles").mkdir()
    for iface in subject.interfaces:
        name = profile_name(iface.key)
        scope = folder / "work" / name
        scope.mkdir(parents=True)
        for rel, data in iface.fixtures.items():
            target = scope / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        (folder / "config/profiles" / f"{name}.toml").write_text(
            'apiVersion = "handler.profile/v1"\n'
            f'name = "{name}"\n'
            f'description = "The conformance check of {iface.key}"\n'
            f'scope = "{scope}"\n'
            'template = "permissive"\n'
            f'services = {{ "{iface.key}" = "{subject.binding.name}" }}\n')
        profiles[iface.key] = name
        scopes[iface.key] = scope
    for helper in subject.helpers:
        name = f"{profile_name(helper.iface.key)}-judge"
        scope = scopes[helper.user]
        (folder / "config/profiles" / f"{name}.toml").write_text(
            'apiVersion = "handler.profile/v1"\n'
            f'name = "{name}"\n'
            f'description = "Hears back what the check of {helper.user} wrote"\n'
            f'scope = "{scope}"\n'
            'template = "permissive"\n'
            f'services = {{ "{helper.iface.key}" = "{helper.binding.name}" }}\n')
        profiles[helper.iface.key] = name
        scopes[helper.iface.key] = scope
    snapshot = Loader().load(FolderSource(folder))
    if not snapshot.ok:
        shown = "\n".join(f.render_text() for f in snapshot.errors)
        raise CheckError(f"the check's own tree for '{subject.connector.name}' does not load:\n{shown}")
    return Workspace(folder, snapshot, MappingProxyType(profiles), MappingProxyType(scopes))


def _concerns(file: str, folders: list[str], binding: Binding) -> bool:
    return file == binding.file or any(file.startswith(folder + "/") for folder in folders)

