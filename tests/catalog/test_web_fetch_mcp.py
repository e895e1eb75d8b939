"""web-fetch-mcp: the unmodified mcp-server-fetch under web-fetch/v1, on its own environment (`[needs]`).

`handler connector check` passes with fuzzing through the real router and sandbox under the shipped
binding `web-fetch-public` (egress *:80 and *:443): the check itself serves the pages of web-fetch/v1's
conformance folder at the address the cases name, and lets the binding reach that address alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.cli import main as handler
from reconciler.config import FolderSource, Loader
from reconciler.connectors.environments import environment_path
from tests.fixtures.vendor_trees import passing_check

REPO = Path(__file__).resolve().parents[2]

def test_its_environment_holds_the_server_not_the_services(tmp_path: Path) -> None:
    assert handler(["connector", "install", "web-fetch-mcp", "--root", str(REPO)]) == 0
    path = environment_path(Loader().load(FolderSource(REPO)).connectors["web-fetch-mcp"])
    assert path is not None
    assert list(path.glob("lib/python3*/site-packages/mcp_server_fetch/__init__.py"))


def test_it_passes_the_check_under_its_shipped_binding(shipped_tree: Path, tmp_path: Path,
                                                      capfd: pytest.CaptureFixture[str]) -> None:
    assert handler(["connector", "install", "web-fetch-mcp", "--root", str(REPO)]) == 0
    summary = passing_check("web-fetch-mcp", "web-fetch-public", shipped_tree, "web-fetch/v1", examples=12, seed=7,
                            result=tmp_path / "result.json", capfd=capfd)
    assert summary["cases"]["passed"] == 5
    assert summary["fuzzing_pass"]


def test_the_shipped_binding_reaches_no_loopback_page_outside_a_check() -> None:
    # The check widens the binding's egress by its own page server's address only, in its own tree.
    binding = Loader().load(FolderSource(REPO)).bindings["web-fetch-public"]
    assert binding.spec.egress == ["*:80", "*:443"]
