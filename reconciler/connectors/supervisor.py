"""The supervisor of one binding's connector process: its start, crashes, pings, disk watch and stop.

The pool (`pool.ConnectorPool`) keeps one `Supervisor` per running process, keyed by the binding and the content
it runs with (`PoolKey`), and decides when one drains; the router's pipeline asks the pool once per call for the
binding's supervisor and asks it the rest: the connector if it runs (`running`, no await), else a start
(`connector`), the host uid of the call's files and the call space they are staged in (`call_space`), a ping after
a call timed out (`suspect`). Around the process, the supervisor keeps:

- crashes: the calls in flight when a process dies fail (`crashed` → `unavailable`); the next call
  starts a new process, after a backoff that doubles with each crash in a row (reset once a
  process has lived `BACKOFF_RESET_SECONDS`); a call that cannot wait out the backoff is told so at
  once. A start that fails (a secret command failing, a missing interface tool, no answer to
  `initialize` or `tools/list` within `startSeconds`) fails the calls of the backoff window at once
  with the same error;
- a restart after a crash: its cgroups made again with the binding's limits, its secrets resolved anew;
- pings: a process suspected of hanging is pinged, and killed if it does not answer;
- the disk watch: what the process keeps in its writable folders, measured while it runs (`diskwatch`);
- the stop (`stop`): a start under way is given up, the process stops, then its process group is
  killed, so nothing is left.

The launch itself (environment, sandbox, egress proxy) is `launching.prepare_launch`'s; the check
of a process's tools against its interfaces is `drift.check_tools`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.config.snapshot import Snapshot
from reconciler.connectors.client import ConnectorProcess, DispatchHook, LaunchSpec, await_start
from reconciler.connectors.diskwatch import CHECK_SECONDS, KILL_MARGIN_NS, measure, remove_left
from reconciler.connectors.drift import check_tools
from reconciler.connectors.errors import (
    ConnectorError,
    ConnectorNotSetUpError,
    ConnectorRestartingError,
    ConnectorStartError,
)
from reconciler.connectors.launching import Launch, declared_env, effective_egress, prepare_launch
from reconciler.connectors.llm import LlmConnector, LlmSettings
from reconciler.connectors.parking import Parking
from reconciler.connectors.quarters import Quarters
from reconciler.connectors.running import InRouter, RunningConnector
from reconciler.connectors.sandbox import limits_for
from reconciler.connectors.wrapping import ToolCaller, WrappedConnector

__all__ = ["BindingStatus", "PoolKey", "Site", "Supervisor"]

log = logging.getLogger("handler.connectors")

BACKOFF_FIRST_SECONDS = 0.1
PROBE_SECONDS = 2.0  # how long a process suspected of hanging has to answer a ping
BACKOFF_MAX_SECONDS = 30.0
BACKOFF_RESET_SECONDS = 60.0

PoolKey = tuple[str, str, str]  # (binding, binding content hash, connector content hash)


@dataclass(frozen=True)
class BindingStatus:
    """What the router can report about a binding's connector: its state, why, and any drift."""

    state: str  # "running" | "stopped" | "failed"
    message: str = ""
    drift: tuple[str, ...] = ()
    pid: int | None = None


@dataclass(eq=False)
class Site:
    """What every supervisor of one pool shares: where connectors run, the spare, the statuses, the pool's table."""

    root: Path
    state_dir: Path
    sandbox: bool
    max_line_bytes: int
    parking: Parking | None
    quarters: Quarters
    statuses: dict[str, BindingStatus]
    enlist: Callable[[PoolKey | None, str], Supervisor]  # the pool's supervisor of a key, entered in its table
    on_dispatch: DispatchHook | None = None
    agents: ToolCaller | None = None  # the router's agent runs, served as the built-in `agent`
    closed: bool = False


