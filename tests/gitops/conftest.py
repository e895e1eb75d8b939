"""Fixtures of the reconciler tests."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def remote(shipped_tree: Path, tmp_path: Path, git: Callable[..., str]) -> tuple[Path, Path]:
    """A bare repository holding the shipped tree on `main`, and a clone of it to push from."""
    bare = tmp_path / "config.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(bare), str(clone))
    for item in shipped_tree.iterdir():
        shutil.copytree(item, clone / item.name)
    git(clone, "add", "-A")
    git(clone, "commit", "-qm", "first")
    git(clone, "push", "-q", "origin", "HEAD:main")
    return bare, clone
