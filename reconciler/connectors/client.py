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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from reconciler.connectors.errors import ConnectorCrashedError, ConnectorError, ConnectorReplyError, ConnectorStartError

__all__ = ["HANDSHAKE_VERSION", "LaunchSpec", "StdioConnector"]

HANDSHAKE_VERSION = "2025-11-25"  # what the router offers a connector; it may answer with an older one
CLIENT_INFO = {"name": "handler-router", "version": "0.1.0"}
DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024
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


class _Pipes(asyncio.SubprocessProtocol):
    """Splits the process's stdout into lines and reports the end of the process to its owner."""

    def __init__(self, owner: StdioConnector) -> None:
        self._owner = owner
        self._buf = bytearray()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd != 1:
            return
        buf = self._buf
        if not buf and data.endswith(_NL) and data.count(_NL) == 1:
            self._owner._on_line(data)  # the common case: one whole message per read
            return
        buf += data
        while (end := buf.find(_NL)) >= 0:
            line = bytes(buf[:end])
            del buf[: end + 1]
            self._owner._on_line(line)
        if len(buf) > self._owner.spec.max_line_bytes:
            buf.clear()
            self._owner._fail_all(ConnectorCrashedError(
                f"connector '{self._owner.spec.name}' wrote a message over {self._owner.spec.max_line_bytes} bytes"),
                kill=True)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            self._owner._on_output_closed()

    def process_exited(self) -> None:
        self._owner._on_exit()


