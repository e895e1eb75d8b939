"""The router's cost per call, governed as shipped, side by side in one run (docs/architecture.md §10).
Prints figures with their goals; asserts none.

Every router here is `handler serve`, governed as it ships (the GovernedGate on its store: SQLite in its
state folder, or PostgreSQL), except the open-gate router, which differs only in its gate (every call
admitted at once): the comparison that tells what governance costs.

First, the host: a pipe round trip to a process that echoes it, where the scheduler puts the two and with
both on one CPU. The difference is what waking a process on the other CPU costs here; a line through a
process in the middle pays it twice more than a direct call, so the latency lines are read against it.

MCP clients (the official `mcp` SDK client, initialize era, calling `echo_say` with its own
output-schema check on every call; the lines take turns, in 8 rounds):
  (a) the SDK client → the echo connector directly (stdio);
  (b) the SDK client → `handler-service` (relaying the session's lines, its default: every request answered
      exactly once) → the governed router → the connector;
  (o) the same with `handler-service --handover` (the router reads and writes the client's stdio itself);
  (c) the SDK client → a FastMCP proxy (`fastmcp.server.create_proxy`) → the connector;
  (h) the SDK client → a plain stdio hop (starts the connector, copies bytes both ways) → the connector: the floor
      that any process in the middle pays on this host, which (b) is read against.
The router alone (a blocking raw-line client, one JSON-RPC line per call; the lines take turns):
  direct: client → the connector's stdio;
  hop:    client → a plain line-forwarding unix-socket hop (uvloop, no parsing) → the connector;
  router: client → the governed router's socket → the connector; open: the same, open gate.
Throughput, 8 concurrent sessions (clients in this process, the router in its own): governed on SQLite,
governed on PostgreSQL, and governed with the profile capped (its calls admitted against budget
leases) on each store, each run back to back with the open gate, round after round; then two
governed routers sharing one PostgreSQL, 8 sessions each, uncapped and with the profile capped.
Each throughput line prints the router's CPU per call, of it its event loop's thread's (the rest is
the store's threads: commits, lease syncs), and, beside it, that of every PostgreSQL server process on
this host (the store's share when both run on the same cores); `--round-calls` sets a round's length.
Side by side (run first): each governed router beside an open-gate router of its own at the same
moments, 8 sessions each, both routers on one CPU of their own (their connectors and the clients on
the others), for `--windows` windows of `--window` seconds each. The kernel shares that CPU
evenly between the two, so the ratio of their calls is the ratio of what a call costs each, measured
under the same conditions. Run back to back instead, two identical routers differ by up to a tenth
on a shared host (the neighbours, the caches, where the scheduler puts the clients and connectors),
more than the cost being measured. Every router is started together, warmed alike and in one pair
only: an open gate paired with every line, or one that had served the other lines first, came out a
few points slower than a fresh one. Every router hashes strings with the run's one seed (`--hash-seed`; drawn
for the run unless given): with seeds of their own, two open-gate routers read 98.6-102.8% of each other, with one,
98.6-101.1%. The control line, a second open-gate router beside the first, shows how even the pairs are (its ratio
should be 100%). Then the governed router on PostgreSQL beside the one on SQLite, the same way: what the store costs
the router itself; and each capped router beside the uncapped governed router on its store: what the budget leases
cost a call over governance itself.
Goals: (b)-(a) <= 150 µs p50 and >= 10x less than (c)-(a) (read against (o) while the relay costs more: docs/
architecture.md §10); router-direct <= 2x hop-direct; governed >= 90% of the open gate's calls/s on SQLite and on
PostgreSQL (side by side), uncapped and with the profile capped; capped >= 5,000 calls/s on each.

Run: .venv/bin/python benchmarks/router.py [--calls N] [--pg URL | --pg '']
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from mcp import Client
from mcp.client.stdio import StdioServerParameters

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.pgschema import pg_schema  # noqa: E402
from tests.fixtures.echo_tree import CONNECTOR, TOKEN_ENV, write_echo_tree  # noqa: E402

BIN = Path(sys.executable).parent
ARGS = {"text": "hello, router"}
CALL = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "echo_say", "arguments": ARGS}}

FORWARDER = '''
import asyncio, sys, uvloop
async def main(path, command):
    async def serve(reader, writer):
        proc = await asyncio.create_subprocess_exec(*command, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, limit=1 << 24)
        async def pump(src, dst):
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        await asyncio.gather(pump(reader, proc.stdin), pump(proc.stdout, writer), return_exceptions=True)
    server = await asyncio.start_unix_server(serve, path)
    print("ready", flush=True)
    await server.serve_forever()
uvloop.run(main(sys.argv[1], sys.argv[2:]))
'''

# The floor of any process in the middle of an MCP client's stdio: it starts the connector and copies bytes both ways
# (uvloop, no parsing), as the plain hop does on a socket.
STDIO_HOP = '''
import asyncio, os, sys, uvloop
async def main(command):
    loop = asyncio.get_running_loop()
    proc = await asyncio.create_subprocess_exec(*command, stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE, limit=1 << 24)
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(0, "rb", 0))
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, os.fdopen(1, "wb", 0))
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    async def pump(src, dst):
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    await asyncio.gather(pump(reader, proc.stdin), pump(proc.stdout, writer), return_exceptions=True)
uvloop.run(main(sys.argv[1:]))
'''

# The router as `handler serve` runs it but with the governance seam open (every call admitted at once).
SERVE_OPEN = '''
import sys
from pathlib import Path
from reconciler.app import serve
from reconciler.config import FolderSource, Loader
from reconciler.governance.gate import OpenGate
root = Path(sys.argv[1])
ready = lambda router: print("handler serve: ready", file=sys.stderr, flush=True)
serve(Loader().load(FolderSource(root)), root=root, gate=OpenGate(), on_ready=ready)
'''

PROXY = '''
import sys
from fastmcp.client.transports import StdioTransport
from fastmcp.server import create_proxy
create_proxy(StdioTransport(command=sys.executable, args=sys.argv[1:]), name="echo-proxy").run(show_banner=False)
'''


def summarize(samples_ns: list[int], wall_s: float) -> dict[str, float]:
    ordered = sorted(samples_ns)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {"p50": statistics.median(ordered) / 1000, "p99": p99 / 1000, "rate": len(ordered) / wall_s}


async def sdk_runs(clients: dict[str, StdioServerParameters], calls: int, warmup: int, rounds: int = 8,
                   pids: dict[str, int] | None = None) -> dict[str, dict[str, float]]:
    """Each client's calls, interleaved in `rounds` blocks, so a slow spell of the machine hits every line alike;
    with `pids`, the CPU per call of the process in the middle of those lines, over their blocks alone."""
    pids = pids or {}
    async with contextlib.AsyncExitStack() as stack:
        opened = {name: await stack.enter_async_context(Client(params, mode="legacy"))
                  for name, params in clients.items()}
        for client in opened.values():
            for _ in range(warmup):
                await client.call_tool("echo_say", ARGS)
        samples: dict[str, list[int]] = {name: [] for name in opened}
        spent, cpu = dict.fromkeys(opened, 0.0), dict.fromkeys(opened, 0.0)
        for _ in range(rounds):
            for name, client in opened.items():
                cpu[name] -= cpu_seconds(pids[name]) if name in pids else 0.0
                start = time.perf_counter()
                for _ in range(calls // rounds):
                    t0 = time.perf_counter_ns()
                    result = await client.call_tool("echo_say", ARGS)
                    samples[name].append(time.perf_counter_ns() - t0)
                    assert not result.is_error
                spent[name] += time.perf_counter() - start
                cpu[name] += cpu_seconds(pids[name]) if name in pids else 0.0
        return {name: summarize(samples[name], spent[name])
                | ({"cpu": cpu[name] / len(samples[name]) * 1e6} if name in pids else {}) for name in opened}


ECHO_SCRIPT = "import os\nwhile (data := os.read(0, 4096)):\n    os.write(1, data)\n"


def host_wakeups(calls: int) -> dict[str, float]:
    """p50 µs of a 200-byte round trip to a process that echoes it over pipes: where the scheduler puts the two,
    and with both on one CPU. What the first adds over the second is the host's price of waking a process on
    another CPU, which every line through a process in the middle pays twice more than a direct call."""
    out = {}
    cpus = os.sched_getaffinity(0)
    for name, where in (("free", cpus), ("one CPU", {min(cpus)})):
        os.sched_setaffinity(0, where)
        try:
            proc = subprocess.Popen([sys.executable, "-c", ECHO_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            assert proc.stdin is not None
            assert proc.stdout is not None
            send, back = proc.stdin.fileno(), proc.stdout.fileno()
            samples = []
            for i in range(calls + calls // 10):
                t0 = time.perf_counter_ns()
                os.write(send, b"x" * 200)
                got = 0
                while got < 200:
                    got += len(os.read(back, 4096))
                if i >= calls // 10:
                    samples.append(time.perf_counter_ns() - t0)
            proc.stdin.close()
            proc.wait()
            proc.stdout.close()
        finally:
            os.sched_setaffinity(0, cpus)
        out[name] = statistics.median(samples) / 1000
    return out


def print_host(calls: int) -> None:
    wakes = host_wakeups(calls)
    print(f"this host: a pipe round trip to another process {wakes['free']:.1f} µs p50 where the scheduler puts them, "
          f"{wakes['one CPU']:.1f} µs on one CPU (the price of a wake-up on another CPU, which lines (b), hop and "
          "router pay twice more than a direct call)")


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User + system CPU time a process has used (Linux /proc); with `thread`, that thread's alone."""
    stat = Path(f"/proc/{pid}/task/{thread}/stat" if thread is not None else f"/proc/{pid}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def postgres_cpu_seconds() -> float:
    """User + system CPU time of every PostgreSQL server process on this host (its backends, WAL writer, ...)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            text = stat.read_text()
            if text[text.index("(") + 1:text.rindex(")")].startswith("postgres"):
                total += cpu_seconds(int(stat.parent.name))
    return total


def raw_loop(send: Any, recv_line: Any, calls: int, warmup: int, pid: int | None = None) -> dict[str, float]:
    """Sequential calls; with `pid`, also that process's CPU per call (steadier than latency on a busy host)."""
    return raw_turns({"line": (send, recv_line, pid)}, calls, warmup, rounds=1)["line"]


def raw_turns(lines: dict[str, tuple[Any, Any, int | None]], calls: int, warmup: int,
              rounds: int = 8) -> dict[str, dict[str, float]]:
    """Sequential calls on each line (send, recv_line, pid of the process in the middle), the lines taking
    turns in `rounds` blocks; with a pid, that process's CPU per call too."""
    samples: dict[str, list[int]] = {name: [] for name in lines}
    spent = dict.fromkeys(lines, 0.0)
    cpu = dict.fromkeys(lines, 0.0)
    ids = 0

    def call(send: Any, recv_line: Any) -> int:
        nonlocal ids
        ids += 1
        t0 = time.perf_counter_ns()
        send(orjson.dumps({**CALL, "id": ids}) + b"\n")
        reply = recv_line()
        took = time.perf_counter_ns() - t0
        assert b'"isError":false' in reply, reply[:300]
        return took

    for send, recv_line, _ in lines.values():
        for _ in range(warmup):
            call(send, recv_line)
    for _ in range(rounds):
        for name, (send, recv_line, pid) in lines.items():
            before, start = cpu_seconds(pid) if pid else 0.0, time.perf_counter()
            samples[name] += [call(send, recv_line) for _ in range(calls // rounds)]
            spent[name] += time.perf_counter() - start
            cpu[name] += (cpu_seconds(pid) - before) if pid else 0.0
    out = {}
    for name, (_, _, pid) in lines.items():
        out[name] = summarize(samples[name], spent[name])
        if pid:
            out[name]["cpu"] = cpu[name] / len(samples[name]) * 1e6
    return out


class LineSocket:
    """A blocking line client on a unix socket."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(str(path))
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_line(self) -> bytes:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def close(self) -> None:
        self.sock.close()


async def concurrent_sessions(path: Path, sessions: int, calls: int) -> dict[str, float]:
    per_session = calls // sessions
    samples: list[int] = []

    async def session(n: int) -> None:
        reader, writer = await asyncio.open_unix_connection(str(path), limit=1 << 24)
        for i in range(per_session + 50):
            t0 = time.perf_counter_ns()
            writer.write(orjson.dumps({**CALL, "id": i}) + b"\n")
            line = await reader.readline()
            if i >= 50:
                samples.append(time.perf_counter_ns() - t0)
            assert b'"isError":false' in line, line[:300]
        writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(session(n) for n in range(sessions)))
    # The warm-up calls run concurrently too; the rate counts every call over the whole run.
    wall = time.perf_counter() - start
    result = summarize(samples, wall)
    result["calls"] = (per_session + 50) * sessions
    result["rate"] = result["calls"] / wall
    return result


@contextlib.contextmanager
def started(command: list[str], env: dict[str, str], ready: str,
            stream: str = "stderr") -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(command, env=env, text=True, stdout=subprocess.PIPE if stream == "stdout" else None,
                            stderr=subprocess.PIPE if stream == "stderr" else None)
    try:
        pipe = proc.stdout if stream == "stdout" else proc.stderr
        assert pipe is not None
        line = pipe.readline()
        if ready not in line:
            raise RuntimeError(f"{command[0]} did not start: {line}")
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def row(name: str, figures: dict[str, float]) -> None:
    cpu = f"   {figures['cpu']:6.1f} µs CPU/call" if "cpu" in figures else ""
    cpu += f" (event loop {figures['loop cpu']:5.1f})" if "loop cpu" in figures else ""
    cpu += f" (+{figures['pg cpu']:5.1f} µs PostgreSQL's)" if "pg cpu" in figures else ""
    print(f"  {name:<52} p50 {figures['p50']:8.1f} µs   p99 {figures['p99']:8.1f} µs   {figures['rate']:9.0f} calls/s"
          + cpu)


def write_bench_files(base: Path, hash_seed: int | None = None) -> tuple[Path, dict[str, str], list[str]]:
    """The echo tree, the helper scripts and the connector command under `base`: (root, env, connector). Every
    router started with `env` hashes strings with one seed, `hash_seed` (else one drawn for the run): a router's
    speed moves by a point or two with the seed Python draws for it (its dictionaries' layout), so two routers
    with seeds of their own differ by that much even when their code is the same."""
    root = write_echo_tree(base / "t")
    tools = root / "catalog/interfaces/echo/v1/tools.json"
    seed = random.randrange(1, 1 << 32) if hash_seed is None else hash_seed
    env = {**os.environ, TOKEN_ENV: "bench-token", "HANDLER_LINK_SECRET": "bench-link-secret",
           "PYTHONHASHSEED": str(seed)}
    (base / "forward.py").write_text(FORWARDER)
    (base / "proxy.py").write_text(PROXY)
    (base / "stdio_hop.py").write_text(STDIO_HOP)
    (base / "serve_open.py").write_text(SERVE_OPEN)
    connector = [sys.executable, str(CONNECTOR), str(tools)]
    return root, env, connector


def capped_tree(base: Path) -> Path:
    """The echo tree with its profile capped (a cap far above what the run spends: every call is admitted)."""
    if (base / "capped").exists():
        return base / "capped"
    root = write_echo_tree(base / "capped")
    profile = root / "config/profiles/tester.toml"
    profile.write_text(profile.read_text() + "\n[caps]\nmonthly_usd = 100000.0\n")
    return root


class Routers:
    """Routers started for the run, each in its own run and state folders; stopped at the end."""

    def __init__(self, base: Path, env: dict[str, str]) -> None:
        self.base = base
        self.env = env
        self.stack = contextlib.ExitStack()
        self._own: dict[int, contextlib.ExitStack] = {}  # pid → what stops that router alone

    def start(self, name: str, command: list[str], store_url: str | None = None) -> tuple[Path, int]:
        """Start a router; its run folder and pid."""
        run_dir = self.base / f"run-{name}"
        env = {**self.env, "HANDLER_RUN_DIR": str(run_dir), "HANDLER_STATE_DIR": str(self.base / f"state-{name}")}
        if store_url:
            env["HANDLER_STORE_URL"] = store_url
        own = self.stack.enter_context(contextlib.ExitStack())
        proc = own.enter_context(started(command, env, "handler serve"))
        self._own[proc.pid] = own
        return run_dir, proc.pid

    def stop(self, pid: int) -> None:
        """Stop one router before the others."""
        self._own.pop(pid).close()

    def close(self) -> None:
        self._own.clear()
        self.stack.close()


def measure_sdk_lines(run: Any, base: Path, governed: tuple[Path, int], connector: list[str],
                      args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Lines (a), (b) and (c): the SDK client direct, through handler-service and the governed router, through
    FastMCP."""
    print("\nMCP clients (the official SDK client, initialize era, validating each result; the five "
          "lines interleaved in 8 rounds):")
    results: dict[str, dict[str, float]] = run(sdk_runs({
        "a": StdioServerParameters(command=connector[0], args=connector[1:]),
        "b": StdioServerParameters(command=str(BIN / "handler-service"), args=["echo", "--profile", "tester"],
                                   env={"HANDLER_RUN_DIR": str(governed[0])}),
        "c": StdioServerParameters(command=sys.executable, args=[str(base / "proxy.py"), *connector[1:]]),
        "h": StdioServerParameters(command=sys.executable, args=[str(base / "stdio_hop.py"), *connector]),
        "o": StdioServerParameters(command=str(BIN / "handler-service"),
                                   args=["echo", "--profile", "tester", "--handover"],
                                   env={"HANDLER_RUN_DIR": str(governed[0])}),
    }, args.calls, args.warmup, pids={"b": governed[1]}))
    row("(a) SDK client -> connector", results["a"])
    row("(b) SDK client -> handler-service -> governed router", results["b"])
    row("(c) SDK client -> FastMCP proxy -> connector", results["c"])
    row("(h) SDK client -> plain stdio hop -> connector", results["h"])
    row("(o) SDK client -> handler-service --handover -> governed router", results["o"])
    return results


def measure_raw_lines(base: Path, env: dict[str, str], connector: list[str],
                      routers: dict[str, tuple[Path, int]], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """The direct, hop, governed-router and open-router lines, taking turns."""
    print("\nThe router alone (a raw line client; the lines take turns in 8 rounds):")
    proc = subprocess.Popen(connector, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert proc.stdin is not None
    assert proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    def pipe_send(data: bytes) -> None:
        stdin.write(data)
        stdin.flush()

    hop_path = base / "hop.sock"
    with started([sys.executable, str(base / "forward.py"), str(hop_path), *connector], env, "ready",
                 "stdout") as forwarder:
        hop = LineSocket(hop_path)
        governed = LineSocket(routers["sqlite"][0] / "profiles/tester.sock")
        opened = LineSocket(routers["open"][0] / "profiles/tester.sock")
        results = raw_turns({"direct": (pipe_send, stdout.readline, None),
                             "hop": (hop.send, hop.recv_line, forwarder.pid),
                             "router": (governed.send, governed.recv_line, routers["sqlite"][1]),
                             "open": (opened.send, opened.recv_line, routers["open"][1])},
                            args.calls, args.warmup)
        for line in (hop, governed, opened):
            line.close()
    stdin.close()
    proc.wait()
    stdout.close()
    row("direct: client -> connector", results["direct"])
    row("hop: client -> line-forwarding hop -> connector", results["hop"])
    row("router: client -> governed router -> connector", results["router"])
    row("open: client -> router, open gate -> connector", results["open"])
    return results


def measure_throughput(run: Any, routers: dict[str, tuple[Path, int]], calls: int,
                       rounds: int = 9) -> dict[str, dict[str, float]]:
    """8 sessions on each router. Each round pairs every governed router with the open gate, run back to back (which
    goes first alternates round by round), so a slow spell of the host hits both lines of a pair; `ratio` is the
    median over the rounds of a governed router's rate against the open gate's in its pair. Also each router's best
    round and its CPU per call over all its rounds (steadier than the rate on a busy host)."""
    print(f"\nThroughput, 8 concurrent sessions, {calls:,} calls a round, {rounds} rounds, each governed line paired "
          "with the open gate's (best round):")
    best: dict[str, dict[str, float]] = {}
    cpu = dict.fromkeys(routers, 0.0)
    loop_cpu = dict.fromkeys(routers, 0.0)  # the router's main thread, which runs its event loop
    server = dict.fromkeys(routers, 0.0)
    done = dict.fromkeys(routers, 0)  # every call of its rounds, the warm-up ones too
    ratios: dict[str, list[float]] = {name: [] for name in routers}

    def one(name: str) -> float:
        run_dir, pid = routers[name]
        before, loop_before, server_before = cpu_seconds(pid), cpu_seconds(pid, pid), postgres_cpu_seconds()
        figures = run(concurrent_sessions(run_dir / "profiles/tester.sock", 8, calls))
        cpu[name] += cpu_seconds(pid) - before
        loop_cpu[name] += cpu_seconds(pid, pid) - loop_before
        server[name] += postgres_cpu_seconds() - server_before
        done[name] += figures["calls"]
        if name not in best or figures["rate"] > best[name]["rate"]:
            best[name] = figures
        return float(figures["rate"])

    for turn in range(rounds):
        for name in routers:
            if name == "open":
                continue
            pair = ("open", name) if turn % 2 == 0 else (name, "open")
            rates = {line: one(line) for line in pair}
            ratios[name].append(rates[name] / rates["open"])
    for name, figures in best.items():
        figures["cpu"] = cpu[name] / done[name] * 1e6
        figures["loop cpu"] = loop_cpu[name] / done[name] * 1e6
        figures["pg cpu"] = server[name] / done[name] * 1e6
        figures["ratio"] = statistics.median(ratios[name]) if ratios[name] else 1.0
        row(f"router x8, {THROUGHPUT_LINES[name]}", figures)
    return best


THROUGHPUT_LINES = {"open": "open gate", "sqlite": "governed, SQLite", "pg": "governed, PostgreSQL",
                    "sqlite capped": "governed, SQLite, profile capped", "pg capped": "governed, PostgreSQL, capped"}
CAPPED_GOAL = 5_000  # calls/s of a capped profile, on each store


def _tasks(pid: int) -> list[int]:
    return [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]


def _descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs (a connector under its sandbox's launcher)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                found += [int(child), *_descendants(int(child))]
    return found


def pin(routers: dict[str, tuple[Path, int]], cpus: set[int]) -> str:
    """Put every thread of the routers on one of `cpus` and their connectors and this process on the others; what
    was done, for the report. With one CPU nothing is pinned."""
    if len(cpus) < 2:
        return "not pinned (one CPU)"
    first = min(cpus)
    _place(routers, {first}, cpus - {first})
    return f"the routers on CPU {first}, their connectors and the clients on CPUs {sorted(cpus - {first})}"


def _place(routers: dict[str, tuple[Path, int]], mine: set[int], rest: set[int]) -> None:
    """Every thread of the routers on `mine`, of their connectors and of this process on `rest`."""
    for _, pid in routers.values():
        for task in _tasks(pid):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(task, mine)
        for child in _descendants(pid):
            for task in _tasks(child):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(task, rest)
    os.sched_setaffinity(0, rest)


async def calls_in_window(paths: dict[str, Path], sessions: int, seconds: float) -> dict[str, int]:
    """`sessions` sessions on each router at once, all connected before any calls; the calls each router answered
    in a window of `seconds`."""
    counts = dict.fromkeys(paths, 0)
    go = asyncio.Event()

    async def session(name: str, path: Path, ready: asyncio.Future[None]) -> None:
        reader, writer = await asyncio.open_unix_connection(str(path), limit=1 << 24)
        ready.set_result(None)
        await go.wait()
        end = time.perf_counter() + seconds
        done = 0
        while time.perf_counter() < end:
            writer.write(orjson.dumps({**CALL, "id": done}) + b"\n")
            line = await reader.readline()
            assert b'"isError":false' in line, line[:300]
            done += 1
        counts[name] += done
        writer.close()

    loop = asyncio.get_running_loop()
    readies = []
    tasks = []
    for name, path in paths.items():
        for _ in range(sessions):
            ready = loop.create_future()
            readies.append(ready)
            tasks.append(asyncio.ensure_future(session(name, path, ready)))
    await asyncio.gather(*readies)
    go.set()
    await asyncio.gather(*tasks)
    return counts


def measure_side_by_side(run: Any, routers: dict[str, tuple[Path, int]], pairs: dict[str, tuple[str, str]],
                         seconds: float, rounds: int,
                         against: str = "the open gate") -> dict[str, dict[str, float]]:
    """Each pair of `pairs` (line → the router it is measured against, `against`: its open gate unless said, and the
    router measured) side by side (`pin`), 8 sessions each, `rounds` windows of `seconds` (whose sessions start first
    alternates window by window): the median, lowest and highest of the measured router's calls against the other's
    in the same window, and each one's CPU a call over those windows (when the routers are not all the time on the
    CPU, the calls ratio is partly a latency ratio, and the two ratios differ)."""
    cpus = os.sched_getaffinity(0)
    pinned = pin(routers, cpus)
    print(f"\nSide by side with {against}, 8 sessions each, {rounds} windows of {seconds:g} s ({pinned}):")
    ratios: dict[str, list[float]] = {line: [] for line in pairs}
    rates: dict[str, list[float]] = {line: [] for line in pairs}
    cpu = {line: [0.0, 0, 0.0, 0] for line in pairs}  # the measured router's CPU and calls, then the other's
    loop = dict.fromkeys(pairs, 0.0)  # the measured router's event loop's thread's CPU
    try:
        for turn in range(rounds):
            for line, (base, measured) in pairs.items():
                pair = (base, measured) if turn % 2 == 0 else (measured, base)
                before = {name: cpu_seconds(routers[name][1]) for name in pair}
                loop_before = cpu_seconds(routers[measured][1], routers[measured][1])
                counts = run(calls_in_window({name: routers[name][0] / SOCKET for name in pair}, 8, seconds))
                loop[line] += cpu_seconds(routers[measured][1], routers[measured][1]) - loop_before
                ratios[line].append(counts[measured] / counts[base])
                rates[line].append(counts[measured] / seconds)
                for at, name in ((0, measured), (2, base)):
                    cpu[line][at] += cpu_seconds(routers[name][1]) - before[name]
                    cpu[line][at + 1] += counts[name]
    finally:
        _place(routers, cpus, cpus)  # as they were, for what runs next
    out = {}
    for line, found in ratios.items():
        spent, calls, other_spent, other_calls = cpu[line]
        quarter, _, three_quarters = statistics.quantiles(found, n=4, method="inclusive")  # within the windows
        figures = out[line] = {"ratio": statistics.median(found), "low": min(found), "high": max(found),
                               "q1": quarter, "q3": three_quarters,
                               "rate": statistics.median(rates[line]), "cpu": spent / max(calls, 1) * 1e6,
                               "cpu against": other_spent / max(other_calls, 1) * 1e6,
                               "loop cpu": loop[line] / max(calls, 1) * 1e6}
        label = SIDE_BY_SIDE_LINES.get(line, THROUGHPUT_LINES.get(line, line))
        print(f"  {label:<52} {figures['ratio']:6.1%} of {against}'s calls (windows {figures['low']:.1%} to "
              f"{figures['high']:.1%}, the middle half {figures['q1']:.1%} to {figures['q3']:.1%}; "
              f"{figures['rate']:,.0f} calls/s on half a CPU; CPU a call "
              f"{figures['cpu']:.1f} µs, its event loop's {figures['loop cpu']:.1f}, against "
              f"{figures['cpu against']:.1f})")
    return out


def side_by_side_lines(run: Any, routers: Routers, started_routers: dict[str, tuple[Path, int]],
                       open_gate: list[str], window: float, windows: int) -> dict[str, dict[str, float]]:
    """Each governed router beside an open-gate router of its own, and the control: two open-gate routers. Every
    router is warmed alike and in one pair only, so the two of a pair have served the same calls; the open gate's own
    for each line are stopped after. Then, when both run, the governed router on PostgreSQL beside the one on SQLite:
    what the store costs the router itself; and each capped router beside the uncapped one on its store: what the
    budget leases cost."""
    governed = [name for name in started_routers if name != "open"]
    twins = {f"open for {name}": routers.start(f"open-{n}", open_gate) for n, name in enumerate(governed)}
    twins["open b"] = routers.start("open-b", open_gate)
    pairs = {name: (f"open for {name}", name) for name in governed}
    pairs["open b"] = ("open", "open b")
    beside = {**started_routers, **twins}
    for run_dir, _ in beside.values():
        run(concurrent_sessions(run_dir / SOCKET, 8, 2000))  # each one's connector started, its code warm
    try:
        out = measure_side_by_side(run, beside, pairs, window, windows)
    finally:
        for _, pid in twins.values():  # idle from here on: stopped, so the rounds after run without them
            routers.stop(pid)
    if "pg" in started_routers and "sqlite" in started_routers:
        out.update(measure_side_by_side(run, started_routers, {"pg beside sqlite": ("sqlite", "pg")}, window,
                                        windows, against="the governed router on SQLite"))
    leased: dict[str, tuple[str, str]] = {f"{name} capped beside": (name, f"{name} capped") for name in ("sqlite", "pg")
              if name in started_routers and f"{name} capped" in started_routers}
    if leased:
        out.update(measure_side_by_side(run, started_routers, leased, window, windows,
                                        against="the uncapped governed router on its store"))
    return out


SOCKET = Path("profiles/tester.sock")
SIDE_BY_SIDE_LINES = {"open b": "control: a second open-gate router", "pg beside sqlite": "governed, PostgreSQL",
                      "sqlite capped beside": "capped, SQLite", "pg capped beside": "capped, PostgreSQL"}


async def two_routers(paths: list[Path], calls: int) -> float:
    """Aggregate calls/s of 8 sessions on each of the routers at once."""
    start = time.perf_counter()
    results = await asyncio.gather(*(concurrent_sessions(path, 8, calls) for path in paths))
    wall = time.perf_counter() - start
    return sum(result["calls"] for result in results) / wall


def measure_scale_out(run: Any, base: Path, root: Path, env: dict[str, str], pg: str, calls: int) -> None:
    """Two governed routers on one PostgreSQL store, 8 sessions each, uncapped then with the profile capped."""
    print(f"\nTwo governed routers, one PostgreSQL, 8 sessions each ({calls:,} calls a router):")
    for label, tree in (("uncapped", root), ("profile capped", capped_tree(base))):
        with pg_schema(pg) as url:
            routers = Routers(base, env)
            try:
                runs = [routers.start(f"{label[:3]}{n}", [str(BIN / "handler"), "serve", str(tree)], url)[0]
                        for n in (1, 2)]
                rate = run(two_routers([r / "profiles/tester.sock" for r in runs], calls))
            finally:
                routers.close()
        print(f"  {label:<52} {rate:9.0f} calls/s aggregate")


def print_sdk_ratios(results: dict[str, dict[str, float]]) -> None:
    """What handler-service and the governed router add to the SDK client's call, against FastMCP and a plain hop."""
    added_b = results["b"]["p50"] - results["a"]["p50"]
    added_o = results["o"]["p50"] - results["a"]["p50"]
    added_c = results["c"]["p50"] - results["a"]["p50"]
    print(f"  (b)-(a) handler-service relaying + governed router adds {added_b:8.1f} µs")
    print(f"  (o)-(a) handler-service --handover + governed router adds {added_o:8.1f} µs   (goal <= 150 µs)")
    print(f"  (c)-(a) FastMCP proxy adds                     {added_c:8.1f} µs")
    print(f"  (c) adds {added_c / added_o if added_o > 0 else float('inf'):.1f}x what (o) adds, "
          f"{added_c / added_b if added_b > 0 else float('inf'):.1f}x what (b) adds   (goal >= 10x)")
    added_h = results["h"]["p50"] - results["a"]["p50"]
    print(f"  (h)-(a) a plain stdio hop adds {added_h:8.1f} µs, the floor of any process in the middle on this "
          f"host; (o) adds {added_o - added_h:.1f} µs more, (b) {added_b - added_h:.1f} µs more")
    print(f"  (b)-(o) exactly once: the bridge relaying the session's lines (the default) over handing its stdio to "
          f"the router: {results['b']['p50'] - results['o']['p50']:.1f} µs")
    # Steadier than latency on a busy host (/proc ticks of 10 ms: a few µs of resolution over the line's calls).
    print(f"  the governed router's CPU per call of line (b): {results['b']['cpu']:.1f} µs")


def print_ratios(results: dict[str, dict[str, float]], mcp: bool) -> None:
    print("\nAdded latency (p50) and ratios:")
    if mcp:
        print_sdk_ratios(results)
    added_router = results["router"]["p50"] - results["direct"]["p50"]
    added_hop = results["hop"]["p50"] - results["direct"]["p50"]
    print(f"  governed router adds {added_router:8.1f} µs, a plain hop adds {added_hop:8.1f} µs: "
          f"{added_router / added_hop if added_hop > 0 else float('inf'):.2f}x   (goal <= 2x)")
    print(f"  CPU per call, one session: the governed router {results['router']['cpu']:.1f} µs, open "
          f"{results['open']['cpu']:.1f} µs, the hop {results['hop']['cpu']:.1f} µs (the process in the middle only)")
    opened = results["x8 open"]
    if "side open b" in results:
        control = results["side open b"]
        print(f"  side by side, control: a second open-gate router {control['ratio']:.1%} of the first "
              f"(windows {control['low']:.1%} to {control['high']:.1%})")
    if "side pg beside sqlite" in results:
        stores = results["side pg beside sqlite"]
        print(f"  side by side, the store: governed on PostgreSQL {stores['ratio']:.1%} of governed on SQLite "
              f"(windows {stores['low']:.1%} to {stores['high']:.1%})")
    for name, store in (("sqlite", "SQLite"), ("pg", "PostgreSQL")):
        if f"side {name} capped beside" in results:
            leased = results[f"side {name} capped beside"]
            print(f"  side by side, the leases: capped on {store} {leased['ratio']:.1%} of the uncapped governed "
                  f"router's calls (windows {leased['low']:.1%} to {leased['high']:.1%}): what a capped call costs "
                  f"over governance itself")
    for name in ("sqlite", "pg"):
        if f"x8 {name}" in results:
            governed = results[f"x8 {name}"]
            beside = results.get(f"side {name}")
            if beside is not None:
                print(f"  8 sessions, {THROUGHPUT_LINES[name]}: {beside['ratio']:.1%} of the open gate's calls/s "
                      f"side by side, the median of its windows (goal >= 90%; windows {beside['low']:.1%} to "
                      f"{beside['high']:.1%})")
            print(f"  8 sessions, {THROUGHPUT_LINES[name]}: {governed['ratio']:.0%} of the open gate's calls/s "
                  f"back to back, the median of its pairs' ratios (best rounds {governed['rate']:,.0f} / "
                  f"{opened['rate']:,.0f}); CPU per call {governed['cpu']:.1f} µs against {opened['cpu']:.1f} µs")
        beside = results.get(f"side {name} capped")
        if beside is not None:
            print(f"  8 sessions, {THROUGHPUT_LINES[name + ' capped']}: {beside['ratio']:.1%} of the open gate's "
                  f"calls/s side by side, the median of its windows (goal >= 90%; windows {beside['low']:.1%} to "
                  f"{beside['high']:.1%})")
        if f"x8 {name} capped" in results:
            capped = results[f"x8 {name} capped"]
            print(f"  8 sessions, {THROUGHPUT_LINES[name + ' capped']}: {capped['rate']:,.0f} calls/s "
                  f"(goal >= {CAPPED_GOAL:,}), {capped['ratio']:.0%} of the open gate")


def sdk_only(run: Any, base: Path, routers: Routers, serve: list[str], connector: list[str],
             args: argparse.Namespace) -> None:
    """`--part sdk`: lines (a), (b), (c) and (h) alone, for tracking what the SDK client's call through the router
    costs without the minutes of the throughput lines."""
    try:
        results = measure_sdk_lines(run, base, routers.start("sqlite", serve), connector, args)
    finally:
        routers.close()
        with contextlib.suppress(OSError):
            subprocess.run(["rm", "-rf", str(base)], check=False)
    print("\nAdded latency (p50) and ratios:")
    print_sdk_ratios(results)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per configuration (default 2000)")
    parser.add_argument("--round-calls", type=int, default=20_000,
                        help="calls of one throughput round, 8 sessions together (default 20,000: rounds of a "
                             "second or so, whose medians move a point or two between runs; 8,000 moved ±3)")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--window", type=float, default=1.0, help="seconds of one side-by-side window (default 1)")
    parser.add_argument("--windows", type=int, default=21,
                        help="side-by-side windows a line (default 21: the median of 11 moved by two points between "
                             "runs, as much as the capped line stands from its goal)")
    parser.add_argument("--part", choices=["all", "raw", "sdk"], default="all",
                        help="raw: without the MCP client lines and the two-router lines; sdk: the MCP client lines "
                             "alone, against one governed router on SQLite")
    parser.add_argument("--hash-seed", type=int, default=None,
                        help="the PYTHONHASHSEED of every router (default: one drawn for the run and printed)")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test",
                        help="the PostgreSQL server for the PostgreSQL lines ('' to leave them out)")
    args = parser.parse_args()
    if args.windows < 2:
        parser.error("--windows needs at least 2: a line's figures are the median and the middle half of its windows")
    if args.hash_seed is not None and not 0 <= args.hash_seed < 1 << 32:
        parser.error("--hash-seed is a PYTHONHASHSEED: an integer from 0 to 4294967295")
    return args


def main() -> None:
    args = arguments()
    try:
        import uvloop
        run = uvloop.run
    except ImportError:  # pragma: no cover
        run = asyncio.run

    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="hb"))
    root, env, connector = write_bench_files(base, args.hash_seed)
    results: dict[str, dict[str, float]] = {}

    print(f"router benchmark: {args.calls} timed calls per line after {args.warmup} warm-up calls; "
          f"{os.cpu_count()} CPUs; Python {sys.version.split()[0]}; every router's PYTHONHASHSEED "
          f"{env['PYTHONHASHSEED']}")
    print_host(args.calls * 5)
    mcp = args.part == "all"
    serve = [str(BIN / "handler"), "serve", str(root)]
    routers = Routers(base, env)
    if args.part == "sdk":
        sdk_only(run, base, routers, serve, connector, args)
        return
    try:
        with pg_schema(args.pg) as pg_url, pg_schema(args.pg) as capped_pg_url:
            started_routers = {"open": routers.start("open", [sys.executable, str(base / "serve_open.py"), str(root)]),
                               "sqlite": routers.start("sqlite", serve)}
            if pg_url:
                started_routers["pg"] = routers.start("pg", serve, pg_url)
            capped = [str(BIN / "handler"), "serve", str(capped_tree(base))]
            started_routers["sqlite capped"] = routers.start("sqlite-capped", capped)
            if capped_pg_url:
                started_routers["pg capped"] = routers.start("pg-capped", capped, capped_pg_url)
            # Side by side first, while every router has served only its warm-up: a router that had served the other
            # lines first ran up to a few points slower beside a fresh one.
            beside = side_by_side_lines(run, routers, started_routers, [sys.executable, str(base / "serve_open.py"),
                                                                         str(root)], args.window, args.windows)
            results.update({f"side {name}": figures for name, figures in beside.items()})
            if mcp:
                results.update(measure_sdk_lines(run, base, started_routers["sqlite"], connector, args))
            results.update(measure_raw_lines(base, env, connector, started_routers, args))
            throughput = measure_throughput(run, started_routers, args.round_calls)
            results.update({f"x8 {name}": figures for name, figures in throughput.items()})
            routers.close()
        if mcp and args.pg:
            measure_scale_out(run, base, root, env, args.pg, args.calls * 4)
    finally:
        routers.close()
    print_ratios(results, mcp)
    with contextlib.suppress(OSError):
        subprocess.run(["rm", "-rf", str(base)], check=False)


if __name__ == "__main__":
    main()