class Supervisor:
    """One binding's connector process, from its first start to its stop, as one key of the pool runs it."""

    def __init__(self, key: PoolKey | None, binding: str, site: Site) -> None:
        self.key = key
        self.binding = binding
        self._site = site
        self.serving: RunningConnector | None = None  # the connector it runs, in a process or inside the router
        self.process: ConnectorProcess | None = None  # the OS process under it, if any
        self.launch: Launch | None = None
        self.starting: asyncio.Task[RunningConnector] | None = None
        self.last_used = time.monotonic()
        self.started_at = 0.0
        self.crashes = 0  # in a row
        self.failures = 0  # failed starts in a row
        self.retry_at = 0.0
        self.restart_at = 0.0  # when a process that crashed starts again, its backoff over
        self.failure: ConnectorStartError | None = None
        self.drift: tuple[str, ...] = ()
        self.snapshot: Snapshot | None = None  # the one it was launched from: a restart resolves its secrets again
        self.watch: asyncio.Task[None] | None = None  # what its process keeps in its writable folders (`diskwatch`)
        self.probe: asyncio.Task[None] | None = None  # a ping after a call timed out
        self.dropped = False  # out of the pool's table (stopped): a later start goes to the table's supervisor

    @property
    def busy(self) -> bool:
        return (self.starting is not None and not self.starting.done()) or (
            self.serving is not None and self.serving.in_flight > 0)

    @property
    def host_uid(self) -> int | None:
        """The host uid the binding's connector runs as (`quarters.Quarters.host_uid`)."""
        return self._site.quarters.host_uid(self.binding)

    def call_space(self) -> tuple[Path, Path] | None:
        """Where a call of the running process stages its files (`Launch.call_space`): the router's path and the
        connector's; None unsandboxed or not running."""
        pid = self.process.pid if self.process is not None else None
        return self.launch.call_space(pid) if self.launch is not None and pid is not None else None

    @property
    def launch_spec(self) -> LaunchSpec | None:
        """How the running process was launched (command, folder, environment), if one runs."""
        return self.launch.spec if self.launch is not None and self.process is not None else None

    # --- the per-call path -------------------------------------------------------------------

    def running(self) -> RunningConnector | None:
        """The connector if it runs now: the per-call fast path, with no await."""
        connector = self.serving
        if connector is None or not connector.running:
            return None
        self.last_used = time.monotonic()
        return connector

    async def connector(self, snapshot: Snapshot, deadline: float | None = None) -> RunningConnector:
        """The running (or just started) connector, as `snapshot` configures the binding.

        A process that crashed starts again after its backoff; a caller who cannot wait that long (its `deadline`, the
        loop's clock, comes first) is told so at once (`ConnectorRestartingError`), not left to time out.
        """
        if self.key is None:
            raise ConnectorStartError(f"binding '{self.binding}' is not a connector binding in this revision")
        found = self.running()
        if found is not None:
            return found
        if self._site.closed:
            raise ConnectorStartError("the router is shutting down")
        if self.dropped:  # stopped (idle, drained) while its caller waited: the pool's supervisor of the key starts
            return await self._site.enlist(self.key, self.binding).connector(snapshot, deadline)
        if self.starting is None or self.starting.done():
            if self.failure is not None and time.monotonic() < self.retry_at:
                raise self.failure.reworded(self.failure.message)
            if self.serving is not None and self.process is not None:  # it ran and is gone: a crash
                self._note_crash()
            # The start runs as a task of its own: a caller cancelled meanwhile leaves no half-started process.
            self.starting = asyncio.get_running_loop().create_task(self._start(snapshot))
            self.starting.add_done_callback(_retrieve)
        starting = self.starting
        if deadline is not None and self.restart_at > deadline:
            wait = self.restart_at - time.monotonic()
            raise ConnectorRestartingError(f"connector of binding '{self.binding}' crashed ({self.crashes} in a row) "
                                           f"and waits {wait:.1f} s before it starts again", wait)
        connector = await await_start(starting, f"connector of binding '{self.binding}' was stopped as it started "
                                      "(the router is shutting down)")
        self.last_used = time.monotonic()
        return connector

    def suspect(self) -> None:
        """A call to this process timed out: ping it, and recycle it if it does not answer.

        A connector stuck on one call would otherwise hold every later call of every session; killing
        it fails what is still in flight (`crashed`) and the next call starts a fresh process.
        """
        if self.process is None or self.probe is not None or self._site.closed:
            return
        if not self.process.running:  # starting, or waiting to restart: nothing to ping, nothing hangs
            return
        self.probe = asyncio.get_running_loop().create_task(self._probe(self.process))

        def forget(_done: asyncio.Task[None]) -> None:
            self.probe = None

        self.probe.add_done_callback(forget)

    async def _probe(self, process: ConnectorProcess) -> None:
        pid = process.pid  # the process pinged, not one started after it
        try:
            await process.ping(PROBE_SECONDS)
        except ConnectorError:
            return  # it answered (with an error), or it ended meanwhile and restarts on the next call
        except TimeoutError:
            log.warning("connector of binding '%s' did not answer a ping after a call timed out; restarting it",
                        self.binding)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)

    def set_dispatch(self, hook: DispatchHook | None) -> None:
        """Hand every tools/call sent to the process through `hook` (`ConnectorPool.on_dispatch`)."""
        if self.process is not None:
            self.process.on_dispatch = hook

    async def restart(self, grace: float = 0.2) -> None:
        """Stop the process (`grace` seconds to exit) and start a fresh one now, with no backoff
        (`ConnectorPool.restart`); a connector inside the router has no process and is left as it is."""
        if self.process is None:
            return
        await self.process.stop(grace=grace)
        await self.process.ensure_started()

    # --- starting ----------------------------------------------------------------------------

    async def _start(self, snapshot: Snapshot) -> RunningConnector:
        binding_name, statuses = self.binding, self._site.statuses
        try:
            if self.serving is not None and self.process is not None:  # it ran and is gone: a crash
                await self._restart()
            else:
                await self._launch(snapshot)
        except ConnectorStartError as exc:
            await self._retire()
            self.failures += 1
            self.failure = exc
            self.retry_at = time.monotonic() + _backoff(self.failures)
            statuses[binding_name] = BindingStatus("failed", exc.message)
            log.warning("connector of binding '%s' did not start: %s", binding_name, exc.message)
            raise
        self.failures, self.failure = 0, None
        self.started_at = self.last_used = time.monotonic()
        pid = self.process.pid if self.process is not None else None
        statuses[binding_name] = BindingStatus("running", "", self.drift, pid)
        self._watch()
        if self.serving is None:  # pragma: no cover - every successful start sets it
            raise ConnectorStartError(f"binding '{binding_name}' started nothing")
        return self.serving

    def _note_crash(self) -> None:
        """The process died: count the crash, and set when it starts again (its backoff)."""
        now = time.monotonic()
        self.crashes = 1 if now - self.started_at >= BACKOFF_RESET_SECONDS else self.crashes + 1
        delay = _backoff(self.crashes)
        self.restart_at = now + delay
        log.warning("connector of binding '%s' ended unexpectedly (%d in a row); restarting in %.1f s",
                    self.binding, self.crashes, delay)

    async def _restart(self) -> None:
        """The process died: start it again after its backoff, in the same folder behind the same proxy,
        with its secrets resolved anew (one that expired may be why it died)."""
        binding_name = self.binding
        if self.process is None:  # pragma: no cover - only a process restarts
            return
        old_pid = self.process.pid
        if old_pid is not None:  # whatever the dead process forked goes with it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(old_pid, signal.SIGKILL)
        await asyncio.sleep(self.restart_at - time.monotonic())
        if self.launch is not None and self.launch.cgroups is not None and self.snapshot is not None:
            limits = limits_for(self.snapshot.connectors[self.snapshot.bindings[binding_name].connector or ""]
                                .spec.sandbox)
            try:
                self.launch.cgroups.remake(limits.processes, limits.memory_bytes)
            except OSError as exc:
                raise ConnectorStartError(f"binding '{binding_name}': cannot make its cgroups again: "
                                          f"{exc.strerror or exc}") from None
        if self.launch is not None and self.snapshot is not None:
            try:
                self.launch = await self.launch.with_fresh_secrets(self.snapshot, binding_name, self._site.root)
                self.process.spec = self.launch.spec
            except ConnectorStartError as exc:
                log.warning("binding '%s': %s; restarting with the secrets it had", binding_name, exc)
        await self.process.ensure_started()
        if self.snapshot is not None:
            self.drift = await check_tools(self.process, self.snapshot, binding_name)

    async def _launch(self, snapshot: Snapshot) -> None:
        binding_name, site = self.binding, self._site
        binding = snapshot.bindings[binding_name]
        connector = snapshot.connectors[binding.connector or ""]
        run = connector.spec.run
        if run.builtin == "agent":
            if site.agents is None:
                raise ConnectorNotSetUpError(f"binding '{binding_name}': this router runs no agents")
            self.serving = InRouter(site.agents)
            return
        if run.builtin is not None:
            if run.builtin != "llm":
                raise ConnectorStartError(f"binding '{binding_name}': connector '{connector.name}' names the "
                                          f"built-in '{run.builtin}'; the router provides only 'llm' and 'agent'")
            env, _ = await declared_env(binding, connector, site.root)
            try:
                settings = LlmSettings.from_env(env)
            except ValueError as exc:  # a setting the router cannot use: a person changes it
                raise ConnectorNotSetUpError(f"binding '{binding_name}': {exc}") from None
            self.serving = InRouter(LlmConnector(settings, effective_egress(binding, connector), binding_name))
            return
        self.launch = await prepare_launch(snapshot, binding_name, site.root, site.state_dir, sandbox=site.sandbox,
                                           max_line_bytes=site.max_line_bytes, host_uid=self.host_uid,
                                           parking=site.parking)
        self.snapshot = snapshot
        process = self.process = ConnectorProcess(self.launch.spec, on_dispatch=site.on_dispatch)
        await process.ensure_started()
        self.drift = await check_tools(process, snapshot, binding_name)
        wrap = connector.spec.wrap
        if wrap is None:
            self.serving = process
            return
        texts = {code: text for key in connector.spec.implements if (iface := snapshot.interfaces.get(key))
                 for code, text in iface.spec.errors.items()}
        self.serving = InRouter(WrappedConnector(process, wrap, texts))  # type: ignore[arg-type]

    # --- the disk watch ----------------------------------------------------------------------

    def _watch(self) -> None:
        """Measure what the process keeps in its writable folders while it runs (sandboxed only)."""
        if self.process is None or self.launch is None or not self.launch.writable:
            return
        if self.watch is None or self.watch.done():
            self.watch = asyncio.get_running_loop().create_task(self._watch_disk(self.process, self.launch))

    async def _watch_disk(self, process: ConnectorProcess, launch: Launch) -> None:
        """Every `CHECK_SECONDS` while `process` runs: over its bound, it is killed (its calls in flight fail) and what
        it left in its writable folders is removed before its next start (`diskwatch`)."""
        while not self._site.closed and self.process is process and process.running:
            await asyncio.sleep(CHECK_SECONDS)
            usage = await asyncio.to_thread(measure, launch.writable, launch.disk_bytes)
            why = usage.over(launch.disk_bytes)
            if why is None or self.process is not process:
                continue
            binding, pid = self.binding, process.pid
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

    # --- stopping ----------------------------------------------------------------------------

    async def _retire(self) -> None:
        """Stop what was started (its connector, its process group, its proxy and folder)."""
        if self.watch is not None:
            self.watch.cancel()
        connector, process, launch = self.serving, self.process, self.launch
        self.serving = self.process = self.launch = self.snapshot = self.watch = None
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

    async def stop(self, why: str) -> None:
        """Stop for good (the pool has dropped it from its table): a start under way is given up, the process ends."""
        if self.starting is None:  # never asked to start (its calls ended before step 7): nothing ran
            return
        if not self.starting.done():
            # Given up, not waited for: a start may take its whole `startSeconds`, or a crash loop's backoff.
            self.starting.cancel()
            await asyncio.wait([self.starting])
        log.info("connector of binding '%s' stopped: %s", self.binding, why)
        await self._retire()


def _backoff(count: int) -> float:
    return float(min(BACKOFF_FIRST_SECONDS * 2.0 ** max(count - 1, 0), BACKOFF_MAX_SECONDS))


def _retrieve(task: asyncio.Task[Any]) -> None:
    # Every caller awaiting a start may have been cancelled: read its outcome so none is reported unread.
    if not task.cancelled():
        task.exception()
