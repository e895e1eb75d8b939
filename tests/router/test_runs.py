"""Agent runs through the router: agent/v1's tools on a profile's socket start, follow and cancel runs of another
profile's runner (a real process), within its limits, each ending with its status and cause, its processes gone."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from reconciler.router.server import Router
from tests.fixtures.agents_tree import write_agents_tree
from tests.fixtures.harness import RawClient, body, exchange

pytestmark = pytest.mark.usefixtures("echo_secret")


@pytest.fixture
def agents_root(tmp_path: Path) -> Path:
    return write_agents_tree(tmp_path / "tree", timeout=1.5, per_parent=3)


async def _ended(client: RawClient, run: str) -> dict[str, Any]:
    for _ in range(200):
        status = body(await client.call("agent_status", {"run": run}))
        if status["status"] != "running":
            return status
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run} still running")


async def _all_gone(pids: list[int]) -> bool:
    """Each process ended (a killed child of a killed runner may take a moment to be reaped by init)."""
    for _ in range(40):
        if all(_gone(pid) for pid in pids):
            return True
        await asyncio.sleep(0.05)
    return False


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_a_run_gives_its_result_with_its_identity_and_configuration(agents_root: Path, run_dir: Path) -> None:
    async def script(client: RawClient, router: Router) -> None:
        started = body(await client.call("agent_run", {"agent": "worker", "input": "count the scans"},
                                         _meta={"handler/instance": "boss-run-1"}))
        assert started["status"] == "running"
        assert started["agent"] == "worker"
        ended = await _ended(client, started["run"])
        assert ended["status"] == "succeeded", ended
        result = json.loads(ended["result"])  # the last line of its output, not the progress line before it
        assert result["input"] == "count the scans"
        assert result["instance"] == started["run"]
        assert result["parent"] == "boss-run-1"
        assert result["cwd"] == str((agents_root / "work/worker").resolve())
        assert result["servers"] == ["echo", "handler"]
        listed = [r for r in router.runs.runs.values() if r.id == started["run"]]
        assert listed[0].parent == "boss-run-1"
        assert listed[0].starter == "run:boss-run-1"

    exchange(agents_root, run_dir, script, profile="boss")


def test_over_its_time_limit_crashing_and_cancelled_each_end_with_a_cause(agents_root: Path, run_dir: Path) -> None:
    async def script(client: RawClient, router: Router) -> None:
        slow = body(await client.call("agent_run", {"agent": "worker", "input": "sleep"}))["run"]
        crash = body(await client.call("agent_run", {"agent": "worker", "input": "crash"}))["run"]
        timed = await _ended(client, slow)
        assert timed["status"] == "timed_out", timed
        assert "1.5 s" in timed["error"]
        pids = [int(p) for p in (agents_root / "work/worker/pids").read_text().split()]
        assert await _all_gone(pids), "the runner and its child outlived the run"
        crashed = await _ended(client, crash)
        assert crashed == {"run": crash, "agent": "worker", "status": "failed",
                           "error": "its runner exited with status 3"}
        (agents_root / "work/worker/pids").unlink()
        cancelled = body(await client.call("agent_run", {"agent": "worker", "input": "sleep"}))["run"]
        while not (agents_root / "work/worker/pids").exists():
            await asyncio.sleep(0.05)
        pids = [int(p) for p in (agents_root / "work/worker/pids").read_text().split()]
        stopped = body(await client.call("agent_cancel", {"run": cancelled}))
        assert stopped.get("status") == "cancelled", stopped
        assert await _all_gone(pids), "a cancelled run's processes are still there"

    exchange(agents_root, run_dir, script, profile="boss")


def test_refusals_are_closed_errors_that_say_what_to_do(agents_root: Path, run_dir: Path) -> None:
    async def script(client: RawClient, router: Router) -> None:
        unknown = await client.call("agent_run", {"agent": "nobody", "input": "x"})
        assert unknown["isError"]
        assert body(unknown)["error"] == "unknown_agent"
        assert "boss" in body(unknown)["message"]
        assert "worker" in body(unknown)["message"]
        itself = await client.call("agent_run", {"agent": "tester", "input": "x"})
        assert body(itself)["error"] == "not_allowed"
        assert "may run: worker" in body(itself)["message"]
        assert body(await client.call("agent_status", {"run": "run-nope"}))["error"] == "unknown_agent"
        runs = [body(await client.call("agent_run", {"agent": "worker", "input": "sleep"},
                                       _meta={"handler/instance": "p1"}))["run"] for _ in range(2)]
        busy = body(await client.call("agent_run", {"agent": "worker", "input": "sleep"}))
        assert busy["error"] == "not_allowed"
        assert "2 runs under way" in busy["message"]
        for run in runs:
            await client.call("agent_cancel", {"run": run})
        third = body(await client.call("agent_run", {"agent": "worker", "input": "hi"},
                                       _meta={"handler/instance": "p1"}))
        assert third["status"] == "running"
        fourth = body(await client.call("agent_run", {"agent": "worker", "input": "hi"},
                                        _meta={"handler/instance": "p1"}))
        assert fourth["error"] == "not_allowed"
        assert "already started 3 runs" in fourth["message"]

    exchange(agents_root, run_dir, script, profile="boss")


def test_another_profile_cannot_follow_or_cancel_a_run(agents_root: Path, run_dir: Path) -> None:
    async def script(client: RawClient, router: Router) -> None:
        run = router.runs.start("worker", "sleep", starter="member:owner")
        other = await RawClient.connect(router.socket_path("boss"))
        try:
            refused = body(await other.call("agent_cancel", {"run": run.id}))
            assert refused["error"] == "not_allowed"
        finally:
            await other.close()
        assert run.status == "running"
        await router.runs.cancel(run.id, "cancelled by owner")
        assert run.status == "cancelled"
        assert run.error == "cancelled by owner"

    exchange(agents_root, run_dir, script, profile="boss")
