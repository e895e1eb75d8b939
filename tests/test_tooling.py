"""The architecture and the tooling are part of the test run: layers, lint and strict typing."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)


def test_import_layers_hold() -> None:
    """The rooms of docs/architecture.md §3 import one way only (contracts in pyproject.toml)."""
    done = _run(str(BIN / "lint-imports"), "--no-cache")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_is_clean() -> None:
    done = _run(str(BIN / "ruff"), "check", "reconciler", "conformance", "tests", "benchmarks")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(300)
def test_mypy_strict_is_clean() -> None:
    done = _run(str(BIN / "mypy"))
    assert done.returncode == 0, done.stdout + done.stderr


MAX_FUNCTION_LINES = 60


def test_no_function_is_over_sixty_lines() -> None:
    """A long function is a sign of two jobs; no ruff rule counts lines, so this does (migrations aside)."""
    long: list[str] = []
    for folder in ("reconciler", "conformance", "catalog", "benchmarks", "tests"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if "migrations" in path.parts or ".venv" in path.parts or "node_modules" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({length} lines)")
    assert long == []


def test_code_cites_only_the_projects_own_design_document() -> None:
    """Comments cite `docs/architecture.md`; a document outside the repository cannot be read by a newcomer."""
    citing = [f"{path.relative_to(REPO)}:{number}"
              for folder in ("reconciler", "conformance", "catalog", "benchmarks", "tests", "docs", ".ci", ".github")
              for path in sorted((REPO / folder).rglob("*"))
              if path.is_file() and path.suffix in {".py", ".md", ".toml", ".yml", ".yaml", ".html", ""}
              and ".venv" not in path.parts and "node_modules" not in path.parts
              for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
              if re.search(r"\bdesign §|DESIGN\.md|\.\./shared", line)]
    assert citing == []


LIBRARIES = ("pgschema.py", "trees.py")  # what the scripts import, not scripts
BENCHMARKS = sorted(p.name for p in (REPO / "benchmarks").glob("*.py") if p.name not in LIBRARIES)


@pytest.mark.parametrize("script", BENCHMARKS)
def test_every_benchmark_starts_and_says_how_it_runs(script: str) -> None:
    """Each script of benchmarks/ imports and answers --help: one named like a module of the standard library (an
    `http.py`) is found first for every script of its folder, and they all fail at their first import."""
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--help"], capture_output=True,
                          text=True, timeout=120, check=False, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
