"""A connector's Python runs its reviewed source, never a compiled file left beside it: the tree's checks and
hashes skip `__pycache__`, and an "unchecked hash" compiled file (PEP 552) would run in place of its source."""

from __future__ import annotations

import importlib.util
import py_compile
from pathlib import Path

import pytest

from reconciler.router.server import Router
from tests.fixtures.harness import RawClient, body, exchange


@pytest.mark.parametrize("sandbox", [True, False])
def test_an_unchecked_compiled_file_in_the_connector_folder_does_not_run(echo_root: Path, run_dir: Path,
                                                                         sandbox: bool) -> None:
    folder = echo_root / "catalog/connectors/echo"
    helper = folder / "helper.py"
    helper.write_text("raise SystemExit('code that no one reviewed ran')\n")
    compiled = Path(importlib.util.cache_from_source(str(helper)))
    py_compile.compile(str(helper), cfile=str(compiled), doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    helper.write_text("REVIEWED = True\n")  # what the pull request shows
    main = folder / "main.py"
    main.write_text(main.read_text().replace("\nimport hashlib\n", "\nimport hashlib\n\nimport helper\n", 1))
    assert "import helper" in main.read_text()

    async def script(client: RawClient, router: Router) -> None:
        result = await client.call("echo_say", {"text": "hi"})
        assert result["isError"] is False, result
        assert body(result) == {"text": "hi"}

    exchange(echo_root, run_dir, script, sandbox=sandbox)
    assert compiled.exists()  # it was there to be run
