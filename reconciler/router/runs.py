"""Agent runs: agent/v1's `agent_run`, `agent_status` and `agent_cancel`, served inside the router (docs/agents.md).

A run is one process of the agent's profile's `[runner]` command, the run's input as its last argument, started in
the profile's scope with the profile's MCP configuration and its instance in its environment; its last line of output
is the run's result. `AgentRuns` keeps the tree of runs (parent, child, starter: a member through the CLI, or the
run whose `agent_run` started it), enforces the runner's limits (its time, the profile's runs at once, the runs one
parent starts of it) and ends every run with a status and a cause, its process group gone. The router hands it to the
connector pool as the built-in `agent` (`ConnectorPool.serve_agents`); the pipeline calls it with the caller's
profile and instance in `_meta`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from reconciler.config.models import Runner
from reconciler.config.snapshot import Profile, Snapshot
from reconciler.connectors.errors import ConnectorNotSetUpError
from reconciler.connectors.llm import tool_error
from reconciler.connectors.runbox import INSIDE_RUN_DIR, RunPlan, box_run, socket_ready
from reconciler.places import ensure_private_dir, open_private_file
from reconciler.router.pipeline import Caller
from reconciler.router.runjournal import RunJournal
from reconciler.wire.meta import INSTANCE, PROFILE, RUN_PREFIX, minted_run_id, secret_digest

__all__ = ["AgentRuns", "Confinement", "Run", "RunRefusedError", "mcp_servers"]

_log = logging.getLogger("handler.router")

RESULT_CHARS = 1_000_000  # agent/v1's most for a result
ERROR_CHARS = 300  # of a failed runner's last line on stderr, in the run's error
# What the router keeps of a runner's output while it runs: the tail, enough for a whole result line (UTF-8: up to
# 4 bytes a character) and its newline. A runner writing more costs the router no more memory than this.
_KEPT_OUT_BYTES = 4 * RESULT_CHARS + 2
_KEPT_ERR_BYTES = 64 * 1024
ENDED = ("succeeded", "failed", "timed_out", "cancelled")
KEPT_ENDED = 1000  # ended runs `handler agent list` and agent_status still know
# What a run of an earlier router says once this one has read it from the journal (`runjournal`), and what a run the
# service stops says: each names what happened and what the agent that started it does next.
STOPPED = ("the service stopped while it ran (a restart or an upgrade), so it was cut short; start it again with "
           "agent_run if it is still needed")
LOST = ("the router that ran it stopped before it ended (it was killed, or its machine restarted), so it was cut "
        "short; start it again with agent_run if it is still needed")
NOT_STARTED_STOPPING = ("the service is stopping (a restart or an upgrade), so no run starts now; start it again in a "
                        "few seconds, once the service is back")
RESULT_LOST = ("it succeeded, but its result was kept only by the router that ran it, which has restarted since; start "
               "it again with agent_run if you need the result")
_PASSED = ("PATH", "LANG", "LC_ALL", "TZ", "HOME")


class RunRefusedError(Exception):
    """A run that cannot start, or a run id that cannot be read: one of agent/v1's errors."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass
class Run:
    """One run: who runs, who started it, under which run, and how it ended."""

    id: str
    agent: str
    input: str
    starter: str  # "member:<name>", or "run:<id>" for a run started by another run's agent_run
    parent: str | None  # the run that started it, if one did
    profile_of_starter: str | None = None  # the profile whose agent_run started it
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)  # proves its sessions
    status: str = "running"
    result: str | None = None
    error: str | None = None
    started: float = field(default_factory=time.time)
    ended: float | None = None
    process: asyncio.subprocess.Process | None = field(default=None, repr=False)
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def view(self) -> dict[str, Any]:
        """What agent_status answers, and `handler agent status` prints."""
        out: dict[str, Any] = {"run": self.id, "agent": self.agent, "status": self.status}
        if self.result is not None:
            out["result"] = self.result
        if self.error is not None:
            out["error"] = self.error
        return out

    def row(self) -> dict[str, Any]:
        """What `handler agent list` shows of it."""
        return {**self.view(), "parent": self.parent, "starter": self.starter, "started": self.started,
                "ended": self.ended}

    def record(self) -> dict[str, Any]:
        """What the journal keeps of it (`runjournal`): no input, no result."""
        return {"run": self.id, "agent": self.agent, "status": self.status, "error": self.error,
                "starter": self.starter, "parent": self.parent, "profileOfStarter": self.profile_of_starter,
                "started": self.started, "ended": self.ended}

    @classmethod
    def recorded(cls, record: Mapping[str, Any]) -> Run:
        """A run of an earlier router, from its journal record (`record`)."""
        return cls(str(record["run"]), str(record.get("agent") or ""), "", str(record.get("starter") or ""),
                   _text(record.get("parent")), _text(record.get("profileOfStarter")),
                   status=str(record.get("status") or "running"), error=_text(record.get("error")),
                   started=_number(record.get("started")) or 0.0, ended=_number(record.get("ended")))


