"""Agent runs through the router: agent/v1's tools on a profile's socket start, follow and cancel runs of another
profile's runner (a real process), within its limits, each ending with its status and cause, its processes gone."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from reconciler.router.runs import KEPT_ENDED, NOT_STARTED_STOPPING, AgentRuns, Run, RunRefusedError
from reconciler.router.server import Router
from tests.fixtures.agents_tree import processes_of, write_agents_tree
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


async def _all_gone(run: str) -> bool:
    """Each process of `run` ended (a killed sandbox's processes may take a moment to be reaped)."""
    for _ in range(40):
        if not processes_of(run):
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.mark.parametrize("sandbox", [True, False], ids=["sandboxed", "no-sandbox"])
def test_a_run_gives_its_result_with_its_identity_and_configuration(agents_root: Path, run_dir: Path,
                                                                    sandbox: bool) -> None:
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

    exchange(agents_root, run_dir, script, profile="boss", sandbox=sandbox)


def test_over_its_time_limit_crashing_and_cancelled_each_end_with_a_cause(agents_root: Path, run_dir: Path) -> None:
    async def script(client: RawClient, router: Router) -> None:
        slow = body(await client.call("agent_run", {"agent": "worker", "input": "sleep"}))["run"]
        crash = body(await client.call("agent_run", {"agent": "worker", "input": "crash"}))["run"]
        timed = await _ended(client, slow)
        assert timed["status"] == "timed_out", timed
        assert "1.5 s" in timed["error"]
        assert await _all_gone(slow), "the runner and its child outlived the run"
        crashed = await _ended(client, crash)
        assert crashed == {"run": crash, "agent": "worker", "status": "failed",
                           "error": "its runner exited with status 3"}
        (agents_root / "work/worker/started").unlink()
        cancelled = body(await client.call("agent_run", {"agent": "worker", "input": "sleep"}))["run"]
        while not (agents_root / "work/worker/started").exists():
            await asyncio.sleep(0.05)
        assert len(processes_of(cancelled)) >= 2, "the runner and its child are not both running"
        stopped = body(await client.call("agent_cancel", {"run": cancelled}))
        assert stopped.get("status") == "cancelled", stopped
        assert await _all_gone(cancelled), "a cancelled run's processes are still there"

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


def test_a_run_reaches_its_scope_and_its_profiles_socket_and_nothing_else(agents_root: Path, run_dir: Path) -> None:
    """The runner runs in the connectors' sandbox: its scope is its folder, the only one it writes; its profile's
    socket is the only socket it sees; the config tree, the state and run folders and the host's network are not
    there (docs/agents.md, "What a run can reach")."""
    listener = socket.create_server(("127.0.0.1", 0))  # a service of the host, on its loopback
    (agents_root / "work/worker").mkdir(parents=True, exist_ok=True)
    (agents_root / "work/worker/scan.txt").write_text("for the run")

    async def script(client: RawClient, router: Router) -> None:
        asked = {"read": [str(agents_root / "work/worker/scan.txt"), str(agents_root / "config/profiles/boss.toml"),
                          str(router.state_dir / "calls.jsonl"), "/etc/shadow"],
                 "list": ["/run/handler/profiles", str(run_dir / "profiles"), str(agents_root)],
                 "connect": listener.getsockname()[1]}
        started = body(await client.call("agent_run", {"agent": "worker", "input": json.dumps(asked)}))["run"]
        ended = await _ended(client, started)
        assert ended["status"] == "succeeded", ended
        seen = json.loads(ended["result"])
        assert seen["cwd"] == str((agents_root / "work/worker").resolve())
        assert seen[f"read {agents_root / 'work/worker/scan.txt'}"] == len("for the run")
        for hidden in (agents_root / "config/profiles/boss.toml", router.state_dir / "calls.jsonl",
                       Path("/etc/shadow")):
            assert seen[f"read {hidden}"] == "FileNotFoundError", hidden
        assert seen["list /run/handler/profiles"] == ["worker.sock"]
        assert seen[f"list {run_dir / 'profiles'}"] == "FileNotFoundError"
        assert seen[f"list {agents_root}"] == ["work"]  # the way to its scope, and nothing beside it
        assert seen["connect"] in ("ConnectionRefusedError", "OSError", "TimeoutError")
        if os.geteuid() == 0:
            assert seen["uid"] != 0  # a host uid of its own, as a connector's
        assert (agents_root / "work/worker/written-by-run").read_text() == "mine"

    try:
        exchange(agents_root, run_dir, script, profile="boss")
    finally:
        listener.close()


def test_a_runner_reaches_the_hosts_its_egress_lists_and_no_other(agents_root: Path, run_dir: Path) -> None:
    """An agent host that calls its own vendor: the runner's `egress` entries, through the allow-list proxy and
    the relay, as a connector's; a port it does not list stays out of reach."""
    listed, unlisted = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    worker = agents_root / "config/profiles/worker.toml"
    worker.write_text(worker.read_text() + f'egress = ["127.0.0.1:{listed.getsockname()[1]}"]\n')

    async def script(client: RawClient, router: Router) -> None:
        seen = {}
        for port in (listed.getsockname()[1], unlisted.getsockname()[1]):
            started = body(await client.call("agent_run", {"agent": "worker", "input": json.dumps({"connect": port})}))
            ended = await _ended(client, started["run"])
            assert ended["status"] == "succeeded", ended
            seen[port] = json.loads(ended["result"])["connect"]
        assert seen[listed.getsockname()[1]] == "connected"
        assert seen[unlisted.getsockname()[1]] != "connected"

    try:
        exchange(agents_root, run_dir, script, profile="boss")
    finally:
        listed.close()
        unlisted.close()


def test_a_runner_flooding_its_output_costs_the_router_only_the_tail(tmp_path: Path, run_dir: Path) -> None:
    """64 MiB on stdout and as much on stderr before the result: the run ends with its last line as its result,
    and the router's memory grows by a small part of what was written (it keeps the tail as it reads)."""
    root = write_agents_tree(tmp_path / "tree", timeout=120)

    async def script(client: RawClient, router: Router) -> None:
        tracemalloc.start()
        try:
            started = body(await client.call("agent_run", {"agent": "worker", "input": "flood"}))["run"]
            ended = await _ended(client, started)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert ended["status"] == "succeeded", ended
        assert ended["result"] == "the result after the flood"
        assert peak < 24 << 20, f"the router held {peak >> 20} MiB while the run wrote 128 MiB"

    exchange(root, run_dir, script, profile="boss")


def test_no_run_starts_while_the_service_stops(agents_root: Path, run_dir: Path) -> None:
    """A run started during the stop's grace would be cut short by its end: it is refused at once as unavailable,
    saying to start it again once the service is back."""
    async def script(client: RawClient, router: Router) -> None:
        await router.quiesce()
        with pytest.raises(RunRefusedError) as refused:
            router.runs.start("worker", "count the scans", starter="member:bob")
        assert refused.value.code == "unavailable"
        assert refused.value.message == NOT_STARTED_STOPPING
        assert "start it again in a few seconds, once the service is back" in refused.value.message
        assert not router.runs.runs

    exchange(agents_root, run_dir, script, profile="boss")


def test_the_runs_kept_once_ended_are_bounded_and_a_running_parents_children_stay(tmp_path: Path) -> None:
    """Each ended run may hold a megabyte of result: past `KEPT_ENDED` the oldest are forgotten, but never one whose
    parent still runs (it counts in that parent's `maxPerParent`)."""
    runs = AgentRuns(lambda: None, tmp_path, tmp_path / "run", tmp_path / "state")
    parent = Run("run-parent", "boss", "", "member:bob", None)
    runs.runs[parent.id] = parent
    children = [Run(f"run-child-{i}", "worker", "", f"run:{parent.id}", parent.id) for i in range(3)]
    others = [Run(f"run-{i}", "worker", "", "member:bob", None) for i in range(KEPT_ENDED + 5)]
    for run in (*children, *others):
        runs.runs[run.id] = run
        runs._end(run, "succeeded", result="x" * 1000)
    assert all(child.id in runs.runs for child in children)
    assert [r.id for r in others if r.id not in runs.runs] == [r.id for r in others[:8]]  # the oldest, 3 + 5 over
    assert sum(r.status != "running" for r in runs.runs.values()) == KEPT_ENDED
