"""checks.tree.profiles, case by case: what a resolved profile names fits the tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.config import FolderSource, Loader
from tests.config.checks.casework import build_case, case_dirs, case_id, case_named, check_case


@pytest.mark.parametrize("case", case_dirs("tree/profiles"), ids=case_id)
def test_case(case: Path) -> None:
    check_case(case)


def test_a_required_version_is_met_while_a_newer_one_exists(tmp_path: Path) -> None:
    """The org requires ocr/v1 and the default binding serves only v1: publishing ocr/v2 changes nothing.

    The cross-file checks must read the version each profile resolved to, not the newest one.
    """
    root = build_case(case_named("files/I009-version-mismatch"), tmp_path / "tree")
    v2 = root / "catalog/interfaces/ocr/v2/interface.toml"
    v2.write_text(v2.read_text().replace("version = 3", "version = 2"))
    snapshot = Loader().load(FolderSource(root))
    assert snapshot.findings == ()
    assert snapshot.profiles["reader"].selections["ocr"].key == "ocr/v1"
