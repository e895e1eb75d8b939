"""How an agent run is confined: the connectors' sandbox, with the profile's scope as its folder (docs/agents.md).

A run's runner gets the same bubblewrap world a connector gets (`sandbox`: its own PID, network, IPC and UTS
namespaces, the seccomp filter, rlimits, a capped `/tmp` as HOME, and as root its own host uid and cgroups),
with a different view of the host:

- read-only: the Python the service runs on and the service's code (`handler-service`, the bridge its host
  starts, and `handler-agent`), the runner's program (the folder of the first word of its command, or its
  runtime's folder when that is a `bin/`), every absolute path among its arguments (a script), and the
  runner's `readable` folders (an agent host's own installation);
- read-write: the profile's scope, its current folder; as root, the scope belongs to the run's uid;
- the profile's socket at `/run/handler/profiles/<profile>.sock`: a socket of its own that the router opens for
  this run alone and closes when it ends (so nothing else of the run folder, and no other profile's socket);
  its MCP configuration at `/run/handler/mcp.json`;
- the network: loopback only, and the runner's `egress` entries through the allow-list proxy, as a
  connector's (an agent host that calls its own vendor's API).

The router's side of the socket is the caller's (`AgentRuns`, which listens on `RunBox.socket`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from reconciler.connectors.cgroups import ConnectorCgroups, make_cgroups
from reconciler.connectors.egress import EgressProxy
from reconciler.connectors.errors import ConnectorNotSetUpError
from reconciler.connectors.launching import SERVICE_CODE, etc_files, program_found, raw_forwards, socket_dir
from reconciler.connectors.sandbox import (
    DEFAULT_LIMITS,
    BoxView,
    Limits,
    boxed,
    confined_env,
    entering,
    sandbox_support,
    write_seccomp,
)
from reconciler.places import open_private_file, remove_tree

__all__ = ["INSIDE_RUN_DIR", "RunBox", "RunPlan", "box_run", "socket_ready"]

log = logging.getLogger("handler.agent")
INSIDE_RUN_DIR = Path("/run/handler")  # the run folder as the run sees it: its profile's socket, its configuration
_HOME = Path("/tmp")  # noqa: S108 - the sandbox's own: a size-capped tmpfs
_MAX_SOCKET_PATH = 100  # unix socket paths are capped near 107 bytes


@dataclass(frozen=True)
class RunPlan:
    """What one run is to be: the runner's command (its input already last), where, as whom, reaching what."""

    run_id: str
    profile: str
    command: list[str]
    scope: Path
    env: dict[str, str]  # the run's own variables (its identity, its profile), added to the confined environment
    config_json: str  # its MCP configuration, naming INSIDE_RUN_DIR as the run folder
    readable: tuple[str, ...] = ()
    egress: tuple[str, ...] = ()
    host_uid: int | None = None  # the uid it runs as when the router is root
    limits: Limits = DEFAULT_LIMITS


@dataclass
class RunBox:
    """A run's sandbox, built: the command to start, where the router listens for it, what to remove after."""

    command: list[str]
    env: dict[str, str] = field(repr=False)
    cwd: Path
    socket: Path  # where the router listens for this run's sessions (bound into the sandbox as its profile's)
    folder: Path  # the run's private folder: its seccomp program, /etc files, configuration and socket
    proxy: EgressProxy | None = None
    readable: tuple[Path, ...] = ()  # its own folders bound read-only (the egress proxy's socket folder)
    cgroups: ConnectorCgroups | None = None

    async def cleanup(self) -> None:
        """Remove what the run's sandbox was built from; its processes are gone by now (killed with bwrap)."""
        if self.proxy is not None:
            await self.proxy.aclose()
        if self.cgroups is not None:
            self.cgroups.remove()
        for folder in (*self.readable, self.folder):
            try:
                remove_tree(folder)
            except OSError as exc:
                log.warning("could not remove %s, an ended run's folder: %s", folder, exc.strerror or exc)


