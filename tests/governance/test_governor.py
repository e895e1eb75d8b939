"""The Governor put together: the gate and the hold runner share the live snapshot, the store and the hooks."""

from __future__ import annotations

import asyncio

from reconciler.governance.governor import Governor
from reconciler.governance.ledger import spend_report
from reconciler.governance.store import Store
from reconciler.governance.store.audit import read_audit
from tests.governance.builders import OWNERS_ORG, cap_snapshot, make_snapshot, priced_call
from tests.governance.governed import PARENT, Recorder, mail, run


def test_a_hold_stored_here_calls_on_hold(store: Store) -> None:
    told: list[str] = []

    async def scenario(g: Governor) -> None:
        g.on_hold = lambda: told.append("hold")
        await g.admit(cap_snapshot(), priced_call())  # runs now: nobody is told
        assert told == []
        await g.admit(cap_snapshot(), mail())
        assert told == ["hold"]

    run(scenario, store)


def test_until_told_otherwise_the_first_snapshot_admitted_is_the_live_one(store: Store) -> None:
    recorder = Recorder()

    async def scenario(g: Governor) -> None:
        await g.start(recorder)  # no use_snapshot: the runner learns the live snapshot from the first call
        rid = (await g.admit(cap_snapshot(), mail())).request_id
        assert rid is not None
        done = await g.decide(rid, "approve", PARENT)
        assert done.status == "executed", done

    run(scenario, store)
    assert len(recorder.calls) == 1


def test_close_commits_what_waits_in_the_backlog(store: Store) -> None:
    governor = Governor(store, owns_store=False, batch_seconds=3600)
    snapshot = make_snapshot({"p": {"template": "permissive"}}, org=dict(OWNERS_ORG))
    admission = governor.admit_now(snapshot, priced_call())
    assert admission.request_id is not None
    assert read_audit(store, request_id=admission.request_id) == []  # waiting for the next commit
    governor.close()
    assert [r["event"] for r in read_audit(store, request_id=admission.request_id)] == ["decided"]


def test_aclose_commits_the_settlements_of_the_last_calls(store: Store) -> None:
    async def scenario() -> None:
        governor = Governor(store, owns_store=False, batch_seconds=3600)
        admission = await governor.admit(cap_snapshot(), priced_call())
        await governor.settle(admission, 0.002, True)
        await governor.aclose()

    asyncio.run(scenario())
    (row,) = read_audit(store)  # settled before its decision was written: one row counts it, with its decision
    assert (row["event"], row["status"], row["tool"]) == ("settled", "executed", "search_query")
    assert row["request_id"] is None
    assert {k: v for k, v in row["detail"].items() if k not in ("reason", "first")} == {
        "cost": 5000, "binding": "search-b", "calls": 1, "reserved": 5000, "charged": 2000}
    assert {r["scope"]: r["micros"] for r in spend_report(store)}["profile:p"] == 2000
