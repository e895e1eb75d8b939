"""Step 6: the per-call timeout, concurrency per instance and calls per run, from the interface and the binding."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.router.errors import ToolError
from reconciler.router.limits import LimitBook
from reconciler.router.server import Router
from tests.fixtures.echo_tree import write_echo_tree
from tests.fixtures.harness import RawClient, body, exchange, log_lines, run, short_dir


@pytest.fixture
def tight_root() -> Iterator[Path]:
    # The binding tightens the interface's limits: the effective ones are the binding's.
    with short_dir() as root:
        yield write_echo_tree(root / "t", limits={"timeoutSeconds": 30, "maxConcurrent": 4, "maxCallsPerRun": 100},
                              binding_limits={"maxConcurrent": 1, "maxCallsPerRun": 3})


@pytest.fixture
def quick_root() -> Iterator[Path]:
    with short_dir() as root:
        yield write_echo_tree(root / "t", limits={"timeoutSeconds": 30}, binding_limits={"timeoutSeconds": 0.5,
                                                                                         "maxConcurrent": 1})


def sleep(seconds: float, instance: str) -> dict[str, Any]:
    return {"name": "echo_misbehave", "arguments": {"mode": "sleep", "seconds": seconds},
            "_meta": {"handler/instance": instance}}


def test_a_call_over_its_timeout_is_unavailable(quick_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        result = (await c.request("tools/call", sleep(5, "i-1")))["result"]
        assert body(result)["error"] == "unavailable"
        assert result["_meta"]["handler/cause"] == "timeout"
        assert "0.5 s" in body(result)["message"]
        assert log_lines(router)[-1]["cause"] == "timeout"

    exchange(quick_root, run_dir, script)


@pytest.fixture
def one_slot_root() -> Iterator[Path]:
    with short_dir() as root:
        yield write_echo_tree(root / "t", limits={"timeoutSeconds": 30}, binding_limits={"maxConcurrent": 1})


def test_concurrency_is_counted_per_instance(one_slot_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        await c.call("echo_say", {"text": "warm"}, _meta={"handler/instance": "i-0"})  # the process is up
        # maxConcurrent 1: i-1's quick call waits for its slow one; i-2 is another run, not held back.
        await c.send({"jsonrpc": "2.0", "id": "slow", "method": "tools/call", "params": sleep(0.4, "i-1")})
        await _wait_for(lambda: router.services.limits.running(("tester", "i-1", "echo/v1")) == 1)
        await c.send({"jsonrpc": "2.0", "id": "waits", "method": "tools/call",
                      "params": {"name": "echo_say", "arguments": {"text": "b"}, "_meta": {"handler/instance": "i-1"}}})
        await c.send({"jsonrpc": "2.0", "id": "free", "method": "tools/call",
                      "params": {"name": "echo_say", "arguments": {"text": "c"}, "_meta": {"handler/instance": "i-2"}}})
        order = [(await c.recv())["id"] for _ in range(3)]
        assert order == ["free", "slow", "waits"]

    exchange(one_slot_root, run_dir, script)


def test_a_call_that_waits_past_its_timeout_for_a_slot_is_unavailable(quick_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        # With one timeout for every call a holder always ends before its waiter's deadline, so the
        # test holds the instance's only slot itself.
        key = ("tester", "i-1", "echo/v1")
        assert router.services.limits.try_acquire(key, 1)
        result = await c.call("echo_say", {"text": "x"}, _meta={"handler/instance": "i-1"})
        assert result["_meta"]["handler/cause"] == "concurrency"
        assert "maxConcurrent 1" in body(result)["message"]
        router.services.limits.release(key)
        assert router.services.limits.running(key) == 0

    exchange(quick_root, run_dir, script)


async def _wait_for(predicate: Any, deadline: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not predicate():
        assert loop.time() < end, "condition not met before the deadline"
        await asyncio.sleep(0.005)


def test_calls_per_run_are_counted_per_instance(tight_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        say = {"name": "echo_say", "arguments": {"text": "x"}, "_meta": {"handler/instance": "run-a"}}
        for _ in range(3):
            assert (await c.request("tools/call", say))["result"]["isError"] is False
        over = (await c.request("tools/call", say))["result"]
        assert over["_meta"]["handler/cause"] == "calls_per_run"
        assert "maxCallsPerRun" in body(over)["message"]
        other = {**say, "_meta": {"handler/instance": "run-b"}}
        assert (await c.request("tools/call", other))["result"]["isError"] is False

    exchange(tight_root, run_dir, script)


def test_a_run_id_the_router_minted_claimed_without_its_secret_spends_nothing_of_that_run(tight_root: Path,
                                                                                         run_dir: Path) -> None:
    """Another session naming a run of the router's own ids in `_meta` is counted as itself, not as that run: it cannot
    use up the run's calls (or its cap) by claiming its id (docs/agents.md)."""
    minted = "run-0123456789abcdef"

    async def script(c: RawClient, router: Router) -> None:
        claim = {"name": "echo_say", "arguments": {"text": "x"}, "_meta": {"handler/instance": minted}}
        for _ in range(3):
            assert (await c.request("tools/call", claim))["result"]["isError"] is False
        assert router.services.limits.calls_made(("tester", minted, "echo/v1")) == 0
        logged = {line["instance"] for line in log_lines(router)}
        assert len(logged) == 1
        assert logged.pop().startswith("conn-")  # the session's own run, as when it names none

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


def test_a_client_naming_a_new_run_on_every_call_cannot_grow_the_count_without_bound() -> None:
    book = LimitBook(runs_kept=100)
    active = ("p", "busy", "x/v1")
    for n in range(1_000):  # a new run per call, and one run calling all along
        book.count_call(("p", f"run-{n}", "x/v1"), 5)
        book.count_call(active, None)
        assert book.runs_counted() <= 200
    assert book.calls_made(active) == 1_000  # a run that keeps calling keeps its count across generations
    assert book.calls_made(("p", "run-999", "x/v1")) == 1
    assert book.calls_made(("p", "run-0", "x/v1")) == 0  # long idle: forgotten


def test_a_run_at_its_cap_stays_refused_across_a_generation() -> None:
    book = LimitBook(runs_kept=10)
    capped = ("p", "capped", "x/v1")
    book.count_call(capped, 1)
    for n in range(15):  # the generation turns over while the run is still calling
        book.count_call(("p", f"run-{n}", "x/v1"), None)
        with pytest.raises(ToolError):
            book.count_call(capped, 1)
    assert book.calls_made(capped) == 1
