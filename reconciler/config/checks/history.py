"""What history shows: published interface versions are frozen (docs/architecture.md §4, §5).

`handler validate --base REF` compares a revision with its base: a version that exists at the base
may not change its interface.toml, tools.json or skills/; its conformance/ may gain cases and
fixtures, but not lose or change one (a published quality floor is not lowered). The finding names
the version to create instead. I010.
"""

from __future__ import annotations

import tomllib
from typing import Any

import orjson

from reconciler.config.findings import Finding
from reconciler.config.snapshot import Snapshot

__all__ = ["check_frozen"]


def check_frozen(base: Snapshot, head: Snapshot) -> list[Finding]:
    """I010 for every file of a published version's contract that differs from `base`, and every case or fixture
    of its conformance/ that was removed or changed."""
    findings: list[Finding] = []
    for key, old in base.interfaces.items():
        new = head.interfaces.get(key)
        if new is None:
            continue
        findings.extend(_weakened(base, head, key))
        if new.contract_files == old.contract_files:
            continue
        latest = max([*base.versions_of(old.name), *head.versions_of(old.name)])
        successor = f"{old.name}/v{latest + 1}"
        changed = sorted(
            p
            for p in {*old.contract_files, *new.contract_files}
            if old.contract_files.get(p) != new.contract_files.get(p)
        )
        for rel in changed:
            path = f"{new.folder}/{rel}"
            line = _first_changed_line(base, head, path)
            what = (
                "added" if rel not in old.contract_files else "removed" if rel not in new.contract_files else "changed"
            )
            findings.append(
                Finding(
                    "I010",
                    path,
                    line,
                    f"{key} is published (it exists at the base revision) and {rel} was {what}",
                    f"{key} unchanged: a published version is frozen, even for an added optional field",
                    f"revert {rel} and put the change in a new version, catalog/interfaces/{old.name}/v{latest + 1}/ "
                    f"({successor})",
                )
            )
    return findings


def _weakened(base: Snapshot, head: Snapshot, key: str) -> list[Finding]:
    """I010 for each conformance case or fixture of published `key` that `head` removed or changed."""
    old, new = base.interfaces[key], head.interfaces[key]
    kept = {case.name: case for case in new.cases}
    cases = f"{new.folder}/conformance/cases.toml"
    gone = [(cases, f"case '{c.name}'", "removed" if c.name not in kept else "changed")
            for c in old.cases if kept.get(c.name) != c]
    gone += [(f"{new.folder}/conformance/{path}", f"fixture {path}",
              "removed" if path not in new.fixtures else "changed")
             for path, data in old.fixtures.items() if new.fixtures.get(path) != data]
    return [Finding("I010", path, 1, f"{key} is published (it exists at the base revision) and its conformance {what} "
                    f"was {how}", f"{key}'s cases and fixtures kept: a published version may gain cases, not lose "
                    "or weaken one", f"restore the {what.split()[0]}; a stricter or different floor belongs in a new "
                    "version") for path, what, how in gone]


def _first_changed_line(base: Snapshot, head: Snapshot, path: str) -> int:
    old, new = base.documents.get(path), head.documents.get(path)
    if old is None or new is None:
        return 1
    try:
        a, b = _parse(old.format, old.text), _parse(new.format, new.text)
    except (ValueError, RecursionError):
        return 1
    diff = _first_diff(a, b, ())
    return new.line_of(*diff) if diff is not None else 1


def _parse(fmt: str, text: str) -> Any:
    return tomllib.loads(text) if fmt == "toml" else orjson.loads(text)


def _first_diff(a: Any, b: Any, path: tuple[str | int, ...]) -> tuple[str | int, ...] | None:
    if a == b:
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*b, *(k for k in a if k not in b)]:
            if a.get(key) != b.get(key):
                if key not in b:
                    return path
                return _first_diff(a.get(key), b[key], (*path, key))
    if isinstance(a, list) and isinstance(b, list):
        for i in range(max(len(a), len(b))):
            if i >= len(b):
                return path
            if i >= len(a) or a[i] != b[i]:
                return _first_diff(a[i] if i < len(a) else None, b[i], (*path, i))
    return path
