"""The Governor as the router sees it: admit, settle, handler_status, handler_decide, approved holds run once."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from governance.builders import OWNERS_ORG, cap_snapshot, make_snapshot, priced_call
from reconciler.config.snapshot import Snapshot
from reconciler.governance.gate import CallRequest, CallResult
from reconciler.governance.governor import Governor
from reconciler.governance.holds import decide_hold, get_hold, list_holds
from reconciler.governance.store import Store, open_store

HERE = Path(__file__).resolve().parent


class Recorder:
    """An executor that records every call it runs and can be told to fail."""

    def __init__(self, ok: bool = True) -> None:
        self.calls: list[CallRequest] = []
        self.ok = ok
        self.ran = asyncio.Event()

    async def __call__(self, call: CallRequest) -> CallResult:
        self.calls.append(call)
        self.ran.set()
        if self.ok:
            return CallResult(True, {"sent": call.arguments.get("to")}, cost=0.02)
        return CallResult(False, {"error": "unavailable", "message": "the mail server is down"})


async def until(check: Callable[[], Awaitable[bool]], seconds: float = 15.0) -> None:
    """Wait for `check()` to hold, up to a deadline (no fixed sleep: it returns as soon as it holds)."""
    deadline = time.monotonic() + seconds
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail("the condition did not hold before the deadline")
        await asyncio.sleep(0.01)


def mail(instance: str = "child", **args: Any) -> CallRequest:
    return priced_call(instance, profile="h", tool="mail_send", to="ceo@example.org", **args)


PARENT = priced_call("parent-1", profile="p")
STRANGER = priced_call("someone-else", profile="p")


def run(scenario: Callable[[Governor], Awaitable[None]], store: Store) -> None:
    async def main() -> None:
        governor = Governor(store, owns_store=False, poll_seconds=0.05)
        try:
            await scenario(governor)
        finally:
            await governor.aclose()

    asyncio.run(main())


def test_the_three_outcomes(store: Store) -> None:
    snapshot = make_snapshot({"p": {"template": "restrictive"}}, org=dict(OWNERS_ORG))

    async def scenario(g: Governor) -> None:
        executed = await g.admit(snapshot, priced_call())
        assert executed.status == "executed"
        assert executed.token is not None
        held = await g.admit(snapshot, priced_call(profile="p", tool="mail_delete", id="m1"))
        assert held.status == "blocked"
        assert held.message == "Destructive actions are not allowed for this agent (Restrictive template)."
        assert next(step["layer"] for step in held.trace) == "guardrails"

    run(scenario, store)


def test_a_hold_is_pending_at_once_with_its_arguments_stored(store: Store) -> None:
    snapshot = cap_snapshot()

    async def scenario(g: Governor) -> None:
        admission = await g.admit(snapshot, mail())
        assert admission.status == "pending"
        assert admission.request_id
        assert "handler_status" in admission.message
        hold = get_hold(store, admission.request_id)
        assert hold.arguments == {"to": "ceo@example.org"}
        assert hold.state == "pending"
        assert hold.approver == {"to": "caller"}
        assert hold.binding == "mail-b"
        status = await g.status(admission.request_id, mail())
        assert status.status == "pending"
        assert (await g.status(admission.request_id, STRANGER)).status == "unknown"  # another profile
        assert (await g.status(admission.request_id, PARENT)).status == "pending"  # its orchestrator
        assert (await g.status("req_nope", mail())).status == "unknown"

    run(scenario, store)


def test_only_the_parent_instance_may_decide_a_hold_routed_to_the_caller(store: Store) -> None:
    snapshot = cap_snapshot()
    recorder = Recorder()

    async def scenario(g: Governor) -> None:
        await g.start(recorder)
        rid = (await g.admit(snapshot, mail())).request_id
        assert rid is not None
        own = await g.decide(rid, "approve", mail())
        assert own.status == "blocked"
        assert "its own hold" in own.message
        other = await g.decide(rid, "approve", priced_call("someone-else", profile="h"))
        assert other.status == "blocked"
        assert "only the instance that started" in other.message
        done = await g.decide(rid, "approve", PARENT)
        assert done.status == "executed", done
        assert done.result is not None
        assert done.result["sent"] == "ceo@example.org"
        assert done.charged == 0.02  # the connector's reported cost, not the $0.01 estimate
        again = await g.decide(rid, "approve", PARENT)
        assert again.status == "blocked"
        assert "already decided" in again.message
        assert len(recorder.calls) == 1
        assert get_hold(store, rid).decided_by == "instance parent-1"

    run(scenario, store)


def test_a_hold_routed_to_a_person_cannot_be_decided_over_mcp(store: Store) -> None:
    snapshot = make_snapshot({"p": {"template": "balanced", "routing": {"to": "member", "member": "bob"}}},
                             org=dict(OWNERS_ORG))

    async def scenario(g: Governor) -> None:
        rid = (await g.admit(snapshot, priced_call(profile="p", tool="mail_send"))).request_id
        assert rid is not None
        refused = await g.decide(rid, "approve", PARENT)
        assert refused.status == "blocked"
        assert "handler approvals" in refused.message

    run(scenario, store)


def test_a_cli_approval_is_run_by_the_router_loop_once(store: Store) -> None:
    snapshot = cap_snapshot()
    recorder = Recorder()

    async def scenario(g: Governor) -> None:
        await g.start(recorder)
        rid = (await g.admit(snapshot, mail())).request_id
        assert rid is not None
        decide_hold(store, rid, "approve", "alice")

        async def executed() -> bool:
            return (await g.status(rid, mail())).status == "executed"

        await until(executed)
        assert len(recorder.calls) == 1
        assert recorder.calls[0].binding == "mail-b"

    run(scenario, store)


def test_a_rejected_hold_reads_rejected(store: Store) -> None:
    snapshot = cap_snapshot()

    async def scenario(g: Governor) -> None:
        rid = (await g.admit(snapshot, mail())).request_id
        assert rid is not None
        decide_hold(store, rid, "reject", "alice")
        status = await g.status(rid, mail())
        assert status.status == "rejected"
        assert "alice" in status.message

    run(scenario, store)


def test_an_approval_while_no_router_runs_is_run_when_one_starts(store_url: str) -> None:
    snapshot = cap_snapshot()
    first = open_store(store_url)
    rid = Governor(first).admit_now(snapshot, mail()).request_id
    first.close()
    assert rid is not None
    second = open_store(store_url)
    decide_hold(second, rid, "approve", "alice")
    recorder = Recorder()

    async def scenario(g: Governor) -> None:
        g.use_snapshot(snapshot)
        await g.start(recorder)
        await asyncio.wait_for(recorder.ran.wait(), 15)

        async def executed() -> bool:
            return get_hold(second, rid).state == "executed"

        await until(executed)

    run(scenario, second)
    second.close()
    assert len(recorder.calls) == 1


@pytest.mark.parametrize(("later", "reason"), [
    ({"h": {"template": "balanced", "routing": {"to": "caller"}, "rules": [{"service": "mail", "outcome": "block"}]}},
     "blocked since it was approved: Blocked: a rule for service mail"),
    ({"h": {"template": "restrictive", "routing": {"to": "caller"}}},
     "blocked since it was approved: Writes are not allowed"),
    ({"h": {"template": "balanced", "routing": {"to": "caller"}, "caps": {"monthly_usd": 0.001}}},
     "blocked since it was approved: Blocked by the profile monthly cap"),
    ({}, "profile h no longer serves mail_send"),
])
def test_blocks_and_guardrails_are_checked_again_at_run_time(store: Store, later: dict[str, Any], reason: str) -> None:
    recorder = Recorder()

    async def scenario(g: Governor) -> None:
        rid = (await g.admit(cap_snapshot(), mail())).request_id
        assert rid is not None
        changed: Snapshot = make_snapshot({"p": {}, **later}, org=dict(OWNERS_ORG), revision="r2")
        g.use_snapshot(changed)
        await g.start(recorder)
        status = await g.decide(rid, "approve", PARENT)
        assert status.status == "failed"
        assert status.message.startswith(reason), status.message

    run(scenario, store)
    assert recorder.calls == []


def test_a_failed_run_is_recorded_and_costs_nothing(store: Store) -> None:
    async def scenario(g: Governor) -> None:
        await g.start(Recorder(ok=False))
        rid = (await g.admit(cap_snapshot(), mail())).request_id
        assert rid is not None
        status = await g.decide(rid, "approve", PARENT)
        assert status.status == "failed"
        assert status.message == "the mail server is down"
        assert status.charged == 0.0

    run(scenario, store)


def test_two_router_processes_run_each_approved_hold_exactly_once(store_url: str, store: Store,
                                                                  tmp_path: Path) -> None:
    snapshot = cap_snapshot()
    governor = Governor(store, owns_store=False)
    rids = [governor.admit_now(snapshot, mail(n=i)).request_id for i in range(20)]
    governor.close()
    runs = tmp_path / "runs.txt"
    env = {**os.environ, "PYTHONPATH": f"{HERE.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs = [subprocess.Popen([sys.executable, str(HERE / "racer.py"), "run", store_url, str(runs)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready"
        for rid in rids:
            assert rid is not None
            decide_hold(store, rid, "approve", "alice")
        deadline = time.monotonic() + 60
        while list_holds(store, ("approved", "running")) or len(list_holds(store, ("executed",))) < 20:
            assert time.monotonic() < deadline, "the holds did not all run in time"
            time.sleep(0.02)
    finally:
        outs = [p.communicate("", timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    assert sorted(int(x) for x in runs.read_text().split()) == list(range(20))
