"""The gate on the call path, through the GovernedGate as the router sees it: admit, handler_status, handler_decide."""

from __future__ import annotations

import dataclasses
import time

import pytest

from reconciler.governance.errors import GovernanceError
from reconciler.governance.governed import GovernedGate
from reconciler.governance.holds import FINAL_HINT, REASON_LIMIT, decide_hold, get_hold
from reconciler.governance.ledger import spend_report
from reconciler.governance.rulebook import to_micros
from reconciler.governance.store import Store
from reconciler.governance.store.audit import read_audit
from reconciler.router.builtins import run_builtin
from tests.governance.builders import OWNERS_ORG, cap_snapshot, make_snapshot, priced_call
from tests.governance.governed import PARENT, STRANGER, Recorder, mail, run


def test_the_three_outcomes(store: Store) -> None:
    snapshot = make_snapshot({"p": {"template": "restrictive"}}, org=dict(OWNERS_ORG))

    async def scenario(g: GovernedGate) -> None:
        executed = await g.admit(snapshot, priced_call())
        assert executed.status == "executed"
        assert executed.ticket is not None
        held = await g.admit(snapshot, priced_call(profile="p", tool="mail_delete", id="m1"))
        assert held.status == "blocked"
        assert held.message == "Destructive actions are not allowed for this agent (Restrictive template)."
        assert next(step["layer"] for step in held.trace) == "guardrails"

    run(scenario, store)


def test_a_hold_is_pending_at_once_with_its_arguments_stored(store: Store) -> None:
    snapshot = cap_snapshot()

    async def scenario(g: GovernedGate) -> None:
        admission = await g.admit(snapshot, mail())
        assert admission.status == "pending"
        assert admission.request_id
        assert "handler_status" in admission.message
        hold = get_hold(store, admission.request_id)
        assert hold.arguments == {"to": "ceo@example.org"}
        assert hold.state == "pending"
        assert hold.approver == {"to": "caller"}
        assert hold.binding == "mail-b"
        status = await g.status(admission.request_id, mail())
        assert status.status == "pending"
        assert (await g.status(admission.request_id, STRANGER)).status == "unknown"  # another profile
        assert (await g.status(admission.request_id, PARENT)).status == "pending"  # its orchestrator
        assert (await g.status("req_nope", mail())).status == "unknown"

    run(scenario, store)


def test_only_the_parent_instance_may_decide_a_hold_routed_to_the_caller(store: Store) -> None:
    snapshot = cap_snapshot()
    recorder = Recorder()

    async def scenario(g: GovernedGate) -> None:
        await g.start(recorder)
        rid = (await g.admit(snapshot, mail())).request_id
        assert rid is not None
        own = await g.decide(rid, "approve", mail())
        assert own.status == "blocked"
        assert "its own hold" in own.message
        other = await g.decide(rid, "approve", dataclasses.replace(priced_call("someone-else", profile="h"),
                                                                   proven=True))  # another run, proven
        assert other.status == "blocked"
        assert "only the instance that started" in other.message
        claimed = await g.decide(rid, "approve", dataclasses.replace(PARENT, proven=False))  # its id, no secret
        assert claimed.status == "unknown"  # to a claim the hold does not exist, as to any other profile
        assert (await g.status(rid, dataclasses.replace(PARENT, proven=False))).status == "unknown"
        done = await g.decide(rid, "approve", PARENT)
        assert done.status == "executed", done
        assert done.result is not None
        assert done.result["sent"] == "ceo@example.org"
        assert done.charged == 0.004  # the connector's reported cost, below the $0.01 reserved
        again = await g.decide(rid, "approve", PARENT)
        assert again.status == "blocked"
        assert "already decided" in again.message
        assert len(recorder.calls) == 1
        assert get_hold(store, rid).decided_by == "instance parent-1"

    run(scenario, store)


def test_a_hold_routed_to_a_person_cannot_be_decided_over_mcp(store: Store) -> None:
    snapshot = make_snapshot({"p": {"template": "balanced", "routing": {"to": "member", "member": "bob"}}},
                             org=dict(OWNERS_ORG))

    async def scenario(g: GovernedGate) -> None:
        rid = (await g.admit(snapshot, priced_call(profile="p", tool="mail_send"))).request_id
        assert rid is not None
        refused = await g.decide(rid, "approve", PARENT)
        assert refused.status == "blocked"
        assert "handler approvals" in refused.message

    run(scenario, store)


