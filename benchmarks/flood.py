"""Hostile clients against `handler serve`: what they cost the router's memory and a good session's latency.

The router runs as the command a user runs (`handler serve`, its own process); the clients run in
this one. For `--seconds` (10 by default) one client floods calls from its first byte without ever
reading a reply, an agent handed over by the bridge (its stdin and stdout passed to the router)
floods `tools/list` lines the same way, and `--partial` clients (20) each send most of a line of
`--line-mib` MiB (15) and hold it unfinished. Meanwhile a well-behaved session calls `echo_say` one
call at a time.

It prints the router's resident memory (VmRSS of /proc/PID/status) before, at its highest during
the attack and after the hostile clients have closed, and the good session's latency with and
without the attack, each beside its goal. It asserts nothing.

Run: .venv/bin/python benchmarks/flood.py [--seconds S] [--partial N] [--line-mib M]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reconciler.router.handoff import attach_line
from tests.fixtures.echo_tree import TOKEN_ENV, write_echo_tree
from tests.fixtures.flood import flood_lines, rss_mb
from tests.fixtures.harness import RawClient

HANDLER = Path(sys.executable).with_name("handler")
CALL = (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo_say","arguments":{"text":"x"}}}\n')


def start_router(root: Path, run_dir: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HANDLER_RUN_DIR": str(run_dir), "HANDLER_STATE_DIR": str(root / "state"),
           TOKEN_ENV: "flood-token"}
    log = (root / "serve.log").open("wb")  # a file, not a pipe: a router blocked on its own log would skew it
    router = subprocess.Popen([str(HANDLER), "serve", str(root), "--no-sandbox"], env=env, stderr=log)
    log.close()
    sock = run_dir / "profiles" / "tester.sock"
    deadline = time.monotonic() + 30
    while not sock.exists():
        if router.poll() is not None or time.monotonic() > deadline:
            router.kill()
            router.wait()
            raise SystemExit("handler serve did not open its socket: " + (root / "serve.log").read_text()[-2000:])
        time.sleep(0.05)
    return router


async def good_session(path: Path, stop: asyncio.Event) -> list[float]:
    client = await RawClient.connect(path)
    times: list[float] = []
    try:
        while not stop.is_set():
            started = time.perf_counter()
            await client.call("echo_say", {"text": "good"})
            times.append((time.perf_counter() - started) * 1e3)
            await asyncio.sleep(0.005)
    finally:
        await client.close()
    return times


def flood(path: Path, seconds: float) -> tuple[socket.socket, int]:
    """Send calls for `seconds` without reading a reply; how many bytes the router took."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    sock.setblocking(False)
    burst, sent = CALL * 1000, 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            sent += sock.send(burst)
        except BlockingIOError:
            time.sleep(0.01)  # the router stopped reading: what a bounded server does
    return sock, sent


def flood_attached(path: Path, seconds: float) -> int:
    """Hand the router an agent's stdin and stdout, as the bridge does, and flood the stdin without reading."""
    router_in, agent_in = os.pipe()
    agent_out, router_out = os.pipe()
    os.set_blocking(agent_in, False)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as lifeline:
            lifeline.connect(str(path))
            socket.send_fds(lifeline, [attach_line({"handler/interface": "echo"})], [router_in, router_out])
            os.close(router_in)
            os.close(router_out)
            return flood_lines(lambda data: os.write(agent_in, data), seconds)
    finally:
        os.close(agent_in)
        os.close(agent_out)


def hold_partial_lines(path: Path, count: int, line_bytes: int) -> list[socket.socket]:
    held = []
    chunk = b'{"pad":"' + b"x" * (1 << 20)
    for _ in range(count):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(path))
        sock.settimeout(5)
        with_sent = 0
        try:
            while with_sent < line_bytes:
                sock.sendall(chunk)
                with_sent += len(chunk)
        except (TimeoutError, OSError):
            pass  # the router refused to take more of it
        held.append(sock)
    return held


async def attack(path: Path, pid: int, args: argparse.Namespace) -> tuple[float, list[float], int]:
    """Run the hostile clients beside a good session; the highest RSS seen, the good call times, bytes flooded."""
    stop, peak = asyncio.Event(), [rss_mb(pid)]

    async def sample() -> None:
        while not stop.is_set():
            peak.append(rss_mb(pid))
            await asyncio.sleep(0.2)

    good = asyncio.create_task(good_session(path, stop))
    sampler = asyncio.create_task(sample())
    held = await asyncio.to_thread(hold_partial_lines, path, args.partial, int(args.line_mib * (1 << 20)))
    attached = asyncio.create_task(asyncio.to_thread(flood_attached, path, args.seconds))
    flooder, flooded = await asyncio.to_thread(flood, path, args.seconds)
    flooded += await attached
    stop.set()
    times = await good
    await sampler
    for sock in [flooder, *held]:
        sock.close()
    return max(peak), times, flooded


async def baseline_times(path: Path, seconds: float) -> list[float]:
    stop = asyncio.Event()
    task = asyncio.create_task(good_session(path, stop))
    await asyncio.sleep(seconds)
    stop.set()
    return await task


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else float("nan")


def report(before: float, peak: float, after: float, quiet: list[float], loud: list[float], flooded: int) -> None:
    print(f"router RSS: before {before:.0f} MB, highest during the attack {peak:.0f} MB "
          f"(+{peak - before:.0f} MB; goal ≤ +100 MB), after the clients closed {after:.0f} MB "
          f"({after - before:+.0f} MB; goal within 20 MB)")
    print(f"flooding clients: the router took {flooded / 1e6:.1f} MB of requests it could not answer into")
    print(f"good session, calls alone: p50 {p(quiet, 50):.2f} ms, p99 {p(quiet, 99):.2f} ms ({len(quiet)} calls)")
    print(f"good session, under attack: p50 {p(loud, 50):.2f} ms, p99 {p(loud, 99):.2f} ms ({len(loud)} calls); "
          f"p99 ratio {p(loud, 99) / p(quiet, 99):.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the flooding client sends")
    parser.add_argument("--partial", type=int, default=20, help="clients holding an unfinished long line")
    parser.add_argument("--line-mib", type=float, default=15.0, help="how much of a line each of them sends")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="hf") as folder:
        root = write_echo_tree(Path(folder) / "t")
        run_dir = Path(folder) / "r"
        router = start_router(root, run_dir)
        try:
            path = run_dir / "profiles" / "tester.sock"
            quiet = asyncio.run(baseline_times(path, 2.0))  # also warms the connector up
            before = rss_mb(router.pid)
            peak, loud, flooded = asyncio.run(attack(path, router.pid, args))
            time.sleep(2.0)  # let the router see the closes and free what they held
            report(before, peak, rss_mb(router.pid), quiet, loud, flooded)
        finally:
            router.terminate()
            router.wait(10)


if __name__ == "__main__":
    main()
