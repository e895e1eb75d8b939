"""What each outcome tells the model of retrying (`_meta["handler/retry"]`, docs/router.md "Retrying"), on a real
router and the echo connector."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.governance.gate import Settlement
from reconciler.router.outcomes import executed_result, priced_note
from tests.fixtures.harness import RawClient, run, serving


def told(result: dict[str, Any]) -> tuple[str, str, str | None]:
    """The error code, the retry advice and the router's cause of a result that was not executed."""
    assert result["isError"] is True, result
    return json.loads(result["content"][0]["text"])["error"], result["_meta"]["handler/retry"], \
        result["_meta"].get("handler/cause")


def test_each_failure_says_whether_calling_again_can_help(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            cases = [
                (("echo_misbehave", {"mode": "error"}), ("empty_text", "never", None)),  # about the call itself
                (("echo_misbehave", {"mode": "error", "retry": "later"}), ("empty_text", "later", None)),
                (("echo_misbehave", {"mode": "bad_code"}), ("unavailable", "later", "undeclared_error")),
                (("echo_misbehave", {"mode": "rpc_error"}), ("unavailable", "later", "connector_error")),
                (("echo_misbehave", {"mode": "wrong_type"}), ("unavailable", "later", "output_invalid")),
                (("echo_say", {"text": 3}), ("invalid_arguments", "never", None)),
                (("echo_shout", {"text": "x"}), ("invalid_arguments", "never", None)),
            ]
            for (tool, arguments), expected in cases:
                assert told(await c.call(tool, arguments)) == expected, (tool, arguments)
            executed = await c.call("echo_say", {"text": "fine"})
            assert "handler/retry" not in executed["_meta"]  # only what was not executed says it
            await c.close()

    run(scenario())


@settings(max_examples=300, deadline=None)
@given(charged=st.floats(min_value=0, max_value=1e7, allow_nan=False),
       remaining=st.floats(min_value=0, max_value=1e9, allow_nan=False))
def test_a_capped_calls_note_reads_as_the_plain_one(charged: float, remaining: float) -> None:
    """The note a capped call's result carries is built from a head kept per price (for speed): it must be, byte for
    byte, the plain note JSON-encoded."""
    expected = orjson.dumps(priced_note(Settlement(charged, remaining)))
    assert executed_result({"text": "x"}, Settlement(charged, remaining)).note == expected
    assert executed_result({"text": "x"}, Settlement(charged, remaining)).note == expected  # the head, reused


@settings(max_examples=500, deadline=None)
@given(charged=st.integers(min_value=0, max_value=10**10), remaining=st.one_of(
    st.integers(min_value=0, max_value=10**16), st.sampled_from([0, 1, 10, 999_999, 10**6, 10**15 - 1, 10**15])))
def test_a_capped_calls_note_in_whole_micros_reads_as_the_plain_one(charged: int, remaining: int) -> None:
    """The amounts governance tells are whole micros: the budget's digits come from orjson's shortest form (for
    speed), and must be, byte for byte, the plain note's, from a micro to past where that form turns exponential."""
    settlement = Settlement(charged / 1_000_000, remaining / 1_000_000)
    assert executed_result({"text": "x"}, settlement).note == orjson.dumps(priced_note(settlement))
