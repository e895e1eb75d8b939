"""The hold runner, through the GovernedGate: approved holds run once, checked again, recorded, across processes."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from reconciler.config.snapshot import Snapshot
from reconciler.governance import holdrunner, ledger
from reconciler.governance.auditing import read_audit
from reconciler.governance.errors import StoreError, StoreRefusedError
from reconciler.governance.gate import CallRequest, CallResult, Executor, HoldStatus
from reconciler.governance.governed import GovernedGate
from reconciler.governance.holds import decide_hold, get_hold, list_holds
from reconciler.governance.ledger import reconcile_reservations, spend_report
from reconciler.governance.rulebook import to_micros
from reconciler.governance.store import Store, open_store
from reconciler.wire.meta import MAX_RUN_ID_CHARS
from tests.governance.builders import OWNERS_ORG, cap_snapshot, make_snapshot
from tests.governance.governed import PARENT, Recorder, mail, run, until

HERE = Path(__file__).resolve().parent


async def started_and_approved(g: GovernedGate, executor: Executor) -> tuple[str, HoldStatus]:
    """Start `g` with `executor`, hold a mail_send and approve it as its parent: its request id and what the
    approval answered."""
    await g.start(executor)
    rid = (await g.admit(cap_snapshot(), mail())).request_id
    assert rid is not None
    return rid, await g.decide(rid, "approve", PARENT)


def test_a_cli_approval_is_run_by_the_router_loop_once(store: Store) -> None:
    snapshot = cap_snapshot()
    recorder = Recorder()

    async def scenario(g: GovernedGate) -> None:
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


def test_an_approval_while_no_router_runs_is_run_when_one_starts(store_url: str) -> None:
    snapshot = cap_snapshot()
    first = open_store(store_url)
    rid = GovernedGate(first).admit_now(snapshot, mail()).request_id
    first.close()
    assert rid is not None
    second = open_store(store_url)
    decide_hold(second, rid, "approve", "alice")
    recorder = Recorder()

    async def scenario(g: GovernedGate) -> None:
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

    async def scenario(g: GovernedGate) -> None:
        rid = (await g.admit(cap_snapshot(), mail())).request_id
        assert rid is not None
        changed: Snapshot = make_snapshot({"p": {}, **later}, org=dict(OWNERS_ORG), revision="r2")
        g.use_snapshot(changed)
        await g.start(recorder)
        status = await g.decide(rid, "approve", PARENT)
        assert status.status == "failed"
        assert status.message.startswith(f"Approved by instance parent-1; the run failed: {reason}"), status.message
        hold = get_hold(store, rid)
        assert hold.cause is not None
        assert hold.cause.startswith(reason)

    run(scenario, store)
    assert recorder.calls == []


def test_a_failed_run_is_final_with_its_cause_recorded_and_costs_nothing(store: Store) -> None:
    async def scenario(g: GovernedGate) -> None:
        rid, status = await started_and_approved(g, Recorder(ok=False))
        assert status.status == "failed"
        # The agent: who approved, that the run failed, that it is final; no advice to retry a final state.
        assert status.message == ("Approved by instance parent-1; the run failed: the service failed. "
                                  "This is final: the hold is never run again.")
        assert status.result == {"error": "unavailable", "message": "the service failed"}
        assert status.charged == 0.0
        hold = get_hold(store, rid)  # people: the cause the router gave
        assert hold.cause == "unavailable (crashed): mail-b exited with status 3"
        assert hold.message == "the service failed"
        (failed,) = [r for r in read_audit(store, request_id=rid) if r["event"] == "failed"]
        assert failed["detail"]["reason"] == ("approved by instance parent-1; the run failed: "
                                              "unavailable (crashed): mail-b exited with status 3")

    run(scenario, store)


def test_a_failure_whose_words_hold_a_nul_is_recorded_and_final_on_either_store(store: Store) -> None:
    """What a connector says of a failure is its own text; PostgreSQL refuses a NUL in a text column, which left the
    hold running for good, its end never recorded. Stored with U+FFFD in its place, the hold fails once, as any."""
    class Garbled(Recorder):
        async def __call__(self, call: CallRequest) -> CallResult:
            self.calls.append(call)
            return CallResult(False, {"error": "unavailable", "message": "the service\x00 failed"},
                              cause="unavailable (connector_error): it said \x00\x00")

    async def scenario(g: GovernedGate) -> None:
        rid, status = await started_and_approved(g, Garbled())
        assert status.status == "failed"
        hold = get_hold(store, rid)
        assert (hold.state, hold.message) == ("failed", "the service\ufffd failed")
        assert hold.cause == "unavailable (connector_error): it said \ufffd\ufffd"
        assert (await g.status(rid, PARENT)).status == "failed"

    run(scenario, store)


def test_a_store_failing_once_the_call_has_run_loses_neither_its_end_nor_its_charge(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The call has run; its settlement cannot be written, and the first writes of its end fail (the first after
    it landed, as when a commit's answer is lost). The hold ends executed, recorded once, and its reservation counts
    until reconciled, charged what it reserved: over, never under."""
    tries: list[str] = []
    real_finish = holdrunner.finish_hold

    def failing_settle(*args: Any, **kwargs: Any) -> Any:
        raise StoreError("the store is down")

    def flaky_finish(*args: Any, **kwargs: Any) -> None:
        tries.append("finish")
        if len(tries) == 1:
            real_finish(*args, **kwargs)
            raise StoreError("the commit's answer was lost")
        if len(tries) == 2:
            raise StoreError("the store is down")
        real_finish(*args, **kwargs)

    monkeypatch.setattr(ledger, "settle", failing_settle)  # what the hold's ticket settles with
    monkeypatch.setattr(holdrunner, "finish_hold", flaky_finish)
    monkeypatch.setattr(holdrunner, "_RETRY_SECONDS", 0.01)
    recorder = Recorder()

    async def scenario(g: GovernedGate) -> None:
        rid, status = await started_and_approved(g, recorder)
        assert status.status == "executed"
        hold = get_hold(store, rid)
        assert (hold.state, hold.charged) == ("executed", hold.cost)
        assert [r["event"] for r in read_audit(store, request_id=rid)].count("executed") == 1

    run(scenario, store)
    assert tries == ["finish"] * 3
    assert len(recorder.calls) == 1
    counted = {r["scope"]: r["micros"] for r in spend_report(store)}
    assert counted["profile:h"] == to_micros(0.01)  # the reservation, still counted
    assert reconcile_reservations(store, older_than=0.0) == 1
    assert {r["scope"]: r["micros"] for r in spend_report(store)} == counted


