"""Spend: reservations never overspend a cap, settle to the actual cost, and refund failures."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from reconciler.governance.governed import GovernedGate
from reconciler.governance.ledger import add_balance, current_month, read_balance, spend_report
from reconciler.governance.rulebook import to_micros
from reconciler.governance.store import Store
from reconciler.governance.store import spend as spend_rows
from reconciler.governance.store.tables import spend
from tests.governance.builders import OWNERS_ORG, cap_snapshot, make_snapshot, priced_call

HERE = Path(__file__).resolve().parent
CAP = to_micros(0.25)


def org_spend(store: Store) -> int:
    with store.engine.connect() as conn:
        value = conn.execute(sa.select(spend.c.micros).where(spend.c.scope == "org:acme",
                                                             spend.c.month == current_month())).scalar()
    return int(value or 0)


def test_months_are_calendar_months_in_utc() -> None:
    assert current_month(1_767_225_599.0) == "2025-12"  # 2025-12-31 23:59:59 UTC
    assert current_month(1_767_225_600.0) == "2026-01"


def test_200_concurrent_calls_against_a_cap_of_50_admit_exactly_50(store: Store) -> None:
    async def race() -> list[str]:
        governor = GovernedGate(store, owns_store=False)
        snapshot = cap_snapshot()
        admissions = await asyncio.gather(*(governor.admit(snapshot, priced_call(f"i{i % 9}")) for i in range(200)))
        settled = await asyncio.gather(*(governor.settle(a, None, True) for a in admissions
                                         if a.status == "executed"))
        assert all(s.charged == 0.005 for s in settled)
        assert min(s.remaining for s in settled if s.remaining is not None) == 0.0
        blocked = [a.message for a in admissions if a.status == "blocked"]
        assert all("org monthly cap" in m for m in blocked), blocked[:3]
        await governor.aclose()
        return [a.status for a in admissions]

    statuses = asyncio.run(race())
    assert statuses.count("executed") == 50
    assert statuses.count("blocked") == 150
    assert org_spend(store) == CAP


def test_two_router_processes_sharing_the_store_admit_exactly_50(store_url: str, store: Store) -> None:
    env = {**os.environ, "PYTHONPATH": f"{HERE.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs = [subprocess.Popen([sys.executable, str(HERE / "racer.py"), "admit", store_url, "100"], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for p in procs:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
    outs = [p.communicate("go\n", timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    counts = [json.loads(o) for o, _ in outs]
    assert sum(c["executed"] for c in counts) == 50
    assert sum(c["blocked"] for c in counts) == 150
    assert org_spend(store) == CAP


def test_a_call_of_no_price_under_a_cap_is_told_the_budget_its_calls_left(store: Store) -> None:
    """A capped profile's tool with no price (`mail_read`) is charged nothing and told what is left of the cap: all
    of it before any priced call, then what the priced calls left, as they are."""
    async def scenario() -> None:
        governor = GovernedGate(store, owns_store=False)
        snapshot = cap_snapshot()
        for _ in range(2):  # the first waits for the leases; the next finds them
            first = await governor.admit(snapshot, priced_call(tool="mail_read"))
            assert (await governor.settle(first, None, True)).remaining == 0.25
        for _ in range(3):
            priced = await governor.admit(snapshot, priced_call())
            assert (await governor.settle(priced, None, True)).remaining is not None
        for _ in range(3):
            free = await governor.admit(snapshot, priced_call(tool="mail_read"))
            assert free.status == "executed"
            settled = await governor.settle(free, None, True)
            assert (settled.charged, settled.remaining) == (0.0, 0.235)  # $0.25 less three searches at $0.005
        await governor.aclose()

    asyncio.run(scenario())


def test_settling_charges_the_actual_cost_and_refunds_failures(store: Store) -> None:
    async def scenario() -> None:
        governor = GovernedGate(store, owns_store=False)
        snapshot = cap_snapshot()
        first = await governor.admit(snapshot, priced_call())
        settled = await governor.settle(first, 0.002, True)
        assert (settled.charged, settled.remaining) == (0.002, 0.248)
        # What a call does not cost goes back to the router's lease at once: the budget it leaves is the cap's.
        early = await governor.admit(snapshot, priced_call())
        assert (await governor.settle(early, None, False)).remaining == 0.248
        failed = await governor.admit(snapshot, priced_call())
        refunded = await governor.settle(failed, None, False)
        assert refunded.charged == 0.0
        assert refunded.remaining == 0.248
        await governor.aclose()

    asyncio.run(scenario())
    assert org_spend(store) == to_micros(0.002)
    report = {r["scope"]: r["micros"] for r in spend_report(store)}
    assert report == {"org:acme": 2000, "profile:p": 2000, "instance:p/i1": 2000}


def test_an_empty_prepaid_balance_blocks_and_a_top_up_admits(store: Store) -> None:
    snapshot = make_snapshot({"p": {"template": "permissive"}}, org={**OWNERS_ORG, "prepaid": True})

    async def scenario() -> None:
        governor = GovernedGate(store, owns_store=False)
        refused = await governor.admit(snapshot, priced_call())
        assert refused.status == "blocked"
        assert "prepaid balance" in refused.message
        add_balance(store, "acme", to_micros(0.01), "alice")
        statuses = [(await governor.admit(snapshot, priced_call())).status for _ in range(3)]
        assert statuses == ["executed", "executed", "blocked"]
        await governor.aclose()

    asyncio.run(scenario())
    assert read_balance(store, "acme") == 0


def test_calls_nothing_limits_are_counted_in_a_batch_without_a_store_round_trip(store: Store) -> None:
    snapshot = make_snapshot({"p": {"template": "permissive"}}, org=dict(OWNERS_ORG))  # no cap, not prepaid

    async def scenario() -> None:
        governor = GovernedGate(store, owns_store=False, batch_seconds=60)  # nothing flushes on its own here
        admissions = [await governor.admit(snapshot, priced_call()) for _ in range(10)]
        assert {a.status for a in admissions} == {"executed"}
        settled = [await governor.settle(a, None, True) for a in admissions]
        assert settled[0].charged == 0.005
        assert settled[0].remaining is None  # nothing limits this spend
        assert spend_report(store) == []  # not written yet
        await governor.flush()
        report = {r["scope"]: r["micros"] for r in spend_report(store)}
        assert report["profile:p"] == to_micros(0.05)
        assert report["org:acme"] == to_micros(0.05)
        await governor.aclose()

    asyncio.run(scenario())


def test_the_spend_rows_a_process_remembers_making_stay_bounded(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client may name a new agent run on every call: each makes an instance row, and the memory of them is bounded
    while every row is still made."""
    monkeypatch.setattr(spend_rows, "KNOWN_ROWS", 10)
    for n in range(40):
        spend_rows.ensure_spend_rows(store, ["org:o", "profile:p", f"instance:p/run-{n}"], "2026-12")
        assert len(spend_rows._statements(store).known) <= 10 + 3
    scopes = {row["scope"] for row in spend_report(store, "2026-12")}
    assert {f"instance:p/run-{n}" for n in range(40)} <= scopes
