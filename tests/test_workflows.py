"""Every workflow file is valid against the GitHub-workflow schema that check-jsonschema carries."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

WORKFLOWS = sorted((Path(__file__).resolve().parent.parent / ".github" / "workflows").glob("*.yml"))


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=[w.name for w in WORKFLOWS])
def test_workflow_matches_the_github_schema(workflow: Path) -> None:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "check-jsonschema"), "--builtin-schema", "vendor.github-workflows",
         str(workflow)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_pull_request_workflow_validates_against_the_base_and_plans() -> None:
    text = (WORKFLOWS[0].parent / "config.yml").read_text()
    assert 'handler validate . --base "origin/${{ github.base_ref }}" --format github' in text
    assert "handler plan . --base" in text
    assert "GITHUB_STEP_SUMMARY" in text
