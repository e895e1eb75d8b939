"""The lanes (`governance/lanes.py`, the governance room's one module written for speed) against a plain version of
the same rules: whatever calls come, in whatever order they settle and whatever takes fall between, the trail and
the charges it leaves are those a call-by-call ledger would leave, and every decision it writes is named by the
settlement of its call. A capped profile's calls take a leased lane, whose leases must end charged with what the
ledger owes and holding nothing reserved, and each call is told the budget the ledger has left once it is settled
(the credit the lanes carve from the leases, `LeaseBook.carve`, is not spent).

The plain version charges each call on its own (what `charging.charge_call` says of a call: a success its report,
never more than its price; a failure nothing, or what it may have cost) and counts it once, however often it is
settled. The lanes count calls in tallies, carry decisions across takes and write rows late; the sums must agree.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.governance.gate import Admission
from reconciler.governance.lanes import Records
from reconciler.governance.leases import Cut, Lease, LeaseBook, LeaseTerms
from reconciler.governance.ledger import current_month, month_span
from reconciler.governance.rulebook import to_micros
from reconciler.governance.rulebook_cache import RulebookCache
from reconciler.governance.store.audit import AuditRow
from tests.governance.builders import OWNERS_ORG, fields, make_snapshot, priced_call

FREE = make_snapshot({"p": {"template": "permissive"}}, org=dict(OWNERS_ORG))
CAPPED = make_snapshot({"p": {"template": "permissive"}}, org={**OWNERS_ORG, "caps": {"monthly_usd": 1_000_000.0}})
PRICE = to_micros(0.005)  # search_query's price in the builders' tree: what a lane call reserves
REPORTS = {"none": None, "price": PRICE, "less": PRICE // 3, "more": PRICE * 2}


@dataclass(frozen=True)
class Step:
    """One call: its instance, what it reports, whether it succeeds, the takes after it began, whether the oldest
    call still running settles then, and whether that one is settled twice."""

    instance: str
    report: str
    ok: bool
    takes: int
    settle_oldest: bool
    twice: bool


steps = st.lists(st.builds(Step, st.sampled_from(["a", "b"]), st.sampled_from(list(REPORTS)), st.booleans(),
                           st.sampled_from([0, 0, 0, 1, 2]), st.booleans(), st.booleans()), min_size=1, max_size=40)


def plain_charge(reported: int | None, ok: bool) -> tuple[int, bool]:
    """The reference: what one call is charged (micros), and whether its report is a pricing violation."""
    if not ok:
        return (0 if reported is None else min(reported, PRICE)), False
    if reported is None:
        return PRICE, False
    return min(reported, PRICE), reported > PRICE


def counted(rows: list[AuditRow]) -> Counter[str]:
    """Calls per event in the trail: a tally row counts its `calls`, any other settlement row one."""
    seen: Counter[str] = Counter()
    for row in map(fields, rows):
        if row["event"] in ("settled", "released"):
            seen[row["event"]] += json.loads(row["detail"]).get("calls", 1) if row["detail"] else 1
        elif row["event"] == "pricing_violation":
            seen["violation"] += 1
    return seen


def leased_records() -> tuple[Records, LeaseBook, Lease]:
    """Lanes with a book holding one lease on the org's cap, with room for every call a test makes (as a sync of the
    keeper leaves one: `leases.sync`)."""
    book = LeaseBook("router-1", LeaseTerms())
    cache = RulebookCache()
    caps = cache.rulebook(CAPPED).entry("p", "search_query").caps  # type: ignore[union-attr]
    (need,) = book.needs(caps, "p", "a", current_month()).leased
    lease = Lease(need.cut, need.cap)
    lease.granted = lease.issued = PRICE * 1000
    lease.bound()
    book._leases[need.cut] = lease  # what a sync would have granted and issued
    return Records(cache, leases=book), book, lease


@settings(max_examples=200, deadline=None)
@given(steps, st.booleans())
def test_the_lanes_leave_the_trail_and_charges_of_a_call_by_call_ledger(calls: list[Step], capped: bool) -> None:
    records, book, lease = leased_records() if capped else (Records(RulebookCache()), None, None)
    snapshot = CAPPED if capped else FREE
    rows: list[AuditRow] = []
    charged: Counter[str] = Counter()
    running: list[tuple[Admission, Step]] = []
    expected: Counter[str] = Counter()
    owed: Counter[str] = Counter()

    def take(everything: bool = False) -> None:
        taken, charges = records.take(everything)
        rows.extend(taken)
        for scopes, _month, micros in charges:
            charged[scopes[0]] += micros  # the instance's row

    def settle_oldest() -> None:
        admission, step = running.pop(0)
        assert admission.ticket is not None
        reported = REPORTS[step.report]
        settlement = admission.ticket.settle(admission, None if reported is None else reported / 1e6, step.ok)
        if step.twice:
            assert admission.ticket.settle(admission, None, True).charged == 0.0  # counted and charged once
        micros, violation = plain_charge(reported, step.ok)
        owed[f"instance:p/{step.instance}"] += micros
        if lease is not None:  # what the ledger has left: the lease less what was charged and what still runs
            assert settlement.remaining == (lease.limit - sum(owed.values()) - PRICE * len(running)) / 1e6
        expected["settled" if step.ok else "released"] += 1
        expected["violation"] += violation

    for step in calls:
        admission = records.admit(snapshot, priced_call(step.instance))
        assert admission is not None
        assert getattr(admission.ticket, "leased", None) is capped
        running.append((admission, step))
        for _ in range(step.takes):
            take()
        if step.settle_oldest:
            settle_oldest()
    take(everything=True)  # the last take (a router closing): the decision of every call still running is written
    while running:  # settled after it: each settlement names the request id its decision was written with
        settle_oldest()
    take()
    if book is not None:
        book.fold()  # as the keeper does before every sync: the lanes' credit back on the leases
    assert counted(rows) == +expected
    trail = [fields(row) for row in rows]
    decided = {row["request_id"] for row in trail if row["event"] == "decided"}
    named = [row["request_id"] for row in trail
             if row["event"] in ("settled", "released") and row["request_id"] is not None]
    assert sorted(named) == sorted(decided), "each decision written is named by one settlement, and only those"
    assert +charged == +owed  # the instances' rows: counted through the backlog, capped or not
    assert records.violations == expected["violation"]
    assert len(records) == 0
    assert records.running == 0
    if lease is not None:  # the org's cap: spent from its lease, every reservation given back
        assert (lease.charged, lease.reserved) == (sum(owed.values()), 0)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 12)), min_size=1, max_size=6))
def test_bursts_of_calls_charged_their_price_between_two_takes_are_counted_call_by_call(
        bursts: list[tuple[str, int]]) -> None:
    """The common case the lanes count apart, with less to add: calls settled at their price before any take."""
    records = Records(RulebookCache())
    rows: list[AuditRow] = []
    owed: Counter[str] = Counter()
    charged: Counter[str] = Counter()
    for instance, calls in bursts:
        for _ in range(calls):
            admission = records.admit(FREE, priced_call(instance))
            assert admission is not None
            assert admission.ticket is not None
            assert admission.ticket.settle(admission, None, True).charged == PRICE / 1e6
            owed[f"instance:p/{instance}"] += PRICE
        taken, charges = records.take()
        rows.extend(taken)
        for scopes, _month, micros in charges:
            charged[scopes[0]] += micros
    assert counted(rows) == Counter(settled=sum(calls for _, calls in bursts))
    assert charged == owed


def test_a_leased_lane_carves_its_credit_in_growing_slices_and_a_lease_near_its_end_a_call_at_a_time() -> None:
    """The credit the lanes carve from a lease (`LeaseBook.carve`): one call's price first, twice as many calls at
    each carve after, never more than 64 calls or half the room left; a fold gives back what no call took and counts
    what the calls spent. A lease with room for three calls admits exactly three."""
    records, book, lease = leased_records()
    admitted = []
    for _ in range(200):
        admission = records.admit(CAPPED, priced_call("a"))
        assert admission is not None
        assert admission.ticket is not None
        admitted.append(admission)
        assert lease.credit < 64 * PRICE
        assert lease.reserved == len(admitted) * PRICE + lease.credit  # the running calls and the credit
    assert lease.credit > 0  # carved for the calls to come
    for admission in admitted[:150]:
        assert admission.ticket is not None
        admission.ticket.settle(admission, None, True)
    book.fold()
    assert (lease.credit, lease.spent, lease.charged, lease.reserved) == (0, 0, 150 * PRICE, 50 * PRICE)

    records, book, lease = leased_records()
    lease.granted = lease.issued = lease.charged + 3 * PRICE
    lease.bound()
    running = [records.admit(CAPPED, priced_call("a")) for _ in range(3)]
    assert all(admission is not None for admission in running)
    assert records.admit(CAPPED, priced_call("a")) is None  # no room: the call waits for the keeper
    first = running[0]
    assert first is not None
    assert first.ticket is not None
    assert first.ticket.settle(first, None, False).remaining == PRICE / 1e6  # released: its price is room again
    assert records.admit(CAPPED, priced_call("a")) is not None
    assert records.admit(CAPPED, priced_call("a")) is None


def test_runs_that_share_a_lease_spend_it_exactly_and_each_call_is_told_the_ledgers_budget() -> None:
    """An org cap beside each run's own cap: the calls of two runs take from the org's lease, each run's also from
    its own. Whatever the order and the folds, the org's lease ends charged every call and holding nothing, and
    every call is told exactly what the ledger has left of the org's cap (the other run's credit is not spent)."""
    snapshot = make_snapshot({"p": {"template": "permissive", "caps": {"instance_usd": 1_000_000.0}}},
                             org={**OWNERS_ORG, "caps": {"monthly_usd": 1_000_000.0}})
    book = LeaseBook("router-1", LeaseTerms())
    cache = RulebookCache()
    caps = cache.rulebook(snapshot).entry("p", "search_query").caps  # type: ignore[union-attr]
    leases: dict[Cut, Lease] = {}
    for instance in ("a", "b"):
        for need in book.needs(caps, "p", instance, current_month()).leased:
            if need.cut not in leases:
                lease = leases[need.cut] = Lease(need.cut, need.cap)
                lease.granted = lease.issued = PRICE * (500 if need.field == "org" else 1000)
                lease.bound()
                book._leases[need.cut] = lease
    (org,) = [lease for cut, lease in leases.items() if cut.scope and cut.scope.startswith("org:")]
    records = Records(cache, leases=book)
    calls = 0
    for n in range(300):
        instance = "ab"[n % 3 % 2]  # a, b, a, a, b, a, ...
        admission = records.admit(snapshot, priced_call(instance))
        assert admission is not None
        assert admission.ticket is not None
        calls += 1
        told = to_micros(admission.ticket.settle(admission, None, True).remaining or 0.0)
        assert told == org.limit - calls * PRICE, n  # the org's lease binds: the ledger's budget left
        if n % 25 == 24:
            book.fold()
    book.fold()
    assert (org.charged, org.reserved) == (calls * PRICE, 0)


def test_a_leased_lanes_calls_take_from_the_lease_the_book_holds_now_whatever_route_they_come_by() -> None:
    """A cap that does not name the instance: every run's calls take from one lease, which the lane's ticket holds
    while the book stands. Once a sync replaces that lease (returned, then taken again), the next call of any route
    or run takes from the new one and is told its budget; the old lease is left as its calls left it."""
    records, book, old = leased_records()
    route = object()  # the router's plan of the tool: the same for every call of it while its snapshot is served
    calls = [priced_call("a"), replace(priced_call("b"), route=route), replace(priced_call("a"), route=route)]
    for call in calls:
        admission = records.admit(CAPPED, call)
        assert admission is not None
        assert admission.ticket is not None
        admission.ticket.settle(admission, None, True)
    book.fold()
    assert (old.charged, old.reserved) == (3 * PRICE, 0)

    del book._leases[old.cut]  # what a sync that returned it and took a new one leaves (`LeaseBook.apply`)
    new = Lease(old.cut, old.cap)
    new.granted = new.issued = PRICE * 10
    new.bound()
    book._leases[new.cut] = new
    book.version += 1
    for n, call in enumerate(calls, start=1):
        admission = records.admit(CAPPED, call)
        assert admission is not None
        assert admission.ticket is not None
        assert admission.ticket.settle(admission, None, True).remaining == (10 - n) * PRICE / 1e6
    book.fold()
    assert (new.charged, new.reserved) == (3 * PRICE, 0)
    assert (old.charged, old.reserved, old.credit) == (3 * PRICE, 0, 0)


def test_calls_settled_one_after_another_are_each_told_the_budget_left_when_they_settle() -> None:
    """The event loop often settles several calls with no admission between (`Records` then hands them one
    `Settlement`): each is still told exactly what the ledger has left once it is settled, and the next admission
    moves it."""
    records, book, lease = leased_records()
    running = [records.admit(CAPPED, priced_call(instance)) for instance in ("a", "b", "a")]
    told = []
    for admission in running:
        assert admission is not None
        assert admission.ticket is not None
        told.append(admission.ticket.settle(admission, None, True).remaining)
    assert told == [(1000 - 3) * PRICE / 1e6] * 3
    admission = records.admit(CAPPED, priced_call("b"))
    assert admission is not None
    assert admission.ticket is not None
    assert admission.ticket.settle(admission, None, True).remaining == (1000 - 4) * PRICE / 1e6
    failed = records.admit(CAPPED, priced_call("a"))
    assert failed is not None
    assert failed.ticket is not None
    assert failed.ticket.settle(failed, None, False).remaining == (1000 - 4) * PRICE / 1e6  # released: room again
    book.fold()
    assert (lease.charged, lease.reserved) == (4 * PRICE, 0)


def test_a_leased_lanes_calls_stop_taking_from_a_months_lease_when_the_month_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The lane's ticket holds this month's lease until the month ends: the first call after it finds that next
    month's lease is not in the book yet and waits for the keeper, spending nothing of the month before."""
    records, _, lease = leased_records()
    admission = records.admit(CAPPED, priced_call("a"))
    assert admission is not None
    _, ends = month_span()
    monkeypatch.setattr(time, "time", lambda: ends + 1.0)
    held = (lease.credit, lease.reserved)
    assert records.admit(CAPPED, priced_call("a")) is None
    assert (lease.credit, lease.reserved) == held
