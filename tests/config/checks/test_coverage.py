"""The case folders as a whole: the base tree is clean, every code has a case, every finding can be acted on."""

from __future__ import annotations

from reconciler.config import CODES
from tests.config.checks.casework import BASE, CASES, case_dirs, expected_codes, findings_of, load_findings

# I010 (a published version was changed) compares two git revisions; it is tested with a repository.
# F008 (a file name that is not UTF-8) would put such a name in this repository; tests/config/test_sources.py
# makes one. F009 (a file past 64 MiB) would put such a file in this repository; test_sources.py lowers the bound.
NOT_BY_CASE = frozenset({"I010", "F008", "F009"})


def test_base_is_clean() -> None:
    findings = load_findings(BASE)
    assert findings == (), "\n".join(f.render_text() for f in findings)


def test_every_code_has_a_case() -> None:
    covered = {p.name.split("-", 1)[0] for p in case_dirs()}
    missing = sorted(set(CODES) - NOT_BY_CASE - covered)
    assert not missing, f"codes without a case folder in {CASES}: {', '.join(missing)}"
    unknown = sorted(covered - set(CODES))
    assert not unknown, f"case folders named for codes that do not exist: {', '.join(unknown)}"


def test_each_case_expects_its_own_code() -> None:
    for case in case_dirs():
        code = case.name.split("-", 1)[0]
        assert code in expected_codes(case), f"{case.name} does not expect a {code} finding"


def test_every_finding_can_be_acted_on() -> None:
    """STYLE point 6: file, line, a message, what was expected and how to fix it."""
    for case in case_dirs():
        for f in findings_of(case):
            where = f"{case.name}: {f.render_text()}"
            assert f.code in CODES, where
            assert f.file, where
            assert not f.file.startswith("/"), where
            assert f.line >= 1, where
            assert f.message.strip(), where
            assert f.expected.strip(), where
            assert f.fix.strip(), where
