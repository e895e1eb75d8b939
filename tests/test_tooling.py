"""The architecture and the tooling are part of the test run: layers, lint and strict typing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)


def test_import_layers_hold() -> None:
    """The rooms of design §3 import one way only (contracts in pyproject.toml)."""
    done = _run(str(BIN / "lint-imports"), "--no-cache")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_is_clean() -> None:
    done = _run(str(BIN / "ruff"), "check", "reconciler", "conformance", "tests", "benchmarks")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(300)
def test_mypy_strict_is_clean() -> None:
    done = _run(str(BIN / "mypy"))
    assert done.returncode == 0, done.stdout + done.stderr
