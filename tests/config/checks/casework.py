"""Case folders: each is a small change to a valid base tree, with every finding it must produce.

tests/config/cases/ holds the base tree (`_base/`) and the case folders, grouped like the modules of
reconciler/config/checks: `syntax/`, `files/`, `tools/`, `conformance/` (cases.toml) and
`tree/<module>/`. A case folder holds only the files that differ from the base (overlaid on a copy
of it), an optional `deleted.txt` (tree-relative paths to remove, one per line) and `expected.txt`:
every finding the changed tree must produce and nothing else, whole and in order, as `handler
validate` prints them (`path:line: CODE message`, then its `expected:` and `fix:` lines), so a
changed message, hint or place fails the case. Folder names start with the code they are about.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from reconciler.config import Finding, FolderSource, Loader

CASES = Path(__file__).resolve().parents[1] / "cases"
BASE = CASES / "_base"
META_FILES = frozenset({"expected.txt", "deleted.txt"})
# The first line of a finding as the text format prints it; its other lines are indented.
_HEAD = re.compile(r"^(?P<file>\S+):(?P<line>\d+): (?P<code>[A-Z]\d{3}) ")


def case_dirs(group: str = "") -> list[Path]:
    """The case folders of `group` ("tree/bindings"), or of every group."""
    return sorted(p.parent for p in (CASES / group).rglob("expected.txt"))


def case_id(case: Path) -> str:
    return case.name


def case_named(name: str) -> Path:
    """The case folder `name`, as "group/CODE-what"."""
    case = CASES / name
    assert (case / "expected.txt").is_file(), f"no case folder {case}"
    return case


def build_case(case: Path, dest: Path) -> Path:
    """The base tree with `case` overlaid and its deletions applied, in `dest`."""
    shutil.copytree(BASE, dest)
    for path in case.rglob("*"):
        rel = path.relative_to(case)
        if path.is_symlink():  # kept a link, as the case folder holds it (F006)
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(path.readlink())
        elif path.is_file() and rel.as_posix() not in META_FILES:
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    deleted = case / "deleted.txt"
    if deleted.exists():
        for line in deleted.read_text().splitlines():
            if line.strip():
                target = dest / line.strip()
                assert target.exists(), f"{case.name}/deleted.txt names {line.strip()}, which the base lacks"
                if target.is_dir():
                    shutil.rmtree(target)
                else:
                    target.unlink()
    return dest


def expected_of(case: Path) -> str:
    """The findings `case` must produce, as the text format prints them."""
    return (case / "expected.txt").read_text()


def expected_codes(case: Path) -> list[str]:
    text = expected_of(case)
    for number, line in enumerate(text.splitlines(), 1):
        assert _HEAD.match(line) or line.startswith("  "), f"{case.name}/expected.txt:{number}: not a finding: {line!r}"
    return [m["code"] for line in text.splitlines() if (m := _HEAD.match(line))]


def render(findings: tuple[Finding, ...]) -> str:
    return "".join(f.render_text() + "\n" for f in findings)


def load_findings(root: Path) -> tuple[Finding, ...]:
    return Loader().load(FolderSource(root)).findings


_LOADED: dict[Path, tuple[Finding, ...]] = {}  # case folder → findings, shared by the tests of one process


def findings_of(case: Path) -> tuple[Finding, ...]:
    """The findings of `case`, loaded at most once per process (the built tree is removed after)."""
    if case not in _LOADED:
        with tempfile.TemporaryDirectory(prefix="hcase-") as tmp:
            _LOADED[case] = load_findings(build_case(case, Path(tmp) / "tree"))
    return _LOADED[case]


def check_case(case: Path) -> None:
    """`case` produces exactly the findings of its expected.txt."""
    assert render(findings_of(case)) == expected_of(case)
