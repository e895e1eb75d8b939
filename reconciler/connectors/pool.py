"""The connector processes of a router: the table of their supervisors, from the first call to the last session.

One process per binding, keyed by the binding's name and the content of the binding and its
connector (`pool_key`), started on the first call that needs it and shared by every session that
selects it. Each process has its supervisor (`supervisor.Supervisor`: its start, crash backoff, pings, disk
watch, cgroups, call space and stop); the router's pipeline asks the pool one thing per call, the supervisor of its
tool's key (`supervisor`), and asks that the rest. The pool decides when a process goes:

- idle stop: a process with no call in flight and none for `idle_seconds` is stopped (the next call
  starts it again);
- drain: the router tells the pool which keys its live generation uses (`set_live`) and which keys
  each session pinned (`pin`/`unpin`); a key no longer live stops as soon as no session pinned to
  it remains and no call is in flight (or when idle);
- shutdown (`close`): a start under way is given up, every process stops, then its process group is
  killed, so nothing is left.

It also keeps what every supervisor shares (`supervisor.Site`): the spare parked for the next start (`parking`),
each binding's host uid (`quarters`), the bindings' statuses, and the conformance runner's dispatch hook.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from reconciler.config.snapshot import Snapshot
from reconciler.connectors.client import DispatchHook, LaunchSpec
from reconciler.connectors.errors import ConnectorStartError
from reconciler.connectors.parking import Parking
from reconciler.connectors.quarters import Quarters
from reconciler.connectors.running import RunningConnector
from reconciler.connectors.supervisor import BindingStatus, PoolKey, Site, Supervisor
from reconciler.connectors.wrapping import ToolCaller
from reconciler.places import default_state_dir
from reconciler.wire.framing import DEFAULT_MAX_LINE_BYTES

__all__ = ["DEFAULT_IDLE_SECONDS", "BindingStatus", "ConnectorPool", "PoolKey", "RunningConnector", "Supervisor",
           "pool_key"]

DEFAULT_IDLE_SECONDS = 600.0  # ten minutes: a session's pauses stay warm, an abandoned connector goes


def pool_key(snapshot: Snapshot, binding_name: str) -> PoolKey | None:
    """What identifies a binding's process in `snapshot`: its name and the content it runs with."""
    binding = snapshot.bindings.get(binding_name)
    connector = snapshot.connectors.get(binding.connector or "") if binding is not None else None
    if binding is None or connector is None:
        return None
    return (binding_name, binding.content_hash, connector.content_hash)


