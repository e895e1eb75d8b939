"""The MCP client to one connector process over stdio: one JSON-RPC message per line, each way.

The router's pipeline (design §2 step 7) calls `StdioConnector.call_tool`; the pool starts the
process on the first call. Calls are multiplexed on the one pipe by request id, so concurrent calls
of many sessions share a process. If the process dies or closes its output, every pending call
fails with `ConnectorCrashedError` and the next call starts a fresh process. A call cancelled by the
router (a timeout, a client's cancellation) is reported to the connector with
`notifications/cancelled`. Nothing here logs a message's content.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import subprocess
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import orjson

from reconciler.connectors.errors import ConnectorCrashedError, ConnectorError, ConnectorReplyError, ConnectorStartError

__all__ = ["HANDSHAKE_VERSION", "LaunchSpec", "StdioConnector"]

HANDSHAKE_VERSION = "2025-11-25"  # what the router offers a connector; it may answer with an older one
CLIENT_INFO = {"name": "handler-router", "version": "0.1.0"}
DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024
SWEEP_SECONDS = 0.02  # how late past its deadline a call may be failed
_NL = b"\n"


@dataclass(frozen=True)
class LaunchSpec:
    """How to run one binding's connector: the command, its folder and its whole environment."""

    name: str  # the binding, for messages
    command: tuple[str, ...]
    cwd: str
    env: Mapping[str, str] = field(repr=False)  # holds secrets: never printed
    stderr_path: str | None = None
    start_timeout: float = 20.0
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    on_stderr: Callable[[bytes], None] | None = None  # gets the process's stderr as it comes (else stderr_path)
    socket_path: str | None = None  # transport "socket": the connector serves MCP here (HANDLER_CONNECTOR_SOCKET)


class _Process:
    """One incarnation of the connector process: its pipes, its calls in flight, whether it ended.

    A crash ends an incarnation; the next call starts a new one. Callbacks of an old incarnation
    (its exit, arriving late) touch only its own state, never the new process's.
    """

    def __init__(self) -> None:
        self.popen: subprocess.Popen[bytes] | None = None
        self.stdin: asyncio.WriteTransport | None = None
        self.stdout: asyncio.ReadTransport | None = None
        self.stderr: asyncio.ReadTransport | None = None
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.deadlines: dict[int, float] = {}  # pending calls that must end by then (the loop's clock)
        self.exited = asyncio.Event()  # the process was reaped
        self.ready = False
        self.dead = False  # stdout closed or the process killed: no reply will come any more

    @property
    def alive(self) -> bool:
        return self.ready and not self.dead and not self.exited.is_set()


class _Reader(asyncio.Protocol):
    """Splits one process's stdout into lines; its end fails what is pending and reaps the process.

    The pipes are plain read/write pipe transports rather than a subprocess transport: uvloop hands a
    subprocess's output to its protocol one loop iteration late, which every call would pay for.
    """

    def __init__(self, owner: StdioConnector, proc: _Process) -> None:
        self._owner = owner
        self._proc = proc
        self._buf = bytearray()

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        if not buf and data.endswith(_NL) and data.count(_NL) == 1:
            self._owner._on_line(self._proc, data)  # the common case: one whole message per read
            return
        buf += data
        while (end := buf.find(_NL)) >= 0:
            line = bytes(buf[:end])
            del buf[: end + 1]
            self._owner._on_line(self._proc, line)
        if len(buf) > self._owner.spec.max_line_bytes:
            buf.clear()
            self._owner._fail_all(self._proc, ConnectorCrashedError(
                f"connector '{self._owner.spec.name}' wrote a message over {self._owner.spec.max_line_bytes} bytes"),
                kill=True)

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        # Every reply written before the process closed stdout has been read by now; what is still
        # pending is lost.
        self._owner._fail_all(self._proc, ConnectorCrashedError(
            f"connector of binding '{self._owner.spec.name}' closed its output (it exited or crashed)"), kill=True)
        self._owner._reap(self._proc)


