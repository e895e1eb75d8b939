"""The `_meta` a client adds, and the one rule for a connector's reported cost."""

from __future__ import annotations

import pytest

from reconciler.wire.meta import (
    COST,
    INSTANCE,
    INTERFACE,
    MAX_RUN_ID_CHARS,
    PARENT_INSTANCE,
    caller_meta,
    read_reported_cost,
    run_id_problem,
)


@pytest.mark.parametrize(("reported", "read"), [
    (0.25, 0.25),
    (0, 0.0),
    (3, 3.0),
    (1e300, 1e9),  # read as the most any amount may be: still above every price
    (2**70, 1e9),
    (-1, None),  # a refund is not a cost
    (True, None),  # a boolean is not a number here
    ("0.5", None),
    (float("nan"), None),
    (float("inf"), None),
    (None, None),
])
def test_a_reported_cost_counts_only_as_a_finite_number_not_below_zero(reported: object, read: float | None) -> None:
    assert read_reported_cost({"_meta": {COST: reported}}) == read


def test_a_result_without_meta_reports_no_cost() -> None:
    assert read_reported_cost({}) is None
    assert read_reported_cost({"_meta": "nope"}) is None


def test_caller_meta_names_the_interface_and_the_instances_the_environment_sets() -> None:
    assert caller_meta("ocr", {}) == {INTERFACE: "ocr"}
    env = {"HANDLER_INSTANCE": "run-1", "HANDLER_PARENT_INSTANCE": "boss", "OTHER": "x"}
    assert caller_meta("ocr", env) == {INTERFACE: "ocr", INSTANCE: "run-1", PARENT_INSTANCE: "boss"}
    assert caller_meta("ocr", {"HANDLER_INSTANCE": ""}) == {INTERFACE: "ocr"}


@pytest.mark.parametrize("run_id", ["r" * MAX_RUN_ID_CHARS, "é" * MAX_RUN_ID_CHARS, "agent 7 / step 3", "运行-一"])
def test_a_run_id_of_printable_text_up_to_128_characters_is_kept(run_id: str) -> None:
    assert run_id_problem(run_id) is None


@pytest.mark.parametrize("run_id", ["r" * (MAX_RUN_ID_CHARS + 1), "a\x00b", "a\tb", "a\nb", "a\x7fb", "a\x9bb",
                                    "a\udcffb"])
def test_a_run_id_too_long_or_holding_a_control_character_is_refused(run_id: str) -> None:
    assert run_id_problem(run_id) is not None
    with pytest.raises(ValueError, match=r"^HANDLER_PARENT_INSTANCE "):
        caller_meta("ocr", {"HANDLER_INSTANCE": "fine", "HANDLER_PARENT_INSTANCE": run_id})
