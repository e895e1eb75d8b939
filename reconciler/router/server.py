"""The running router: one unix socket per profile, the live generation, and the swap to a new one.

`Router` is what `app.serve` (and tests, and the reconcile loop) builds from a snapshot. Each profile
gets `$HANDLER_RUN_DIR/profiles/<profile>.sock`, mode 0600: which socket a caller reached is who it
is. `swap(snapshot)` compiles the new generation first, then replaces the live one in a single
assignment, then opens sockets for new profiles and closes those of removed ones; sessions keep the
generation they pinned, so calls in flight finish on theirs. `quiesce` stops taking calls and waits for those in
flight (docs/router.md "Stopping"); `aclose` closes the sockets and stops everything it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

from reconciler.config.errors import HandlerError
from reconciler.config.snapshot import Snapshot
from reconciler.connectors.pool import DEFAULT_IDLE_SECONDS, ConnectorPool
from reconciler.governance.gate import CallRequest, CallResult, Gate, OpenGate
from reconciler.places import (
    SHORTER_SOCKET,
    PrivatePlaceError,
    default_state_dir,
    ensure_private_dir,
    socket_path,
    socket_too_long,
)
from reconciler.router.calllog import CallLog
from reconciler.router.generation import Generation, ValidatorCache, compile_generation
from reconciler.router.hub import ConnectionBounds
from reconciler.router.limits import LimitBook
from reconciler.router.pipeline import Caller, Services, run_held
from reconciler.router.resumption import ENDED_NAME, Revocations, SessionSigner, load_key
from reconciler.router.runs import AgentRuns, Confinement
from reconciler.router.transport import Connection, Listener
from reconciler.wire.framing import DEFAULT_MAX_LINE_BYTES, LineBudget

__all__ = ["Router", "RouterError"]


class RouterError(HandlerError):
    """The router cannot serve as asked: a socket path too long, or another router on a profile."""


class Router:
    """Serves every profile of the live snapshot on its socket; see the module docstring."""

    def __init__(self, snapshot: Snapshot, *, root: Path, run_dir: Path, state_dir: Path | None = None,
                 gate: Gate | None = None, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
                 call_log: bool = True, sandbox: bool = True, idle_seconds: float = DEFAULT_IDLE_SECONDS,
                 bounds: ConnectionBounds | None = None) -> None:
        self.root = root
        self.run_dir = run_dir
        self.bounds = bounds or ConnectionBounds(max_line_bytes=max_line_bytes)
        self.line_budget = LineBudget(self.bounds.held_bytes)
        state = state_dir if state_dir is not None else default_state_dir(root)
        self.state_dir = state
        self._cache = ValidatorCache()
        self.live: Generation = compile_generation(snapshot, 1, root, self._cache)
        proofs: dict[str, Caller] = {}  # an agent run's secret's digest → the caller it proves
        self.services = Services(
            gate=gate or OpenGate(),
            pool=ConnectorPool(root, state, idle_seconds=idle_seconds, sandbox=sandbox),
            limits=LimitBook(),
            log=CallLog(_private(state, "HANDLER_STATE_DIR") / "calls.jsonl" if call_log else None),
            calls_dir=run_dir / "calls",  # one folder per binding, so a connector sees only its own
            proofs=proofs,
        )
        self.services.pool.set_live(self.live.pool_keys)
        confine = Confinement(self.services.pool.run_uid, lambda profile, path: Listener(self, profile, path)) \
            if sandbox else None
        self.runs = AgentRuns(lambda: self.live.snapshot, root, run_dir, state, proofs, confine=confine,
                              withdraw=self.services.gate.withdraw)
        self.services.pool.serve_agents(self.runs)
        self._listeners: dict[str, Listener] = {}
        self.connections: set[Connection] = set()
        self.stopping = False  # `quiesce` began: no socket opens again, those open turn new connections away
        self._signer: SessionSigner | None = None

    @property
    def signer(self) -> SessionSigner:
        """The signer of session records, under the state folder's key (made when first needed): the records of
        sessions over HTTP and of sessions a bridge handed over, which a restarted router resumes."""
        if self._signer is None:
            state = _private(self.state_dir, "HANDLER_STATE_DIR")
            self._signer = SessionSigner(load_key(state), Revocations(state / ENDED_NAME))
        return self._signer

    def socket_path(self, profile: str) -> Path:
        return socket_path(self.run_dir, profile)

    async def start(self) -> None:
        """Create the run folder (0700, see `_private`) and open a socket for every profile."""
        for folder in (self.run_dir, self.run_dir / "profiles", self.services.calls_dir):
            _private(folder, "HANDLER_RUN_DIR")
        await self.services.pool.start()
        self.runs.restore()
        for profile in sorted(self.live.snapshot.profiles):
            await self._open(profile)

    async def swap(self, snapshot: Snapshot) -> Generation:
        """Make `snapshot` live for sessions that start from now on; returns the new generation.

        A new profile whose socket cannot be opened (its path past the limit, another router serving it) is a
        `RouterError` raised before anything changes: the live generation stays live, every socket as it was.
        """
        generation = compile_generation(snapshot, self.live.number + 1, self.root, self._cache)
        opening = sorted(set(snapshot.profiles) - set(self._listeners))
        for profile in opening:
            if (problem := self._socket_problem(profile)) is not None:
                raise RouterError(problem)
        self.live = generation  # the swap itself: one assignment, nothing awaited in between
        self.services.pool.set_live(generation.pool_keys)  # the others drain as their sessions end
        for profile in opening if not self.stopping else ():
            self._listen(profile)  # each checked above
        for profile in sorted(set(self._listeners) - set(snapshot.profiles)):
            await self._close_socket(profile)
        return generation

    async def _open(self, profile: str) -> None:
        if (problem := self._socket_problem(profile)) is not None:
            raise RouterError(problem)
        self._listen(profile)

    def _listen(self, profile: str) -> None:
        """Serve the profile on its socket, whose path `_socket_problem` found usable."""
        path = self.socket_path(profile)
        if path.exists() or path.is_symlink():
            path.unlink()  # a socket nobody listens on: a stopped router's
        self._listeners[profile] = Listener(self, profile, path)

    def _socket_problem(self, profile: str) -> str | None:
        """Why the profile's socket cannot be opened, or None."""
        if (too_long := socket_too_long(self.run_dir, profile)) is not None:
            return f"profile '{profile}' cannot be served: {too_long}; {SHORTER_SOCKET}"
        path = self.socket_path(profile)
        if (path.exists() or path.is_symlink()) and _someone_listens(path):
            return f"another router already serves profile '{profile}' at {path}"
        return None

    async def _close_socket(self, profile: str) -> None:
        self._listeners.pop(profile).close()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path(profile).unlink()

    async def quiesce(self) -> None:
        """Stop taking calls and return once those in flight have finished and replied: every connection reads no
        further request (`Connection.stop_input`), so what its client sends next waits for the next router, and the
        profiles' sockets turn new connections away, a bridge's attach as one to make to the next router
        (`Listener`). The caller bounds the wait; `aclose` then ends what still runs."""
        self.stopping = self.runs.stopping = True
        await asyncio.gather(*(listener.started() for listener in self._listeners.values()))
        await asyncio.gather(*(conn.stop_input() for conn in list(self.connections)))

    @property
    def calls_in_flight(self) -> int:
        """How many calls its connections are running now."""
        return sum(len(conn.session.tasks) for conn in self.connections)

    async def aclose(self) -> None:
        """Close the sockets and sessions, end the agent runs, stop the connector processes, close the log."""
        await self.runs.stop()
        for profile in list(self._listeners):
            await self._close_socket(profile)
        for conn in list(self.connections):
            conn.end(over=False)  # a bridge holding its session hands it to the next router
        await asyncio.sleep(0)  # let cancelled calls log and settle before their connectors go
        await self.services.pool.close()
        self.services.log.close()

    async def execute_held(self, call: CallRequest) -> CallResult:
        """Run an approved hold on the live generation (the gate's `Executor`): see `pipeline.run_held`."""
        return await run_held(self.services, self.live, call)


def _private(folder: Path, setting: str) -> Path:
    """Make `folder` ours and 0700, refusing another user's: they could swap our sockets for theirs or
    read the call log (docs/architecture.md §6)."""
    try:
        return ensure_private_dir(folder, setting)
    except PrivatePlaceError as exc:
        raise RouterError(str(exc)) from None


def _someone_listens(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True