class ConnectorPool:
    """The table of a router's connector processes' supervisors: finds, shares, stops and drains them."""

    def __init__(self, root: Path, state_dir: Path | None = None, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, *,
                 idle_seconds: float = DEFAULT_IDLE_SECONDS, sandbox: bool = True) -> None:
        state = state_dir if state_dir is not None else default_state_dir(root)
        self.idle_seconds = idle_seconds
        self.sandbox = sandbox
        self._live: dict[PoolKey, Supervisor] = {}
        self._pins: Counter[PoolKey] = Counter()
        self._current: frozenset[PoolKey] | None = None  # None: every key is live
        self.statuses: dict[str, BindingStatus] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        # A process parked in cgroups ahead of the next start (root only: the cgroups are root's).
        self._parking = Parking() if sandbox and os.geteuid() == 0 else None
        self._site = Site(root, state, sandbox, max_line_bytes, self._parking,
                          Quarters(state, sandbox=sandbox), self.statuses, self.supervisor)

    async def start(self) -> None:
        """Get ready for the first start: park a spare process (`parking`) when this pool uses cgroups."""
        if self._parking is not None:
            await self._parking.start()

    # --- the per-call path -------------------------------------------------------------------

    def supervisor(self, key: PoolKey | None, binding_name: str) -> Supervisor:
        """The supervisor of `key`'s process (see `pool_key`), entered in the table if it has none yet: the one
        question a call asks the pool, with no await; the process starts on the supervisor's `connector`."""
        found = self._live.get(key) if key is not None else None
        if found is not None:
            return found
        made = Supervisor(key, binding_name, self._site)
        if key is not None and not self._site.closed:
            self._live[key] = made
            self._ensure_reaper()
        return made

    async def connector(self, snapshot: Snapshot, binding_name: str, deadline: float | None = None) -> RunningConnector:
        """The running (or just started) connector for `binding_name` as `snapshot` configures it
        (`Supervisor.connector`)."""
        key = pool_key(snapshot, binding_name)
        if key is None:
            raise ConnectorStartError(f"binding '{binding_name}' is not a connector binding in this revision")
        return await self.supervisor(key, binding_name).connector(snapshot, deadline)

    def suspect(self, key: PoolKey | None) -> None:
        """A call to `key`'s process timed out: ping it, and recycle it if it does not answer (`Supervisor.suspect`)."""
        found = self._live.get(key) if key is not None else None
        if found is not None:
            found.suspect()

    def on_dispatch(self, hook: DispatchHook | None) -> None:
        """Hand every tools/call sent to a connector process, from now on, through `hook`.

        The hook sees what reaches the process (for a wrap, the wrapped server's calls, after
        renaming), across restarts: how the conformance runner records what reached a connector.
        """
        self._site.on_dispatch = hook
        for found in self._live.values():
            found.set_dispatch(hook)

    def serve_agents(self, runs: ToolCaller) -> None:
        """Serve the built-in `agent` connector with `runs` (the router's `runs.AgentRuns`)."""
        self._site.agents = runs

    def run_uid(self, profile: str) -> int | None:
        """The host uid the runs of `profile`'s agent run as when the router is root (`quarters`), else None:
        one per profile, apart from every binding's."""
        return self._site.quarters.host_uid(f"run:{profile}")

    def launch_spec(self, binding_name: str) -> LaunchSpec | None:
        """How the binding's running process was launched (command, folder, environment), if one runs."""
        for found in self._live.values():
            if found.binding == binding_name and found.launch_spec is not None:
                return found.launch_spec
        return None

    async def restart(self, snapshot: Snapshot, binding_name: str, grace: float = 0.2) -> None:
        """Stop the binding's process (`grace` seconds to exit) and start a fresh one now, with no backoff.

        For a caller that judges each call on its own (the conformance runner after a hang or a crash);
        a connector inside the router has no process and is left as it is.
        """
        key = pool_key(snapshot, binding_name)
        found = self._live.get(key) if key is not None else None
        if found is not None:
            await found.restart(grace)

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
        return [s.process.pid for s in self._live.values()
                if s.process is not None and s.process.running and s.process.pid is not None]

    # --- idle stop and drain ---------------------------------------------------------------------

    async def _stop(self, found: Supervisor, why: str) -> None:
        """Take `found` out of the table and stop its process; the binding reads stopped when none of it is left."""
        if found.key is not None:
            self._live.pop(found.key, None)
        found.dropped = True
        binding = found.binding
        if not any(k[0] == binding for k in self._live) and self.statuses.get(binding) is not None \
                and self.statuses[binding].state == "running":
            self.statuses[binding] = BindingStatus("stopped", why)
        await found.stop(why)

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
        while not self._site.closed:  # the flag, not only the cancel: a cancelled wait_for can lose the cancel
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(tick):
                    await wake.wait()
            wake.clear()
            if self._site.closed:
                return
            now = time.monotonic()
            for key, found in list(self._live.items()):
                if found.busy:
                    continue
                if self._current is not None and key not in self._current and self._pins[key] <= 0:
                    await self._stop(found, "its binding changed or was removed and no session uses it")
                elif now - found.last_used >= self.idle_seconds:
                    await self._stop(found, f"idle for {self.idle_seconds:g} s")

    async def close(self) -> None:
        """Stop every process this pool started; none is left behind."""
        self._site.closed = True
        for found in self._live.values():
            if found.probe is not None:
                found.probe.cancel()
        self._poke()
        if self._reaper is not None:
            # Not cancelled: it may be stopping a drained process, which must end whole (no pipe left open).
            done, _ = await asyncio.wait([self._reaper], timeout=30)
            if not done:
                self._reaper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._reaper
        supervisors, self._live = list(self._live.values()), {}
        await asyncio.gather(*(self._stop(s, "the router stopped") for s in supervisors), return_exceptions=True)
        if self._parking is not None:
            await self._parking.aclose()
