"""`handler agent run | status | list | cancel` against a running service: a member starts a run of a profile's
runner, follows it to its result, lists it with its starter, and cancels another mid-run."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from reconciler.app import UpOptions
from tests.fixtures.agents_tree import write_agents_tree
from tests.fixtures.echo_tree import OWNED_ORG
from tests.fixtures.harness import run, short_dir
from tests.fixtures.service import running

HANDLER = str(Path(sys.executable).parent / "handler")
pytestmark = pytest.mark.usefixtures("echo_secret")


async def _cli(*args: str) -> tuple[int, str, str]:
    done = await asyncio.create_subprocess_exec(HANDLER, "agent", *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await done.communicate()
    assert done.returncode is not None
    return done.returncode, out.decode(), err.decode()


def test_a_member_runs_follows_lists_and_cancels(tmp_path: Path) -> None:
    root = write_agents_tree(tmp_path / "tree", timeout=30)
    (root / "config/org.toml").write_text(OWNED_ORG)
    with short_dir() as short:
        options = UpOptions(root=str(root), run_dir=short / "run", state_dir=short / "state", http_port=0)
        where = ("--root", str(root), "--state-dir", str(short / "state"))

        async def scenario() -> None:
            async with running(options):
                code, out, err = await _cli("run", "worker", "--input", "read the scans", "--as", "bob", "--wait",
                                            "--format", "json", *where)
                assert code == 0, err
                done = json.loads(out)
                assert done["status"] == "succeeded"
                assert json.loads(done["result"])["input"] == "read the scans"
                assert done["starter"] == "member:bob"
                code, out, err = await _cli("run", "worker", "--input", "sleep", "--as", "mallory", *where)
                assert code == 1
                assert "'mallory' is not a member of config/org.toml" in err
                code, out, _ = await _cli("run", "worker", "--input", "sleep", "--as", "owner", "--format", "json",
                                          *where)
                slow = json.loads(out)["run"]
                code, out, _ = await _cli("list", *where)
                assert done["run"] in out
                assert "starter: member:owner" in out
                code, out, _ = await _cli("cancel", slow, "--as", "owner", *where)
                assert code == 1
                assert "cancelled" in out
                assert "cancelled by owner from the CLI" in out
                code, out, _ = await _cli("status", done["run"], *where)
                assert code == 0
                assert "succeeded" in out
                code, _, err = await _cli("status", "run-nope", *where)
                assert code == 1
                assert "handler agent list" in err

        run(scenario(), timeout=120)