class StdioConnector:
    """One running connector process and the calls in flight on it."""

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        self._transport: asyncio.SubprocessTransport | None = None
        self._stdin: asyncio.WriteTransport | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._start_lock = asyncio.Lock()
        self._ready = False
        self._exited = asyncio.Event()
        self.server_info: Mapping[str, Any] = {}

    @property
    def running(self) -> bool:
        return self._ready and self._transport is not None and not self._exited.is_set()

    @property
    def pid(self) -> int | None:
        return self._transport.get_pid() if self._transport is not None else None

    async def ensure_started(self) -> None:
        """Start the process and complete the MCP handshake, once; a no-op while it runs."""
        if self.running:
            return
        async with self._start_lock:
            if self.running:
                return
            await self._start()

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._transport is not None:  # a previous process that died: release its pipes
            self._transport.close()
            self._transport = None
        self._exited = asyncio.Event()
        self._ready = False
        stderr: int | Any = asyncio.subprocess.DEVNULL
        if self.spec.stderr_path:
            stderr = os.open(self.spec.stderr_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            transport, _ = await loop.subprocess_exec(
                lambda: _Pipes(self), *self.spec.command, cwd=self.spec.cwd, env=dict(self.spec.env),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr,
                start_new_session=True)
        except OSError as exc:
            raise ConnectorStartError(
                f"connector of binding '{self.spec.name}' could not start ({self.spec.command[0]}): "
                f"{exc.strerror or exc}") from None
        finally:
            if isinstance(stderr, int) and stderr >= 0:
                os.close(stderr)
        self._transport = transport
        stdin = transport.get_pipe_transport(0)
        if not isinstance(stdin, asyncio.WriteTransport):  # pragma: no cover - asyncio always gives one for PIPE
            raise ConnectorStartError(f"connector of binding '{self.spec.name}' has no stdin pipe")
        self._stdin = stdin
        try:
            async with asyncio.timeout(self.spec.start_timeout):
                result = await self._request("initialize", {
                    "protocolVersion": HANDSHAKE_VERSION, "capabilities": {}, "clientInfo": CLIENT_INFO})
        except TimeoutError:
            await self.stop()
            raise ConnectorStartError(f"connector of binding '{self.spec.name}' did not answer initialize "
                                      f"within {self.spec.start_timeout:.0f} s") from None
        except ConnectorError as exc:
            await self.stop()
            raise ConnectorStartError(f"connector of binding '{self.spec.name}' failed its handshake: "
                                      f"{exc.message}") from None
        self.server_info = result.get("serverInfo") or {}
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self._ready = True

    async def call_tool(self, name: str, arguments: Mapping[str, Any],
                        meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Run one tools/call; the raw `CallToolResult` dict, or a `ConnectorError`."""
        await self.ensure_started()
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        if meta:
            params["_meta"] = meta
        return await self._request("tools/call", params)

    async def _request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        msg_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = future
        try:
            self._send({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
            return await future
        except asyncio.CancelledError:
            # The router gave up on the call (timeout or the agent's cancellation): tell the connector.
            if not self._exited.is_set():
                with contextlib.suppress(ConnectorError):
                    self._send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                "params": {"requestId": msg_id, "reason": "cancelled by the router"}})
            raise
        finally:
            self._pending.pop(msg_id, None)

    def _send(self, message: Mapping[str, Any]) -> None:
        stdin = self._stdin
        if stdin is None or stdin.is_closing() or self._exited.is_set():
            raise ConnectorCrashedError(f"connector of binding '{self.spec.name}' is not running")
        stdin.write(orjson.dumps(message, option=orjson.OPT_APPEND_NEWLINE))

    def _on_line(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            msg = orjson.loads(line)
        except orjson.JSONDecodeError:
            self._fail_all(ConnectorCrashedError(f"connector of binding '{self.spec.name}' wrote a line that is not "
                                            "JSON on stdout (stdout is for MCP messages; log to stderr)"), kill=True)
            return
        if not isinstance(msg, dict):
            return
        if "method" in msg:
            self._answer_connector_request(msg)
            return
        future = self._pending.get(msg.get("id"))  # type: ignore[arg-type]
        if future is None or future.done():
            return  # a reply to a call the router already gave up on
        if "error" in msg:
            error = msg["error"] if isinstance(msg["error"], dict) else {}
            future.set_exception(ConnectorReplyError(int(error.get("code", -32603)), str(error.get("message", ""))))
        elif isinstance(msg.get("result"), dict):
            future.set_result(msg["result"])
        else:
            future.set_exception(ConnectorError("the connector's reply holds no result object"))

    def _answer_connector_request(self, msg: dict[str, Any]) -> None:
        # The router asks nothing of a connector's client features (sampling, roots); ping is answered.
        if "id" not in msg:
            return
        with contextlib.suppress(ConnectorError):
            if msg.get("method") == "ping":
                self._send({"jsonrpc": "2.0", "id": msg["id"], "result": {}})
            else:
                self._send({"jsonrpc": "2.0", "id": msg["id"],
                            "error": {"code": -32601, "message": "the router offers no client features"}})

    def _on_output_closed(self) -> None:
        self._fail_all(ConnectorCrashedError(f"connector of binding '{self.spec.name}' closed its output "
                                        "(the process exited or crashed)"), kill=True)

    def _on_exit(self) -> None:
        # Pending calls are failed when stdout reports closed, which comes after every reply the
        # process wrote before exiting has been read: failing them here could lose a written reply.
        self._ready = False
        self._exited.set()

    def _fail_all(self, error: ConnectorError, kill: bool) -> None:
        self._ready = False
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
        if kill and self._transport is not None and not self._exited.is_set():
            with contextlib.suppress(ProcessLookupError):
                self._transport.kill()

    async def stop(self, grace: float = 2.0) -> None:
        """Close stdin, wait `grace` seconds for the process to exit, then kill it."""
        transport = self._transport
        if transport is None:
            return
        self._ready = False
        if self._stdin is not None and not self._stdin.is_closing():
            self._stdin.close()
        if not self._exited.is_set():
            try:
                async with asyncio.timeout(grace):
                    await self._exited.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    transport.kill()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(grace):
                        await self._exited.wait()
        transport.close()
        self._fail_all(ConnectorCrashedError(f"connector of binding '{self.spec.name}' was stopped"), kill=False)
        self._transport = None
