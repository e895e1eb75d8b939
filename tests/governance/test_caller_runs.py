"""Caller routing between real runs: a worker run's held call is decided by the run that started it, proven by the
secret the router gave that run; a client claiming that run's id, and the held run itself, cannot decide it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.governance.governed import GovernedGate
from reconciler.governance.holds import get_hold
from reconciler.governance.store import Store
from reconciler.router.runs import Run
from reconciler.router.server import Router
from tests.fixtures.agents_tree import MEMBERS_ORG, write_agents_tree
from tests.fixtures.harness import RawClient, body, run, serving

pytestmark = pytest.mark.usefixtures("echo_secret")
ROUTED = 'routing = { to = "caller" }\n'


async def _until(check: Any, seconds: float = 30.0) -> None:
    async with asyncio.timeout(seconds):
        while not check():
            await asyncio.sleep(0.05)


async def _orchestrate(router: Router, root: Path, boss: Run) -> None:
    """As the boss run's agent: start the worker, list what waits on it, approve it with a reason."""
    proof = {"handler/secret": boss.secret}
    me = await RawClient.connect(router.socket_path("boss"))
    claimer = await RawClient.connect(router.socket_path("tester"))
    try:
        child = body(await me.call("agent_run", {"agent": "worker", "input": "write"}, _meta=proof))["run"]
        assert router.runs.runs[child].parent == boss.id
        await _until(lambda: (root / "work/worker/held").exists() or router.runs.runs[child].status != "running")
        assert router.runs.runs[child].status == "running", router.runs.runs[child]
        request_id = (root / "work/worker/held").read_text()
        # Another profile's client sending the boss run's id, no secret: to it the hold does not exist.
        stranger = await claimer.call("handler_decide", {"request_id": request_id, "decision": "approve"},
                                      _meta={"handler/instance": boss.id})
        assert body(stranger)["status"] == "unknown"
        unproven = await RawClient.connect(router.socket_path("boss"))  # the boss's own socket, its id claimed
        try:
            bare = await unproven.call("handler_decide", {"request_id": request_id, "decision": "approve"},
                                       _meta={"handler/instance": boss.id})
            assert body(bare)["status"] == "unknown"
            wrong = await unproven.call("handler_decide", {"request_id": request_id, "decision": "approve"},
                                        _meta={"handler/secret": "a guess", "handler/instance": boss.id})
            assert body(wrong)["status"] == "unknown"
        finally:
            await unproven.close()
        listed = body(await me.call("handler_status", {}, _meta=proof))
        assert [w["request_id"] for w in listed["waiting"]] == [request_id]
        assert listed["waiting"][0]["tool"] == "echo_write"
        decided = body(await me.call("handler_decide", {"request_id": request_id, "decision": "approve",
                                                        "reason": "a note in its own folder is fine"}, _meta=proof))
        assert decided["status"] == "executed", decided
        await _until(lambda: router.runs.runs[child].status != "running")
        ended = router.runs.runs[child]
        assert ended.status == "succeeded", ended.error
        told = json.loads(ended.result or "{}")
        assert told["held"] == "pending"
        assert "its own hold" in told["own"]["message"]
        assert told["final"]["status"] == "executed"
        assert "a note in its own folder is fine" in told["final"]["message"]
        assert (root / "work/worker/note.txt").read_text() == "hello"
    finally:
        await me.close()
        await claimer.close()


def test_the_parent_run_decides_its_childs_hold_and_nobody_else(tmp_path: Path, sqlite_store: Store,
                                                                run_dir: Path) -> None:
    root = write_agents_tree(tmp_path / "tree", worker_template="balanced", worker_routing=ROUTED)

    async def scenario() -> None:
        governor = GovernedGate(sqlite_store, owns_store=False)
        try:
            async with serving(root, run_dir, gate=governor) as router:
                await governor.start(router.execute_held)
                boss = router.runs.start("boss", "sleep", starter="member:owner")
                await _orchestrate(router, root, boss)
        finally:
            await governor.aclose()

    run(scenario(), timeout=120)




async def _approvals(verb: str, request_id: str, member: str, root: Path, store_url: str) -> tuple[int, str]:
    done = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "handler"), "approvals", verb, request_id, "--as", member, "--root",
        str(root), env={**os.environ, "HANDLER_STORE_URL": store_url}, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    out, _ = await done.communicate()
    return done.returncode or 0, out.decode()


@contextlib.asynccontextmanager
async def _bobs_held_run(root: Path, store: Store, run_dir: Path) -> AsyncIterator[tuple[Router, Run, str]]:
    """The worker's run started by bob, its write held for him (caller routing): the router, the run, the hold."""
    governor = GovernedGate(store, owns_store=False)
    try:
        async with serving(root, run_dir, gate=governor) as router:
            await governor.start(router.execute_held)
            started = router.runs.start("worker", "write", starter="member:bob")
            await _until(lambda: (root / "work/worker/held").exists() or started.status != "running")
            yield router, started, (root / "work/worker/held").read_text()
    finally:
        await governor.aclose()


def test_a_member_started_runs_hold_goes_to_that_member_who_decides_it(tmp_path: Path, sqlite_store: Store,
                                                                       sqlite_url: str, run_dir: Path) -> None:
    root = write_agents_tree(tmp_path / "tree", worker_template="balanced", worker_routing=ROUTED)
    (root / "config/org.toml").write_text(MEMBERS_ORG)

    async def scenario() -> None:
        async with _bobs_held_run(root, sqlite_store, run_dir) as (_router, started, request_id):
            assert get_hold(sqlite_store, request_id).approver == {"to": "member", "member": "bob", "via": "caller"}
            code, said = await _approvals("approve", request_id, "carol", root, sqlite_url)
            assert code != 0
            assert "routed to member bob; carol is not an owner" in said
            code, said = await _approvals("approve", request_id, "bob", root, sqlite_url)
            assert code == 0, said
            await _until(lambda: started.status != "running")
            assert started.status == "succeeded", started.error
            assert json.loads(started.result or "{}")["final"]["status"] == "executed"

    run(scenario(), timeout=120)


def test_a_run_cancelled_with_a_call_held_takes_its_hold_back_and_the_call_never_runs(
        tmp_path: Path, sqlite_store: Store, sqlite_url: str, run_dir: Path) -> None:
    """The member cancels the run whose write waits on their approval: the hold is rejected, saying the run ended
    and how, and approving it afterwards is refused; the write never happens."""
    root = write_agents_tree(tmp_path / "tree", worker_template="balanced", worker_routing=ROUTED)
    (root / "config/org.toml").write_text(MEMBERS_ORG)

    async def scenario() -> None:
        async with _bobs_held_run(root, sqlite_store, run_dir) as (router, started, request_id):
            assert get_hold(sqlite_store, request_id).state == "pending"
            await router.runs.cancel(started.id, "cancelled by bob from the CLI")
            await _until(lambda: get_hold(sqlite_store, request_id).state != "pending")
            hold = get_hold(sqlite_store, request_id)
            assert (hold.state, hold.decided_by) == ("rejected", "the service")
            assert hold.decision_reason == "its run ended: cancelled, cancelled by bob from the CLI"
            code, said = await _approvals("approve", request_id, "bob", root, sqlite_url)
            assert code != 0
            assert "already decided: it is rejected (by the service)" in said

    run(scenario(), timeout=120)
    assert not (root / "work/worker/note.txt").exists()
