"""What the lanes' records leave in the trail across the gate's periodic takes: a call decided since the last take
and still running is carried to the next, so a busy router writes its decision only if it outlives two."""

from __future__ import annotations

import json

from reconciler.governance.lanes import Records
from reconciler.governance.rulebook import to_micros
from reconciler.governance.rulebook_cache import RulebookCache
from reconciler.governance.store.audit import AuditRow
from tests.governance.builders import OWNERS_ORG, fields, make_snapshot, priced_call

FREE = make_snapshot({"p": {"template": "permissive"}}, org=dict(OWNERS_ORG))


def _events(rows: list[AuditRow]) -> list[tuple[str, str | None]]:
    return [(fields(row)["event"], fields(row)["request_id"]) for row in rows]


def test_a_call_that_ends_before_the_second_take_is_only_counted() -> None:
    records = Records(RulebookCache())
    admission = records.admit(FREE, priced_call())
    assert admission is not None
    rows, _ = records.take()
    assert rows == []  # decided since the last take (there was none): carried, not written
    assert len(records) == 1  # so the gate's flush keeps coming back for it
    admission.ticket.settle(admission, None, True)
    rows, charges = records.take()
    assert [(row["event"], row["request_id"], json.loads(row["detail"])["calls"]) for row in map(fields, rows)] == [
        ("settled", None, 1)]
    assert [micros for _, _, micros in charges] == [to_micros(0.005)]
    assert len(records) == 0


def test_a_call_running_through_two_takes_has_its_decision_written_then_its_settlement() -> None:
    records = Records(RulebookCache())
    admission = records.admit(FREE, priced_call())
    assert admission is not None
    assert records.take()[0] == []
    (decided,) = map(fields, records.take()[0])
    assert decided["event"] == "decided"
    assert decided["request_id"] is not None  # the request id its settlement will name
    admission.ticket.settle(admission, 0.001, True)
    (settled,), charges = records.take()
    assert _events([settled]) == [("settled", decided["request_id"])]
    assert [micros for _, _, micros in charges] == [to_micros(0.001)]
    assert admission.ticket.settle(admission, None, True).charged == 0.0  # settled twice: counted and charged once


def test_the_last_take_writes_the_decision_of_every_call_still_running() -> None:
    records = Records(RulebookCache())
    first = records.admit(FREE, priced_call())
    records.take()
    second = records.admit(FREE, priced_call("i2"))
    assert first is not None
    assert second is not None
    rows, _ = records.take(everything=True)
    decided = sorted((row["event"], row["instance"]) for row in map(fields, rows))
    assert decided == [("decided", "i1"), ("decided", "i2")]
    assert records.running == 2


def test_a_leased_call_is_carried_as_a_lanes_call_is() -> None:
    records = Records(RulebookCache())
    row: AuditRow = (1.0, "decided", "req_1", "p", "i1", "search_query", None, "executed", '{"reason":"r"}')
    records.decided("req_1", row)
    assert records.take()[0] == []
    assert _events(records.take()[0]) == [("decided", "req_1")]
    records.settled("req_1", priced_call(), True, 5000, 1000, None)
    assert _events(records.take()[0]) == [("settled", "req_1")]
