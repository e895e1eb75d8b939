"""checks.tree.org, case by case: what org.toml names exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config.checks.casework import case_dirs, case_id, check_case


@pytest.mark.parametrize("case", case_dirs("tree/org"), ids=case_id)
def test_case(case: Path) -> None:
    check_case(case)
