"""The connector processes of a router: their lifecycle, from the first call to the last session.

One process per binding, keyed by the binding's name and the content of the binding and its
connector (`pool_key`), started on the first call that needs it and shared by every session that
selects it. Around it:

- idle stop: a process with no call in flight and none for `idle_seconds` is stopped (the next call
  starts it again);
- crashes: the calls in flight when a process dies fail (`crashed` → `unavailable`); the next call
  starts a new process, after a backoff that doubles with each crash in a row (reset once a
  process has lived `BACKOFF_RESET_SECONDS`); a call that cannot wait out the backoff is told so at
  once. A start that fails (a secret command failing, a missing interface tool, no answer to
  `initialize` or `tools/list` within `startSeconds`) fails the calls of the backoff window at once
  with the same error;
- drain: the router tells the pool which keys its live generation uses (`set_live`) and which keys
  each session pinned (`pin`/`unpin`); a key no longer live stops as soon as no session pinned to
  it remains and no call is in flight (or when idle);
- shutdown (`close`): a start under way is given up, every process stops, then its process group is
  killed, so nothing is left.

The launch itself (environment, sandbox, egress proxy) is `launching.prepare_launch`'s; the check
of a process's tools against its interfaces is `drift.find_tool_drift`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from reconciler.config.snapshot import Snapshot
from reconciler.connectors.client import ConnectorProcess, DispatchHook, LaunchSpec, await_start
from reconciler.connectors.diskwatch import CHECK_SECONDS, KILL_MARGIN_NS, measure, remove_left
from reconciler.connectors.drift import find_tool_drift
from reconciler.connectors.errors import (
    ConnectorError,
    ConnectorNotSetUpError,
    ConnectorReplyError,
    ConnectorRestartingError,
    ConnectorStartError,
)
from reconciler.connectors.launching import Launch, declared_env, inbox_dir, prepare_launch
from reconciler.connectors.llm import LlmConnector, LlmSettings
from reconciler.connectors.parking import Parking
from reconciler.connectors.sandbox import limits_for
from reconciler.connectors.wrapping import ToolCaller, WrappedConnector, check_wrap
from reconciler.places import default_state_dir
from reconciler.wire.framing import DEFAULT_MAX_LINE_BYTES

__all__ = ["DEFAULT_IDLE_SECONDS", "BindingStatus", "ConnectorPool", "PoolKey", "RunningConnector", "pool_key"]

log = logging.getLogger("handler.connectors")

DEFAULT_IDLE_SECONDS = 600.0  # ten minutes: a session's pauses stay warm, an abandoned connector goes
BACKOFF_FIRST_SECONDS = 0.1
PROBE_SECONDS = 2.0  # how long a process suspected of hanging has to answer a ping
BACKOFF_MAX_SECONDS = 30.0
BACKOFF_RESET_SECONDS = 60.0
# Host uids for connectors when the router is root: far above any account, below 2^31 (some tools read uids signed).
HOST_UID_BASE = 0x50000000
HOST_UID_SPAN = 1 << 24

PoolKey = tuple[str, str, str]  # (binding, binding content hash, connector content hash)


def pool_key(snapshot: Snapshot, binding_name: str) -> PoolKey | None:
    """What identifies a binding's process in `snapshot`: its name and the content it runs with."""
    binding = snapshot.bindings.get(binding_name)
    connector = snapshot.connectors.get(binding.connector or "") if binding is not None else None
    if binding is None or connector is None:
        return None
    return (binding_name, binding.content_hash, connector.content_hash)


class RunningConnector(Protocol):
    """What the pipeline calls: a running connector, in a process or inside the router."""

    @property
    def running(self) -> bool: ...

    @property
    def in_flight(self) -> int: ...

    def call_tool(self, name: str, arguments: Mapping[str, Any], meta: Mapping[str, Any] | None = None,
                  deadline: float | None = None) -> Awaitable[dict[str, Any]]: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True)
class BindingStatus:
    """What the router can report about a binding's connector: its state, why, and any drift."""

    state: str  # "running" | "stopped" | "failed"
    message: str = ""
    drift: tuple[str, ...] = ()
    pid: int | None = None


