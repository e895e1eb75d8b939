"""Budget leases (docs/governance.md, "Leases"): each router spends a slice of a cap's headroom in memory.

The leases and the settled spend never pass a cap, however many routers take them; a cap near its end
admits exactly the calls that fit; a lease a killed router never returned stays counted as spent until
it is reconciled (at that router's next start, or by anyone once it expired), which gives back only
what its calls could not have used; idle leases go back on their own; `handler spend` and `balance
show` say what leases hold.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from reconciler.config.snapshot import Snapshot
from reconciler.governance.gate import Admission
from reconciler.governance.governed import GovernedGate
from reconciler.governance.leases import LeaseBook, LeaseTerms, Waiter, reconcile_leases, sync
from reconciler.governance.ledger import add_balance, current_month, leased_balance, read_balance, spend_report
from reconciler.governance.rulebook import CapSet, to_micros
from reconciler.governance.store import Store, open_store
from reconciler.governance.store.audit import read_audit
from reconciler.governance.store.tables import leases, spend
from tests.governance.builders import OWNERS_ORG, cap_snapshot, make_snapshot, priced_call
from tests.governance.governed import PARENT, Recorder, mail, until

HERE = Path(__file__).resolve().parent
PRICE = to_micros(0.005)  # a search's price: the most one call may cost
CAP = to_micros(0.25)  # the org cap of `cap_snapshot()`


def capped(usd: float) -> Snapshot:
    return make_snapshot({"p": {"template": "permissive"}}, org={**OWNERS_ORG, "caps": {"monthly_usd": usd}})


def org_row(store: Store) -> int:
    with store.engine.connect() as conn:
        value = conn.execute(sa.select(spend.c.micros).where(spend.c.scope == "org:acme",
                                                             spend.c.month == current_month())).scalar()
    return int(value or 0)


def lease_rows(store: Store, **where: Any) -> list[dict[str, Any]]:
    query = sa.select(leases).where(*(leases.c[k] == v for k, v in where.items()))
    with store.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def _racer(store_url: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{HERE.parent.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, str(HERE / "racer.py"), args[0], store_url, *args[1:]], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_9(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)  # and its pipes closed


def test_leases_and_settled_spend_never_pass_the_cap_across_two_router_processes(store_url: str,
                                                                                  store: Store) -> None:
    """Two routers churn through 600 calls settled at their price, half of it, or failed; the cap is
    watched from outside all along: the org's row (settled spend and open leases) never passes it."""
    procs = [_racer(store_url, "churn", "300", str(seed)) for seed in (1, 2)]
    for p in procs:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
    seen: list[tuple[int, int]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            row = (sa.select(spend.c.micros).where(spend.c.scope == "org:acme", spend.c.month == current_month())
                   .scalar_subquery())
            held = (sa.select(sa.func.coalesce(sa.func.sum(leases.c.granted), 0))
                    .where(leases.c.scope == "org:acme", leases.c.state == "open").scalar_subquery())
            with store.engine.connect() as conn:  # one statement: one snapshot of both tables
                found = conn.execute(sa.select(row, held)).one()
            seen.append((int(found[0] or 0), int(found[1] or 0)))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        outs = [p.communicate("go\n", timeout=120) for p in procs]
    finally:
        done.set()
        watcher.join()
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    counts = [json.loads(o) for o, _ in outs]
    assert len(seen) > 10
    assert max(row for row, _ in seen) <= CAP
    assert all(held <= row for row, held in seen)  # the row counts every open lease
    charged = sum(c["charged"] for c in counts)
    assert org_row(store) == charged <= CAP  # both returned theirs: the row is what was charged
    assert sum(c["executed"] for c in counts) > 50  # refunds went back into the leases and were spent again
    assert [c["leased"] for c in counts] == [c["executed"] for c in counts]  # each admitted on its router's leases
    assert lease_rows(store, state="open") == []


def test_a_cap_near_its_end_admits_exactly_what_fits(store: Store) -> None:
    mails = [priced_call("i2", tool="mail_send", to="x") for _ in range(5)]  # $0.01 each
    searches = [priced_call("i2") for _ in range(5)]  # $0.005 each

    async def scenario() -> tuple[list[Admission], list[Admission], Admission]:
        governor = GovernedGate(store, owns_store=False)
        try:
            for _ in range(47):
                await governor.settle(await governor.admit(cap_snapshot(), priced_call("i1")), None, True)
            # $0.015 is left: ten calls at once, five at $0.01 and five at $0.005, take exactly that.
            both = await asyncio.gather(*(governor.admit(cap_snapshot(), c) for pair in zip(mails, searches,
                                                                                             strict=True)
                                          for c in pair))
            free = await governor.admit(cap_snapshot(), priced_call("i3", tool="mail_read"))  # $0 passes a full cap
            return list(both[0::2]), list(both[1::2]), free
        finally:
            await governor.aclose()

    mail_admissions, search_admissions, free = asyncio.run(scenario())
    spent = (sum(a.status == "executed" for a in mail_admissions) * to_micros(0.01)
             + sum(a.status == "executed" for a in search_admissions) * PRICE)
    assert spent == to_micros(0.015)
    assert org_row(store) == CAP  # 47 x $0.005 and what the last ones reserved, to the micro-dollar
    blocked = [a for a in mail_admissions + search_admissions if a.status == "blocked"]
    assert len(blocked) >= 7
    assert all(a.message.startswith("Blocked by the org monthly cap of the org acme:") for a in blocked), blocked
    assert free.status == "executed"


def test_a_lowered_cap_is_not_overspent_by_a_lease_taken_under_the_old_one(store: Store) -> None:
    async def scenario() -> list[str]:
        governor = GovernedGate(store, owns_store=False, leases=LeaseTerms(lease_seconds=100.0))
        try:
            for _ in range(10):  # a lease sized for a long while under $1
                await governor.settle(await governor.admit(capped(1.0), priced_call()), None, True)
            after = [await governor.admit(capped(0.06), priced_call()) for _ in range(5)]  # a reload lowers it
            return [a.status for a in after]
        finally:
            await governor.aclose()

    assert asyncio.run(scenario()) == ["executed", "executed", "blocked", "blocked", "blocked"]
    assert org_row(store) == to_micros(0.06)


def test_a_leased_call_is_decided_by_the_snapshot_it_comes_with_not_by_the_decision_kept_from_the_last(
        store: Store) -> None:
    # A covered call's decision is worked out once per snapshot, profile, tool and price and kept (its leased lane): a
    # reload that makes the same tool held, or that lowers its price, is obeyed by the very next call.
    held = make_snapshot({"p": {"template": "balanced", "routing": {"to": "caller"}}},
                         org={**OWNERS_ORG, "caps": {"monthly_usd": 1.0}})

    async def scenario() -> list[str]:
        governor = GovernedGate(store, owns_store=False)
        try:
            seen = []
            for snapshot in (capped(1.0), capped(1.0), held, capped(1.0)):
                admission = await governor.admit(snapshot, priced_call(tool="mail_send", to="x"))
                seen.append(admission.status)
                if admission.status == "executed":
                    await governor.settle(admission, None, True)
            return seen
        finally:
            await governor.aclose()

    assert asyncio.run(scenario()) == ["executed", "executed", "pending", "executed"]
    assert org_row(store) == 3 * to_micros(0.01)


def test_a_killed_router_leaves_its_lease_counted_and_its_next_start_gives_back_what_it_never_issued(
        store_url: str, store: Store) -> None:
    router = "router-restarted"
    proc = _racer(store_url, "lease", router, "60")
    assert proc.stdout is not None
    charged = json.loads(proc.stdout.readline())["charged"]
    (lease,) = lease_rows(store, router=router, state="open", scope="org:acme")
    assert org_row(store) == lease["granted"]  # the whole lease counts against the cap while it is out
    assert charged <= lease["issued"] < lease["granted"]  # 20 calls at $0.002; issued a little ahead of them
    _kill_9(proc)
    # As the router left it: its keeper may have moved `issued` further ahead of its calls since the first read.
    (lease,) = lease_rows(store, id=lease["id"])
    assert org_row(store) == lease["granted"]  # still counted: nobody knows what its last calls cost
    assert charged <= lease["issued"] < lease["granted"]
    assert reconcile_leases(store) == []  # not expired: another router leaves it alone

    async def restart() -> None:  # the same router starting again knows its last process is gone
        governor = GovernedGate(store, owns_store=False, router_id=router)
        await governor.start(Recorder())
        await governor.aclose()

    asyncio.run(restart())
    assert org_row(store) == lease["issued"] >= charged  # what its calls may have cost stays spent, never less
    (closed,) = lease_rows(store, id=lease["id"])
    assert (closed["state"], closed["granted"]) == ("reconciled", lease["issued"])
    (row,) = [r for r in read_audit(store) if r["event"] == "reconciled"]
    assert row["actor"] == router
    assert row["detail"]["returned"] == lease["granted"] - lease["issued"]


def test_a_lease_its_router_let_expire_is_reconciled_by_anyone(store_url: str, store: Store) -> None:
    proc = _racer(store_url, "lease", "router-gone", "1")
    assert proc.stdout is not None
    charged = json.loads(proc.stdout.readline())["charged"]
    _kill_9(proc)
    (lease,) = lease_rows(store, router="router-gone", state="open", scope="org:acme")
    stale = {r["scope"]: r for r in spend_report(store)}["org:acme"]
    assert stale["micros"] == lease["granted"]

    async def expired() -> bool:
        return bool(await asyncio.to_thread(reconcile_leases, store))

    asyncio.run(until(expired, 10.0))
    assert org_row(store) == lease["issued"] >= charged
    report = {r["scope"]: r for r in spend_report(store)}["org:acme"]
    assert (report["leased"], report["stale"]) == (0, 0)

    async def reconciled_by_a_live_router() -> list[dict[str, object]]:
        proc = _racer(store_url, "lease", "router-gone-too", "1")  # another lease left to expire
        assert proc.stdout is not None
        proc.stdout.readline()
        _kill_9(proc)
        governor = GovernedGate(store, owns_store=False, router_id="router-alive", leases=LeaseTerms(ttl_seconds=1))
        try:
            await governor.start(Recorder())

            async def closed() -> bool:
                return any(r["detail"]["router"] == "router-gone-too" for r in
                           await asyncio.to_thread(read_audit, store, event="reconciled"))

            await until(closed, 30.0)
            return await asyncio.to_thread(read_audit, store, event="reconciled")
        finally:
            await governor.aclose()

    rows = asyncio.run(reconciled_by_a_live_router())
    (row,) = [r for r in rows if r["detail"]["router"] == "router-gone-too"]
    assert row["actor"] == "router-alive"  # who reconciled it; the detail names the lease's own router


def test_a_lease_reconciled_under_a_live_router_never_lets_it_pass_the_cap(store: Store) -> None:
    """Reconciled by mistake (another router took it for dead): its router admits no more against it than it
    had issued, which stays counted, and takes a new lease for the rest."""
    async def scenario() -> tuple[int, int]:
        governor = GovernedGate(store, owns_store=False)
        try:
            executed = charged = 0
            for n in range(80):
                if n == 20:
                    await asyncio.to_thread(reconcile_leases, store, governor._keeper.router)
                admission = await governor.admit(cap_snapshot(), priced_call())
                if admission.status == "executed":
                    executed += 1
                    charged += to_micros((await governor.settle(admission, 0.004, True)).charged)
                assert org_row(store) <= CAP
            return executed, charged
        finally:
            await governor.aclose()

    executed, charged = asyncio.run(scenario())
    assert charged <= org_row(store) <= CAP
    assert executed >= 20
    assert [r["state"] for r in lease_rows(store, scope="org:acme")].count("reconciled") == 1


def test_a_sync_that_only_renews_a_lease_another_router_reconciled_writes_nothing_and_drops_it(store: Store) -> None:
    """A sync that moves no spend writes a lease's row without locking it first: one reconciled meanwhile (its router
    was taken for dead) stays as the reconciliation left it, and the router no longer admits against it."""
    book = LeaseBook("router-slow", LeaseTerms())
    needs = book.needs(CapSet("acme", CAP, None, None, False, False, "p.toml"), "p", "run-1", current_month())
    first = Waiter(needs, PRICE)
    sync(store, book, [first])
    assert first.held is not None
    assert len(book) == 1
    book.settle(first.held, PRICE, PRICE)
    reconciled = reconcile_leases(store, "router-slow", by="router-other")
    assert len(reconciled) == 1
    (lease,) = book._leases.values()
    lease.renewed = 0.0  # due for renewal: the sync's only step writes its row, moving no spend
    spent = org_row(store)

    assert sync(store, book, [])
    assert len(book) == 0  # lost: its next call takes a new lease
    (row,) = lease_rows(store, scope="org:acme")
    assert (row["state"], row["granted"]) == ("reconciled", reconciled[0]["issued"])
    assert org_row(store) == spent


def test_an_idle_lease_goes_back_and_the_row_is_what_was_charged(store: Store) -> None:
    async def scenario() -> None:
        governor = GovernedGate(store, owns_store=False, leases=LeaseTerms(idle_seconds=0.2))
        try:
            for _ in range(3):
                await governor.settle(await governor.admit(cap_snapshot(), priced_call()), 0.002, True)
            assert org_row(store) >= to_micros(0.006)

            async def returned() -> bool:
                return await asyncio.to_thread(lease_rows, store, state="open") == []

            await until(returned, 10.0)
        finally:
            await governor.aclose()

    asyncio.run(scenario())
    assert org_row(store) == to_micros(0.006)
    (lease,) = lease_rows(store, scope="org:acme")
    assert (lease["state"], lease["granted"], lease["charged"]) == ("returned", 6000, 6000)


@pytest.fixture
def two_stores(store_url: str) -> Iterator[tuple[Store, Store]]:
    """Two routers' own connections to one store."""
    stores = (open_store(store_url), open_store(store_url))
    yield stores
    for s in stores:
        s.close()


def test_a_prepaid_balance_is_leased_the_same_way(two_stores: tuple[Store, Store]) -> None:
    snapshot = make_snapshot({"p": {"template": "permissive"}}, org={**OWNERS_ORG, "prepaid": True})
    add_balance(two_stores[0], "acme", to_micros(0.05), "alice")  # ten searches

    async def scenario() -> list[str]:
        governors = [GovernedGate(s, owns_store=False) for s in two_stores]
        try:
            admitted = await asyncio.gather(*(governors[n % 2].admit(snapshot, priced_call(f"i{n}"))
                                              for n in range(40)))
            held = leased_balance(two_stores[0], "acme")
            assert held["leased"] == to_micros(0.05)  # all of it out on leases, none settled yet
            assert read_balance(two_stores[0], "acme") == 0
            for n, a in enumerate(admitted):
                if a.status == "executed":
                    await governors[n % 2].settle(a, 0.003, True)  # $0.002 of each comes back
            return [a.status for a in admitted]
        finally:
            for g in governors:
                await g.aclose()

    statuses = asyncio.run(scenario())
    assert statuses.count("executed") == 10
    assert read_balance(two_stores[0], "acme") == to_micros(0.05 - 10 * 0.003)
    assert leased_balance(two_stores[0], "acme") == {"leased": 0, "stale": 0}


def test_an_approved_hold_may_use_what_its_routers_own_lease_holds(store: Store) -> None:
    """The router's lease holds all the cap's headroom; the hold's own reservation still finds room."""
    async def scenario() -> str:
        governor = GovernedGate(store, owns_store=False, leases=LeaseTerms(lease_seconds=100.0, idle_seconds=3600))
        await governor.start(Recorder())
        try:
            for _ in range(40):
                await governor.settle(await governor.admit(cap_snapshot(), priced_call()), None, True)
            assert org_row(store) == CAP  # the rest of the cap is out on this router's lease
            rid = (await governor.admit(cap_snapshot(), mail())).request_id
            assert rid is not None
            return (await governor.decide(rid, "approve", PARENT)).status
        finally:
            await governor.aclose()

    assert asyncio.run(scenario()) == "executed"
    assert org_row(store) == to_micros(40 * 0.005 + 0.004)


def test_handler_spend_says_what_leases_hold(store: Store) -> None:
    async def scenario() -> dict[str, Any]:
        governor = GovernedGate(store, owns_store=False, leases=LeaseTerms(idle_seconds=3600))
        try:
            admission = await governor.admit(cap_snapshot(), priced_call())
            report = {r["scope"]: r for r in spend_report(store)}
            await governor.settle(admission, None, True)
            return report
        finally:
            await governor.aclose()

    during = asyncio.run(scenario())
    assert during["org:acme"]["micros"] == during["org:acme"]["leased"] >= PRICE
    after = {r["scope"]: r for r in spend_report(store)}
    assert (after["org:acme"]["micros"], after["org:acme"]["leased"]) == (PRICE, 0)
