"""The save-time checks, case by case: each folder of cases/ is a small change to a valid base tree.

A case folder holds only the files that differ from `cases/_base/` (overlaid on a copy of it), an
optional `deleted.txt` (tree-relative paths to remove, one per line) and `expected.txt`: every
finding the changed tree must produce and nothing else, whole and in order, as `handler validate`
prints them (`path:line: CODE message`, then its `expected:` and `fix:` lines). A changed message,
hint or place fails the case. Folder names start with the code they are about, so a code without a
case is easy to spot (and fails `test_every_code_has_a_case`).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import pytest

from reconciler.config import CODES, Finding, FolderSource, Loader

CASES = Path(__file__).resolve().parent / "cases"
BASE = CASES / "_base"
META_FILES = frozenset({"expected.txt", "deleted.txt"})
# I010 (a published version was changed) compares two git revisions; it is tested with a repository.
NOT_BY_CASE = frozenset({"I010"})
# The first line of a finding as the text format prints it; its other lines are indented.
_HEAD = re.compile(r"^(?P<file>\S+):(?P<line>\d+): (?P<code>[A-Z]\d{3}) ")


def _case_dirs() -> list[Path]:
    return sorted(p for p in CASES.iterdir() if p.is_dir() and not p.name.startswith("_"))


def build_case(case: Path, dest: Path) -> Path:
    """The base tree with `case` overlaid and its deletions applied, in `dest`."""
    shutil.copytree(BASE, dest)
    for path in case.rglob("*"):
        rel = path.relative_to(case)
        if path.is_file() and rel.as_posix() not in META_FILES:
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


_LOADED: dict[str, tuple[Finding, ...]] = {}  # case name → findings, shared by the tests of one process


def _case_findings(name: str) -> tuple[Finding, ...]:
    """Findings of one case, loaded at most once per process (the built tree is removed after)."""
    if name not in _LOADED:
        with tempfile.TemporaryDirectory(prefix="hcase-") as tmp:
            _LOADED[name] = load_findings(build_case(CASES / name, Path(tmp) / "tree"))
    return _LOADED[name]


@pytest.mark.parametrize("case", _case_dirs(), ids=lambda p: p.name)
def test_case(case: Path, tmp_path: Path) -> None:
    findings = _LOADED[case.name] = load_findings(build_case(case, tmp_path / "tree"))
    assert render(findings) == expected_of(case)


def test_base_is_clean() -> None:
    findings = load_findings(BASE)
    assert findings == (), "\n".join(f.render_text() for f in findings)


def test_every_code_has_a_case() -> None:
    covered = {p.name.split("-", 1)[0] for p in _case_dirs()}
    missing = sorted(set(CODES) - NOT_BY_CASE - covered)
    assert not missing, f"codes without a case folder in {CASES}: {', '.join(missing)}"
    unknown = sorted(covered - set(CODES))
    assert not unknown, f"case folders named for codes that do not exist: {', '.join(unknown)}"


def test_each_case_expects_its_own_code() -> None:
    for case in _case_dirs():
        code = case.name.split("-", 1)[0]
        assert code in expected_codes(case), f"{case.name} does not expect a {code} finding"


def test_every_finding_can_be_acted_on() -> None:
    """STYLE point 6: file, line, a message, what was expected and how to fix it."""
    for case in _case_dirs():
        for f in _case_findings(case.name):
            where = f"{case.name}: {f.render_text()}"
            assert f.code in CODES, where
            assert f.file, where
            assert not f.file.startswith("/"), where
            assert f.line >= 1, where
            assert f.message.strip(), where
            assert f.expected.strip(), where
            assert f.fix.strip(), where


def test_a_near_miss_name_says_did_you_mean() -> None:
    findings = [f for f in _case_findings("P001-unknown-binding") if f.code == "P001"]
    assert len(findings) == 1
    assert "'ocr-locl'" in findings[0].message
    assert "did you mean 'ocr-local'?" in findings[0].message


def test_an_unknown_key_says_did_you_mean() -> None:
    (finding,) = _case_findings("F004-unknown-key")
    assert "did you mean 'template'?" in finding.message


def test_a_name_far_from_every_known_one_gets_no_guess() -> None:
    findings = [f for f in _case_findings("P010-unknown-interface") if f.code == "P010"]
    assert findings
    assert all("did you mean" not in f.message for f in findings)


def test_fix_hints_name_the_corrected_value() -> None:
    (snake,) = _case_findings("I005-not-snake-case")
    assert snake.fix == "rename it to 'too_large'"
    (empty,) = _case_findings("P013-empty")
    assert empty.message == "scope is empty"


def test_a_required_version_is_met_while_a_newer_one_exists(tmp_path: Path) -> None:
    """The org requires ocr/v1 and the default binding serves only v1: publishing ocr/v2 changes nothing.

    The cross-file checks must read the version each profile resolved to, not the newest one.
    """
    root = build_case(CASES / "I009-version-mismatch", tmp_path / "tree")
    v2 = root / "catalog/interfaces/ocr/v2/interface.toml"
    v2.write_text(v2.read_text().replace("version = 3", "version = 2"))
    snapshot = Loader().load(FolderSource(root))
    assert snapshot.findings == ()
    assert snapshot.profiles["reader"].selections["ocr"].key == "ocr/v1"