class InRouter:
    """A connector served inside the router (the built-in llm, a wrap's renaming): deadline and count."""

    def __init__(self, inner: ToolCaller) -> None:
        self.inner = inner
        self.in_flight = 0

    @property
    def running(self) -> bool:
        return self.inner.running

    def call_tool(self, name: str, arguments: Mapping[str, Any], meta: Mapping[str, Any] | None = None,
                  deadline: float | None = None) -> Awaitable[dict[str, Any]]:
        return self._call(name, arguments, meta, deadline)

    async def _call(self, name: str, arguments: Mapping[str, Any], meta: Mapping[str, Any] | None,
                    deadline: float | None) -> dict[str, Any]:
        self.in_flight += 1
        try:
            async with asyncio.timeout_at(deadline):
                return await self.inner.call_tool(name, arguments, meta)
        finally:
            self.in_flight -= 1

    async def stop(self) -> None:
        await self.inner.stop()


@dataclass(eq=False)
class _Entry:
    key: PoolKey
    connector: RunningConnector | None = None
    process: ConnectorProcess | None = None  # the OS process under it, if any
    launch: Launch | None = None
    starting: asyncio.Task[RunningConnector] | None = None
    last_used: float = 0.0
    started_at: float = 0.0
    crashes: int = 0  # in a row
    failures: int = 0  # failed starts in a row
    retry_at: float = 0.0
    restart_at: float = 0.0  # when a process that crashed starts again, its backoff over
    failure: ConnectorStartError | None = None
    drift: tuple[str, ...] = field(default=())
    snapshot: Snapshot | None = None  # the one it was launched from: a restart resolves its secrets again
    watch: asyncio.Task[None] | None = None  # what its process keeps in its writable folders (`diskwatch`)

    @property
    def busy(self) -> bool:
        return (self.starting is not None and not self.starting.done()) or (
            self.connector is not None and self.connector.in_flight > 0)


