"""The router's cost per call, side by side in one run (issue 3, point 8). Prints figures; asserts none.

MCP clients (the official `mcp` SDK client, initialize era, calling `echo_say` with its own
output-schema check on every call; the three lines take turns, in 8 rounds):
  (a) the SDK client → the echo connector directly (stdio);
  (b) the SDK client → `handler-service` → the router (`handler serve`, call log on) → the connector;
      the bridge hands the client's pipes to the router, so the router reads and writes them itself;
  (c) the SDK client → a FastMCP proxy (`fastmcp.server.create_proxy`) → the connector.
The router alone (a blocking raw-line client, one JSON-RPC line per call; the first three take turns):
  direct: client → the connector's stdio;
  hop:    client → a plain line-forwarding unix-socket hop (uvloop, no parsing) → the connector;
  router: client → the router's socket → the connector;
  router x8: 8 concurrent sessions on the router, for throughput.
The governed line runs `handler serve` as shipped (the Governor on its SQLite store), for reference.
Goals (issue 3): (b)-(a) ≤ 150 µs p50 and ≥ 10x less than (c)-(a); router-direct ≤ 2x hop-direct;
≥ 10,000 validated calls/s with 8 sessions.

Run: .venv/bin/python benchmarks/router.py [--calls N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
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

# The router as `handler serve` runs it, with the governance seam open (every call admitted at once):
# what this benchmark measures is the router's own cost; a governed line follows for reference.
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


async def sdk_runs(clients: dict[str, StdioServerParameters], calls: int, warmup: int,
                   rounds: int = 8) -> dict[str, dict[str, float]]:
    """Each client's calls, interleaved in `rounds` blocks, so a slow spell of the machine hits every line alike."""
    async with contextlib.AsyncExitStack() as stack:
        opened = {name: await stack.enter_async_context(Client(params, mode="legacy"))
                  for name, params in clients.items()}
        for client in opened.values():
            for _ in range(warmup):
                await client.call_tool("echo_say", ARGS)
        samples: dict[str, list[int]] = {name: [] for name in opened}
        spent = dict.fromkeys(opened, 0.0)
        for _ in range(rounds):
            for name, client in opened.items():
                start = time.perf_counter()
                for _ in range(calls // rounds):
                    t0 = time.perf_counter_ns()
                    result = await client.call_tool("echo_say", ARGS)
                    samples[name].append(time.perf_counter_ns() - t0)
                    assert not result.is_error
                spent[name] += time.perf_counter() - start
        return {name: summarize(samples[name], spent[name]) for name in opened}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    result["rate"] = (per_session + 50) * sessions / wall
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
    print(f"  {name:<52} p50 {figures['p50']:8.1f} µs   p99 {figures['p99']:8.1f} µs   {figures['rate']:9.0f} calls/s"
          + cpu)


def write_bench_files(base: Path) -> tuple[Path, Path, dict[str, str], list[str]]:
    """The echo tree, the helper scripts and the connector command under `base`: (root, run_dir, env, connector)."""
    root = write_echo_tree(base / "t")
    run_dir = base / "run"
    tools = root / "catalog/interfaces/echo/v1/tools.json"
    env = {**os.environ, TOKEN_ENV: "bench-token", "HANDLER_RUN_DIR": str(run_dir)}
    (base / "forward.py").write_text(FORWARDER)
    (base / "proxy.py").write_text(PROXY)
    (base / "serve_open.py").write_text(SERVE_OPEN)
    connector = [sys.executable, str(CONNECTOR), str(tools)]
    return root, run_dir, env, connector


def measure_sdk_lines(run: Any, base: Path, run_dir: Path, connector: list[str],
                      args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Lines (a), (b) and (c): the SDK client direct, through handler-service and the router, through FastMCP."""
    print("\nMCP clients (the official SDK client, initialize era, validating each result; the three "
          "lines interleaved in 8 rounds):")
    results: dict[str, dict[str, float]] = run(sdk_runs({
        "a": StdioServerParameters(command=connector[0], args=connector[1:]),
        "b": StdioServerParameters(command=str(BIN / "handler-service"), args=["echo", "--profile", "tester"],
                                   env={"HANDLER_RUN_DIR": str(run_dir)}),
        "c": StdioServerParameters(command=sys.executable, args=[str(base / "proxy.py"), *connector[1:]]),
    }, args.calls, args.warmup))
    row("(a) SDK client -> connector", results["a"])
    row("(b) SDK client -> handler-service -> router -> connector", results["b"])
    row("(c) SDK client -> FastMCP proxy -> connector", results["c"])
    return results


def measure_raw_lines(base: Path, run_dir: Path, env: dict[str, str], connector: list[str], router_pid: int,
                      args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """The direct, hop and router lines, taking turns."""
    print("\nThe router alone (a raw line client; the three lines take turns in 8 rounds):")
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
        client = LineSocket(run_dir / "profiles/tester.sock")
        results = raw_turns({"direct": (pipe_send, stdout.readline, None),
                             "hop": (hop.send, hop.recv_line, forwarder.pid),
                             "router": (client.send, client.recv_line, router_pid)},
                            args.calls, args.warmup)
        hop.close()
        client.close()
    stdin.close()
    proc.wait()
    stdout.close()
    row("direct: client -> connector", results["direct"])
    row("hop: client -> line-forwarding hop -> connector", results["hop"])
    row("router: client -> router -> connector", results["router"])
    return results


def measure_governed(root: Path, run_dir: Path, env: dict[str, str], calls: int) -> None:
    """The router as `handler serve` ships it, for reference."""
    with started([str(BIN / "handler"), "serve", str(root)], env, "handler serve"):
        client = LineSocket(run_dir / "profiles/tester.sock")
        governed = raw_loop(client.send, client.recv_line, max(200, calls // 10), 50)
        client.close()
        row("router, governed (`handler serve`: Governor, SQLite)", governed)


def print_ratios(results: dict[str, dict[str, float]], mcp: bool) -> None:
    print("\nAdded latency (p50) and ratios:")
    if mcp:
        added_b = results["b"]["p50"] - results["a"]["p50"]
        added_c = results["c"]["p50"] - results["a"]["p50"]
        print(f"  (b)-(a) handler-service + router adds   {added_b:8.1f} µs   (goal <= 150 µs)")
        print(f"  (c)-(a) FastMCP proxy adds               {added_c:8.1f} µs")
        print(f"  (c) adds {added_c / added_b if added_b > 0 else float('inf'):.1f}x what (b) adds          "
              "(goal >= 10x)")
    added_router = results["router"]["p50"] - results["direct"]["p50"]
    added_hop = results["hop"]["p50"] - results["direct"]["p50"]
    print(f"  router adds {added_router:8.1f} µs, a plain hop adds {added_hop:8.1f} µs: "
          f"{added_router / added_hop if added_hop > 0 else float('inf'):.2f}x   (goal <= 2x)")
    print(f"  CPU per call: the router {results['router']['cpu']:.1f} µs, the hop {results['hop']['cpu']:.1f} µs "
          "(the process in the middle only)")
    print(f"  8 sessions: {results['x8']['rate']:.0f} validated calls/s   (goal >= 10,000)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per configuration (default 2000)")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--part", choices=["all", "raw"], default="all",
                        help="raw: only the router-alone lines (direct, hop, router, x8)")
    args = parser.parse_args()
    try:
        import uvloop
        run = uvloop.run
    except ImportError:  # pragma: no cover
        run = asyncio.run

    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="hb"))
    root, run_dir, env, connector = write_bench_files(base)
    results: dict[str, dict[str, float]] = {}

    print(f"router benchmark: {args.calls} timed calls per line after {args.warmup} warm-up calls; "
          f"{os.cpu_count()} CPUs; Python {sys.version.split()[0]}")
    mcp = args.part == "all"
    with started([sys.executable, str(base / "serve_open.py"), str(root)], env, "handler serve") as router:
        if mcp:
            results.update(measure_sdk_lines(run, base, run_dir, connector, args))
        results.update(measure_raw_lines(base, run_dir, env, connector, router.pid, args))
        results["x8"] = run(concurrent_sessions(run_dir / "profiles/tester.sock", 8, args.calls * 4))
        row("router x8: 8 concurrent sessions", results["x8"])
    measure_governed(root, run_dir, env, args.calls)
    print_ratios(results, mcp)
    with contextlib.suppress(OSError):
        subprocess.run(["rm", "-rf", str(base)], check=False)


if __name__ == "__main__":
    main()
