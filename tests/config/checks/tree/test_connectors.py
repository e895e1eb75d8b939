"""checks.tree.connectors, case by case: what a connector implements and wraps exists."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.config.checks.casework import BASE, case_dirs, case_id, check_case, load_findings


@pytest.mark.parametrize("case", case_dirs("tree/connectors"), ids=case_id)
def test_case(case: Path) -> None:
    check_case(case)


@pytest.mark.parametrize(("command", "needs"), [
    ('["python3", "main.py"]', ""),
    ('["python3", "-u", "-W", "ignore", "main.py", "--fast"]', ""),
    ('["/usr/bin/python3", "main.py"]', ""),  # an absolute runtime, the script its folder's
    ('["python3", "-m", "mcp_server_fetch"]', '[needs]\npython = ["mcp-server-fetch>=2025.1"]\n'),
    ('["node", "main.js"]', '[needs]\nprograms = ["node"]\n'),
    ('["sh", "-e", "run.sh"]', '[needs]\nprograms = ["sh"]\n'),
    ('["./run.sh"]', ""),
])
def test_run_of_code_in_the_folder(tmp_path: Path, command: str, needs: str) -> None:
    """A command that runs code of the connector's folder (or a declared package's module) is no finding."""
    root = shutil.copytree(BASE, tmp_path / "tree")
    folder = root / "catalog/connectors/ocr-engine"
    for name in ("main.js", "run.sh"):
        (folder / name).write_text("")
    toml = folder / "connector.toml"
    text = toml.read_text().replace('command = ["python3", "main.py"]', f"command = {command}")
    toml.write_text(text.replace("[run]", f"{needs}[run]"))
    assert [f.code for f in load_findings(root) if f.file.startswith("catalog/connectors/")] == []