class ConnectorPool:
    """Finds, starts, shares, stops and drains the connector processes of a router."""

    def __init__(self, root: Path, state_dir: Path | None = None, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, *,
                 idle_seconds: float = DEFAULT_IDLE_SECONDS, sandbox: bool = True, run_dir: Path | None = None) -> None:
        self._root = root
        self._run_dir = run_dir  # the router's sockets and call folders: hidden from sandboxed connectors
        self._state = state_dir if state_dir is not None else default_state_dir(root)
        self._max_line_bytes = max_line_bytes
        self.idle_seconds = idle_seconds
        self.sandbox = sandbox
        self._live: dict[PoolKey, _Entry] = {}
        self._pins: Counter[PoolKey] = Counter()
        self._current: frozenset[PoolKey] | None = None  # None: every key is live
        self.statuses: dict[str, BindingStatus] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._closed = False
        self._probes: dict[PoolKey, asyncio.Task[None]] = {}
        self._on_dispatch: DispatchHook | None = None
        self._uids: dict[str, int] = {}
        self._inboxes: dict[str, Path] = {}  # made (and its mode set) once per binding, not per call
        # A process parked in cgroups ahead of the next start (root only: the cgroups are root's).
        self._parking = Parking() if sandbox and os.geteuid() == 0 else None

    async def start(self) -> None:
        """Get ready for the first start: park a spare process (`parking`) when this pool uses cgroups."""
        if self._parking is not None:
            await self._parking.start()

    def host_uid(self, binding_name: str) -> int | None:
        """The host uid `binding_name`'s connector runs as when the router is root and sandboxes it, else None.

        Each binding has its own, kept for the router's life, so no two connectors share files or a process
        count (docs/architecture.md §6); it is derived from the state folder and the binding, so a router
        restarted on the same folder finds the files its connectors left as theirs.
        """
        if not self.sandbox or os.geteuid() != 0:
            return None
        uid = self._uids.get(binding_name)
        if uid is None:
            taken = set(self._uids.values())
            seed = zlib.crc32(f"{self._state}:{binding_name}".encode())
            uid = next(HOST_UID_BASE + (seed + i) % HOST_UID_SPAN for i in range(HOST_UID_SPAN)
                       if HOST_UID_BASE + (seed + i) % HOST_UID_SPAN not in taken)
            self._uids[binding_name] = uid
        return uid

    def inbox(self, binding_name: str) -> Path | None:
        """The binding's inbox: a folder of the router's its sandbox shows read-only, where a call's input files are
        hard-linked rather than copied (`files.CallFolder`); None without a sandbox (a link would let the connector
        write to the agent's file) or a run folder."""
        if not self.sandbox or self._run_dir is None:
            return None
        inbox = self._inboxes.get(binding_name)
        if inbox is None:
            inbox = self._inboxes[binding_name] = inbox_dir(self._run_dir, binding_name, self.host_uid(binding_name))
        return inbox

    # --- the per-call path -------------------------------------------------------------------

    def running(self, key: PoolKey | None) -> RunningConnector | None:
        """The connector of `key` (see `pool_key`) if it runs now: the per-call fast path, with no await."""
        entry = self._live.get(key) if key is not None else None
        if entry is None or entry.connector is None or not entry.connector.running:
            return None
        entry.last_used = time.monotonic()
        return entry.connector

    async def connector(self, snapshot: Snapshot, binding_name: str, deadline: float | None = None) -> RunningConnector:
        """The running (or just started) connector for `binding_name` as `snapshot` configures it.

        A process that crashed starts again after its backoff; a caller who cannot wait that long (its `deadline`, the
        loop's clock, comes first) is told so at once (`ConnectorRestartingError`), not left to time out.
        """
        key = pool_key(snapshot, binding_name)
        if key is None:
            raise ConnectorStartError(f"binding '{binding_name}' is not a connector binding in this revision")
        found = self.running(key)
        if found is not None:
            return found
        if self._closed:
            raise ConnectorStartError("the router is shutting down")
        entry = self._live.get(key)
        if entry is None:
            entry = self._live[key] = _Entry(key)
            self._ensure_reaper()
        if entry.starting is None or entry.starting.done():
            if entry.failure is not None and time.monotonic() < entry.retry_at:
                raise entry.failure.reworded(entry.failure.message)
            if entry.connector is not None and entry.process is not None:  # it ran and is gone: a crash
                self._note_crash(entry, binding_name)
            # The start runs as a task of its own: a caller cancelled meanwhile leaves no half-started process.
            entry.starting = asyncio.get_running_loop().create_task(self._start(entry, snapshot, binding_name))
            entry.starting.add_done_callback(_retrieve)
        starting = entry.starting
        if deadline is not None and entry.restart_at > deadline:
            wait = entry.restart_at - time.monotonic()
            raise ConnectorRestartingError(f"connector of binding '{binding_name}' crashed ({entry.crashes} in a row) "
                                           f"and waits {wait:.1f} s before it starts again", wait)
        connector = await await_start(starting, f"connector of binding '{binding_name}' was stopped as it started "
                                      "(the router is shutting down)")
        entry.last_used = time.monotonic()
        return connector

    def suspect(self, key: PoolKey | None) -> None:
        """A call to `key`'s process timed out: ping it, and recycle it if it does not answer.

        A connector stuck on one call would otherwise hold every later call of every session; killing
        it fails what is still in flight (`crashed`) and the next call starts a fresh process.
        """
        entry = self._live.get(key) if key is not None else None
        if entry is None or entry.process is None or key in self._probes or self._closed:
            return
        if not entry.process.running:  # starting, or waiting to restart: nothing to ping, nothing hangs
            return
        task = asyncio.get_running_loop().create_task(self._probe(entry, entry.process))
        self._probes[entry.key] = task

        def forget(_done: asyncio.Task[None], key: PoolKey = entry.key) -> None:
            self._probes.pop(key, None)

        task.add_done_callback(forget)

    async def _probe(self, entry: _Entry, process: ConnectorProcess) -> None:
        pid = process.pid  # the process pinged, not one started after it
        try:
            await process.ping(PROBE_SECONDS)
        except ConnectorError:
            return  # it answered (with an error), or it ended meanwhile and restarts on the next call
        except TimeoutError:
            log.warning("connector of binding '%s' did not answer a ping after a call timed out; restarting it",
                        entry.key[0])
            if pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)

    def on_dispatch(self, hook: DispatchHook | None) -> None:
        """Hand every tools/call sent to a connector process, from now on, through `hook`.

        The hook sees what reaches the process (for a wrap, the wrapped server's calls, after
        renaming), across restarts: how the conformance runner records what reached a connector.
        """
        self._on_dispatch = hook
        for entry in self._live.values():
            if entry.process is not None:
                entry.process.on_dispatch = hook

    def launch_spec(self, binding_name: str) -> LaunchSpec | None:
        """How the binding's running process was launched (command, folder, environment), if one runs."""
        for entry in self._live.values():
            if entry.key[0] == binding_name and entry.launch is not None and entry.process is not None:
                return entry.launch.spec
        return None

    async def restart(self, snapshot: Snapshot, binding_name: str, grace: float = 0.2) -> None:
        """Stop the binding's process (`grace` seconds to exit) and start a fresh one now, with no backoff.

        For a caller that judges each call on its own (the conformance runner after a hang or a crash);
        a connector inside the router has no process and is left as it is.
        """
        key = pool_key(snapshot, binding_name)
        entry = self._live.get(key) if key is not None else None
        if entry is None or entry.process is None:
            return
        await entry.process.stop(grace=grace)
        await entry.process.ensure_started()

    # --- sessions and generations ------------------------------------------------------------

    def pin(self, keys: Iterable[PoolKey]) -> None:
        """A session started on a generation using `keys`: they stay until it `unpin`s them."""
        self._pins.update(keys)

    def unpin(self, keys: Iterable[PoolKey]) -> None:
        """A session ended: a key no longer live stops once no session holds it."""
        self._pins.subtract(keys)
        self._poke()

    def set_live(self, keys: Iterable[PoolKey]) -> None:
        """The keys the live generation uses; the others drain."""
        self._current = frozenset(keys)
        self._poke()

    def parked(self) -> int | None:
        """The process id of the spare parked for the next start, if one is ready (for status and tests)."""
        return self._parking.parked if self._parking is not None else None

    def processes(self) -> list[int]:
        """The process ids of the running connector processes (for status and tests)."""
        return [e.process.pid for e in self._live.values()
                if e.process is not None and e.process.running and e.process.pid is not None]

    # --- starting and stopping -----------------------------------------------------------------

    async def _start(self, entry: _Entry, snapshot: Snapshot, binding_name: str) -> RunningConnector:
        try:
            if entry.connector is not None and entry.process is not None:  # it ran and is gone: a crash
                await self._restart(entry, binding_name)
            else:
                await self._launch(entry, snapshot, binding_name)
        except ConnectorStartError as exc:
            await self._retire(entry)
            entry.failures += 1
            entry.failure = exc
            entry.retry_at = time.monotonic() + _backoff(entry.failures)
            self.statuses[binding_name] = BindingStatus("failed", exc.message)
            log.warning("connector of binding '%s' did not start: %s", binding_name, exc.message)
            raise
        entry.failures, entry.failure = 0, None
        entry.started_at = entry.last_used = time.monotonic()
        pid = entry.process.pid if entry.process is not None else None
        self.statuses[binding_name] = BindingStatus("running", "", entry.drift, pid)
        self._watch(entry)
        if entry.connector is None:  # pragma: no cover - every successful start sets it
            raise ConnectorStartError(f"binding '{binding_name}' started nothing")
        return entry.connector

    def _note_crash(self, entry: _Entry, binding_name: str) -> None:
        """The process died: count the crash, and set when it starts again (its backoff)."""
        now = time.monotonic()
        entry.crashes = 1 if now - entry.started_at >= BACKOFF_RESET_SECONDS else entry.crashes + 1
        delay = _backoff(entry.crashes)
        entry.restart_at = now + delay
        log.warning("connector of binding '%s' ended unexpectedly (%d in a row); restarting in %.1f s",
                    binding_name, entry.crashes, delay)

    async def _restart(self, entry: _Entry, binding_name: str) -> None:
        """The process died: start it again after its backoff, in the same folder behind the same proxy,
        with its secrets resolved anew (one that expired may be why it died)."""
        if entry.process is None:  # pragma: no cover - only a process restarts
            return
        old_pid = entry.process.pid
        if old_pid is not None:  # whatever the dead process forked goes with it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(old_pid, signal.SIGKILL)
        await asyncio.sleep(entry.restart_at - time.monotonic())
        if entry.launch is not None and entry.launch.cgroups is not None and entry.snapshot is not None:
            limits = limits_for(entry.snapshot.connectors[entry.snapshot.bindings[binding_name].connector or ""]
                                .spec.sandbox)
            try:
                entry.launch.cgroups.remake(limits.processes, limits.memory_bytes)
            except OSError as exc:
                raise ConnectorStartError(f"binding '{binding_name}': cannot make its cgroups again: "
                                          f"{exc.strerror or exc}") from None
        if entry.launch is not None and entry.snapshot is not None:
            try:
                entry.launch = await entry.launch.with_fresh_secrets(entry.snapshot, binding_name, self._root)
                entry.process.spec = entry.launch.spec
            except ConnectorStartError as exc:
                log.warning("binding '%s': %s; restarting with the secrets it had", binding_name, exc)
        await entry.process.ensure_started()
        if entry.snapshot is not None:
            await _check_tools(entry, entry.process, entry.snapshot, binding_name)

    async def _launch(self, entry: _Entry, snapshot: Snapshot, binding_name: str) -> None:
        binding = snapshot.bindings[binding_name]
        connector = snapshot.connectors[binding.connector or ""]
        run = connector.spec.run
        if run.builtin is not None:
            if run.builtin != "llm":
                raise ConnectorStartError(f"binding '{binding_name}': connector '{connector.name}' names the "
                                          f"built-in '{run.builtin}'; the router provides only 'llm'")
            env, _ = await declared_env(binding, connector, self._root)
            try:
                settings = LlmSettings.from_env(env)
            except ValueError as exc:  # a setting the router cannot use: a person changes it
                raise ConnectorNotSetUpError(f"binding '{binding_name}': {exc}") from None
            entry.connector = InRouter(LlmConnector(settings, name=binding_name))
            return
        entry.launch = await prepare_launch(snapshot, binding_name, self._root, self._state, sandbox=self.sandbox,
                                            max_line_bytes=self._max_line_bytes, run_dir=self._run_dir,
                                            host_uid=self.host_uid(binding_name), parking=self._parking)
        entry.snapshot = snapshot
        process = entry.process = ConnectorProcess(entry.launch.spec, on_dispatch=self._on_dispatch)
        await process.ensure_started()
        await _check_tools(entry, process, snapshot, binding_name)
        wrap = connector.spec.wrap
        if wrap is None:
            entry.connector = process
            return
        texts = {code: text for key in connector.spec.implements if (iface := snapshot.interfaces.get(key))
                 for code, text in iface.spec.errors.items()}
        entry.connector = InRouter(WrappedConnector(process, wrap, texts))  # type: ignore[arg-type]

    def _watch(self, entry: _Entry) -> None:
        """Measure what the process of `entry` keeps in its writable folders while it runs (sandboxed only)."""
        if entry.process is None or entry.launch is None or not entry.launch.writable:
            return
        if entry.watch is None or entry.watch.done():
            entry.watch = asyncio.get_running_loop().create_task(self._watch_disk(entry, entry.process, entry.launch))

    async def _watch_disk(self, entry: _Entry, process: ConnectorProcess, launch: Launch) -> None:
        """Every `CHECK_SECONDS` while `process` runs: over its bound, it is killed (its calls in flight fail) and what
        it left in its writable folders is removed before its next start (`diskwatch`)."""
        while not self._closed and entry.process is process and process.running:
            await asyncio.sleep(CHECK_SECONDS)
            usage = await asyncio.to_thread(measure, launch.writable, launch.disk_bytes)
            why = usage.over(launch.disk_bytes)
            if why is None or entry.process is not process:
                continue
            binding, pid = entry.key[0], process.pid
            log.error("connector of binding '%s' kept %s; killed, and what it left there removed; raise [sandbox] "
                      "diskMb in its manifest if its calls need that room", binding, why)
            # Only what changed status before this is the process's. The kernel stamps changes on a coarse clock that
            # may lag this one by a tick; the margin keeps a folder a call makes just after the kill from looking older.
            killed_at = time.time_ns() - KILL_MARGIN_NS
            if pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            await process.exited()
            removed = 0
            for folder in launch.writable:
                removed += await asyncio.to_thread(remove_left, folder, killed_at)
            log.info("binding '%s': %d entries its killed connector left were removed", binding, removed)
            return

    async def _retire(self, entry: _Entry) -> None:
        """Stop what an entry started (its connector, its process group, its proxy and folder)."""
        if entry.watch is not None:
            entry.watch.cancel()
        connector, process, launch = entry.connector, entry.process, entry.launch
        entry.connector = entry.process = entry.launch = entry.snapshot = entry.watch = None
        if connector is not None:
            with contextlib.suppress(Exception):
                await connector.stop()
        if process is not None:
            pid = process.pid
            await process.stop()
            if pid is not None:  # whatever the connector forked outlives no stop
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
        if launch is not None:
            await launch.cleanup()

    async def _stop_entry(self, entry: _Entry, why: str) -> None:
        self._live.pop(entry.key, None)
        binding = entry.key[0]
        if not any(k[0] == binding for k in self._live) and self.statuses.get(binding) is not None \
                and self.statuses[binding].state == "running":
            self.statuses[binding] = BindingStatus("stopped", why)
        if entry.starting is not None and not entry.starting.done():
            # Given up, not waited for: a start may take its whole `startSeconds`, or a crash loop's backoff.
            entry.starting.cancel()
            await asyncio.wait([entry.starting])
        log.info("connector of binding '%s' stopped: %s", binding, why)
        await self._retire(entry)

    # --- idle stop and drain ---------------------------------------------------------------------

    def _ensure_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._wake = asyncio.Event()
            self._reaper = asyncio.get_running_loop().create_task(self._reap())

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _reap(self) -> None:
        tick = min(max(self.idle_seconds / 4, 0.01), 5.0)
        wake = self._wake or asyncio.Event()
        while not self._closed:  # the flag, not only the cancel: a cancelled wait_for can lose the cancel
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(tick):
                    await wake.wait()
            wake.clear()
            if self._closed:
                return
            now = time.monotonic()
            for key, entry in list(self._live.items()):
                if entry.busy:
                    continue
                if self._current is not None and key not in self._current and self._pins[key] <= 0:
                    await self._stop_entry(entry, "its binding changed or was removed and no session uses it")
                elif now - entry.last_used >= self.idle_seconds:
                    await self._stop_entry(entry, f"idle for {self.idle_seconds:g} s")

    async def close(self) -> None:
        """Stop every process this pool started; none is left behind."""
        self._closed = True
        for probe in list(self._probes.values()):
            probe.cancel()
        self._poke()
        if self._reaper is not None:
            # Not cancelled: it may be stopping a drained process, which must end whole (no pipe left open).
            done, _ = await asyncio.wait([self._reaper], timeout=30)
            if not done:
                self._reaper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._reaper
        entries, self._live = list(self._live.values()), {}
        await asyncio.gather(*(self._stop_entry(e, "the router stopped") for e in entries), return_exceptions=True)
        if self._parking is not None:
            await self._parking.aclose()


