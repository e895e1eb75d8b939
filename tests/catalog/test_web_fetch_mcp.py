"""web-fetch-mcp: the unmodified mcp-server-fetch under web-fetch/v1, on its own environment (`[needs]`).

`handler connector check` passes with fuzzing through the real router and sandbox, reading the pages of
web-fetch/v1's conformance folder from a loopback HTTP server this test starts at the address the cases
name; the binding under check allows that address alone.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli import main as handler
from reconciler.config import FolderSource, Loader
from reconciler.connectors.environments import environment_path
from tests.fixtures.loopback import serve_on
from tests.fixtures.vendor_trees import passing_check

REPO = Path(__file__).resolve().parents[2]
PAGES = REPO / "catalog/interfaces/web-fetch/v1/conformance/pages"
ADDRESS = ("127.0.0.1", 28461)  # the address web-fetch/v1's cases name


class Pages(SimpleHTTPRequestHandler):
    """The conformance pages, served as files; quiet."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def pages() -> Iterator[str]:
    with serve_on(ADDRESS, functools.partial(Pages, directory=str(PAGES))) as url:
        yield url


def test_its_environment_holds_the_server_not_the_services(tmp_path: Path) -> None:
    assert handler(["connector", "install", "web-fetch-mcp", "--root", str(REPO)]) == 0
    path = environment_path(Loader().load(FolderSource(REPO)).connectors["web-fetch-mcp"])
    assert path is not None
    assert list(path.glob("lib/python3*/site-packages/mcp_server_fetch/__init__.py"))


def test_it_passes_the_check_with_fuzzing(shipped_tree: Path, tmp_path: Path, pages: str,
                                          capfd: pytest.CaptureFixture[str]) -> None:
    assert handler(["connector", "install", "web-fetch-mcp", "--root", str(REPO)]) == 0
    (shipped_tree / "config/bindings/web-fetch-check.toml").write_text(
        'apiVersion = "handler.binding/v1"\nname = "web-fetch-check"\nconnector = "web-fetch-mcp"\n'
        f'egress = ["{ADDRESS[0]}:{ADDRESS[1]}"]\n')
    summary = passing_check("web-fetch-mcp", "web-fetch-check", shipped_tree, "web-fetch/v1", examples=12, seed=7,
                            result=tmp_path / "result.json", capfd=capfd)
    assert summary["cases"]["passed"] == 5
    assert summary["fuzzing_pass"]
