"""What was reviewed is what runs: a compiled file planted in a connector's folder never runs in its place
(docs/architecture.md §6), and `handler validate` refuses one (N013).

The attack: a timestamp `.pyc` in the folder's `__pycache__`, compiled from other code, whose header copies the
reviewed source's mtime and size, so a plain Python takes it as current. It is planted after the router read the
tree (so no check saw it), and the connector's process starts at the next call. Run as root (as CI runs) and as
an unprivileged user (nobody, from the world-readable virtualenv of `tests/fixtures/hostile/routers.py`), by a
real `handler serve` in a process of its own and the real bridge.
"""

from __future__ import annotations

import importlib.util
import os
import py_compile
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from reconciler.cli import main as handler
from tests.fixtures.echo_tree import TOKEN_ENV, write_echo_tree
from tests.fixtures.harness import bridge_params, run
from tests.fixtures.hostile.routers import MODES, NOBODY, REPO, user_venv

pytestmark = pytest.mark.timeout(600)
DEADLINE = 60.0
FORGED = "raise SystemExit('the forged file ran')\n"
REVIEWED = "REVIEWED = True".ljust(len(FORGED) - 1) + "\n"  # as long as FORGED: the header holds the size


def plant_forged(folder: Path) -> Path:
    """`helper.py` reads as reviewed; `__pycache__` holds FORGED, compiled, its header the reviewed file's."""
    helper = folder / "helper.py"
    helper.write_text(FORGED)
    stamp = helper.stat().st_mtime_ns
    compiled = Path(importlib.util.cache_from_source(str(helper)))
    py_compile.compile(str(helper), cfile=str(compiled), doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    helper.write_text(REVIEWED)
    os.utime(helper, ns=(stamp, stamp))
    return compiled


def header_of(compiled: Path, source: Path) -> str:
    """The compiled file's header against the source, asserting they match (a plain Python takes it as current)."""
    mtime, size = struct.unpack("<II", compiled.read_bytes()[8:16])
    assert (mtime, size) == (int(source.stat().st_mtime) & 0xFFFFFFFF, source.stat().st_size)
    return f"{compiled.name}'s header says mtime {mtime}, size {size}, as helper.py's"


@pytest.fixture(params=MODES)
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, Path, Path]]:
    """`handler serve` of an echo tree whose connector imports `helper`, as root or as nobody: (mode, root, run)."""
    mode = request.param
    if mode == "user" and os.geteuid() != 0:
        pytest.skip("the unprivileged run drops from root to nobody; this run is not root")
    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="hr"))
    base.chmod(0o755)
    root, run_dir = write_echo_tree(base / "t", python="python3"), base / "run"
    folder = root / "catalog/connectors/echo"
    (folder / "helper.py").write_text(REVIEWED)
    main = folder / "main.py"
    main.write_text(main.read_text().replace("\nimport hashlib\n", "\nimport hashlib\n\nimport helper\n", 1))
    env: dict[str, str] = {"HANDLER_RUN_DIR": str(run_dir), "HANDLER_STATE_DIR": str(base / "state"),
                           TOKEN_ENV: "t0ken"}
    user: dict[str, Any] = {}
    if mode == "user":
        venv = user_venv()
        command = [str(venv / "bin/handler"), "serve", str(root)]
        env |= {"PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": str(base), "LANG": "C.UTF-8"}
        subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(base)], check=True, timeout=60)
        user = {"user": NOBODY, "group": NOBODY, "extra_groups": []}
    else:
        command = [str(Path(sys.executable).parent / "handler"), "serve", str(root)]
        env |= {k: v for k, v in os.environ.items() if not k.startswith("HANDLER_")} | {"PYTHONPATH": str(REPO)}
    with (base / "serve.log").open("wb") as log:
        proc = subprocess.Popen(command, env=env, cwd=base, stdin=subprocess.DEVNULL, stdout=log, stderr=log, **user)
    try:
        deadline = time.monotonic() + DEADLINE
        while not (run_dir / "profiles/tester.sock").exists():
            assert proc.poll() is None, (base / "serve.log").read_text()
            assert time.monotonic() < deadline, (base / "serve.log").read_text()
            time.sleep(0.05)
        yield mode, root, run_dir
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(base, ignore_errors=True)


def test_a_forged_timestamp_pyc_in_pycache_does_not_run_in_place_of_the_source(
        served: tuple[str, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    mode, root, run_dir = served
    compiled = plant_forged(root / "catalog/connectors/echo")

    async def call() -> Any:
        async with Client(bridge_params(run_dir, "tester", "echo")) as client:
            return await client.call_tool("echo_say", {"text": "hi"})

    header = header_of(compiled, root / "catalog/connectors/echo/helper.py")
    result = run(call(), timeout=120)
    assert not result.is_error, result
    assert result.structured_content == {"text": "hi"}  # the reviewed helper was imported: the forged one exits
    assert compiled.exists()
    assert handler(["validate", str(root)]) != 0
    said = capsys.readouterr().out
    assert f"N013 catalog/connectors/echo/__pycache__/{compiled.name} is compiled Python" in said
    print(f"evidence ({mode}): {header}; echo_say answered {result.structured_content} (the forged file exits); "
          f"handler validate refuses the tree: N013 on {compiled.name}")
