"""A connector's Python runs its reviewed source, never a compiled file left beside it: its sandbox shows the
folder's `__pycache__` empty (unsandboxed, its Pythons keep compiled files in a private folder of their own,
`PYTHONPYCACHEPREFIX`), and `validate` refuses compiled Python in the connector's folder (N013), which the tree
reads and hashes whole, hidden files and `__pycache__` included."""

from __future__ import annotations

import importlib.util
import os
import py_compile
from pathlib import Path

import pytest

from reconciler.config import FolderSource, Loader
from reconciler.router.server import Router
from tests.fixtures.harness import RawClient, body, exchange

FORGED = "raise SystemExit('the forged file ran')\n"
REVIEWED = "REVIEWED = True".ljust(len(FORGED) - 1) + "\n"  # as long as FORGED: a timestamp header checks the size


def plant_compiled(folder: Path, mode: py_compile.PycInvalidationMode) -> Path:
    """`helper.py` reads as reviewed, and `__pycache__` holds what was compiled from other code: a timestamp file
    whose header holds the reviewed source's mtime and size, or an "unchecked hash" one (PEP 552)."""
    assert len(FORGED) == len(REVIEWED)
    helper = folder / "helper.py"
    helper.write_text(FORGED)
    compiled = Path(importlib.util.cache_from_source(str(helper)))
    stamp = helper.stat().st_mtime_ns
    py_compile.compile(str(helper), cfile=str(compiled), doraise=True, invalidation_mode=mode)
    helper.write_text(REVIEWED)
    os.utime(helper, ns=(stamp, stamp))  # what the pull request shows, with the forged file's header still matching
    return compiled


def import_helper(folder: Path) -> None:
    main = folder / "main.py"
    main.write_text(main.read_text().replace("\nimport hashlib\n", "\nimport hashlib\n\nimport helper\n", 1))
    assert "import helper" in main.read_text()


@pytest.mark.parametrize("mode", [py_compile.PycInvalidationMode.TIMESTAMP,
                                  py_compile.PycInvalidationMode.UNCHECKED_HASH], ids=["timestamp", "unchecked"])
@pytest.mark.parametrize("sandbox", [True, False])
def test_a_compiled_file_planted_after_the_tree_loaded_does_not_run(echo_root: Path, run_dir: Path, sandbox: bool,
                                                                    mode: py_compile.PycInvalidationMode) -> None:
    folder = echo_root / "catalog/connectors/echo"
    (folder / "helper.py").write_text(REVIEWED)
    import_helper(folder)

    async def script(client: RawClient, router: Router) -> None:
        compiled = plant_compiled(folder, mode)  # the tree was read clean; the process starts at the first call
        result = await client.call("echo_say", {"text": "hi"})
        assert result["isError"] is False, result
        assert body(result) == {"text": "hi"}
        assert compiled.exists()  # it was there to be run

    exchange(echo_root, run_dir, script, sandbox=sandbox)


def test_the_forged_file_would_run_without_the_private_cache(echo_root: Path) -> None:
    """The attack is real: a plain Python given the folder runs the forged file in place of the source."""
    import subprocess
    import sys

    folder = echo_root / "catalog/connectors/echo"
    plant_compiled(folder, py_compile.PycInvalidationMode.TIMESTAMP)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    done = subprocess.run([sys.executable, "-c", "import helper"], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 1, done
    assert "the forged file ran" in done.stderr


@pytest.mark.parametrize("name", ["__pycache__/helper.cpython-311.pyc", "helper.pyc", "lib/old.pyo"])
def test_validate_refuses_compiled_python_anywhere_in_a_connector_folder(echo_root: Path, name: str) -> None:
    target = echo_root / "catalog/connectors/echo" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"\x00compiled")
    snapshot = Loader().load(FolderSource(echo_root))
    found = [f for f in snapshot.findings if f.code == "N013"]
    assert [f.file for f in found] == [f"catalog/connectors/echo/{name}"]
    assert "remove" in found[0].fix


def test_every_file_of_a_connector_folder_is_in_its_hash_hidden_ones_included(echo_root: Path) -> None:
    before = Loader().load(FolderSource(echo_root))
    folder = echo_root / "catalog/connectors/echo"
    (folder / ".hidden.py").write_text("print('run by a dot-file')\n")
    hidden = Loader().load(FolderSource(echo_root))
    assert hidden.connectors["echo"].content_hash != before.connectors["echo"].content_hash
    assert hidden.revision != before.revision
    assert ".hidden.py" in hidden.connectors["echo"].files
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__/notes.txt").write_text("kept\n")
    cached = Loader().load(FolderSource(echo_root))
    assert cached.connectors["echo"].content_hash != hidden.connectors["echo"].content_hash
    (echo_root / "config/.editor-state").write_text("x\n")  # outside connectors' folders, hidden files stay out
    assert Loader().load(FolderSource(echo_root)).revision == cached.revision
