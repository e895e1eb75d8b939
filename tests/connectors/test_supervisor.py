"""The supervisor of a binding's process, as the pipeline meets it: one per key, found with one question to the pool.

Its start, crash backoff, pings and disk watch are exercised through the pool and the router (test_pool.py,
test_sandbox.py, tests/security); here, what the split itself promises: the pool hands out one supervisor per
key, a supervisor no call started leaves no trace, and one the pool let go while its call waited starts its
process in the pool's table, where the pool stops it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from reconciler.connectors.pool import ConnectorPool, pool_key
from tests.fixtures.harness import load, run

DEADLINE = 15.0


async def wait_until(predicate: Callable[[], bool], what: str) -> None:
    """Wait for `predicate` under a deadline, checking as the loop turns (no fixed sleep)."""
    end = time.monotonic() + DEADLINE
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_one_supervisor_per_key_answers_the_calls_questions(echo_root: Path, echo_secret: str) -> None:
    async def scenario() -> None:
        pool = ConnectorPool(echo_root, echo_root / ".handler", sandbox=False)
        try:
            snapshot = load(echo_root)
            key = pool_key(snapshot, "echo-local")
            supervisor = pool.supervisor(key, "echo-local")
            assert pool.supervisor(key, "echo-local") is supervisor
            assert supervisor.running() is None  # nothing started by asking
            assert (supervisor.host_uid, supervisor.call_space()) == (None, None)  # unsandboxed, not running
            connector = await supervisor.connector(snapshot)
            assert supervisor.running() is connector
            assert supervisor.call_space() is None  # unsandboxed: a call's files stay in the router's folder
            assert await pool.connector(snapshot, "echo-local") is connector  # the pool's own way in, the same
            said = await connector.call_tool("echo_say", {"text": "hi"})
            assert said["structuredContent"] == {"text": "hi"}
            assert supervisor.process is not None
            assert pool.processes() == [supervisor.process.pid]
        finally:
            await pool.close()
        assert pool.processes() == []

    run(scenario())


def test_a_supervisor_no_call_started_goes_idle_without_a_trace(echo_root: Path) -> None:
    async def scenario() -> None:
        pool = ConnectorPool(echo_root, echo_root / ".handler", sandbox=False, idle_seconds=0.05)
        try:
            snapshot = load(echo_root)
            supervisor = pool.supervisor(pool_key(snapshot, "echo-local"), "echo-local")  # a call refused after
            await wait_until(lambda: supervisor.dropped, "the idle supervisor to be let go")
            assert pool.statuses == {}  # never started: neither running nor stopped
            assert pool.processes() == []
        finally:
            await pool.close()

    run(scenario())


def test_a_supervisor_let_go_while_its_call_waited_starts_in_the_pools_table(echo_root: Path,
                                                                             echo_secret: str) -> None:
    """A call holds its supervisor from step 7's start; waiting for a slot meanwhile, it may outlast `idle_seconds`.
    Its start then goes to the table's supervisor of the key, so the pool still stops that process."""
    async def scenario() -> None:
        pool = ConnectorPool(echo_root, echo_root / ".handler", sandbox=False, idle_seconds=0.05)
        snapshot = load(echo_root)
        key = pool_key(snapshot, "echo-local")
        held = pool.supervisor(key, "echo-local")
        try:
            await wait_until(lambda: held.dropped, "the waiting call's supervisor to be let go")
            connector = await held.connector(snapshot)
            assert held.process is None  # the dropped one started nothing itself
            tabled = pool.supervisor(key, "echo-local")
            assert tabled is not held
            assert tabled.running() is connector
            assert len(pool.processes()) == 1
        finally:
            await pool.close()
        assert pool.processes() == []
        assert pool.statuses["echo-local"].state == "stopped"

    run(scenario())
