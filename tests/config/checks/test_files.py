"""checks.files, case by case: what one file of each kind shows beyond its model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config.checks.casework import case_dirs, case_id, case_named, check_case, findings_of


@pytest.mark.parametrize("case", case_dirs("files"), ids=case_id)
def test_case(case: Path) -> None:
    check_case(case)


def test_fix_hints_name_the_corrected_value() -> None:
    (snake,) = findings_of(case_named("files/I005-not-snake-case"))
    assert snake.fix == "rename it to 'too_large'"
    (empty,) = findings_of(case_named("files/P013-empty"))
    assert empty.message == "scope is empty"