def test_a_rejected_hold_reads_rejected_with_the_reason_given(store: Store) -> None:
    snapshot = cap_snapshot()

    async def scenario(g: GovernedGate) -> None:
        rid = (await g.admit(snapshot, mail())).request_id
        silent = (await g.admit(snapshot, mail(n=2))).request_id
        assert rid is not None
        assert silent is not None
        too_long = "x" * (REASON_LIMIT + 1)
        with pytest.raises(GovernanceError, match=f"at most {REASON_LIMIT}"):
            decide_hold(store, rid, "reject", "alice", reason=too_long)
        assert get_hold(store, rid).state == "pending"  # a refused reason decides nothing
        decide_hold(store, rid, "reject", "alice", reason="  not to the CEO,\n ask finance first ")
        status = await g.status(rid, mail())
        assert status.status == "rejected"
        assert status.message == ("Rejected by alice: not to the CEO, ask finance first. "
                                  "This is final: the hold is never run again.")
        assert "retry" not in status.message
        assert get_hold(store, rid).decision_reason == "not to the CEO, ask finance first"
        (row,) = [r for r in read_audit(store, request_id=rid) if r["event"] == "rejected"]
        assert row["actor"] == "alice"
        assert row["detail"]["reason"] == "rejected by alice: not to the CEO, ask finance first"
        decide_hold(store, silent, "reject", "alice")
        assert (await g.status(silent, mail())).message.startswith("Rejected by alice (no reason given).")
        stopped = (await g.admit(snapshot, mail(n=3))).request_id
        assert stopped is not None
        decide_hold(store, stopped, "reject", "alice", reason="Not now.")
        assert (await g.status(stopped, mail())).message == "Rejected by alice: Not now. " + FINAL_HINT

    run(scenario, store)


def test_every_decision_leaves_one_decided_row_of_the_same_shape(store: Store) -> None:
    """Decided in memory, under the cap's lock, or held: the audit row of the decision is the same."""
    free = make_snapshot({"p": {"template": "permissive"}}, org=dict(OWNERS_ORG))  # nothing limits p

    async def scenario(g: GovernedGate) -> None:
        lane = await g.admit(free, priced_call())  # in memory, on its lane: no request id until its row is written
        assert lane.request_id is None
        rids = [(await g.admit(cap_snapshot(), priced_call())).request_id,  # under the org cap
                (await g.admit(cap_snapshot(), mail())).request_id]  # held
        await g.flush()  # the lane's call still runs: its decision is written now, with a request id of its own
        (written,) = [r for r in read_audit(store) if r["event"] == "decided" and r["request_id"] not in rids]
        for rid in [written["request_id"], *rids]:
            assert rid is not None
            (row,) = [r for r in read_audit(store, request_id=rid) if r["event"] == "decided"]
            assert row["detail"]["binding"] in ("search-b", "mail-b")
            assert set(row["detail"]) == {"reason", "cost", "binding"}
            assert row["detail"]["cost"] == to_micros(0.005 if row["tool"] == "search_query" else 0.01)

    run(scenario, store)