async def _check_tools(entry: _Entry, process: ConnectorProcess, snapshot: Snapshot, binding_name: str) -> None:
    """Hold the tools a process just started lists against its interfaces (`find_tool_drift`, which sets the entry's
    drift) or its [wrap] (`check_wrap`); a tool it no longer offers refuses the start. At every start: a restart
    after a crash may run other code (a connector updated in place, a server that changed)."""
    connector = snapshot.connectors[snapshot.bindings[binding_name].connector or ""]
    tools = await _listed_tools(process, binding_name)
    wrap = connector.spec.wrap
    if wrap is None:
        entry.drift = find_tool_drift(binding_name, tools, snapshot, connector)  # raises on a missing tool
        return
    if tools is None:
        raise ConnectorStartError(f"binding '{binding_name}': the server connector '{connector.name}' wraps "
                                  "does not answer tools/list, so its [wrap] cannot be checked")
    takes = {tool.name: set(tool.inputSchema.get("properties") or ()) for key in connector.spec.implements
             if (iface := snapshot.interfaces.get(key)) for tool in iface.tools}
    check_wrap(binding_name, wrap, takes, tools)


async def _listed_tools(process: ConnectorProcess, binding_name: str) -> list[dict[str, Any]] | None:
    """The tools `process` lists, None when it answers tools/list with an error; within its `startSeconds`, which a
    process that never answers would otherwise hold its binding's start (and the router's shutdown) on for good."""
    seconds = process.spec.start_timeout
    try:
        async with asyncio.timeout(seconds):
            return await process.list_tools()
    except ConnectorReplyError:
        return None  # it does not list its tools: nothing to compare
    except TimeoutError:
        raise ConnectorStartError(f"connector of binding '{binding_name}' did not answer tools/list within "
                                  f"{seconds:g} s") from None
    except ConnectorError as exc:  # it died or closed its output instead
        raise ConnectorStartError(f"connector of binding '{binding_name}' failed its tools/list: "
                                  f"{exc.message}") from None


def _backoff(count: int) -> float:
    return float(min(BACKOFF_FIRST_SECONDS * 2.0 ** max(count - 1, 0), BACKOFF_MAX_SECONDS))


def _retrieve(task: asyncio.Task[Any]) -> None:
    # Every caller awaiting a start may have been cancelled: read its outcome so none is reported unread.
    if not task.cancelled():
        task.exception()
