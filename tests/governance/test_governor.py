"""The Governor put together: the gate and the hold runner share the live snapshot, the store and the hooks."""

from __future__ import annotations

import asyncio
import threading

import psycopg
import pytest

from reconciler.governance.governor import Governor
from reconciler.governance.ledger import spend_report
from reconciler.governance.store import Store, open_store
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


@pytest.mark.timeout(60)
def test_aclose_while_a_commit_waits_on_a_lock_waits_for_it_and_lands_every_record_once(
        pg_admin: str, pg_url: str) -> None:
    """On PostgreSQL the loop commits the backlog itself. Closing while such a commit waits (here on a spend row another
    transaction holds) waits for it, rather than cancel it (its rows then lost, or written twice) or write the rest
    beside it from the loop's own thread (which would wait on the same row: never done)."""
    store = open_store(pg_url)
    snapshot = make_snapshot({"p": {"template": "permissive"}}, org=dict(OWNERS_ORG))
    schema = pg_url.rsplit("%3D", 1)[1]

    async def calls(governor: Governor, count: int) -> None:
        for _ in range(count):
            await governor.settle(await governor.admit(snapshot, priced_call()), None, True)

    def hold_spend_rows(locked: threading.Event, release: threading.Event) -> None:
        with psycopg.connect(pg_admin, options=f"-csearch_path={schema}") as conn, conn.transaction():
            conn.execute("SELECT micros FROM spend WHERE scope = 'profile:p' FOR UPDATE")
            locked.set()
            release.wait(30)

    async def scenario() -> None:
        governor = Governor(store, owns_store=False, batch_seconds=0.01)
        await calls(governor, 10)
        await governor.flush()  # the spend rows exist
        locked, release = threading.Event(), threading.Event()
        holder = threading.Thread(target=hold_spend_rows, args=(locked, release))
        holder.start()
        assert await asyncio.to_thread(locked.wait, 10)
        await calls(governor, 10)
        await asyncio.sleep(0.1)  # the flush task's commit now waits on the row
        threading.Timer(0.5, release.set).start()
        await governor.aclose()
        holder.join()

    try:
        asyncio.run(scenario())
        settled = [r for r in read_audit(store, limit=1000) if r["event"] == "settled"]
        assert sum(r["detail"].get("calls", 1) for r in settled) == 20
        assert {r["scope"]: r["micros"] for r in spend_report(store)}["profile:p"] == 20 * 5000
    finally:
        store.close()
