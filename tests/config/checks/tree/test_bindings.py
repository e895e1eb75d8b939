"""checks.tree.bindings, case by case: what a binding asks of its connector fits it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config.checks.casework import case_dirs, case_id, check_case


@pytest.mark.parametrize("case", case_dirs("tree/bindings"), ids=case_id)
def test_case(case: Path) -> None:
    check_case(case)
