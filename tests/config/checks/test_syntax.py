"""checks.syntax, case by case: TOML and JSON syntax, apiVersion and the model's keys and types."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config.checks.casework import case_dirs, case_id, case_named, check_case, findings_of


@pytest.mark.parametrize("case", case_dirs("syntax"), ids=case_id)
def test_case(case: Path) -> None:
    check_case(case)


def test_an_unknown_key_says_did_you_mean() -> None:
    (finding,) = findings_of(case_named("syntax/F004-unknown-key"))
    assert "did you mean 'template'?" in finding.message