def test_calls_nothing_limits_settled_before_their_record_is_written_leave_one_row_per_run_tool_and_outcome(
        store: Store) -> None:
    """Decided by the revision alone, recorded without a lock: one row counts the calls of an agent run, tool and
    outcome, with the decision and what they were charged; the spend is the same as any other call's."""
    free = make_snapshot({"p": {"template": "permissive"}}, org=dict(OWNERS_ORG))
    price = to_micros(0.005)  # search_query's

    async def scenario(g: GovernedGate) -> None:
        settled = []
        started = time.time()
        # A failed call is released (charged nothing), unless it ended unanswered: then the pipeline says what it
        # may have cost, its price, and it is charged that (i2's second).
        for instance, reported, ok in (("i1", 0.002, True), ("i1", None, True), ("i1", 0.0, True),
                                       ("i1", None, False), ("i1", 0.009, True), ("i2", None, True),
                                       ("i2", 0.005, False)):
            admission = await g.admit(free, priced_call(instance))
            assert admission.status == "executed"
            settled.append((admission.request_id, (await g.settle(admission, reported, ok)).charged))
        # the 5th reported more than its price
        assert [charged for _, charged in settled] == [0.002, 0.005, 0.0, 0.0, 0.005, 0.005, 0.005]
        await g.flush()
        trail = read_audit(store, limit=100)
        counted = {(r["instance"], r["event"]): r for r in trail if r["event"] != "pricing_violation"}
        assert set(counted) == {("i1", "settled"), ("i1", "released"), ("i2", "settled"), ("i2", "released")}
        for row in counted.values():
            assert (row["request_id"], row["profile"], row["tool"]) == (None, "p", "search_query")
            assert row["status"] == ("executed" if row["event"] == "settled" else "failed")
            assert row["detail"]["reason"] == "Runs now: the permissive template maps read to auto."
            assert (row["detail"]["cost"], row["detail"]["binding"]) == (price, "search-b")
            assert started <= row["detail"]["first"] <= row["at"]
        shown = {key: {k: row["detail"][k] for k in ("calls", "reserved", "charged")} for key, row in counted.items()}
        assert shown == {("i1", "settled"): {"calls": 4, "reserved": 4 * price, "charged": to_micros(0.012)},
                         ("i1", "released"): {"calls": 1, "reserved": price, "charged": 0},
                         ("i2", "settled"): {"calls": 1, "reserved": price, "charged": price},
                         ("i2", "released"): {"calls": 1, "reserved": price, "charged": price}}
        # The pricing violation is a row of its own, as on every path: its call's run, what it reported and paid.
        assert all(rid is None for rid, _ in settled)  # no one is told a request id of these calls
        (violation,) = [r for r in trail if r["event"] == "pricing_violation"]
        assert violation["request_id"] is not None
        assert (violation["profile"], violation["instance"], violation["detail"]["tool"]) == ("p", "i1", "search_query")
        assert (violation["detail"]["reported"], violation["detail"]["reserved"]) == (to_micros(0.009), price)
        assert {r["scope"]: r["micros"] for r in spend_report(store)}["profile:p"] == to_micros(0.022)

    run(scenario, store)


def test_a_capped_call_still_running_when_the_record_is_written_has_its_decision_in_the_trail_at_once(
        store: Store) -> None:
    """Admitted against this router's leases: its decision is written with the next flush, its settlement after."""
    async def scenario(g: GovernedGate) -> None:
        admission = await g.admit(cap_snapshot(), priced_call())
        assert admission.status == "executed"
        await g.flush()
        rows = read_audit(store, request_id=admission.request_id)
        assert [(r["event"], r["status"], r["tool"]) for r in rows] == [("decided", "executed", "search_query")]
        await g.settle(admission, 0.001, True)
        await g.flush()
        rows = read_audit(store, request_id=admission.request_id)
        assert [(r["event"], r["status"]) for r in rows] == [("decided", "executed"), ("settled", "executed")]
        assert rows[1]["detail"] == {"reserved": to_micros(0.005), "charged": to_micros(0.001)}

    run(scenario, store)


def test_a_call_nothing_limits_still_running_when_the_record_is_written_leaves_its_decision_then_its_settlement(
        store: Store) -> None:
    free = make_snapshot({"p": {"template": "permissive"}}, org=dict(OWNERS_ORG))
    price = to_micros(0.005)

    async def scenario(g: GovernedGate) -> None:
        running = await g.admit(free, priced_call())
        done = await g.admit(free, priced_call())
        await g.settle(done, None, True)
        await g.flush()  # `running` has not ended: its decision is written now, on its own, with a request id
        # The trail keeps the order things happened in: `running` was decided before `done` was counted.
        (decided, counted) = read_audit(store)
        assert (decided["event"], decided["status"], decided["tool"]) == ("decided", "executed", "search_query")
        assert set(decided["detail"]) == {"reason", "cost", "binding"}
        assert decided["request_id"] is not None
        assert (counted["request_id"], counted["event"]) == (None, "settled")
        await g.settle(running, 0.001, True)
        await g.flush()  # its settlement names the request id its decision was written with
        rows = read_audit(store, request_id=decided["request_id"])
        assert [(r["event"], r["status"]) for r in rows] == [("decided", "executed"), ("settled", "executed")]
        assert rows[1]["detail"] == {"reserved": price, "charged": to_micros(0.001)}
        assert rows[0]["at"] <= rows[1]["at"]
        assert {r["scope"]: r["micros"] for r in spend_report(store)}["profile:p"] == price + to_micros(0.001)

    run(scenario, store)


def test_a_cap_added_by_a_new_revision_applies_to_the_next_call(store: Store) -> None:
    """A call nothing limits is decided once per snapshot: the next snapshot's cap is not missed."""
    free = make_snapshot({"p": {"template": "permissive"}}, org=dict(OWNERS_ORG))
    capped = make_snapshot({"p": {"template": "permissive", "caps": {"monthly_usd": 0.001}}},
                           org=dict(OWNERS_ORG), revision="r2")

    async def scenario(g: GovernedGate) -> None:
        assert (await g.admit(free, priced_call())).status == "executed"
        refused = await g.admit(capped, priced_call())
        assert (refused.status, "profile monthly cap" in refused.message) == ("blocked", True)
        assert (await g.admit(free, priced_call())).status == "executed"  # a session still on r1

    run(scenario, store)


