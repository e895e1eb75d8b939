"""Fixtures of the config room's tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def committed(shipped_tree: Path, git: Callable[..., str]) -> Path:
    """The repository's own config tree, committed as the base revision (HEAD) of a fresh repository."""
    git(shipped_tree, "init", "-q")
    git(shipped_tree, "add", "-A")
    git(shipped_tree, "commit", "-qm", "publish v1")
    return shipped_tree
