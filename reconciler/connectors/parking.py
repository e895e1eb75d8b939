"""One process parked in fresh cgroups ahead of need, so a connector's start does not wait on the kernel.

When the router is root, each connector's processes are bound by `pids` and `memory` cgroups (`cgroups`),
and the sandbox's first process must join them before it starts anything. On cgroup v1, the first task
migration after a quiet spell waits for an RCU grace period: about 6 to 16 ms here, most of what the
sandbox added to a cold start (docs/architecture.md §10). So the pool keeps one spare: a small process
(`spare`) already in leaves of its own, waiting on a pipe. A start takes it: the leaves get the
binding's limits, and the spare is handed the sandbox's command (bubblewrap onwards) and the launch's
environment as its one order, and executes it in place; the next spare is parked a moment later, off
the start's path. With no spare ready (several starts at once, or the first moments of the router),
the start goes the usual way, its shell joining fresh leaves itself (`sandbox.entering`).

Only used when the router is root and cgroups can be made; the spare runs as root on the host until it
executes bubblewrap, exactly as that shell does, and reads nothing but the router's order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from reconciler.connectors.cgroups import ConnectorCgroups, make_cgroups, sweep_stale
from reconciler.connectors.client import Handoff

__all__ = ["Parking", "Spare"]

log = logging.getLogger("handler.connector")
_SPARE = Path(__file__).with_name("spare.py")
_SPARE_PROCESSES = 4  # the parked process itself, until a start gives its leaves the binding's limits
_SPARE_MEMORY = 256 * 1024 * 1024
_REFILL_SECONDS = 0.5  # after a take: not on the start's own moment, on two cores it would slow it
_READY_SECONDS = 5.0


@dataclass
class Spare:
    """A parked process and its leaves."""

    popen: subprocess.Popen[bytes]
    cgroups: ConnectorCgroups
    taken: bool = field(default=False, init=False)

    def handoff(self, box: Sequence[str], seccomp: Path) -> Handoff:
        """The launch's first spawn: send the order and return this process; None when used already (a restart
        of the same launch starts the usual way, into the same leaves)."""

        def spawn(_command: Sequence[str], cwd: str, env: dict[str, str],
                  pipes: bool) -> subprocess.Popen[bytes] | None:
            if self.taken:
                return None
            self.taken = True
            order = orjson.dumps({"argv": list(box), "env": env, "cwd": cwd, "seccomp": str(seccomp), "pipes": pipes})
            stdin = self.popen.stdin
            assert stdin is not None  # noqa: S101 - parked with a pipe
            stdin.write(len(order).to_bytes(8, "big") + order)
            stdin.flush()
            if not pipes:  # a socket connector: it gets /dev/null, as a usual spawn gives it
                stdin.close()
                if self.popen.stdout is not None:
                    self.popen.stdout.close()
                self.popen.stdin = self.popen.stdout = None
            return self.popen

        return spawn

    def discard(self) -> None:
        """End a spare no start took, and remove its leaves."""
        with contextlib.suppress(OSError):
            if self.popen.stdin is not None:
                self.popen.stdin.close()
        try:
            self.popen.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        for pipe in (self.popen.stdout, self.popen.stderr):
            if pipe is not None:
                pipe.close()
        self.cgroups.remove()


class Parking:
    """Keeps one spare ready for the pool's next start."""

    def __init__(self) -> None:
        self._spare: Spare | None = None
        self._making: asyncio.Task[None] | None = None
        self._in_thread = False  # `_making` is parking a spare on a thread now
        self._closed = False

    @property
    def parked(self) -> int | None:
        """The process id of the spare ready now, if any."""
        return self._spare.popen.pid if self._spare is not None else None

    async def start(self) -> None:
        """Sweep the leaves a killed router left, park the first spare and wait for it (bounded), so the router's
        first start finds it."""
        swept = await asyncio.to_thread(sweep_stale)
        if swept:
            log.info("removed %d empty connector cgroups left by a router that was killed", swept)
        self._refill(delay=0)
        if self._making is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._making), _READY_SECONDS)

    def take(self, processes: int, memory_bytes: int) -> Spare | None:
        """The spare, its leaves bound for the binding; None when none is ready (the next one is on its way)."""
        spare, self._spare = self._spare, None
        self._refill(delay=_REFILL_SECONDS)
        if spare is None:
            return None
        why = f"it stopped (exit status {spare.popen.returncode})" if spare.popen.poll() is not None else ""
        if not why:
            try:
                spare.cgroups.set_limits(processes, memory_bytes)
            except OSError as exc:
                why = f"its cgroups refused the binding's limits: {exc.strerror}"
        if why:
            log.warning("cannot use the parked connector process (%s); starting the usual way", why)
            threading.Thread(target=spare.discard, name="discard-spare", daemon=True).start()  # not on the loop
            return None
        return spare

    def _refill(self, delay: float) -> None:
        if self._closed or self._spare is not None or (self._making is not None and not self._making.done()):
            return
        self._making = asyncio.get_running_loop().create_task(self._make(delay))

    async def _make(self, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)  # only here may `aclose` cancel it: a thread parking cannot be stopped
        self._in_thread = True
        parking = asyncio.ensure_future(asyncio.to_thread(_park))
        try:
            spare = await asyncio.shield(parking)
        except asyncio.CancelledError:  # the loop is going away: the spare the thread brings must not outlive it
            parking.add_done_callback(_discard_parked)
            raise
        finally:
            self._in_thread = False
        if self._closed and spare is not None:
            await asyncio.to_thread(spare.discard)
            return
        self._spare = spare

    async def aclose(self) -> None:
        """End the spare and stop parking."""
        self._closed = True
        if self._making is not None:
            if not self._in_thread:
                self._making.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._making  # a spare parked meanwhile sees the parking closed and ends
        spare, self._spare = self._spare, None
        if spare is not None:
            await asyncio.to_thread(spare.discard)


def _discard_parked(done: asyncio.Future[Spare | None]) -> None:
    if not done.cancelled() and done.exception() is None and (spare := done.result()) is not None:
        spare.discard()


def _park() -> Spare | None:
    """A new spare, once it has joined its leaves; None where that cannot be done here."""
    try:
        return _parked_spare()
    except OSError as exc:
        log.warning("could not park a connector process (%s); starts join their cgroups themselves", exc)
        return None


def _parked_spare() -> Spare | None:
    cgroups = make_cgroups(f"spare.{secrets.token_hex(4)}", _SPARE_PROCESSES, _SPARE_MEMORY)
    if cgroups is None:
        return None
    try:
        popen = subprocess.Popen([sys.executable, "-I", "-S", str(_SPARE), *cgroups.procs], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/", env={},
                                 start_new_session=True)
    except OSError as exc:
        log.warning("could not park a connector process (%s); starts join their cgroups themselves", exc.strerror)
        cgroups.remove()
        return None
    spare = Spare(popen, cgroups)
    assert popen.stdout is not None  # noqa: S101 - a pipe
    if os.read(popen.stdout.fileno(), 1) != b"\0":  # it joined its leaves (or died saying why on stderr)
        said = popen.stderr.read().decode(errors="replace").strip() if popen.stderr else ""
        log.warning("a parked connector process stopped: %s", said or f"exit status {popen.wait()}")
        spare.discard()
        return None
    return spare
