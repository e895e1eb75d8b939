"""The rows of held calls: each state change happens once, whoever asks how often."""

from __future__ import annotations

from typing import Any

from reconciler.governance.store import Store
from reconciler.governance.store.holds import (
    approved_ids,
    count_holds,
    fetch_hold,
    fetch_holds,
    insert_hold,
    set_claimed,
    set_decided,
    set_finished,
)


def _values(hold_id: str) -> dict[str, Any]:
    return {"id": hold_id, "revision": "r1", "profile": "p", "instance": "i", "parent_instance": None,
            "interface": "mail/v1", "tool": "mail_send", "binding": "mail-b", "arguments": {"to": "x"},
            "cost": 10_000, "approver": {"to": "owners"}, "reason": "held", "trace": [{"layer": "guardrails"}]}


def test_a_hold_is_decided_claimed_and_finished_once(store: Store) -> None:
    with store.begin() as tx:
        insert_hold(tx, _values("req_1"))
    assert fetch_hold(store, "req_nope") is None
    assert (count_holds(store, ("pending",)), approved_ids(store, 10)) == (1, [])
    with store.begin() as tx:
        assert not set_claimed(tx, "req_1", "router-a")  # not approved yet
        assert set_decided(tx, "req_1", "approved", "alice", "")
        assert not set_decided(tx, "req_1", "rejected", "bob", "rejected by bob")
    assert approved_ids(store, 10) == ["req_1"]
    with store.begin() as tx:
        assert set_claimed(tx, "req_1", "router-a")
        assert not set_claimed(tx, "req_1", "router-b")
        set_finished(tx, "req_1", "executed", {"sent": True}, "", 20_000)
    row = fetch_hold(store, "req_1")
    assert row is not None
    assert (row["state"], row["decided_by"], row["claimed_by"], row["result"], row["charged"]) == (
        "executed", "alice", "router-a", {"sent": True}, 20_000)
    assert [r["id"] for r in fetch_holds(store, ("executed",), 10)] == ["req_1"]
    assert fetch_holds(store, ("pending",), 10) == []