async def box_run(plan: RunPlan, base: Path) -> RunBox:
    """The sandbox of `plan`, built in a private folder under `base` (see the module docstring).

    Raises `ConnectorNotSetUpError` when no sandbox can be built here, saying why and what to change.
    """
    support = sandbox_support()
    if not support.ok:
        raise ConnectorNotSetUpError(f"its runner cannot be sandboxed: {support.reason}")
    uid = plan.host_uid if support.privileged else None
    folder = _run_folder(base, plan.run_id)
    box = RunBox([], {}, plan.scope, folder / "profile.sock", folder)
    try:
        _write_private(folder / "mcp.json", plan.config_json, uid)
        if uid is not None:  # a walk of the whole scope: off the event loop
            await asyncio.to_thread(_own_scope, plan.scope, uid)
        env = {**confined_env({}, _HOME, tmp=_HOME, system_path=True), **plan.env,
               "HANDLER_RUN_DIR": str(INSIDE_RUN_DIR), "HANDLER_MCP_CONFIG": str(INSIDE_RUN_DIR / "mcp.json"),
               "PYTHONDONTWRITEBYTECODE": "1"}
        command = program_found(plan.command, env["PATH"], "install it, or give its absolute path in the profile's "
                                "[runner] command", "its runner")
        relay, hosts = await _egress(plan, box, uid)
        view = _view(plan, command, box, etc_files(folder, uid, hosts))
        box.cgroups = make_cgroups(f"run-{plan.run_id}", plan.limits.processes, plan.limits.memory_bytes)
        seccomp = folder / "seccomp.bpf"
        write_seccomp(seccomp)
        inside = boxed(command, view, plan.limits, host_uid=uid, relay=relay, chdir=str(plan.scope))
        box.command = [*entering(seccomp, box.cgroups.procs if box.cgroups is not None else ()), *inside]
        box.env = env
    except BaseException:
        await box.cleanup()
        raise
    return box


def socket_ready(box: RunBox, uid: int | None) -> None:
    """The router's socket for the run is listening at `box.socket`: make it the run's uid's to connect to."""
    if uid is not None and sandbox_support().privileged:
        os.chown(box.socket, uid, uid)


async def _egress(plan: RunPlan, box: RunBox, uid: int | None) -> tuple[list[str] | None, dict[str, str]]:
    """The relay that starts the run (its egress proxy started, in a folder of the run's uid bound into the
    sandbox), and the `/etc/hosts` lines of its raw forwards; no relay when it has no egress."""
    forwards, hosts = raw_forwards(plan.egress)
    if not plan.egress:
        return None, hosts
    net = socket_dir(box.folder, uid)
    box.proxy = EgressProxy(net / "egress.sock", list(plan.egress), owner=f"run {plan.run_id}")
    await box.proxy.start()
    if uid is not None:
        os.chown(box.proxy.socket_path, uid, uid)
    box.readable = (net,)
    return [sys.executable, "-m", "reconciler.connectors.relay", "--proxy", str(box.proxy.socket_path),
            *(arg for f in forwards for arg in ("--forward", f.to_arg()))], hosts


def _view(plan: RunPlan, command: Sequence[str], box: RunBox, etc: dict[str, str]) -> BoxView:
    readable = [SERVICE_CODE, Path(sys.prefix), Path(sys.base_prefix), *map(Path, plan.readable), *box.readable]
    if Path(command[0]).is_absolute():
        folder = Path(command[0]).resolve().parent
        readable.append(folder.parent if folder.name == "bin" else folder)
    readable += [Path(arg) for arg in command[1:] if arg.startswith("/")]
    files = {**etc, str(INSIDE_RUN_DIR / "mcp.json"): str(box.folder / "mcp.json"),
             str(INSIDE_RUN_DIR / "profiles" / f"{plan.profile}.sock"): str(box.socket)}
    kept = {str(p.resolve()) for p in readable if p.exists()}
    shown = tuple(p for p in kept if p not in {"/", "/usr"} and not p.startswith("/usr/"))
    return BoxView(shown, (str(plan.scope),), files)


def _run_folder(base: Path, run_id: str) -> Path:
    """The run's private folder: under `base`, or a short one under /tmp when a socket path there would be too
    long for a unix socket."""
    folder = base / run_id
    if len(os.fsencode(folder / "profile.sock")) > _MAX_SOCKET_PATH:
        return Path(tempfile.mkdtemp(dir="/tmp", prefix="hr"))
    folder.mkdir(mode=0o700)
    return folder


def _write_private(path: Path, text: str, uid: int | None) -> None:
    """A 0600 file of the run's uid (it holds the run's secret)."""
    fd = open_private_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW)
    with os.fdopen(fd, "w") as out:
        if uid is not None:
            os.fchown(out.fileno(), uid, uid)
        out.write(text)


def _own_scope(scope: Path, uid: int) -> None:
    """As root, the scope and what is in it become the run's uid's (its links are left as they are)."""
    os.chown(scope, uid, uid)
    for parent, folders, files in os.walk(scope):
        for name in (*folders, *files):
            with contextlib.suppress(FileNotFoundError):
                os.chown(Path(parent, name), uid, uid, follow_symlinks=False)
