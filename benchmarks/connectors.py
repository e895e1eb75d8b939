"""Connector lifecycle costs through the real router, sandboxed and not, in one run. Prints figures; asserts none.

- cold: a session's first call to a binding whose process is not running (the start included:
  secrets, private folder, sandbox, handshake, tools/list comparison), to its result; the rounds
  alternate between a sandboxed router and a `--no-sandbox` one, so both see the same machine;
- the floor: bubblewrap alone starting `true` in the same namespaces, against `true` started plainly;
- warm: the first call of a new session when the binding's process already runs;
- shared: calls/s with 8 sessions sharing the one process (each session one call at a time).

Run: .venv/bin/python benchmarks/connectors.py [--rounds N] [--calls N]
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


async def first_call_ms(root: Path, run_dir: Path, sandbox: bool) -> tuple[float, float]:
    """One round: a router of its own, whose first call starts the process cold; then a warm first call."""
    out = []
    async with serving(root, run_dir, sandbox=sandbox, call_log=False) as router:
        for _ in range(2):
            client = await RawClient.connect(router.socket_path("tester"))
            started = time.perf_counter()
            await client.call("echo_say", {"text": "x"})
            out.append((time.perf_counter() - started) * 1000)
            await client.close()
    return out[0], out[1]


def bwrap_floor_ms(rounds: int) -> tuple[float, float]:
    """p50 of bubblewrap starting `true` in the sandbox's namespaces, and of `true` alone."""
    import shutil
    import subprocess

    bwrap = shutil.which("bwrap") or "bwrap"
    boxed = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
             *([] if os.geteuid() == 0 else ["--unshare-user"]), "--die-with-parent", "--ro-bind", "/usr", "/usr",
             "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
             "--proc", "/proc", "--dev", "/dev", "--", "/usr/bin/true"]
    times: dict[str, list[float]] = {"boxed": [], "plain": []}
    for _ in range(rounds):
        for name, command in (("boxed", boxed), ("plain", ["/usr/bin/true"])):
            started = time.perf_counter()
            subprocess.run(command, check=True)
            times[name].append((time.perf_counter() - started) * 1000)
    return statistics.median(times["boxed"]), statistics.median(times["plain"])


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
    args = parser.parse_args()
    os.environ.setdefault(TOKEN_ENV, "bench-token")
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    cold: dict[bool, list[float]] = {True: [], False: []}
    warm: dict[bool, list[float]] = {True: [], False: []}
    rates = {}
    with short_dir() as folder, short_dir() as run_dir:
        root = write_echo_tree(folder / "t")
        runner(first_call_ms(root, run_dir, True))  # once unmeasured: the page cache, the seccomp program
        for _ in range(args.rounds):
            for sandbox in (True, False):
                c, w = runner(first_call_ms(root, run_dir, sandbox))
                cold[sandbox].append(c)
                warm[sandbox].append(w)
        for sandbox in (True, False):
            rates[sandbox] = runner(shared_rate(root, run_dir, args.calls, sandbox))
    boxed, plain = bwrap_floor_ms(args.rounds * 2)
    who = "root: each connector its own uid" if os.geteuid() == 0 else "an ordinary user: a user namespace"
    print(f"connector lifecycle (echo connector, {args.rounds} rounds each, the router as {who})")
    print(f"{'':36}{'sandboxed':>12}{'--no-sandbox':>14}{'added':>10}{'ratio':>8}")
    p50 = {k: statistics.median(v) for k, v in cold.items()}
    print(f"{'cold first call (start included) ms':36}{p50[True]:12.1f}{p50[False]:14.1f}"
          f"{p50[True] - p50[False]:10.1f}{p50[True] / p50[False]:8.2f}")
    w50 = {k: statistics.median(v) for k, v in warm.items()}
    print(f"{'warm first call (new session) ms':36}{w50[True]:12.3f}{w50[False]:14.3f}"
          f"{w50[True] - w50[False]:10.3f}{w50[True] / w50[False]:8.2f}")
    print(f"{'8 sessions, one process, calls/s':36}{rates[True][0]:12,.0f}{rates[False][0]:14,.0f}"
          f"{'':10}{rates[True][0] / rates[False][0]:8.2f}")
    print(f"{'floor: bwrap true vs true, ms':36}{boxed:12.1f}{plain:14.1f}{boxed - plain:10.1f}{boxed / plain:8.2f}")


if __name__ == "__main__":
    main()
