"""checks.tree.selections, case by case: what a profile selects, itself or by the org's defaults, exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config.checks.casework import case_dirs, case_id, case_named, check_case, findings_of


@pytest.mark.parametrize("case", case_dirs("tree/selections"), ids=case_id)
def test_case(case: Path) -> None:
    check_case(case)


def test_a_near_miss_name_says_did_you_mean() -> None:
    findings = [f for f in findings_of(case_named("tree/selections/P001-unknown-binding")) if f.code == "P001"]
    assert len(findings) == 1
    assert "'ocr-locl'" in findings[0].message
    assert "did you mean 'ocr-local'?" in findings[0].message


def test_a_name_far_from_every_known_one_gets_no_guess() -> None:
    findings = [f for f in findings_of(case_named("tree/selections/P010-unknown-interface")) if f.code == "P010"]
    assert findings
    assert all("did you mean" not in f.message for f in findings)


def test_a_broken_org_default_is_reported_once_not_per_profile() -> None:
    findings = findings_of(case_named("tree/selections/O006-default-interface"))  # both profiles fall back
    assert [(f.code, f.file) for f in findings] == [("O006", "config/org.toml")]
