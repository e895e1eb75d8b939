"""checks.tree.layout, case by case: files nothing reads, version folders lacking a file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config.checks.casework import case_dirs, case_id, check_case


@pytest.mark.parametrize("case", case_dirs("tree/layout"), ids=case_id)
def test_case(case: Path) -> None:
    check_case(case)
