"""A connector never charges more than was reserved, and no settlement is lost (issue 11, point 2).

The binding's `[pricing]` value is the most one call may cost: a report above it is charged the
reservation and recorded as a `pricing_violation`. Every settled call reaches `handler spend`
whatever the concurrency, a commit that fails keeps its rows, a call settled after governance closed
is still recorded, and a reservation a killed router never settled is charged at the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from reconciler.config.snapshot import Snapshot
from reconciler.governance.errors import StoreError
from reconciler.governance.gate import Admission
from reconciler.governance.governed import GovernedGate
from reconciler.governance.ledger import current_month, reconcile_reservations, spend_report
from reconciler.governance.rulebook import from_micros, to_micros
from reconciler.governance.store import Store, open_store
from reconciler.governance.store.audit import audit_row, read_audit
from reconciler.governance.store.backlog import Backlog
from reconciler.governance.store.tables import reservations
from tests.governance.builders import OWNERS_ORG, make_snapshot, priced_call
from tests.governance.governed import until

PRICE = 0.005  # search_query's [pricing] in `builders.PRICES`: the most one call may cost


def capped(usd: float) -> Snapshot:
    """Profile `p` (permissive) under an org cap of `usd`."""
    return make_snapshot({"p": {"template": "permissive"}}, org={**OWNERS_ORG, "caps": {"monthly_usd": usd}})


def uncapped() -> Snapshot:
    """Profile `p` (permissive) with no cap anywhere: its calls are decided in memory."""
    return make_snapshot({"p": {"template": "permissive"}})


def org_spend(store: Store) -> int:
    return sum(r["micros"] for r in spend_report(store) if r["scope"].startswith("org:"))


def violations(store: Store) -> list[dict[str, Any]]:
    return [r for r in read_audit(store, limit=1000) if r["event"] == "pricing_violation"]


async def call_once(governor: GovernedGate, snapshot: Snapshot, i: int, reported: float) -> tuple[Admission, float]:
    """Admit one search, let it run a moment, settle it at `reported`; (admission, what the reply says it cost)."""
    admission = await governor.admit(snapshot, priced_call(f"i{i % 9}"))
    if admission.status != "executed":
        return admission, 0.0
    await asyncio.sleep((i % 7) * 0.005)  # settlements keep arriving while the backlog commits
    return admission, (await governor.settle(admission, reported, True)).charged


def test_200_calls_reporting_100_times_their_price_never_pass_a_50_cent_cap(store: Store) -> None:
    async def race() -> list[tuple[Admission, float]]:
        governor = GovernedGate(store, owns_store=False)
        try:
            return await asyncio.gather(*(call_once(governor, capped(0.50), i, PRICE * 100) for i in range(200)))
        finally:
            await governor.aclose()

    calls = asyncio.run(race())
    executed = [charged for a, charged in calls if a.status == "executed"]
    assert len(executed) == 100  # $0.50 / $0.005 reserved each
    assert all(charged == PRICE for charged in executed)  # the reservation, not the $0.50 reported
    assert sum(to_micros(c) for c in executed) <= to_micros(0.50)
    assert org_spend(store) == to_micros(0.50)
    found = violations(store)
    assert len(found) == 100
    assert found[0]["tool"] == "search_query"
    assert found[0]["detail"] == {"binding": "search-b", "tool": "search_query", "reported": to_micros(0.5),
                                  "reserved": to_micros(PRICE), "charged": to_micros(PRICE)}


def test_two_routers_on_one_store_never_pass_the_cap_together(store_url: str) -> None:
    """Two routers (two governors, each its own connection to the store) split 200 calls against one cap."""
    stores = [open_store(store_url), open_store(store_url)]

    async def race() -> list[tuple[Admission, float]]:
        governors = [GovernedGate(s, owns_store=False) for s in stores]
        try:
            return await asyncio.gather(*(call_once(governors[i % 2], capped(0.50), i, PRICE * 100)
                                          for i in range(200)))
        finally:
            for governor in governors:
                await governor.aclose()

    try:
        calls = asyncio.run(race())
        executed = [charged for a, charged in calls if a.status == "executed"]
        blocked = [a for a, _ in calls if a.status == "blocked"]
        assert len(executed) == 100, len(executed)  # $0.50 / $0.005, whichever router admitted them
        assert len(blocked) == 100
        assert all("cap" in (a.message or "") for a in blocked)
        assert sum(to_micros(c) for c in executed) <= to_micros(0.50)
        assert org_spend(stores[0]) == to_micros(0.50)
    finally:
        for s in stores:
            s.close()


def test_a_report_above_the_price_of_an_uncapped_call_is_charged_the_price(store: Store) -> None:
    async def scenario() -> tuple[float, int]:
        governor = GovernedGate(store, owns_store=False)
        try:
            return (await call_once(governor, uncapped(), 0, 1.00))[1], governor.pricing_violations
        finally:
            await governor.aclose()

    assert asyncio.run(scenario()) == (PRICE, 1)  # counted where `handler status` reads it
    assert org_spend(store) == to_micros(PRICE)
    assert [v["detail"]["reported"] for v in violations(store)] == [to_micros(1.00)]


def test_a_tool_with_no_price_is_charged_nothing_whatever_its_connector_reports(store: Store) -> None:
    async def scenario() -> tuple[float, int]:
        governor = GovernedGate(store, owns_store=False)
        try:
            admission = await governor.admit(capped(0.50), priced_call("i1", tool="mail_read"))
            assert admission.status == "executed"
            charged = (await governor.settle(admission, 1.00, True)).charged
            return charged, governor.pricing_violations
        finally:
            await governor.aclose()

    assert asyncio.run(scenario()) == (0.0, 1)
    assert org_spend(store) == 0
    found = violations(store)
    assert [(v["tool"], v["detail"]["binding"], v["detail"]["reserved"]) for v in found] == [("mail_read", "mail-b", 0)]


@pytest.mark.parametrize("snapshot", [uncapped(), capped(1000.0)], ids=["uncapped", "capped"])
def test_every_settlement_reaches_handler_spend_under_60_concurrent_calls(store: Store, snapshot: Snapshot) -> None:
    async def scenario() -> None:
        governor = GovernedGate(store, owns_store=False)
        try:
            calls = await asyncio.gather(*(call_once(governor, snapshot, i, PRICE * 0.6) for i in range(60)))
            replied = sum(to_micros(charged) for _, charged in calls)
            assert replied == 60 * to_micros(PRICE * 0.6)

            async def recorded() -> bool:  # no new call comes to push the last settlements out
                return await asyncio.to_thread(org_spend, store) == replied

            await until(recorded, 5.0)
        finally:
            await governor.aclose()

    asyncio.run(scenario())


def test_a_settlement_arriving_while_the_backlog_commits_is_not_left_behind(store: Store,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    real = store.begin

    @contextlib.contextmanager
    def slow_begin() -> Iterator[Any]:
        time.sleep(0.2)  # a commit that takes a while, as under load
        with real() as tx:
            yield tx

    monkeypatch.setattr(store, "begin", slow_begin)

    async def scenario() -> None:
        governor = GovernedGate(store, owns_store=False, batch_seconds=0.01)
        try:
            first = await governor.admit(uncapped(), priced_call("i1"))
            second = await governor.admit(uncapped(), priced_call("i2"))
            await governor.settle(first, 0.001, True)
            await asyncio.sleep(0.1)  # the backlog's commit is under way now
            await governor.settle(second, 0.002, True)  # and no call comes after this one

            async def recorded() -> bool:
                return await asyncio.to_thread(org_spend, store) == to_micros(0.003)

            await until(recorded, 3.0)
        finally:
            await governor.aclose()

    asyncio.run(scenario())


def test_a_call_settled_after_governance_closed_is_still_recorded(store: Store) -> None:
    async def scenario() -> None:
        governor = GovernedGate(store, owns_store=False)
        admission = await governor.admit(uncapped(), priced_call("i1"))
        await governor.aclose()  # `handler up` closes governance before the router: calls still run
        assert (await governor.settle(admission, 0.002, True)).charged == 0.002
        refused = await governor.admit(uncapped(), priced_call("i2"))
        assert refused.status == "blocked"
        assert "shutting down" in refused.message

    asyncio.run(scenario())
    assert org_spend(store) == to_micros(0.002)


class _Failing:
    """A store whose every transaction fails."""

    @contextlib.contextmanager
    def begin(self) -> Iterator[Any]:
        raise StoreError("the store is down")
        yield


def test_a_commit_that_fails_keeps_its_rows_for_the_next(store: Store) -> None:
    backlog = Backlog()
    backlog.add_spend(("org:acme",), current_month(), 700)
    with pytest.raises(StoreError):
        backlog.flush(_Failing())  # type: ignore[arg-type]
    backlog.add_spend(("org:acme",), current_month(), 300)
    assert backlog.flush(store) == 1
    assert org_spend(store) == 1000


def test_the_loop_takes_only_audit_rows_and_spend_and_a_failed_commit_gives_them_back() -> None:
    """What `store.committing` commits from the event loop on PostgreSQL: a backlog holding a settlement too is left
    whole to the worker's transaction."""
    backlog = Backlog()
    backlog.add_rows([audit_row("settled", profile="p", status="executed", detail={"calls": 3})],
                     [(("org:acme", "profile:p"), current_month(), 300)])
    backlog.add_spend(("org:acme",), current_month(), 200)
    taken = backlog.take_plain()
    assert taken is not None
    assert len(taken.audit) == 1
    assert taken.spend == {("org:acme", current_month()): 500, ("profile:p", current_month()): 300}
    assert len(backlog) == 0
    backlog.put_back(taken)  # the commit failed
    backlog.add_settlement("res_1", 100, True, -50, ("org:acme",), current_month(), None)
    assert backlog.take_plain() is None  # a settlement waits: nothing is taken, the worker commits it all
    assert len(backlog) == 4  # the audit row, two spend sums, the settlement


def test_a_reservation_a_killed_router_never_settled_counts_and_is_charged_at_the_next_start(store: Store) -> None:
    """A call reserved on its own (`admit_now`, as an approved hold is) whose router died before it settled."""
    governor = GovernedGate(store, owns_store=False)
    assert governor.admit_now(capped(0.50), priced_call("i1")).status == "executed"
    governor.close()  # the reservation's row is written; its settlement never comes

    assert org_spend(store) == to_micros(PRICE)  # counted at the most it may cost until reconciled
    assert reconcile_reservations(store, older_than=0.0) == 1
    assert reconcile_reservations(store, older_than=0.0) == 0
    with store.engine.connect() as conn:
        row = conn.execute(sa.select(reservations.c.state, reservations.c.charged)).one()
    assert tuple(row) == ("settled", to_micros(PRICE))
    assert org_spend(store) == to_micros(PRICE)
    reconciled = [r for r in read_audit(store) if r["event"] == "reconciled"]
    assert [from_micros(r["detail"]["charged"]) for r in reconciled] == [PRICE]
