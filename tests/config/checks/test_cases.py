"""checks.cases, case by case: a conformance cases.toml alone and beside its interface version (I013)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config.checks.casework import case_dirs, case_id, check_case


@pytest.mark.parametrize("case", case_dirs("conformance"), ids=case_id)
def test_case(case: Path) -> None:
    check_case(case)
