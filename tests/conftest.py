"""Shared fixtures: the repository's own config tree and small git repositories in temp folders."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

# The echo connector's fixtures (a config tree around it, its secret, a short run folder) serve every suite;
# the browser's (one headless Chromium per test process, started when a test first asks for it) the web suite.
pytest_plugins = ["tests.fixtures.echo_fixtures", "tests.fixtures.browser"]

# Tests that import a shipped connector's main.py would leave its compiled file in the connector's folder, which
# validate refuses (N013) and the connector's hash counts: the test process writes no compiled files.
sys.dont_write_bytecode = True

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo_root() -> Path:
    return REPO


@pytest.fixture
def shipped_tree(tmp_path: Path) -> Path:
    """A copy of the repository's own config tree (catalog/ and config/) in a temp folder."""
    root = tmp_path / "tree"
    for folder in ("catalog/interfaces", "catalog/connectors", "config"):
        shutil.copytree(REPO / folder, root / folder)
    return root


@pytest.fixture
def git() -> Callable[..., str]:
    """Run git in a folder with a fixed identity; returns its stdout."""

    def run(cwd: Path, *args: str) -> str:
        done = subprocess.run(
            [
                "git",
                "-c",
                "user.name=Test",
                "-c",
                "user.email=test@example.org",
                "-c",
                "init.defaultBranch=main",
                *args,
            ],
            cwd=cwd,
            check=True,
            capture_output=True,
            text=True,
        )
        return done.stdout.strip()

    return run