def test_a_call_is_decided_by_its_own_snapshot_whatever_route_it_names(store: Store) -> None:
    """The gate finds a lane by the call's route only within the snapshot it worked the lane out for: the same route
    named under a snapshot with a cap takes the cap's path, and back under the first one its lane again."""
    free = make_snapshot({"p": {"template": "permissive"}}, org=dict(OWNERS_ORG))
    capped = make_snapshot({"p": {"template": "permissive", "caps": {"monthly_usd": 0.001}}},
                           org=dict(OWNERS_ORG), revision="r2")
    route = object()

    async def scenario(g: GovernedGate) -> None:
        for snapshot, status in ((free, "executed"), (free, "executed"), (capped, "blocked"), (free, "executed")):
            admission = await g.admit(snapshot, dataclasses.replace(priced_call(), route=route))
            assert admission.status == status
            if status == "executed":
                assert (await g.settle(admission, None, True)).charged == 0.005
        await g.flush()
        settled = [r for r in read_audit(store, limit=100) if r["event"] == "settled"]
        assert sum(r["detail"]["calls"] for r in settled) == 3

    run(scenario, store)


def test_a_cap_that_blocks_is_named_in_the_decided_row(store: Store) -> None:
    snapshot = make_snapshot({"p": {"template": "permissive", "caps": {"monthly_usd": 0.001}}},
                             org=dict(OWNERS_ORG))

    async def scenario(g: GovernedGate) -> None:
        refused = await g.admit(snapshot, priced_call())
        assert refused.status == "blocked"
        assert refused.request_id is not None
        await g.flush()
        (row,) = read_audit(store, request_id=refused.request_id)
        assert (row["event"], row["status"], row["detail"]["cap"]) == ("decided", "blocked", "profile monthly cap")

    run(scenario, store)


def test_a_tool_the_profile_does_not_serve_is_blocked_and_recorded(store: Store) -> None:
    async def scenario(g: GovernedGate) -> None:
        refused = await g.admit(cap_snapshot(), priced_call(tool="search_nothing"))
        assert refused.status == "blocked"
        assert refused.message == "Blocked: profile p serves no tool search_nothing in revision r1."
        assert refused.request_id is not None
        assert [r["event"] for r in read_audit(store, request_id=refused.request_id)] == ["blocked"]

    run(scenario, store)


def test_a_lane_call_settled_twice_is_counted_and_charged_once(store: Store) -> None:
    free = make_snapshot({"p": {"template": "permissive"}}, org=dict(OWNERS_ORG))

    async def scenario(g: GovernedGate) -> None:
        admission = await g.admit(free, priced_call())
        assert (await g.settle(admission, None, True)).charged == 0.005
        assert (await g.settle(admission, None, True)).charged == 0.0
        await g.flush()
        (row,) = read_audit(store)
        assert (row["event"], row["detail"]["calls"], row["detail"]["charged"]) == ("settled", 1, to_micros(0.005))
        assert {r["scope"]: r["micros"] for r in spend_report(store)}["profile:p"] == to_micros(0.005)

    run(scenario, store)


@pytest.mark.parametrize("routing", [{"to": "caller"}, {"to": "member", "member": "alice"}],
                         ids=["to-caller", "to-member"])
def test_a_hold_of_another_profile_is_answered_as_an_unknown_id_by_both_builtins(
        store: Store, routing: dict[str, str]) -> None:
    snapshot = make_snapshot({"h": {"template": "balanced", "routing": routing}, "p": {"template": "permissive"}},
                             org=dict(OWNERS_ORG))

    async def scenario(g: GovernedGate) -> None:
        rid = (await g.admit(snapshot, mail())).request_id
        assert rid is not None
        for name, extra in (("handler_status", {}), ("handler_decide", {"decision": "approve"}),
                            ("handler_decide", {"decision": "reject"})):
            told = await run_builtin(g, name, {"request_id": rid, **extra}, STRANGER)
            is_error, unknown = await run_builtin(g, name, {"request_id": "req_nope", **extra}, STRANGER)
            assert told == (is_error, {**unknown, "message": unknown["message"].replace("req_nope", rid)}), name
        assert get_hold(store, rid).state == "pending"

    run(scenario, store)
