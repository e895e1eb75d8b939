"""The event loop's commits of the backlog (`store.committing`), on each store: what the audit trail and the spend
rows hold afterwards is exactly what was added, in order."""

from __future__ import annotations

import asyncio

from reconciler.governance.ledger import current_month, spend_report
from reconciler.governance.store import Store
from reconciler.governance.store.audit import AuditRow, read_audit
from reconciler.governance.store.backlog import Backlog
from reconciler.governance.store.committing import loop_committer

ROWS: list[AuditRow] = [
    (1764547200.123456, "settled", None, "p", "run-1", "search_query", None, "executed",
     '{"reason":"auto","cost":5000,"binding":"b","calls":3,"first":1764547199.9876543}'),
    (1764547200.5, "decided", "req_7f3a", "p", "ünïcødé run \\ \" '", "search_query", None, "executed",
     '{"nested":{"list":[1,2.5,null,true],"text":"a \\"quoted\\" word"}}'),
    (1764547201.0, "pricing_violation", "req_7f3a", "p", "run-2", None, "router", None, "{}"),
]


def flushed(store: Store, backlog: Backlog) -> bool:
    async def commit() -> bool:
        committer = loop_committer(store)
        assert committer is not None
        try:
            return await committer.flush(backlog)
        finally:
            await committer.aclose()

    return asyncio.run(commit())


def test_the_loops_commit_writes_every_audit_row_as_given_in_order_and_adds_the_spend(store: Store) -> None:
    month = current_month()
    backlog = Backlog()
    backlog.add_rows(ROWS[:2], [(("org:acme", "profile:p"), month, 300)])
    backlog.add_spend(("org:acme",), month, 200)
    assert flushed(store, backlog)
    backlog.add_rows(ROWS[2:], [])  # audit rows alone
    assert flushed(store, backlog)
    backlog.add_spend(("profile:p", "instance:p/run-1"), month, 50)  # spend alone, onto rows that exist
    assert flushed(store, backlog)
    assert len(backlog) == 0

    found = read_audit(store)
    assert [r["id"] for r in found] == sorted(r["id"] for r in found)
    assert [(r["at"], r["event"], r["request_id"], r["profile"], r["instance"], r["tool"], r["actor"], r["status"])
            for r in found] == [row[:8] for row in ROWS]
    assert found[0]["detail"]["first"] == 1764547199.9876543
    assert found[1]["detail"] == {"nested": {"list": [1, 2.5, None, True], "text": 'a "quoted" word'}}
    assert found[2]["detail"] == {}
    assert {r["scope"]: r["micros"] for r in spend_report(store)} == {
        "org:acme": 500, "profile:p": 350, "instance:p/run-1": 50}
