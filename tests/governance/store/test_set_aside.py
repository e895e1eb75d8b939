"""A commit the store refuses for its data: the rows it refuses are set aside in the audit trail with the store's
reason, and every other row is recorded, rather than the whole commit retried (and refused) for good."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from reconciler.governance.errors import StoreRefusedError
from reconciler.governance.governed import GovernedGate
from reconciler.governance.ledger import current_month, spend_report
from reconciler.governance.store import Store, open_store
from reconciler.governance.store.audit import AuditRow, read_audit
from reconciler.governance.store.backlog import SET_ASIDE, Backlog
from reconciler.governance.store.tables import balances, spend
from tests.governance.builders import OWNERS_ORG, make_snapshot, priced_call
from tests.governance.store.test_committing import flushed

TOP = 2**63 - 1  # the most a spend row (BIGINT micro-dollars) holds on either store
PAST = 2**63  # a sum past it: SQLite's driver cannot bind it, PostgreSQL refuses it as a BIGINT


def _at_the_top(store: Store, scope: str) -> None:
    """A spend row so near the top that either store refuses to add 2,000 to it."""
    with store.begin() as tx:
        tx.execute(sa.insert(spend), [{"scope": scope, "month": current_month(), "micros": TOP - 1000}])


def refuse_a_row(store: Store) -> None:
    """A commit holding a spend sum either store refuses (past 64 bits): set aside, as a defect's row would be."""
    backlog = Backlog()
    backlog.add_spend(("org:acme",), current_month(), PAST)
    assert backlog.flush(store) == 1


def _row(instance: str) -> AuditRow:
    return (1764547200.0, "decided", None, "p", instance, "search_query", None, "executed", "{}")


def test_the_loops_commit_refused_puts_every_row_back_and_the_workers_sets_the_refused_one_aside(store: Store) -> None:
    month = current_month()
    backlog = Backlog()
    backlog.add_rows([_row("run-1"), _row("run-2")], [(("profile:p",), month, 2000), (("org:acme",), month, PAST)])

    with pytest.raises(StoreRefusedError, match="refused a write"):
        flushed(store, backlog)  # one statement on PostgreSQL, one transaction on SQLite: nothing lands
    assert len(backlog) == 4
    assert read_audit(store) == []

    assert backlog.flush(store) == 4
    assert len(backlog) == 0
    rows = read_audit(store)
    assert [(r["event"], r["instance"]) for r in rows] == [("decided", "run-1"), ("decided", "run-2"),
                                                          (SET_ASIDE, None)]
    aside = rows[2]
    assert aside["status"] == "refused"
    assert aside["detail"]["what"] == "spend sum"
    assert aside["detail"]["row"] == {"scope": "org:acme", "month": month, "micros": PAST}
    assert "range" in aside["detail"]["reason"] or "too large" in aside["detail"]["reason"]
    assert {r["scope"]: r["micros"] for r in spend_report(store)} == {"profile:p": 2000}


def test_after_a_refused_row_the_next_commits_go_in_whole(store: Store) -> None:
    backlog = Backlog()
    backlog.add_spend(("org:acme",), current_month(), PAST)
    backlog.flush(store)
    backlog.add_rows([_row("run-3")], [(("profile:p",), current_month(), 70)])
    assert flushed(store, backlog)  # the loop's commit again: nothing of the refused row was left behind
    assert [r["event"] for r in read_audit(store)] == [SET_ASIDE, "decided"]
    assert {r["scope"]: r["micros"] for r in spend_report(store)}["profile:p"] == 70


def test_postgresql_refuses_text_past_a_column_and_a_nul_and_each_is_set_aside_alone(pg_url: str) -> None:
    pg_store = open_store(pg_url)
    backlog = Backlog()
    backlog.add_rows([_row("run-1"), _row("r" * 300), _row("nul\x00run"), _row("run-4")], [])
    with pytest.raises(StoreRefusedError):
        flushed(pg_store, backlog)
    backlog.flush(pg_store)
    rows = read_audit(pg_store)
    assert [(r["event"], r["instance"]) for r in rows] == [
        ("decided", "run-1"), (SET_ASIDE, None), (SET_ASIDE, None), ("decided", "run-4")]
    assert rows[1]["detail"]["row"]["instance"] == "r" * 300
    assert "too long" in rows[1]["detail"]["reason"]
    assert rows[2]["detail"]["row"]["instance"] == "nul\x00run"  # JSON keeps what text cannot
    assert "NUL" in rows[2]["detail"]["reason"]
    pg_store.close()


def test_a_sum_past_64_bits_is_refused_and_set_aside_on_either_store(store: Store) -> None:
    """SQLite made such a sum a REAL and kept it without a word; now it refuses it as PostgreSQL does."""
    month = current_month()
    _at_the_top(store, "profile:p")
    backlog = Backlog()
    backlog.add_spend(("profile:p", "org:acme"), month, 2000)
    assert backlog.flush(store) == 2
    aside = [r for r in read_audit(store) if r["event"] == SET_ASIDE]
    assert [(r["detail"]["what"], r["detail"]["row"]) for r in aside] == [
        ("spend sum", {"scope": "profile:p", "month": month, "micros": 2000})]
    assert "range" in aside[0]["detail"]["reason"]
    spent = {r["scope"]: r["micros"] for r in spend_report(store)}
    assert spent == {"profile:p": TOP - 1000, "org:acme": 2000}
    assert type(spent["profile:p"]) is int  # not a float near it


def test_a_balance_past_64_bits_is_refused_and_set_aside_on_either_store(store: Store) -> None:
    with store.begin() as tx:
        tx.execute(sa.insert(balances), [{"account": "org:acme", "micros": TOP - 10}])
    backlog = Backlog()
    # A call that reserved 100 more than it cost: the difference goes back to the balance, past the top.
    backlog.add_settlement("res-1", 0, True, -100, ("org:acme",), current_month(), "org:acme")
    backlog.flush(store)
    aside = [r for r in read_audit(store) if r["event"] == SET_ASIDE]
    assert [(r["detail"]["what"], r["detail"]["row"]) for r in aside] == [
        ("balance change", {"account": "org:acme", "micros": 100})]
    with store.read() as conn:
        kept = conn.execute(sa.select(balances.c.micros)).scalar_one()
    assert kept == TOP - 10
    assert type(kept) is int


def test_a_governed_call_whose_spend_the_store_refuses_is_still_recorded_and_the_next_call_too(
        store_url: str, caplog: pytest.LogCaptureFixture) -> None:
    store = open_store(store_url)
    snapshot = make_snapshot({"p": {"template": "permissive"}}, org=dict(OWNERS_ORG))
    _at_the_top(store, "profile:p")

    async def scenario() -> None:
        governor = GovernedGate(store, owns_store=False, batch_seconds=3600)
        try:
            for _ in range(2):
                admission = await governor.admit(snapshot, priced_call())
                await governor.settle(admission, 0.002, True)
                await governor.flush()
        finally:
            await governor.aclose()

    asyncio.run(scenario())
    events = [r["event"] for r in read_audit(store)]
    assert events.count(SET_ASIDE) == 2  # each call's sum for the profile at its top
    assert events.count("settled") + events.count("decided") >= 2
    spent = {r["scope"]: r["micros"] for r in spend_report(store)}
    store.close()
    assert spent["profile:p"] == TOP - 1000
    assert spent["org:acme"] == 4000  # the other sums of both calls are recorded
    assert "set aside in the audit trail" in caplog.text
    assert "`handler audit --event set_aside` lists them" in caplog.text
