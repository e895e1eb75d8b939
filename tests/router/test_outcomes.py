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


MICROS = st.one_of(st.integers(min_value=0, max_value=10**9), st.integers(min_value=0, max_value=10**16)).map(
    lambda micros: micros / 1_000_000)


@settings(max_examples=500, deadline=None)
@given(charged=st.one_of(st.floats(min_value=0, max_value=1e7, allow_nan=False), MICROS),
       remaining=st.one_of(MICROS, st.sampled_from([0, 1, 9, 10, 11, 999_999, 10**6, 10**15 - 1, 10**15, 10**16])
                           .map(lambda micros: micros / 1_000_000)))
def test_a_capped_calls_note_reads_as_the_plain_one(charged: float, remaining: float) -> None:
    """The note a capped call's result carries is built from a head kept per price and the budget's digits as orjson
    writes them (for speed): it must be, byte for byte, the plain note JSON-encoded, for every budget governance can
    tell (whole micros, `Settlement`), from none or a micro left to past where orjson writes an exponent; and the
    note of the settlement governance hands to the calls it settles one after another, kept for the next."""
    expected = orjson.dumps(priced_note(Settlement(charged, remaining)))
    assert executed_result({"text": "x"}, Settlement(charged, remaining)).note == expected
    settlement = Settlement(charged, remaining)
    assert executed_result({"text": "x"}, settlement).note == expected  # the head, reused
    assert executed_result({"text": "x"}, settlement).note == expected  # the one governance handed out again