def mcp_servers(profile: str, run_dir: Path, interfaces: list[str],
                identity: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The `mcpServers` entries of `profile` (as `handler mcp-config` prints them): one bridge per interface, and
    `handler` for the built-in tools; each bridge's environment carries `identity` (a run's instance and secret),
    since a host starts its servers with an environment of its own, not the run's."""
    bridge = Path(sys.executable).parent / "handler-service"
    command = str(bridge) if bridge.exists() else "handler-service"
    env = {"HANDLER_RUN_DIR": str(run_dir), **(identity or {})}
    servers = {"handler": {"command": command, "args": ["handler", "--profile", profile], "env": env}}
    servers.update({name: {"command": command, "args": [name, "--profile", profile, "--no-builtins"], "env": env}
                    for name in sorted(interfaces)})
    return {"mcpServers": servers}


class Closing(Protocol):
    def close(self) -> None: ...


@dataclass(frozen=True)
class Confinement:
    """How the router confines runs: the host uid of a profile's runs (root only), and a socket of a profile that
    the router serves at a path for one run alone (bound into its sandbox as the profile's socket)."""

    host_uid: Callable[[str], int | None]
    listen: Callable[[str, Path], Closing]


class AgentRuns:
    """Every run this router started, running or ended; served as the built-in `agent` connector."""

    running = True

    def __init__(self, snapshot: Callable[[], Snapshot | None], root: Path, run_dir: Path, state_dir: Path,
                 proofs: dict[str, Caller] | None = None, *, confine: Confinement | None = None,
                 withdraw: Callable[[str, str], Coroutine[Any, Any, int]] | None = None) -> None:
        self._snapshot = snapshot
        self.proofs = proofs if proofs is not None else {}  # a running run's secret's digest → the caller it proves
        self.root, self.run_dir = root, run_dir
        self.folder = state_dir / "runs"
        self.confine = confine  # None: runs are not sandboxed (the router's --no-sandbox)
        self._withdraw = withdraw  # the gate's: rejects the pending holds of a run that did not succeed
        self._withdrawing: set[asyncio.Task[int]] = set()
        self.runs: dict[str, Run] = {}
        self._journal = RunJournal(self.folder / "journal.jsonl", KEPT_ENDED)
        self.stopping = False  # the service is stopping (`Router.quiesce`): no run starts, since it would be cut short

    def restore(self) -> None:
        """Take in the runs of the routers before this one from the journal: a run that had ended as it ended (a
        result not kept: `RESULT_LOST`), one still running when its router was killed as cancelled (`LOST`), its
        pending holds withdrawn, as a run that ends does. Called on the event loop, before any run starts."""
        try:
            records = self._journal.recorded()
        except OSError as exc:
            _log.warning("the journal of runs cannot be read (%s): the runs of the routers before are not known",
                         exc.strerror)
            return
        for record in records:
            if record.get("status") not in ("running", *ENDED) or not minted_run_id(record["run"]):
                continue  # not a run's record (the journal was written by hand): its id names no file of ours either
            run = Run.recorded(record)
            self.runs[run.id] = run
            if run.status == "running":
                self._end(run, "cancelled", error=LOST)
            elif run.status == "succeeded":
                run.error = RESULT_LOST

    # --- agent/v1, as a connector answers -----------------------------------------------------

    async def ensure_started(self) -> None:
        """Nothing to start: runs start at agent_run."""

    async def call_tool(self, name: str, arguments: Mapping[str, Any],
                        meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
        meta = meta or {}
        caller, instance = str(meta.get(PROFILE, "")), meta.get(INSTANCE)
        try:
            if name == "agent_run":
                run = self.start(str(arguments["agent"]), str(arguments["input"]), starter=f"run:{instance}",
                                 parent=instance if isinstance(instance, str) else None, caller=caller)
                return _ok({"run": run.id, "agent": run.agent, "status": run.status})
            run = self.own(str(arguments["run"]), caller)
            if name == "agent_status":
                return _ok(run.view())
            await self.cancel(run.id, f"cancelled by the agent of profile '{caller}'")
            return _ok({"run": run.id, "agent": run.agent, "status": run.status})
        except RunRefusedError as exc:
            return tool_error(exc.code, exc.message)

    async def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        """What `handler agent` asks on the service's control socket: `{"op": "run" | "status" | "list" | "cancel"}`;
        a run is started as the member `as`, who must be one of org.toml."""
        op = message.get("op")
        try:
            if op == "list":
                return {"runs": [run.row() for run in sorted(self.runs.values(), key=lambda r: r.started)]}
            if op == "run":
                member = str(message.get("as") or "")
                snapshot = self._snapshot()
                if snapshot is None or snapshot.org is None or member not in snapshot.org.members:
                    return {"error": f"'{member}' is not a member of config/org.toml: give --as one of its members"}
                run = self.start(str(message.get("agent")), str(message.get("input") or ""), starter=f"member:{member}")
                return {"run": run.row()}
            found = self.runs.get(str(message.get("run")))
            if found is None:
                return {"error": f"no run '{message.get('run')}': `handler agent list` shows the runs"}
            if op == "cancel":
                await self.cancel(found.id, f"cancelled by {message.get('as') or 'an operator'} from the CLI")
            return {"run": found.row()}
        except RunRefusedError as exc:
            return {"error": exc.message}

    def own(self, run_id: str, caller: str) -> Run:
        """The run `run_id`, if the profile `caller` started it (or is it)."""
        run = self.runs.get(run_id)
        if run is None:
            raise RunRefusedError("unknown_agent", f"no run '{run_id}': give a run id agent_run returned")
        if caller not in (run.profile_of_starter, run.agent):
            raise RunRefusedError("not_allowed", f"run '{run_id}' was not started by this agent; follow your own runs")
        return run

    # --- starting, following, stopping ----------------------------------------------------------

    def start(self, agent: str, text: str, *, starter: str, parent: str | None = None,
              caller: str | None = None) -> Run:
        """Start a run of `agent` with input `text`; `caller` is the profile whose agent_run asks (None: a member)."""
        if self.stopping:
            raise RunRefusedError("unavailable", NOT_STARTED_STOPPING)
        snapshot = self._snapshot()
        profile = snapshot.profiles.get(agent) if snapshot is not None else None
        if snapshot is None or profile is None:
            known = ", ".join(sorted(snapshot.profiles)) if snapshot is not None else "none"
            raise RunRefusedError("unknown_agent", f"no agent '{agent}' (agents: {known})")
        if caller is not None:
            allowed = snapshot.profiles[caller].spec.agents if caller in snapshot.profiles else []
            if agent not in allowed:
                raise RunRefusedError("not_allowed", f"this profile may not run '{agent}'; it may run: "
                                      f"{', '.join(allowed) or 'no agent'}")
        runner = profile.spec.runner
        if runner is None:
            raise RunRefusedError("unavailable", f"agent '{agent}' has no [runner] in its profile: an owner adds one")
        self._check_limits(agent, parent, runner.maxConcurrent, runner.maxPerParent)
        run = Run(RUN_PREFIX + secrets.token_hex(8), agent, text, starter, parent, caller)
        self.runs[run.id] = run
        self._note(run)
        member = run.starter.removeprefix("member:") if run.parent is None and run.starter.startswith("member:") \
            else None
        self.proofs[secret_digest(run.secret)] = Caller(agent, run.id, run.parent, True, member)
        run.task = asyncio.get_running_loop().create_task(self._run(run, profile))
        return run

    def _check_limits(self, agent: str, parent: str | None, at_once: int, per_parent: int) -> None:
        mine = [r for r in self.runs.values() if r.agent == agent]
        if sum(r.status == "running" for r in mine) >= at_once:
            raise RunRefusedError("not_allowed", f"agent '{agent}' already has {at_once} runs under way, its most "
                                  "at once: wait for one to end")
        if parent is not None and sum(r.parent == parent for r in mine) >= per_parent:
            raise RunRefusedError("not_allowed", f"this run already started {per_parent} runs of '{agent}', its "
                                  "most: do the rest yourself")

    async def cancel(self, run_id: str, why: str) -> Run:
        """End `run_id` as cancelled (a run already ended stays as it ended); its process group is killed."""
        run = self.runs.get(run_id)
        if run is None:
            raise RunRefusedError("unknown_agent", f"no run '{run_id}'")
        if run.status == "running":
            self._end(run, "cancelled", error=why)
            if run.task is not None:
                run.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await run.task
            if run.process is not None:
                await run.process.wait()  # killed with its group by `_end`: reaped before the cancel answers
        return run

    async def stop(self) -> None:
        for run in list(self.runs.values()):
            await self.cancel(run.id, STOPPED)
        if self._withdrawing:
            await asyncio.gather(*self._withdrawing, return_exceptions=True)

    # --- one run's process ------------------------------------------------------------------------

    async def _run(self, run: Run, profile: Profile) -> None:
        runner = profile.spec.runner
        if runner is None:  # `start` found one; a profile is frozen
            return
        async with contextlib.AsyncExitStack() as stack:
            try:
                command, env, cwd = await self._launch(run, profile, runner, stack)
                run.process = await asyncio.create_subprocess_exec(
                    *command, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE, start_new_session=True)
            except (OSError, ConnectorNotSetUpError) as exc:
                cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                self._end(run, "failed", error=f"its runner could not start: {cause}")
                return
            try:
                async with asyncio.timeout(runner.timeoutSeconds):
                    out, err = await asyncio.gather(_tail(run.process.stdout, _KEPT_OUT_BYTES),
                                                    _tail(run.process.stderr, _KEPT_ERR_BYTES))
                    await run.process.wait()
            except TimeoutError:
                self._end(run, "timed_out", error=f"it ran past its runner's {runner.timeoutSeconds:g} s limit")
                return
            finally:
                _kill_group(run.process)
                await run.process.wait()
        self._ended_with(run, run.process.returncode or 0, out, err)

    def _ended_with(self, run: Run, status: int, out: bytes, err: bytes) -> None:
        """End `run` by what its runner did: its exit status, its last line of output (the result) or of stderr."""
        if status != 0:
            last = next((line for line in reversed(err.decode(errors="replace").splitlines()) if line.strip()), "")
            said = f": {last.strip()[:ERROR_CHARS]}" if last else ""
            self._end(run, "failed", error=f"its runner exited with status {status}{said}")
            return
        lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
        if not lines:
            self._end(run, "failed", error="its runner wrote no result on its output")
            return
        self._end(run, "succeeded", result=lines[-1][:RESULT_CHARS])

    async def _launch(self, run: Run, profile: Profile, runner: Runner,
                      stack: contextlib.AsyncExitStack) -> tuple[list[str], dict[str, str], Path]:
        """The command, environment and folder of the run's process; in its sandbox (`runbox`) unless the router
        runs connectors unconfined. What it made is undone by `stack` once the run ended."""
        scope = (self.root / profile.spec.scope).resolve()
        scope.mkdir(parents=True, exist_ok=True)
        identity = {"HANDLER_INSTANCE": run.id, "HANDLER_INSTANCE_SECRET": run.secret}
        if run.parent is not None:
            identity["HANDLER_PARENT_INSTANCE"] = run.parent
        ensure_private_dir(self.folder)
        if self.confine is None:
            return [*runner.command, run.input], self._unconfined_env(run, profile, identity), scope
        uid = self.confine.host_uid(profile.name)
        config = json.dumps(mcp_servers(profile.name, INSIDE_RUN_DIR, list(profile.selections), identity))
        plan = RunPlan(run.id, profile.name, [*runner.command, run.input], scope,
                       {"HANDLER_PROFILE": profile.name, **identity}, config, tuple(runner.readable),
                       tuple(runner.egress), uid)
        box = await box_run(plan, self.folder)
        stack.push_async_callback(box.cleanup)
        listener = self.confine.listen(profile.name, box.socket)
        stack.callback(listener.close)
        socket_ready(box, uid)
        return box.command, box.env, box.cwd

    def _unconfined_env(self, run: Run, profile: Profile, identity: dict[str, str]) -> dict[str, str]:
        """Unsandboxed (--no-sandbox): the run reaches the router's own socket of its profile, its MCP
        configuration in a 0600 file of the state folder (it holds the run's secret)."""
        config = self.folder / f"{run.id}.mcp.json"
        fd = open_private_file(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(mcp_servers(profile.name, self.run_dir, list(profile.selections), identity)))
        env = {k: v for k in _PASSED if (v := os.environ.get(k)) is not None}
        env.update({"HANDLER_RUN_DIR": str(self.run_dir), "HANDLER_PROFILE": profile.name,
                    "HANDLER_MCP_CONFIG": str(config), **identity})
        return env

    def _end(self, run: Run, status: str, *, result: str | None = None, error: str | None = None) -> None:
        if run.status != "running":
            return
        run.status, run.result, run.error, run.ended = status, result, error, time.time()
        self._note(run)
        self.proofs.pop(secret_digest(run.secret), None)  # an ended run's sessions prove nothing any more
        if status != "succeeded" and self._withdraw is not None:
            # A held call of a run cut short never runs after it; a run that finished left its holds on purpose.
            task = asyncio.get_running_loop().create_task(self._withdraw(run.id, f"{status}, {error}"))
            self._withdrawing.add(task)
            task.add_done_callback(self._withdrawing.discard)
        if run.process is not None:
            _kill_group(run.process)
        with contextlib.suppress(FileNotFoundError):  # unconfined runs' configuration
            (self.folder / f"{run.id}.mcp.json").unlink()
        self._forget_oldest()

    def _note(self, run: Run) -> None:
        """The run's start or end, into the journal; a journal that cannot be written costs the run nothing."""
        try:
            self._journal.write(run.record())
        except OSError as exc:
            _log.warning("the journal of runs cannot be written (%s): a restart will not know run %s",
                         exc.strerror, run.id)

    def _forget_oldest(self) -> None:
        """Keep at most `KEPT_ENDED` ended runs (each may hold a result of a megabyte), forgetting the oldest; a run
        whose parent still runs is kept, since it counts in that parent's `maxPerParent`."""
        ended = [r for r in self.runs.values() if r.status != "running"]
        if len(ended) <= KEPT_ENDED:
            return
        running = {r.id for r in self.runs.values() if r.status == "running"}
        forgettable = [r for r in ended if r.parent not in running]
        for old in sorted(forgettable, key=lambda r: r.ended or 0.0)[:len(ended) - KEPT_ENDED]:
            del self.runs[old.id]


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _kill_group(process: asyncio.subprocess.Process) -> None:
    """Kill the run's process and everything it started (its own session's group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _ok(body: dict[str, Any]) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": json.dumps(body)}], "structuredContent": body, "isError": False}


async def _tail(stream: asyncio.StreamReader | None, keep: int) -> bytes:
    """Read `stream` to its end, keeping its last `keep` bytes only: a runner's output is not the router's to hold."""
    kept = bytearray()
    while stream is not None and (chunk := await stream.read(1 << 16)):
        kept += chunk
        if len(kept) > 2 * keep:
            del kept[:-keep]
    return bytes(kept[-keep:])
