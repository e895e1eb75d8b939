"""checks.tools, case by case: the rules each tools.json keeps (S2, S4-S6, annotations)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config.checks.casework import case_dirs, case_id, check_case


@pytest.mark.parametrize("case", case_dirs("tools"), ids=case_id)
def test_case(case: Path) -> None:
    check_case(case)
