"""Step 6: the per-call timeout, concurrency per instance and calls per run, from the interface and the binding."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.echo_tree import write_echo_tree
from fixtures.harness import RawClient, exchange, log_lines, run, short_dir

from reconciler.router.errors import ToolError
from reconciler.router.limits import LimitBook
from reconciler.router.server import Router


@pytest.fixture
def tight_root() -> Iterator[Path]:
    # The binding tightens the interface's limits: the effective ones are the binding's.
    with short_dir() as root:
        yield write_echo_tree(root / "t", limits={"timeoutSeconds": 30, "maxConcurrent": 4, "maxCallsPerRun": 100},
                              binding_limits={"timeoutSeconds": 0.5, "maxConcurrent": 1, "maxCallsPerRun": 3})


def sleep(seconds: float, instance: str) -> dict[str, Any]:
    return {"name": "echo_misbehave", "arguments": {"mode": "sleep", "seconds": seconds},
            "_meta": {"handler/instance": instance}}


def test_a_call_over_its_timeout_is_unavailable(tight_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        result = (await c.request("tools/call", sleep(5, "i-1")))["result"]
        assert result["structuredContent"]["error"] == "unavailable"
        assert result["_meta"]["handler/cause"] == "timeout"
        assert "0.5 s" in result["structuredContent"]["message"]
        assert log_lines(router)[-1]["cause"] == "timeout"

    exchange(tight_root, run_dir, script)


def test_concurrency_is_counted_per_instance(tight_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        # maxConcurrent 1: i-1's second call waits for its first and runs out of time waiting;
        # i-2 is another agent run and is not held back by i-1.
        await c.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": sleep(0.3, "i-1")})
        await c.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": sleep(0.3, "i-1")})
        await c.send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": sleep(0.05, "i-2")})
        replies = {r["id"]: r["result"] for r in [await c.recv() for _ in range(3)]}
        assert replies[1]["structuredContent"] == {"text": "slept"}
        assert replies[3]["structuredContent"] == {"text": "slept"}
        assert replies[2]["_meta"]["handler/cause"] in {"concurrency", "timeout"}

    exchange(tight_root, run_dir, script)


def test_calls_per_run_are_counted_per_instance(tight_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        say = {"name": "echo_say", "arguments": {"text": "x"}, "_meta": {"handler/instance": "run-a"}}
        for _ in range(3):
            assert (await c.request("tools/call", say))["result"]["isError"] is False
        over = (await c.request("tools/call", say))["result"]
        assert over["_meta"]["handler/cause"] == "calls_per_run"
        assert "maxCallsPerRun" in over["structuredContent"]["message"]
        other = {**say, "_meta": {"handler/instance": "run-b"}}
        assert (await c.request("tools/call", other))["result"]["isError"] is False

    exchange(tight_root, run_dir, script)


def test_invalid_arguments_do_not_count_against_the_run(tight_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        for _ in range(5):
            await c.request("tools/call", {"name": "echo_say", "arguments": {}, "_meta": {"handler/instance": "r"}})
        assert router.services.limits.calls_made(("tester", "r", "echo/v1")) == 0

    exchange(tight_root, run_dir, script)


def test_slots_are_handed_over_in_arrival_order() -> None:
    async def scenario() -> list[int]:
        book = LimitBook()
        key = ("p", "i", "x/v1")
        order: list[int] = []
        assert await book.acquire(key, 1)

        async def waiter(n: int) -> None:
            await book.acquire(key, 1)
            order.append(n)
            book.release(key)

        tasks = [asyncio.create_task(waiter(n)) for n in range(3)]
        cancelled = asyncio.create_task(waiter(99))
        await asyncio.sleep(0)
        cancelled.cancel()
        book.release(key)
        await asyncio.gather(*tasks)
        assert book.running(key) == 0
        return order

    assert run(scenario()) == [0, 1, 2]


def test_no_limit_takes_no_slot_and_the_run_count_refuses_past_its_cap() -> None:
    async def scenario() -> None:
        book = LimitBook()
        assert not await book.acquire(("p", "i", "x/v1"), None)
        book.count_call(("p", "i", "x/v1"), 1)
        with pytest.raises(ToolError) as refused:
            book.count_call(("p", "i", "x/v1"), 1)
        assert refused.value.cause == "calls_per_run"

    run(scenario())