def test_an_end_the_store_refuses_is_recorded_as_failed_naming_the_refusal_not_retried_for_good(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write the store refuses for its data fails again at every retry: the hold would stay running for good. Its
    end is recorded as failed instead, once, with the store's reason as its cause."""
    tries: list[bool] = []
    real_finish = holdrunner.finish_hold

    def refusing_finish(*args: Any, ok: bool, **kwargs: Any) -> None:
        tries.append(ok)
        if ok:
            raise StoreRefusedError("the store refused a write: value too long for type character varying(200)")
        real_finish(*args, ok=ok, **kwargs)

    monkeypatch.setattr(holdrunner, "finish_hold", refusing_finish)
    recorder = Recorder()

    async def scenario(g: GovernedGate) -> None:
        rid, status = await started_and_approved(g, recorder)
        assert status.status == "failed"
        assert "its result could not be stored" in (status.message or "")
        hold = get_hold(store, rid)
        assert hold.state == "failed"
        assert "value too long" in (hold.cause or "")

    run(scenario, store)
    assert tries == [True, False]
    assert len(recorder.calls) == 1


def test_a_parent_run_with_the_longest_id_a_client_may_give_decides_its_childs_hold(store: Store) -> None:
    """The approver is stored as `instance <id>`: an id as long as the router takes still fits the store's column."""
    parent = dataclasses.replace(PARENT, instance="p" * MAX_RUN_ID_CHARS)
    recorder = Recorder()

    async def scenario(g: GovernedGate) -> None:
        await g.start(recorder)
        child = dataclasses.replace(mail(), parent_instance=parent.instance)
        rid = (await g.admit(cap_snapshot(), child)).request_id
        assert rid is not None
        assert (await g.decide(rid, "approve", parent)).status == "executed"
        assert get_hold(store, rid).decided_by == f"instance {parent.instance}"

    run(scenario, store)
    assert len(recorder.calls) == 1


def test_two_router_processes_run_each_approved_hold_exactly_once(store_url: str, store: Store,
                                                                  tmp_path: Path) -> None:
    snapshot = cap_snapshot()
    governor = GovernedGate(store, owns_store=False)
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


def test_an_executor_that_raises_fails_the_hold_once_and_it_costs_nothing(store: Store) -> None:
    recorder = Recorder(raises=True)

    async def scenario(g: GovernedGate) -> None:
        rid, status = await started_and_approved(g, recorder)
        assert status.status == "failed"
        assert status.message.startswith("Approved by instance parent-1; the run failed: the call could not run: "
                                          "the router is gone. This is final")
        assert get_hold(store, rid).cause == "the router could not run it: RuntimeError: the router is gone"
        assert status.charged == 0.0
        assert (await g.decide(rid, "approve", PARENT)).status == "blocked"  # already decided: never again

    run(scenario, store)
    assert len(recorder.calls) == 1


def test_a_runner_listening_on_postgresql_polls_seldom_and_still_runs_an_approval_at_once(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """While LISTEN is up every decision wakes the runner, so it looks in the store only every few seconds, in case
    a notification was lost, instead of at its poll interval; an approval made elsewhere still runs at once."""
    store = open_store(pg_url)
    looked: list[float] = []
    real = holdrunner.approved_ids

    def counted(store: Store) -> list[str]:
        looked.append(time.monotonic())
        return real(store)

    monkeypatch.setattr(holdrunner, "approved_ids", counted)
    recorder = Recorder()

    async def scenario(g: GovernedGate) -> None:
        g.use_snapshot(cap_snapshot())  # the runner looks for holds only once it knows the live snapshot
        await g.start(recorder)

        async def listening() -> bool:
            return g._runner.listening

        await until(listening)
        await asyncio.sleep(0.2)  # the look its connecting woke
        looked.clear()
        await asyncio.sleep(1.5)  # thirty polls' worth at the 0.05 s the test asks for
        assert len(looked) <= 1, looked
        rid = (await g.admit(cap_snapshot(), mail())).request_id
        assert rid is not None
        started = time.monotonic()
        decide_hold(store, rid, "approve", "alice")  # another process's decision: only its NOTIFY wakes the runner

        async def executed() -> bool:
            return (await g.status(rid, mail())).status == "executed"

        await until(executed)
        assert time.monotonic() - started < 3
        assert len(recorder.calls) == 1

    try:
        run(scenario, store)
    finally:
        store.close()


def test_the_loop_outlives_a_store_it_cannot_read_and_runs_what_was_approved_meanwhile(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    """The poll finds the store unreadable (here its holds table renamed away, as a migration gone wrong would);
    once it can read it again, a hold approved from the CLI in between runs, without restarting the router."""
    snapshot = cap_snapshot()
    recorder = Recorder()

    def rename(old: str, new: str) -> None:
        with store.begin() as tx:
            tx.exec_driver_sql(f"ALTER TABLE {old} RENAME TO {new}")

    async def scenario(g: GovernedGate) -> None:
        await g.start(recorder)
        rid = (await g.admit(snapshot, mail())).request_id
        assert rid is not None
        rename("holds", "holds_aside")

        async def told() -> bool:
            return "cannot read the approved holds from the store" in caplog.text

        await until(told)
        rename("holds_aside", "holds")
        decide_hold(store, rid, "approve", "alice")

        async def executed() -> bool:
            return get_hold(store, rid).state == "executed"

        await until(executed)
        assert len(recorder.calls) == 1

    run(scenario, store)
    assert caplog.text.count("cannot read the approved holds") == 1  # said once for the outage, not at every poll
    assert "the approved holds are read from the store again" in caplog.text