class StdioConnector:
    """One binding's connector: its current process and the calls in flight on it."""

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        self._proc = _Process()
        self._ids = itertools.count(1)
        self._starting: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # set at start: the loop the pipes live on
        self._sweep: asyncio.TimerHandle | None = None
        self.server_info: Mapping[str, Any] = {}

    @property
    def running(self) -> bool:
        return self._proc.alive

    @property
    def in_flight(self) -> int:
        """How many calls wait for a reply of the current process."""
        return len(self._proc.pending)

    @property
    def pid(self) -> int | None:
        popen = self._proc.popen
        return popen.pid if popen is not None else None

    async def ensure_started(self) -> None:
        """Start the process and complete the MCP handshake, once; a no-op while it runs.

        The start runs as a task of its own, shielded from the caller: a call cancelled while the
        process starts (a timeout, the agent's cancellation) never leaves a half-started process.
        """
        if self._proc.alive:
            return
        if self._starting is None or self._starting.done():
            self._starting = asyncio.get_running_loop().create_task(self._start())
            self._starting.add_done_callback(_retrieve)
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        old = self._proc
        if old.stdin is not None:  # a previous process that died: release its pipes
            old.stdin.close()
        proc = self._proc = _Process()
        try:
            popen = await asyncio.to_thread(self._spawn)
        except OSError as exc:
            proc.dead = True
            raise ConnectorStartError(
                f"connector of binding '{self.spec.name}' could not start ({self.spec.command[0]}): "
                f"{exc.strerror or exc}") from None
        proc.popen = popen
        if self.spec.socket_path is None and (popen.stdin is None or popen.stdout is None):  # pragma: no cover
            raise ConnectorStartError(f"connector of binding '{self.spec.name}' has no pipes")
        if self.spec.socket_path is None:
            proc.stdin, _ = await loop.connect_write_pipe(asyncio.BaseProtocol, popen.stdin)
            proc.stdout, _ = await loop.connect_read_pipe(lambda: _Reader(self, proc), popen.stdout)
        else:
            await self._connect_socket(proc, popen, self.spec.socket_path)
        sink = self.spec.on_stderr
        if popen.stderr is not None and sink is not None:
            proc.stderr, _ = await loop.connect_read_pipe(lambda: _Stderr(sink), popen.stderr)
        try:
            async with asyncio.timeout(self.spec.start_timeout):
                result = await self._request(proc, "initialize", {
                    "protocolVersion": HANDSHAKE_VERSION, "capabilities": {}, "clientInfo": CLIENT_INFO})
        except TimeoutError:
            await self._stop_process(proc)
            raise ConnectorStartError(f"connector of binding '{self.spec.name}' did not answer initialize "
                                      f"within {self.spec.start_timeout:.0f} s") from None
        except ConnectorError as exc:
            await self._stop_process(proc)
            raise ConnectorStartError(f"connector of binding '{self.spec.name}' failed its handshake: "
                                      f"{exc.message}") from None
        self.server_info = result.get("serverInfo") or {}
        self._send(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        proc.ready = True

    async def _connect_socket(self, proc: _Process, popen: subprocess.Popen[bytes], path: str) -> None:
        """Wait (within the start timeout) for the connector to listen on `path`, then speak MCP there."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.spec.start_timeout
        while True:
            try:
                transport, _ = await loop.create_unix_connection(lambda: _Reader(self, proc), path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if popen.poll() is not None or loop.time() > end:
                    await self._stop_process(proc)
                    why = ("exited" if popen.poll() is not None
                           else f"did not listen within {self.spec.start_timeout:.0f} s")
                    raise ConnectorStartError(f"connector of binding '{self.spec.name}' {why} on its socket "
                                              "(HANDLER_CONNECTOR_SOCKET)") from None
                await asyncio.sleep(0.01)
        proc.stdin = cast(asyncio.WriteTransport, transport)
        proc.stdout = cast(asyncio.ReadTransport, transport)

    def _spawn(self) -> subprocess.Popen[bytes]:
        stderr: int = subprocess.DEVNULL
        if self.spec.on_stderr is not None:
            stderr = subprocess.PIPE
        elif self.spec.stderr_path:
            stderr = os.open(self.spec.stderr_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            pipe = subprocess.PIPE if self.spec.socket_path is None else subprocess.DEVNULL
            return subprocess.Popen(list(self.spec.command), cwd=self.spec.cwd, env=dict(self.spec.env),
                                    stdin=pipe, stdout=pipe, stderr=stderr, start_new_session=True)
        finally:
            if stderr >= 0:
                os.close(stderr)

    def _reap(self, proc: _Process) -> None:
        """Wait for the process in a worker thread (its output closed: it is ending), then mark it exited."""
        popen = proc.popen
        if popen is None or proc.exited.is_set():
            proc.exited.set()
            return
        loop = self._loop or asyncio.get_running_loop()
        waited = loop.run_in_executor(None, popen.wait)
        waited.add_done_callback(lambda _f: proc.exited.set())

    def call_tool(self, name: str, arguments: Mapping[str, Any], meta: Mapping[str, Any] | None = None,
                  deadline: float | None = None) -> Awaitable[dict[str, Any]]:
        """Run one tools/call; the raw `CallToolResult` dict, or a `ConnectorError`.

        With a `deadline` (the loop's clock) the call fails with `TimeoutError` once it passes (checked
        every `SWEEP_SECONDS`) and the connector is told the call is cancelled: one sweeping timer per
        process instead of a timer or a timeout scope per call.
        """
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        if meta:
            params["_meta"] = meta
        if self._proc.alive:  # the common case: one coroutine per call, not two
            return self._request(self._proc, "tools/call", params, deadline)
        return self._start_and_request(params, deadline)

    async def list_tools(self) -> list[dict[str, Any]]:
        """The connector's own `tools/list` (its first page), starting the process if needed."""
        await self.ensure_started()
        result = await self._request(self._proc, "tools/list", {})
        tools = result.get("tools")
        return [t for t in tools if isinstance(t, dict)] if isinstance(tools, list) else []

    async def _start_and_request(self, params: dict[str, Any], deadline: float | None) -> dict[str, Any]:
        await self.ensure_started()
        return await self._request(self._proc, "tools/call", params, deadline)

    async def _request(self, proc: _Process, method: str, params: Mapping[str, Any],
                       deadline: float | None = None) -> dict[str, Any]:
        msg_id = next(self._ids)
        loop = self._loop or asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        proc.pending[msg_id] = future
        if deadline is not None:
            proc.deadlines[msg_id] = deadline
            if self._sweep is None:
                self._sweep = loop.call_later(SWEEP_SECONDS, self._expire_late)
        try:
            self._send(proc, {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
            return await future
        except (asyncio.CancelledError, TimeoutError):
            # The router gave up on the call (its deadline or the agent's cancellation): tell the connector.
            with contextlib.suppress(ConnectorError):
                self._send(proc, {"jsonrpc": "2.0", "method": "notifications/cancelled",
                                  "params": {"requestId": msg_id, "reason": "cancelled by the router"}})
            raise
        finally:
            proc.pending.pop(msg_id, None)
            proc.deadlines.pop(msg_id, None)

    def _expire_late(self) -> None:
        """Fail the calls whose deadline passed; sweep again while calls with a deadline are pending."""
        self._sweep = None
        proc = self._proc
        loop = self._loop or asyncio.get_running_loop()
        now = loop.time()
        for msg_id, deadline in list(proc.deadlines.items()):
            future = proc.pending.get(msg_id)
            if deadline <= now and future is not None and not future.done():
                future.set_exception(TimeoutError())
        if proc.deadlines:
            self._sweep = loop.call_later(SWEEP_SECONDS, self._expire_late)

    def _send(self, proc: _Process, message: Mapping[str, Any]) -> None:
        stdin = proc.stdin
        if stdin is None or stdin.is_closing() or proc.dead or proc.exited.is_set():
            raise ConnectorCrashedError(f"connector of binding '{self.spec.name}' is not running")
        stdin.write(orjson.dumps(message, option=orjson.OPT_APPEND_NEWLINE))

    def _on_line(self, proc: _Process, line: bytes) -> None:
        if not line.strip():
            return
        try:
            msg = orjson.loads(line)
        except orjson.JSONDecodeError:
            self._fail_all(proc, ConnectorCrashedError(
                f"connector of binding '{self.spec.name}' wrote a line that is not JSON on stdout (stdout is for "
                "MCP messages; log to stderr)"), kill=True)
            return
        if not isinstance(msg, dict):
            return
        if "method" in msg:
            self._answer_connector_request(proc, msg)
            return
        msg_id = msg.get("id")
        future = proc.pending.get(msg_id) if isinstance(msg_id, int) else None
        if future is None or future.done():
            return  # a reply to a call the router already gave up on
        if "error" in msg:
            error = msg["error"] if isinstance(msg["error"], dict) else {}
            code = error.get("code")
            future.set_exception(ConnectorReplyError(code if isinstance(code, int) else -32603,
                                                     str(error.get("message", ""))))
        elif isinstance(msg.get("result"), dict):
            future.set_result(msg["result"])
        else:
            future.set_exception(ConnectorError("the connector's reply holds no result object"))

    def _answer_connector_request(self, proc: _Process, msg: dict[str, Any]) -> None:
        # The router offers a connector no client features (sampling, roots); ping is answered.
        if "id" not in msg:
            return
        with contextlib.suppress(ConnectorError):
            if msg.get("method") == "ping":
                self._send(proc, {"jsonrpc": "2.0", "id": msg["id"], "result": {}})
            else:
                self._send(proc, {"jsonrpc": "2.0", "id": msg["id"],
                                  "error": {"code": -32601, "message": "the router offers no client features"}})

    def _fail_all(self, proc: _Process, error: ConnectorError, kill: bool) -> None:
        proc.ready = False
        proc.dead = True
        pending, proc.pending = proc.pending, {}
        proc.deadlines = {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
        if kill and proc.popen is not None and not proc.exited.is_set():
            with contextlib.suppress(ProcessLookupError):
                proc.popen.kill()

    async def ping(self, timeout: float) -> None:
        """Ask the running process for a ping reply within `timeout` seconds (TimeoutError if none)."""
        proc = self._proc
        if not proc.alive:
            raise ConnectorCrashedError(f"connector of binding '{self.spec.name}' is not running")
        await asyncio.wait_for(self._request(proc, "ping", {}), timeout)

    async def stop(self, grace: float = 2.0) -> None:
        """Close stdin, wait `grace` seconds for the process to exit, then kill it (a start under way first ends)."""
        starting = self._starting
        if starting is not None and not starting.done():
            await asyncio.wait([starting], timeout=self.spec.start_timeout)
            if not starting.done():
                starting.cancel()
                await asyncio.wait([starting])
        await self._stop_process(self._proc, grace)

    async def _stop_process(self, proc: _Process, grace: float = 2.0) -> None:
        popen = proc.popen
        if popen is None:
            return
        proc.ready = False
        if proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.close()  # EOF on its stdin: a well-behaved server exits
        if popen.poll() is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await asyncio.to_thread(popen.wait)
        if popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                popen.kill()
            await asyncio.to_thread(popen.wait)
        # Every pipe is closed here, not left to EOF: a process group member may still hold one open,
        # and a loop closing with an open pipe handle fails (uvloop: EBUSY).
        for transport in (proc.stdout, proc.stderr):
            if transport is not None and not transport.is_closing():
                transport.close()
        await asyncio.sleep(0)  # let the closed transports' connection_lost callbacks run
        self._fail_all(proc, ConnectorCrashedError(f"connector of binding '{self.spec.name}' was stopped"), kill=False)
        proc.exited.set()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None


class _Stderr(asyncio.Protocol):
    """Hands the process's stderr to `LaunchSpec.on_stderr` as it comes; closes at its end."""

    def __init__(self, sink: Callable[[bytes], None]) -> None:
        self._sink = sink

    def data_received(self, data: bytes) -> None:
        self._sink(data)


def _retrieve(task: asyncio.Task[None]) -> None:
    # Every caller awaiting a start may have been cancelled: read its outcome so none is reported unread.
    if not task.cancelled():
        task.exception()
