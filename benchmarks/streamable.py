"""MCP over Streamable HTTP through the governed router, against stdio through `handler-service` and against
FastMCP's own HTTP proxy of the same connector, in one run (docs/router.md "MCP over HTTP"). Prints figures with
their goals; asserts none.

The router is `handler serve --http`, governed as it ships (the GovernedGate on SQLite in its state folder), on the
echo tree; its HTTP clients carry a token of the profile. Lines of the official SDK client (initialize era,
checking each result against the outputSchema), interleaved in 8 rounds:
  (a) the SDK client -> the echo connector directly (stdio);
  (b) the SDK client -> `handler-service` -> the governed router -> the connector (stdio, as today);
  (s) the SDK client -> HTTP -> the governed router -> the connector;
  (f) the SDK client -> HTTP -> FastMCP's proxy (`create_proxy(...).run(transport="http")`) -> the connector;
  (z) the SDK client -> HTTP -> a server that answers at once (the floor: the client's own HTTP).
Then 8 sessions of a raw HTTP client (one keep-alive connection each, written and read by hand: the SDK client
alone spends ~0.2 ms of CPU a call, httpx about as much) calling `echo_say` as fast as answers come.
Goals: (s)-(b) <= 1 ms p50; what FastMCP's proxy adds over the floor, (f)-(z), >= 5x what ours adds, (s)-(z) (the
same ratio against the stdio connector is printed beside it: the client's own HTTP is in both of its terms); 8 raw
sessions >= 5,000 governed calls/s.

Run: .venv/bin/python benchmarks/streamable.py [--calls N] [--sessions-calls N]
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the tests' fixtures (the echo tree) are imported from the repository

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402
from urllib.parse import urlsplit  # noqa: E402

import orjson  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402

from reconciler.governance.store import open_store  # noqa: E402
from reconciler.governance.store.engine import store_url  # noqa: E402
from reconciler.governance.tokens import create_token  # noqa: E402
from tests.fixtures.echo_tree import CONNECTOR, TOKEN_ENV, write_echo_tree  # noqa: E402

BIN = Path(sys.executable).parent
ARGS = {"text": "hello, router"}
PROXY = '''
import sys
from fastmcp.client.transports import StdioTransport
from fastmcp.server import create_proxy
create_proxy(StdioTransport(command=sys.executable, args=sys.argv[2:]), name="echo-proxy").run(
    transport="http", host="127.0.0.1", port=int(sys.argv[1]), show_banner=False, log_level="warning")
'''
# The HTTP floor (z): an ASGI app on uvicorn with httptools that answers every message at once, with no connector
# behind it. What the SDK client spends on HTTP itself (its httpx requests, its session machinery) shows here, and
# no server can take it away; what a server adds is its line above this one.
FLOOR = '''
import sys
import orjson
import uvicorn
RESULTS = {"initialize": {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                          "serverInfo": {"name": "floor", "version": "1"}},
           "tools/list": {"tools": [{"name": "echo_say", "inputSchema": {"type": "object"}}]},
           "tools/call": {"content": [{"type": "text", "text": "hello, router"}], "isError": False}}
async def app(scope, receive, send):
    body, more = b"", True
    while more:
        message = await receive()
        body, more = body + message.get("body", b""), message.get("more_body", False)
    request = orjson.loads(body) if body else {}
    if scope["method"] != "POST" or "id" not in request:  # GET: no stream here; DELETE: ended; a notification
        status = {"GET": 405, "DELETE": 200}.get(scope["method"], 202)
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    out = orjson.dumps({"jsonrpc": "2.0", "id": request["id"], "result": RESULTS[request["method"]]})
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), (b"mcp-session-id", b"floor"), (b"content-length", b"%d" % len(out))]})
    await send({"type": "http.response.body", "body": out})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), http="httptools", log_level="warning", access_log=False)
'''
HELLO = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}


def summarize(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)
    return {"p50": statistics.median(ordered) / 1000, "p99": ordered[int(len(ordered) * 0.99)] / 1000}


async def sdk_runs(servers: dict[str, Any], calls: int, warmup: int, rounds: int = 8) -> dict[str, dict[str, float]]:
    """Each line's calls, interleaved in `rounds` blocks, so a slow spell of the machine hits every line alike."""
    async with contextlib.AsyncExitStack() as stack:
        opened = {name: await stack.enter_async_context(Client(server, mode="legacy"))
                  for name, server in servers.items()}
        for client in opened.values():
            for _ in range(warmup):
                await client.call_tool("echo_say", ARGS)
        samples: dict[str, list[int]] = {name: [] for name in opened}
        for _ in range(rounds):
            for name, client in opened.items():
                for _ in range(calls // rounds):
                    t0 = time.perf_counter_ns()
                    result = await client.call_tool("echo_say", ARGS)
                    samples[name].append(time.perf_counter_ns() - t0)
                    assert not result.is_error, result
        return {name: summarize(samples[name]) for name in opened}


async def raw_sessions(url: str, token: str, sessions: int, calls: int) -> float:
    """Governed calls a second, `sessions` raw HTTP sessions at once: each one keep-alive connection written and
    read by hand (an HTTP client library spends more CPU a request than the router does)."""
    parts = urlsplit(url)
    head = (f"Host: {parts.netloc}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            "Accept: application/json, text/event-stream\r\n")

    def request(body: bytes, extra: str = "") -> bytes:
        return (f"POST {parts.path} HTTP/1.1\r\n{head}{extra}Content-Length: {len(body)}\r\n\r\n").encode() + body

    async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> tuple[bytes, bytes]:
        writer.write(data)
        response_head = await reader.readuntil(b"\r\n\r\n")
        length = int(response_head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        return response_head, await reader.readexactly(length)

    async def one() -> None:
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        try:
            opened, _ = await exchange(reader, writer, request(orjson.dumps(HELLO)))
            at = opened.lower().index(b"mcp-session-id: ") + len(b"mcp-session-id: ")
            sid = opened[at:opened.index(b"\r\n", at)].decode()
            mine = f"Mcp-Session-Id: {sid}\r\n"
            for i in range(calls):
                call = {"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
                        "params": {"name": "echo_say", "arguments": ARGS}}
                answer_head, body = await exchange(reader, writer, request(orjson.dumps(call), mine))
                assert answer_head.startswith(b"HTTP/1.1 200"), answer_head
                assert b'"isError":false' in body, body
        finally:
            writer.close()

    await one()  # warm: the connector started, the caches filled
    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(sessions)))
    return sessions * calls / (time.perf_counter() - start)


def cpu_seconds(pid: int) -> float:
    """The process's own CPU time so far (user and system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_router(root: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([str(BIN / "handler"), "serve", str(root), "--http", "127.0.0.1:0"],
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    base, line = "", ""
    while not base or "revision" not in line:
        line = proc.stderr.readline()
        assert line, "handler serve did not start"
        if "MCP over HTTP at " in line:
            base = line.split("MCP over HTTP at ")[1].split("/mcp/")[0]
    return proc, base


def wait_listening(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise AssertionError("FastMCP's proxy did not listen")


def report(lines: dict[str, dict[str, float]], rate: float, router_cpu: float) -> None:
    """Each line's p50 and p99, then each figure beside its goal."""
    names = {"a": "SDK client -> connector (stdio)", "b": "SDK client -> handler-service -> governed router",
             "s": "SDK client -> HTTP -> governed router", "f": "SDK client -> HTTP -> FastMCP proxy",
             "z": "SDK client -> HTTP -> a server answering at once"}
    print("MCP clients (the official SDK client, initialize era; the lines interleaved in 8 rounds):")
    for key, name in names.items():
        print(f"  ({key}) {name:<50} p50 {lines[key]['p50']:8.1f} µs   p99 {lines[key]['p99']:8.1f} µs")
    over_stdio = lines["s"]["p50"] - lines["b"]["p50"]
    ours, theirs = lines["s"]["p50"] - lines["z"]["p50"], lines["f"]["p50"] - lines["z"]["p50"]
    ours_stdio, theirs_stdio = lines["s"]["p50"] - lines["a"]["p50"], lines["f"]["p50"] - lines["a"]["p50"]
    print(f"\n  HTTP over the stdio path, (s)-(b):         {over_stdio:8.1f} µs p50   [goal: <= 1,000 µs]")
    print(f"  FastMCP's HTTP proxy adds (f)-(z) {theirs:8.1f} µs; ours (s)-(z) {ours:8.1f} µs: "
          f"{theirs / ours if ours > 0 else float('inf'):5.1f}x   [goal: >= 5x]")
    print(f"    the same against the connector on stdio, (f)-(a) {theirs_stdio:8.1f} µs over (s)-(a) "
          f"{ours_stdio:8.1f} µs: {theirs_stdio / ours_stdio if ours_stdio > 0 else float('inf'):5.1f}x, the "
          f"client's own HTTP, (z)-(a) {lines['z']['p50'] - lines['a']['p50']:.1f} µs, in both")
    print(f"  8 raw HTTP sessions, governed:            {rate:8.0f} calls/s   [goal: >= 5,000]; the router's CPU "
          f"{router_cpu:6.1f} µs a call (the clients share these cores: {os.cpu_count()} here)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--sessions-calls", type=int, default=1000, help="calls of each of the 8 raw sessions")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="hb"))
    root = write_echo_tree(base / "t")
    env = {**os.environ, TOKEN_ENV: "bench-token", "HANDLER_RUN_DIR": str(base / "run")}
    env.pop("HANDLER_STORE_URL", None)
    env.pop("HANDLER_STATE_DIR", None)
    connector = [sys.executable, str(CONNECTOR), str(root / "catalog/interfaces/echo/v1/tools.json")]
    (base / "proxy.py").write_text(PROXY)
    (base / "floor.py").write_text(FLOOR)
    router, url_base = start_router(root, env)
    proxy_port, floor_port = free_port(), free_port()
    proxy = subprocess.Popen([sys.executable, str(base / "proxy.py"), str(proxy_port), *connector[1:]],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    floor = subprocess.Popen([sys.executable, str(base / "floor.py"), str(floor_port)])
    try:
        wait_listening(proxy_port)
        wait_listening(floor_port)
        with contextlib.closing(open_store(store_url(root, env, state_dir=root / ".handler"))) as store:
            token = create_token(store, "tester", name="bench", instance=None, expires_in=None, actor="bench").token
        url = f"{url_base}/mcp/tester"
        lines = asyncio.run(sdk_runs({
            "a": StdioServerParameters(command=connector[0], args=connector[1:]),
            "b": StdioServerParameters(command=str(BIN / "handler-service"), args=["echo", "--profile", "tester"],
                                       env={"HANDLER_RUN_DIR": str(base / "run")}),
            "s": streamable_http_client(url, http_client=create_mcp_http_client(
                headers={"Authorization": f"Bearer {token}"})),
            "f": streamable_http_client(f"http://127.0.0.1:{proxy_port}/mcp"),
            "z": streamable_http_client(f"http://127.0.0.1:{floor_port}/mcp"),
        }, args.calls, args.warmup))
        before = cpu_seconds(router.pid)
        rate = asyncio.run(raw_sessions(url, token, 8, args.sessions_calls))
        report(lines, rate, (cpu_seconds(router.pid) - before) / (9 * args.sessions_calls) * 1e6)
    finally:
        for proc in (floor, proxy, router):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
