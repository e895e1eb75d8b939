"""The MCP client to one connector process, over its stdio or its socket (docs/architecture.md §2, step 7).

The router's pipeline calls `ConnectorProcess.call_tool`; the pool starts the process on the first
call. The messages travel on the wire's line client (`reconciler.wire.client`), which multiplexes
calls by request id, so concurrent calls of many sessions share a process, and tells the connector
of a call given up on (a timeout, a client's cancellation) with `notifications/cancelled`. If the
process dies or closes its output, every pending call fails with `ConnectorCrashedError` and the
next call starts a fresh process. A reply that is not JSON (or nests past the parser's limit) fails
only its own call (`output_invalid`); any other line on its output that is not JSON is logged
(secrets masked) and skipped. A reply over the line limit fails only its own call
(`output_too_large`), or every pending call when its id cannot be read. Nothing here logs a reply's
content.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from reconciler.config.eventloop import LoopPipe
from reconciler.connectors.errors import (
    ConnectorCrashedError,
    ConnectorError,
    ConnectorNotSetUpError,
    ConnectorOutputInvalidError,
    ConnectorOutputTooLargeError,
    ConnectorReplyError,
    ConnectorStartError,
)
from reconciler.wire.client import MOST_UNREAD_ANSWERS, LineClient
from reconciler.wire.errors import JsonRpcError
from reconciler.wire.framing import DEFAULT_MAX_LINE_BYTES

__all__ = ["ConnectorProcess", "DispatchHook", "LaunchSpec", "await_start"]

_T = TypeVar("_T")

CLIENT_INFO = {"name": "handler-router", "version": "0.1.0"}
_SHOWN_BYTES = 200  # how much of a stray output line the log shows
_SHOWN_BAD_LINES = 20  # stray output lines of one process the log shows
_EXIT_GRACE_SECONDS = 0.5  # after the process exited, for what it wrote before to be read, before its output is cut

log = logging.getLogger("handler.connectors")


# A launch's first spawn done another way (a process parked ahead of need, `parking`): given its command, cwd,
# environment and whether stdio carries MCP, the process running it, or None to spawn the usual way.
Handoff = Callable[[Sequence[str], str, dict[str, str], bool], "subprocess.Popen[bytes] | None"]


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
    # Gets the process's stderr as it comes, then b"" at its end (else it goes to stderr_path).
    on_stderr: Callable[[bytes], None] | None = None
    socket_path: str | None = None  # transport "socket": the connector serves MCP here (HANDLER_CONNECTOR_SOCKET)
    mask: Callable[[str], str] | None = None  # hides the binding's secrets in what is logged of its output
    handoff: Handoff | None = None  # its first spawn, when a parked process runs it


class DispatchHook(Protocol):
    """Sees each tools/call on its way to the process: it gets the call under way and returns what to await."""

    def __call__(self, name: str, arguments: Mapping[str, Any],
                 call: Awaitable[dict[str, Any]]) -> Awaitable[dict[str, Any]]: ...


class _Incarnation:
    """One run of the connector process: its pipes, its line client, whether it ended.

    A crash ends an incarnation; the next call starts a new one. Callbacks of an old incarnation
    (its exit, arriving late) touch only its own state, never the new process's.
    """

    def __init__(self, spec: LaunchSpec) -> None:
        self.popen: subprocess.Popen[bytes] | None = None
        self.line = _ConnectorLine(self, spec)
        self.stderr: asyncio.ReadTransport | None = None
        self.exited = asyncio.Event()  # the process was reaped
        self.ready = False
        self._pidfd: int | None = None

    @property
    def alive(self) -> bool:
        return self.ready and not self.line.closed and not self.exited.is_set()

    def kill(self) -> None:
        if self.popen is not None and not self.exited.is_set():
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()

    def watch_exit(self) -> None:
        """Notice the process's exit itself, not only the end of its output: a process it forked into a session of
        its own may hold that open long after it exited (without a sandbox, whose end would end them all)."""
        if self.popen is None:  # pragma: no cover - called once spawned
            return
        try:
            self._pidfd = os.pidfd_open(self.popen.pid)
        except OSError:  # a kernel without pidfds: the end of its output alone tells
            return
        asyncio.get_running_loop().add_reader(self._pidfd, self._on_exit)

    def unwatch(self) -> None:
        fd, self._pidfd = self._pidfd, None
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)

    def _on_exit(self) -> None:
        self.unwatch()
        if not self.line.closed:
            why = ConnectorCrashedError(f"{self.line.name} exited (a process it started still holds its output)")
            asyncio.get_running_loop().call_later(_EXIT_GRACE_SECONDS, self.line.abort, why)

    def reap(self) -> None:
        """Wait for the process in a worker thread (its output closed: it is ending), then mark it exited."""
        self.unwatch()
        popen = self.popen
        if popen is None or self.exited.is_set():
            self.exited.set()
            return
        waited = asyncio.get_running_loop().run_in_executor(None, popen.wait)
        waited.add_done_callback(lambda _f: self.exited.set())


class _ConnectorLine(LineClient):
    """The line client of one incarnation: a connector's misbehaviour ends the process.

    Its pipes are plain read/write pipe transports rather than a subprocess transport: uvloop hands a
    subprocess's output to its protocol one loop iteration late, which every call would pay for.
    """

    def __init__(self, incarnation: _Incarnation, spec: LaunchSpec) -> None:
        super().__init__(f"connector of binding '{spec.name}'", max_line_bytes=spec.max_line_bytes,
                         duplex=spec.socket_path is not None)
        self._incarnation = incarnation
        self._spec = spec
        self._bad_lines = 0

    def closed_error(self, why: str) -> Exception:
        return ConnectorCrashedError(why)

    def reply_error(self, error: JsonRpcError) -> Exception:
        return ConnectorReplyError(error.code, error.message)

    def bad_line(self, line: bytes) -> None:
        # A stray print is the connector's bug, not a reason to fail the calls of every session on it; a stream of
        # them is logged only at first, so a connector cannot flood the router's log through its stdout.
        self._bad_lines += 1
        if self._bad_lines > _SHOWN_BAD_LINES:
            return
        text = line[:_SHOWN_BYTES].decode(errors="replace").strip()
        mask = self._spec.mask
        log.warning("%s wrote a line that is not JSON on its output, skipped (stdout is for MCP messages; log to "
                    "stderr): %s%s", self.name, mask(text) if mask is not None else "(not shown)",
                    "; further such lines of this process are skipped without a word"
                    if self._bad_lines == _SHOWN_BAD_LINES else "")

    def answer_request(self, msg: Mapping[str, Any]) -> None:
        unanswered = self.unanswered
        super().answer_request(msg)
        if self.unanswered and not unanswered:
            log.warning("%s sends requests and does not read the answers; they go unanswered while more than "
                        "%d bytes of them wait", self.name, MOST_UNREAD_ANSWERS)

    def oversize_error(self, why: str) -> Exception:
        return ConnectorOutputTooLargeError(why)

    def unreadable_error(self, why: str) -> Exception:
        return ConnectorOutputInvalidError(f"{self.name} answered with a reply {why}", f"(a reply {why})")

    def abort(self, error: Exception) -> None:
        super().abort(error)
        self._incarnation.kill()

    def connection_lost(self, exc: Exception | None) -> None:
        self.abort(ConnectorCrashedError(f"{self.name} closed its output (it exited or crashed)"))
        self._incarnation.reap()


class ConnectorProcess:
    """One binding's connector: its current process and the calls in flight on it."""

    def __init__(self, spec: LaunchSpec, *, on_dispatch: DispatchHook | None = None) -> None:
        self.spec = spec
        self.on_dispatch = on_dispatch
        self._inc = _Incarnation(spec)
        self._starting: asyncio.Task[None] | None = None
        self.server_info: Mapping[str, Any] = {}

    @property
    def running(self) -> bool:
        return self._inc.alive

    @property
    def in_flight(self) -> int:
        """How many calls wait for a reply of the current process."""
        return self._inc.line.in_flight

    @property
    def pid(self) -> int | None:
        popen = self._inc.popen
        return popen.pid if popen is not None else None

    async def ensure_started(self) -> None:
        """Start the process and complete the MCP handshake, once; a no-op while it runs.

        The start runs as a task of its own, shielded from the caller: a call cancelled while the
        process starts (a timeout, the agent's cancellation) never leaves a half-started process.
        """
        if self._inc.alive:
            return
        if self._starting is None or self._starting.done():
            self._starting = asyncio.get_running_loop().create_task(self._start())
            self._starting.add_done_callback(_retrieve)
        await await_start(self._starting, f"connector of binding '{self.spec.name}' was stopped as it started "
                          "(a reload or a shutdown); the next call starts it again")

    async def _start(self) -> None:
        self._inc.line.close()  # a previous process that died: release its pipes
        inc = self._inc = _Incarnation(self.spec)
        spawning = asyncio.ensure_future(asyncio.to_thread(self._spawn))
        try:
            inc.popen = await asyncio.shield(spawning)
        except asyncio.CancelledError:  # a stop while it spawns: the process it made still ends with `stop`
            with contextlib.suppress(Exception):
                inc.popen = await spawning
            if inc.popen is not None:  # never handed to the loop: its pipes closed here, EOF on its stdin
                _close_pipes(inc.popen)
            raise
        except OSError as exc:
            inc.line.close()
            missing = isinstance(exc, FileNotFoundError | PermissionError)  # the machine lacks it: no retry helps
            kind = ConnectorNotSetUpError if missing else ConnectorStartError
            raise kind(
                f"connector of binding '{self.spec.name}' could not start ({self.spec.command[0]}): "
                f"{exc.strerror or exc}") from None
        await self._connect(inc, inc.popen)
        inc.watch_exit()
        try:
            async with asyncio.timeout(self.spec.start_timeout):
                result = await inc.line.initialize(CLIENT_INFO)
        except TimeoutError:
            await self._stop_incarnation(inc)
            raise ConnectorStartError(f"connector of binding '{self.spec.name}' did not answer initialize "
                                      f"within {self.spec.start_timeout:g} s") from None
        except ConnectorError as exc:
            await self._stop_incarnation(inc)
            raise ConnectorStartError(f"connector of binding '{self.spec.name}' failed its handshake: "
                                      f"{exc.message}") from None
        self.server_info = result.get("serverInfo") or {}
        inc.ready = True

    async def _connect(self, inc: _Incarnation, popen: subprocess.Popen[bytes]) -> None:
        """Attach the incarnation's line client to the process's pipes (or socket), and its stderr to the sink."""
        loop = asyncio.get_running_loop()
        if self.spec.socket_path is None:
            if popen.stdin is None or popen.stdout is None:  # pragma: no cover - both are pipes
                raise ConnectorStartError(f"connector of binding '{self.spec.name}' has no pipes")
            stdin, stdout = LoopPipe.taken_from(popen.stdin, loop), LoopPipe.taken_from(popen.stdout, loop)
            popen.stdin = popen.stdout = None
            try:
                writer, _ = await loop.connect_write_pipe(asyncio.BaseProtocol, stdin)
            except BaseException:
                stdout.discard()  # never handed to the loop
                raise
            inc.line.set_writer(writer)
            await loop.connect_read_pipe(lambda: inc.line, stdout)
        else:
            await self._connect_socket(inc, popen, self.spec.socket_path)
        sink = self.spec.on_stderr
        if popen.stderr is not None and sink is not None:
            stderr = LoopPipe.taken_from(popen.stderr, loop)
            popen.stderr = None
            inc.stderr, _ = await loop.connect_read_pipe(lambda: _Stderr(sink), stderr)

    async def _connect_socket(self, inc: _Incarnation, popen: subprocess.Popen[bytes], path: str) -> None:
        """Wait (within the start timeout) for the connector to listen on `path`, then speak MCP there."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.spec.start_timeout
        while True:
            try:
                await _connect_unlinked(loop, inc.line, path)
            except (FileNotFoundError, ConnectionRefusedError):
                if popen.poll() is not None or loop.time() > end:
                    await self._stop_incarnation(inc)
                    why = ("exited" if popen.poll() is not None
                           else f"did not listen within {self.spec.start_timeout:g} s")
                    raise ConnectorStartError(f"connector of binding '{self.spec.name}' {why} on its socket "
                                              "(HANDLER_CONNECTOR_SOCKET)") from None
                await asyncio.sleep(0.01)
            else:
                return

    def _spawn(self) -> subprocess.Popen[bytes]:
        if self.spec.handoff is not None:
            parked = self.spec.handoff(self.spec.command, self.spec.cwd, dict(self.spec.env),
                                       self.spec.socket_path is None)
            if parked is not None:
                return parked
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

    def call_tool(self, name: str, arguments: Mapping[str, Any], meta: Mapping[str, Any] | None = None,
                  deadline: float | None = None,
                  on_progress: Callable[[Mapping[str, Any]], None] | None = None) -> Awaitable[dict[str, Any]]:
        """Run one tools/call; the raw `CallToolResult` dict, or a `ConnectorError`.

        With a `deadline` (the loop's clock) the call fails with `TimeoutError` once it passes, and the
        connector is told the call is cancelled (the line client's one sweeping timer, no timer per call), as it
        is when the caller cancels the call. With `on_progress`, the call carries a `progressToken` of this
        process's line and the connector's progress notifications for it go there.
        """
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        if meta:
            params["_meta"] = meta
        if self._inc.alive:  # the common case: one coroutine per call, not two
            call = self._inc.line.request("tools/call", params, deadline, on_progress)
        else:
            call = self._start_and_request(params, deadline, on_progress)
        return call if self.on_dispatch is None else self.on_dispatch(name, arguments, call)

    async def list_tools(self) -> list[dict[str, Any]]:
        """The connector's own `tools/list` (its first page), starting the process if needed."""
        await self.ensure_started()
        result = await self._inc.line.request("tools/list", {})
        tools = result.get("tools")
        return [t for t in tools if isinstance(t, dict)] if isinstance(tools, list) else []

    async def _start_and_request(self, params: dict[str, Any], deadline: float | None,
                                 on_progress: Callable[[Mapping[str, Any]], None] | None) -> dict[str, Any]:
        await self.ensure_started()
        return await self._inc.line.request("tools/call", params, deadline, on_progress)

    async def ping(self, timeout: float) -> None:
        """Ask the running process for a ping reply within `timeout` seconds (TimeoutError if none)."""
        inc = self._inc
        if not inc.alive:
            raise ConnectorCrashedError(f"connector of binding '{self.spec.name}' is not running")
        await asyncio.wait_for(inc.line.request("ping", {}), timeout)

    async def exited(self, timeout: float = 5.0) -> None:
        """Wait until the current process has ended (a kill sent), for at most `timeout` seconds."""
        popen = self._inc.popen
        if popen is not None and popen.poll() is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await asyncio.to_thread(popen.wait)

    async def stop(self, grace: float = 2.0) -> None:
        """Close stdin, wait `grace` seconds for the process to exit, then kill it.

        A start under way is given up, not waited for: a connector that loads a model before it answers
        `initialize` may take its whole `startSeconds`, and a reload or a shutdown must not wait that long.
        """
        starting = self._starting
        if starting is not None and not starting.done():
            starting.cancel()
            await asyncio.wait([starting])
        await self._stop_incarnation(self._inc, grace)

    async def _stop_incarnation(self, inc: _Incarnation, grace: float = 2.0) -> None:
        popen = inc.popen
        if popen is None:
            return
        inc.ready = False
        inc.unwatch()
        inc.line.close_writer()  # EOF on its stdin: a well-behaved server exits
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
        inc.line.abort(ConnectorCrashedError(f"connector of binding '{self.spec.name}' was stopped"))
        if inc.stderr is not None and not inc.stderr.is_closing():
            inc.stderr.close()
        await asyncio.sleep(0)  # let the closed transports' connection_lost callbacks run
        inc.exited.set()


async def await_start(starting: asyncio.Task[_T], stopped: str) -> _T:
    """What a start running as a task of its own gives, shielded from the caller: a caller cancelled meanwhile leaves
    no half-started process. A start given up by a stop or a shutdown, not by the caller's own cancellation, is
    `ConnectorStartError(stopped)`."""
    try:
        return await asyncio.shield(starting)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if starting.cancelled() and task is not None and not task.cancelling():
            raise ConnectorStartError(stopped) from None
        raise


async def _connect_unlinked(loop: asyncio.AbstractEventLoop, protocol: asyncio.Protocol,
                            path: str) -> asyncio.BaseTransport:
    """Connect to the socket at `path` itself, never through a link: the connector owns the folder it is in and
    could swap it for a link to another socket of this machine (a profile's, a database's). The socket is opened
    without following a link, checked to be a socket, and connected to through that descriptor."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise ConnectionRefusedError(f"{path} is not a socket")
        transport, _ = await loop.create_unix_connection(lambda: protocol, f"/proc/self/fd/{fd}")
        return transport
    finally:
        os.close(fd)


class _Stderr(asyncio.Protocol):
    """Hands the process's stderr to `LaunchSpec.on_stderr` as it comes, and b"" at its end; closes then."""

    def __init__(self, sink: Callable[[bytes], None]) -> None:
        self._sink = sink

    def data_received(self, data: bytes) -> None:
        self._sink(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._sink(b"")


def _close_pipes(popen: subprocess.Popen[bytes]) -> None:
    for pipe in (popen.stdin, popen.stdout, popen.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


def _retrieve(task: asyncio.Task[None]) -> None:
    # Every caller awaiting a start may have been cancelled: read its outcome so none is reported unread.
    if not task.cancelled():
        task.exception()
