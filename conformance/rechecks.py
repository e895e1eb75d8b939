"""What CI checks again, and whether its re-runs reproduce the result files: the gate behind the listing.

Called by `handler catalog changed` (which connectors to check, with what, and which seeds to replay)
and `handler catalog build --check --base REF` (docs/conformance.md, "The gate").

A result file is text anyone can write. It is trusted only as far as the runner reproduces it: every
run a change adds (a run of the file that the base's file does not hold, an edited one included) at the
current revision must be matched by a run the workflow made itself, into a folder of its own, with
the same seed, the same evidence and the same hashes, and the same outcome for each interface version
(its cases, fuzzing and refusals, item for item). A pass written by hand, or copied from another
connector, is not reproduced by a connector that does not pass, and fails the gate on a clean clone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.defaults import DEFAULT_EXAMPLES
from conformance.errors import ListingError
from conformance.pages import page_addresses
from conformance.results import RESULTS_FOLDER, parse_results, read_results
from conformance.workspace import find_helpers
from reconciler.config import Connector, FolderSource, GitSource, Loader, Snapshot
from reconciler.places import KIT_PACKAGE

__all__ = ["STAND_IN", "Recheck", "changed_connectors", "new_runs", "verify_reruns"]

KIT_FOLDER = f"kit/{KIT_PACKAGE}"  # where the service's repository keeps the connector kit
STAND_IN = ":stand-in"  # in `catalog changed`'s binding column: the test suite's stand-in check runs it
_OUTCOME = ("cases", "fuzz", "refuse", "cases_pass", "fuzzing_pass")


@dataclass(frozen=True)
class Recheck:
    """A connector to check again: with `binding` (None: no binding configures it), or against its stand-in,
    replaying `replays` (seed and examples of each run its result file gained; none: one run, a fresh seed)."""

    connector: str
    binding: str | None
    replays: tuple[tuple[int, int], ...] = ()

    def line(self) -> str:
        """`connector binding seed:examples,...` (`-`: one run with a fresh seed), as the workflow reads it."""
        return f"{self.connector} {self.binding} {','.join(f'{s}:{e}' for s, e in self.replays) or '-'}"


def runs_here(connector: Connector, snapshot: Snapshot) -> bool:
    """Whether `handler connector check` can run it with a shipped binding: it reaches no network, or only the
    pages the check itself serves (every interface it implements has its pages in its conformance folder)."""
    if not connector.spec.egress:
        return True
    return all(key in snapshot.interfaces and page_addresses(snapshot.interfaces[key])
               for key in connector.spec.implements)


def changed_connectors(root: Path, base: str | None) -> list[Recheck]:
    """Each connector whose folder, interfaces, bindings, result file or connector kit (for one written on it: the
    tree's own `kit/`, where the tree is the service's repository) changed since the git ref `base` (with no
    base: every connector), egress included: one that reaches a vendor is checked against its stand-in (the
    binding column says `:stand-in`), the built-in llm connector by its own tests (it has no process to check)."""
    head = Loader().load(FolderSource(root))
    source = GitSource.for_folder(root, base) if base else None
    before = Loader().load(source) if source is not None else Loader().load(_Empty())
    changed: list[Recheck] = []
    kit_moved = source is not None and _kit_changed(root, source)
    for name, connector in sorted(head.connectors.items()):
        if connector.spec.run.builtin:
            continue
        bindings = sorted(b for b, spec in head.bindings.items() if spec.connector == name)
        added = new_runs(root, source, name)
        # A transcriber that judges its cases (find_helpers) is part of what its results rest on.
        implemented = tuple(head.interfaces[k] for k in connector.spec.implements if k in head.interfaces)
        judges = find_helpers(head, implemented)
        moved = (_hash(before.connectors, name) != connector.content_hash or (kit_moved and on_kit(root, connector))
                 or any(_hash(before.interfaces, key) != _hash(head.interfaces, key)
                        for key in connector.spec.implements)
                 or any(_hash(before.connectors, j.connector.spec.name) != j.connector.content_hash
                        or _hash(before.bindings, j.binding.name) != j.binding.content_hash for j in judges)
                 or any(_hash(before.bindings, b) != head.bindings[b].content_hash for b in bindings)
                 or bool(added) or (source is not None and _file_changed(root, source, name)))
        if not moved:
            continue
        changed.extend(_rechecks(connector, head, bindings, added))
    return changed


def _rechecks(connector: Connector, head: Snapshot, bindings: list[str],
              added: list[dict[str, Any]]) -> list[Recheck]:
    """How to check `connector` again: each binding its gained runs at this revision used, with their seeds (one
    with egress against its stand-in); with none gained, its first binding and a fresh seed."""
    here = runs_here(connector, head)
    by_binding: dict[str | None, set[tuple[int, int]]] = {}
    for run in added:
        if _current(run, connector, head) and isinstance(run.get("seed"), int):
            binding = run.get("binding") if here and run.get("binding") in bindings else None
            key = binding if here else STAND_IN
            by_binding.setdefault(key, set()).add((run["seed"], run.get("examples") or DEFAULT_EXAMPLES))
    if not by_binding:
        return [Recheck(connector.name, (bindings[0] if bindings else None) if here else STAND_IN)]
    return [Recheck(connector.name, binding, tuple(sorted(replays))) for binding, replays in sorted(
        by_binding.items(), key=lambda item: str(item[0]))]


def new_runs(root: Path, source: GitSource | None, name: str) -> list[dict[str, Any]]:
    """The runs of `name`'s result file that its file at `source`'s commit does not hold (with no source: all)."""
    path = root / RESULTS_FOLDER / f"{name}.json"
    now = read_results(path) if path.is_file() else []
    then = _runs_at(source, name) if source is not None else []
    return [r for r in now if r not in then]


def verify_reruns(root: Path, base: str | None, reruns: Path | None) -> list[str]:
    """The runs added since `base` that the re-runs in `reruns` (result files the workflow recorded itself) do
    not reproduce, one error each; with no base, every run at the current revision must be reproduced."""
    head = Loader().load(FolderSource(root))
    source = GitSource.for_folder(root, base) if base else None
    errors: list[str] = []
    for name, connector in sorted(head.connectors.items()):
        added = [r for r in new_runs(root, source, name) if _current(r, connector, head)]
        if not added:
            continue
        redone_path = reruns / f"{name}.json" if reruns is not None else None
        redone = read_results(redone_path) if redone_path and redone_path.is_file() else []
        for run in added:
            problem = _reproduced(run, redone)
            if problem:
                errors.append(f"catalog/results/{name}.json: the run of {run.get('started')} (seed {run.get('seed')}, "
                              f"{run.get('evidence')}) {problem}\n  fix: record runs with `handler connector check "
                              f"{name} --binding <binding>` (the file is the runner's, never edited), and let CI "
                              "re-run them")
    return errors


def _reproduced(run: Mapping[str, Any], redone: list[dict[str, Any]]) -> str | None:
    """Why no run of `redone` reproduces `run` (None when one does)."""
    if run.get("evidence") == "vendor":
        return "claims the vendor's service, which no re-run here can reach; it cannot be reproduced"
    same_seed = [r for r in redone if r.get("seed") == run.get("seed") and r.get("evidence") == run.get("evidence")
                 and r.get("connector_hash") == run.get("connector_hash")
                 and (run.get("evidence") == "stand-in" or r.get("binding") == run.get("binding"))]
    if not same_seed:
        return "was not re-run here with its seed and evidence, so nothing shows the runner produced it"
    claimed = _outcome(run)
    for other in same_seed:
        if _outcome(other) == claimed:
            return None
    got = _outcome(same_seed[-1])
    return f"is not what the re-run here with its seed gave: the file says {_show(claimed)}; the re-run {_show(got)}"


def _outcome(run: Mapping[str, Any]) -> dict[str, Any]:
    interfaces = run.get("interfaces") or {}
    return {key: {k: summary.get(k) for k in ("interface_hash", *_OUTCOME)}
            for key, summary in sorted(interfaces.items()) if isinstance(summary, dict)}


def _show(outcome: Mapping[str, Any]) -> str:
    parts = []
    for key, summary in outcome.items():
        cases = summary.get("cases") or {}
        parts.append(f"{key} cases {cases.get('passed')}/{sum(v for v in cases.values() if isinstance(v, int))} "
                     f"{'pass' if summary.get('cases_pass') else 'fail'}, fuzzing "
                     f"{'passes' if summary.get('fuzzing_pass') else 'fails'}")
    return "; ".join(parts) or "nothing"


def _current(run: Mapping[str, Any], connector: Connector, head: Snapshot) -> bool:
    """Whether `run` is of the current revision: the connector's folder and each interface's hash as they do now."""
    interfaces = run.get("interfaces") or {}
    return run.get("connector_hash") == connector.content_hash and all(
        (interfaces.get(key) or {}).get("interface_hash") == _hash(head.interfaces, key)
        for key in connector.spec.implements)


def _runs_at(source: GitSource, name: str) -> list[dict[str, Any]]:
    data = _blob_at(source, f"{RESULTS_FOLDER}/{name}.json")
    if data is None:
        return []
    try:
        return parse_results(data, f"{RESULTS_FOLDER}/{name}.json at {source.ref}")
    except ListingError:
        return []  # an unreadable base file holds no run a change could keep


def on_kit(root: Path, connector: Connector) -> bool:
    """Whether the connector is written on the connector kit: Python of its folder imports it."""
    return any(KIT_PACKAGE in path.read_text(errors="replace") for path in (root / connector.folder).rglob("*.py"))


def _kit_changed(root: Path, source: GitSource) -> bool:
    """Whether a file of the kit in the tree (`kit/handler_kit/`) differs from the same file at the base."""
    folder = root / KIT_FOLDER
    files = sorted(folder.rglob("*.py")) if folder.is_dir() else []
    return any(_blob_at(source, path.relative_to(root).as_posix()) != path.read_bytes() for path in files)


def _file_changed(root: Path, source: GitSource, name: str) -> bool:
    rel = f"{RESULTS_FOLDER}/{name}.json"
    path = root / rel
    return (path.read_bytes() if path.is_file() else None) != _blob_at(source, rel)


def _blob_at(source: GitSource, rel: str) -> bytes | None:
    try:
        blob = source.repo.commit(source.ref).tree / "/".join(filter(None, (source.subdir, rel)))
    except KeyError:  # not at the base
        return None
    data: bytes = blob.data_stream.read()
    return data


class _Empty:
    """A tree with nothing in it: against it, everything changed."""

    def read(self) -> tuple[str, dict[str, Any]]:
        return "empty", {}


def _hash(objects: Mapping[str, Any], name: str) -> str | None:
    found = objects.get(name)
    return found.content_hash if found is not None else None
