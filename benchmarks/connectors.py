"""Connector lifecycle costs through the real router (issue 4, point 8). Prints figures; asserts none.

- cold: a session's first call to a binding whose process is not running (the start included:
  secrets, private folder, sandbox, handshake, tools/list comparison), to its result;
- warm: the first call of a new session when the binding's process already runs;
- shared: calls/s with 8 sessions sharing the one process (each session one call at a time).

Run: .venv/bin/python benchmarks/connectors.py [--rounds N] [--calls N] [--no-sandbox]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fixtures.echo_tree import TOKEN_ENV, write_echo_tree
from tests.fixtures.harness import RawClient, serving, short_dir


async def first_call_ms(root: Path, run_dir: Path, rounds: int, sandbox: bool) -> tuple[list[float], list[float]]:
    cold: list[float] = []
    warm: list[float] = []
    for _ in range(rounds):  # a router of its own per round: its first call starts the process cold
        async with serving(root, run_dir, sandbox=sandbox, call_log=False) as router:
            for kind in (cold, warm):
                client = await RawClient.connect(router.socket_path("tester"))
                started = time.perf_counter()
                await client.call("echo_say", {"text": "x"})
                kind.append((time.perf_counter() - started) * 1000)
                await client.close()
    return cold, warm


async def shared_rate(root: Path, run_dir: Path, calls: int, sandbox: bool) -> tuple[float, int]:
    async with serving(root, run_dir, sandbox=sandbox, call_log=False) as router:
        clients = [await RawClient.connect(router.socket_path("tester")) for _ in range(8)]
        for c in clients:
            await c.call("echo_say", {"text": "warm"})

        async def drive(c: RawClient) -> None:
            for _ in range(calls // 8):
                await c.call("echo_say", {"text": "x"})

        started = time.perf_counter()
        await asyncio.gather(*(drive(c) for c in clients))
        elapsed = time.perf_counter() - started
        processes = len(router.services.pool.processes())
        for c in clients:
            await c.close()
    return (calls // 8) * 8 / elapsed, processes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=8000)
    parser.add_argument("--no-sandbox", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault(TOKEN_ENV, "bench-token")
    sandbox = not args.no_sandbox
    with short_dir() as folder, short_dir() as run_dir:
        root = write_echo_tree(folder / "t")
        try:
            import uvloop
            runner = uvloop.run
        except ImportError:  # pragma: no cover
            runner = asyncio.run
        cold, warm = runner(first_call_ms(root, run_dir, args.rounds, sandbox))
        rate, processes = runner(shared_rate(root, run_dir, args.calls, sandbox))
    label = "sandboxed" if sandbox else "no sandbox"
    print(f"connector lifecycle ({label}, echo connector, {args.rounds} rounds)")
    print(f"  cold first call (start included): p50 {statistics.median(cold):8.1f} ms   max {max(cold):8.1f} ms")
    print(f"  warm first call (new session):    p50 {statistics.median(warm):8.3f} ms   max {max(warm):8.3f} ms")
    print(f"  8 sessions sharing {processes} process: {rate:,.0f} calls/s ({args.calls // 8 * 8} calls)")


if __name__ == "__main__":
    main()
