"""The GovernedGate put together: the gate and the hold runner share the live snapshot, the store and the hooks."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import psycopg
import pytest

from reconciler.governance.governed import GovernedGate
from reconciler.governance.ledger import spend_report
from reconciler.governance.store import Store, committing, open_store
from reconciler.governance.store.audit import read_audit
from tests.governance.builders import OWNERS_ORG, cap_snapshot, make_snapshot, priced_call
from tests.governance.governed import PARENT, Recorder, mail, run


def test_a_hold_stored_here_calls_on_hold(store: Store) -> None:
    told: list[str] = []

    async def scenario(g: GovernedGate) -> None:
        g.on_hold = lambda: told.append("hold")
        await g.admit(cap_snapshot(), priced_call())  # runs now: nobody is told
        assert told == []
        await g.admit(cap_snapshot(), mail())
        assert told == ["hold"]

    run(scenario, store)


def test_until_told_otherwise_the_first_snapshot_admitted_is_the_live_one(store: Store) -> None:
    recorder = Recorder()

    async def scenario(g: GovernedGate) -> None:
        await g.start(recorder)  # no use_snapshot: the runner learns the live snapshot from the first call
        rid = (await g.admit(cap_snapshot(), mail())).request_id
        assert rid is not None
        done = await g.decide(rid, "approve", PARENT)
        assert done.status == "executed", done

    run(scenario, store)
    assert len(recorder.calls) == 1


def test_close_commits_what_waits_in_the_backlog(store: Store) -> None:
    governor = GovernedGate(store, owns_store=False, batch_seconds=3600)
    snapshot = make_snapshot({"p": {"template": "permissive"}}, org=dict(OWNERS_ORG))
    admission = governor.admit_now(snapshot, priced_call())
    assert admission.request_id is not None
    assert read_audit(store, request_id=admission.request_id) == []  # waiting for the next commit
    governor.close()
    assert [r["event"] for r in read_audit(store, request_id=admission.request_id)] == ["decided"]


def test_aclose_commits_the_settlements_of_the_last_calls(store: Store) -> None:
    async def scenario() -> None:
        governor = GovernedGate(store, owns_store=False, batch_seconds=3600)
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

    async def calls(governor: GovernedGate, count: int) -> None:
        for _ in range(count):
            await governor.settle(await governor.admit(snapshot, priced_call()), None, True)

    def hold_spend_rows(locked: threading.Event, release: threading.Event) -> None:
        with psycopg.connect(pg_admin, options=f"-csearch_path={schema}") as conn, conn.transaction():
            conn.execute("SELECT micros FROM spend WHERE scope = 'profile:p' FOR UPDATE")
            locked.set()
            release.wait(30)

    async def scenario() -> None:
        governor = GovernedGate(store, owns_store=False, batch_seconds=0.01)
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


def test_on_sqlite_the_loop_never_waits_for_a_write_lock_another_process_holds(sqlite_store: Store) -> None:
    """The loop commits the backlog itself only when the file's write lock is free: while another process (here a
    connection of its own, as `handler` in a shell would be) holds it, the worker waits for it instead, the loop
    runs on, and every record lands once the lock is let go."""
    database = sqlite_store.sqlite_file
    assert database is not None
    snapshot = make_snapshot({"p": {"template": "permissive"}}, org=dict(OWNERS_ORG))

    async def scenario() -> int:
        governor = GovernedGate(sqlite_store, owns_store=False, batch_seconds=3600)
        other = sqlite3.connect(database, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # the write lock, held
        for _ in range(10):
            await governor.settle(await governor.admit(snapshot, priced_call()), None, True)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticking = asyncio.create_task(ticker())
        flushing = asyncio.create_task(governor.flush())
        await asyncio.sleep(0.3)
        assert not flushing.done()  # the worker waits on the lock ...
        seen = ticks  # ... and the loop did not
        other.execute("COMMIT")
        other.close()
        await flushing
        ticking.cancel()
        await governor.aclose()
        return seen

    assert asyncio.run(scenario()) >= 10
    settled = [r for r in read_audit(sqlite_store, limit=1000) if r["event"] == "settled"]
    assert sum(r["detail"].get("calls", 1) for r in settled) == 10
    assert {r["scope"]: r["micros"] for r in spend_report(sqlite_store)}["profile:p"] == 10 * 5000


def test_on_sqlite_the_write_ahead_log_is_checkpointed_off_the_loop(sqlite_store: Store,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(committing, "CHECKPOINT_EVERY", 3)
    checkpoints = []
    original = committing.SqliteCommitter._checkpoint_now

    def counted(self: committing.SqliteCommitter) -> None:
        checkpoints.append(threading.current_thread() is not threading.main_thread())
        original(self)

    monkeypatch.setattr(committing.SqliteCommitter, "_checkpoint_now", counted)
    snapshot = make_snapshot({"p": {"template": "permissive"}}, org=dict(OWNERS_ORG))

    async def scenario() -> None:
        governor = GovernedGate(sqlite_store, owns_store=False, batch_seconds=3600)
        for _ in range(7):
            await governor.settle(await governor.admit(snapshot, priced_call()), None, True)
            await governor.flush()  # one commit from the loop each
        await governor.aclose()

    asyncio.run(scenario())
    # After the 3rd commit, and the 6th unless the first still ran: never more often, never on the loop's thread.
    assert checkpoints in ([True], [True, True])
    settled = [r for r in read_audit(sqlite_store, limit=1000) if r["event"] == "settled"]
    assert sum(r["detail"].get("calls", 1) for r in settled) == 7
