"""Building one connector process's launch from its binding, its connector and the sandbox.

The supervisor of a binding's process (`supervisor.Supervisor`) calls `prepare_launch` at each start. The
launch is everything that process gets and nothing more:

- a private folder under the state folder (`connectors/<binding>.<hash>.*/`, the router's, 0700) holding
  what its sandbox is built from (the seccomp program, its `/etc/passwd`, `group` and `hosts`) and
  its socket folder; removed when the process stops;
- the confined environment: the connector's declared settings (the binding's value, else the
  manifest's default) and secrets (resolved now, from the binding's references), plus PATH, LANG
  and HOME, and what a connector on the connector kit reads (`kit_env`: `HANDLER_INTERFACES`, the
  tree's interfaces, and the kit's folder as PYTHONPATH, both in its view); nothing else of the router's
  environment;
- its sandbox (`sandbox.entering` and `sandbox.boxed`): the view `box_view` computes, its call space
  (`callspace`: a tmpfs of its `diskMb`, which the router reaches through the sandbox's root), a
  size-capped `/tmp` as HOME; its socket folder writable only for a socket connector (the relay only
  connects to the proxy's socket there); when the router is root, the host uid the pool gives the
  binding and its cgroups (`cgroups`: the leaves of the pool's parked spare, `parking`, when one is
  ready, whose process then runs the sandbox; else fresh ones its shell joins); the egress it may
  reach (the binding's `egress`, else the connector's)
  through an `EgressProxy` on a unix socket and the `relay` inside; `egress = []` means no proxy and
  no network at all. Where no sandbox can be built the launch is refused, saying why and what to
  change, unless the router was started with `--no-sandbox` (which warns once: the connector then
  runs in the router's own folder and network, with its rlimits and environment still confined);
- relative paths in `run.command` resolve against the connector's folder
  (`command = ["python3", "main.py"]` runs the connector's own `main.py`);
- `python` (or `python3`) first in `run.command` is the Python of the connector's own environment when its
  `[needs]` declares Python packages (its `bin/` leads PATH; a missing one refuses the start, naming
  `handler connector install`), else the service's; whatever `[run]` starts (`python3 main.py`, `./server`,
  `sh run.sh`), the sandbox shows the connector folder's `__pycache__` folders empty (unsandboxed, its
  Pythons keep compiled files in its private folder, `PYTHONPYCACHEPREFIX`), so a compiled file there
  never runs in place of its reviewed source (validate refuses one anyway, N013); the Debian packages
  and programs it needs are
  checked first (`environments`), a missing one refusing the start with the `apt-get install` to run;
- its stderr, line by line, to the log `handler.connector` and to `connectors/<binding>.stderr.log`,
  with every secret value masked, metered and rotated (`stderrlog`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from reconciler.config.snapshot import Binding, Connector, Snapshot
from reconciler.connectors.callspace import INSIDE, CallSpace
from reconciler.connectors.cgroups import ConnectorCgroups, make_cgroups
from reconciler.connectors.client import Handoff, LaunchSpec
from reconciler.connectors.diskwatch import DEFAULT_DISK_BYTES
from reconciler.connectors.egress import EgressProxy
from reconciler.connectors.environments import environment_path, missing_on_machine, require_environment, runtime_home
from reconciler.connectors.errors import ConnectorNotSetUpError, ConnectorStartError
from reconciler.connectors.parking import Parking
from reconciler.connectors.relay import Forward
from reconciler.connectors.sandbox import (
    BoxView,
    Limits,
    boxed,
    confined_env,
    entering,
    limits_for,
    sandbox_support,
    write_seccomp,
)
from reconciler.connectors.secrets import resolve_secret
from reconciler.connectors.stderrlog import StderrLog
from reconciler.places import PrivatePlaceError, ensure_private_dir, kit_folder, remove_tree
from reconciler.wire.framing import DEFAULT_MAX_LINE_BYTES

__all__ = ["SERVICE_CODE", "Launch", "box_view", "declared_env", "effective_egress", "etc_files", "kit_env",
           "limited_command", "prepare_launch", "program_found", "raw_forwards", "resolve_command", "socket_dir"]

log = logging.getLogger("handler.connector")
_MAX_SOCKET_PATH = 100  # unix socket paths are capped near 107 bytes
_warned_no_sandbox = False
_SANDBOX_HOME = Path("/tmp")  # noqa: S108 - the sandbox's own /tmp: a size-capped tmpfs no one else sees
PYCACHE = ".pycache"  # unsandboxed, under its private tmp: where its Pythons keep compiled files
SERVICE_CODE = Path(__file__).resolve().parents[1]  # the service's package: the relay and the wrapper run from it


@dataclass
class Launch:
    """One process's launch and what the pool must clean up after it."""

    spec: LaunchSpec
    folder: Path  # the private working folder
    proxy: EgressProxy | None = None
    secrets: tuple[str, ...] = field(default=(), repr=False)  # the values to mask in its stderr
    socket_dirs: tuple[Path, ...] = ()  # its socket folder (mcp.sock, egress.sock), bound into its sandbox
    stderr: StderrLog | None = None
    host_uid: int | None = None  # the uid it runs as, when not the router's (the router is root)
    cgroups: ConnectorCgroups | None = None
    handoff: Handoff | None = None  # its first spawn, by the parked spare it took
    writable: tuple[Path, ...] = ()  # the host's folders it may write (sandboxed), which the pool measures
    disk_bytes: int = DEFAULT_DISK_BYTES  # the most those may hold
    space: CallSpace | None = None  # its calls' files, in its sandbox (sandboxed only)

    def call_space(self, pid: int) -> tuple[Path, Path] | None:
        """Where a call of its process `pid` stages files: the router's path and the connector's path of the same
        folder; None when it has no call space (unsandboxed: the call folders are the host's)."""
        return (self.space.reach(pid), INSIDE) if self.space is not None else None

    async def with_fresh_secrets(self, snapshot: Snapshot, binding_name: str, root: Path) -> Launch:
        """This launch with its secrets resolved again, so a restart picks up a rotated token.

        Raises `ConnectorStartError` when a secret cannot be resolved now (the caller keeps this one).
        """
        binding = snapshot.bindings[binding_name]
        declared, secrets = await declared_env(binding, snapshot.connectors[binding.connector or ""], root)
        if self.stderr is not None:
            self.stderr.add_secrets(secrets)
        spec = dataclasses.replace(self.spec, env={**self.spec.env, **declared})
        return dataclasses.replace(self, spec=spec, secrets=tuple({*self.secrets, *secrets}))

    async def cleanup(self) -> None:
        if self.proxy is not None:
            await self.proxy.aclose()
        if self.cgroups is not None:
            self.cgroups.remove()
        if self.space is not None:
            self.space.close()
        for folder in (*self.socket_dirs, self.folder):  # the private folder holds what the connector wrote in tmp/
            try:
                remove_tree(folder)
            except OSError as exc:
                log.warning("could not remove %s, a stopped connector's folder: %s", folder, exc.strerror or exc)


async def declared_env(binding: Binding, connector: Connector, root: Path) -> tuple[dict[str, str], tuple[str, ...]]:
    """The connector's declared variables as this binding fills them, and the secret values among them.

    A secret that cannot be resolved raises `ConnectorStartError` naming the binding and the slot.
    """
    env: dict[str, str] = {}
    for name, spec in connector.spec.settings.items():
        value = binding.spec.settings.get(name, spec.default)
        if value is not None:
            env[spec.env] = _setting_text(value)
    secrets: list[str] = []
    for slot, ref in binding.spec.secrets.items():
        slot_spec = connector.spec.secretSlots.get(slot)
        if slot_spec is None:
            continue
        try:
            value = await resolve_secret(slot, ref, root)
        except ConnectorStartError as exc:
            raise exc.reworded(f"binding '{binding.name}': {exc.message}") from None
        env[slot_spec.env] = value
        secrets.append(value)
    return env, tuple(secrets)


def resolve_command(command: Sequence[str], folder: Path) -> list[str]:
    """`command` with each relative path that exists in the connector's folder made absolute."""
    out = []
    for i, arg in enumerate(command):
        looks_like_path = "/" in arg or i > 0
        if looks_like_path and not arg.startswith("-") and not Path(arg).is_absolute() and (folder / arg).exists():
            out.append(str((folder / arg).resolve()))
        else:
            out.append(arg)
    return out


def effective_egress(binding: Binding, connector: Connector) -> list[str]:
    """The binding's egress (which may only narrow the connector's), else the connector's."""
    return list(binding.spec.egress) if binding.spec.egress is not None else list(connector.spec.egress)


async def prepare_launch(snapshot: Snapshot, binding_name: str, root: Path, state_dir: Path, *,
                         sandbox: bool = True, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
                         host_uid: int | None = None, parking: Parking | None = None) -> Launch:
    """Everything one process of `binding_name` needs; see the module docstring.

    `host_uid`: the uid its sandbox runs it as when the router is root (the pool gives each binding its own);
    `parking`: the pool's spare, taken for this launch when one is ready.
    """
    binding = snapshot.bindings[binding_name]
    connector = snapshot.connectors[binding.connector or ""]
    run = connector.spec.run
    if not run.command:
        raise ConnectorStartError(f"connector '{connector.name}' has no run command")
    support = sandbox_support() if sandbox else None
    if support is not None and not support.ok:
        raise ConnectorNotSetUpError(f"binding '{binding_name}': connector '{connector.name}' cannot be sandboxed: "
                                  f"{support.reason}")
    uid = host_uid if support is not None and support.privileged else None
    declared, secrets = await declared_env(binding, connector, root)
    digest = hashlib.sha256(f"{binding.content_hash}:{connector.content_hash}".encode()).hexdigest()[:10]
    base = (state_dir / "connectors").absolute()  # its paths are read from the launch folder (the sandbox's cwd)
    _private_dir(base, "HANDLER_STATE_DIR")
    folder = Path(tempfile.mkdtemp(dir=base, prefix=f"{binding_name}.{digest}."))
    limits = limits_for(connector.spec.sandbox)
    if support is None:
        (folder / "tmp").mkdir(mode=0o700)
        env = confined_env(declared, folder)
    else:
        env = confined_env(declared, _SANDBOX_HOME, tmp=_SANDBOX_HOME, system_path=True)
    if support is None:  # unconfined: its Pythons keep compiled files in its private folder (sandboxed: see box_view)
        env["PYTHONPYCACHEPREFIX"] = str(Path(env["TMPDIR"]) / PYCACHE)
    env.update(kit_env(root))
    launch = Launch(LaunchSpec(name=binding_name, command=(), cwd=str(folder), env=env), folder, secrets=secrets,
                    host_uid=uid)
    try:  # whatever stops the start, the folder (and proxy, cgroups) made for it go
        _meet_needs(connector, binding_name, env)
        command = program_found(resolve_command(run.command, root / connector.folder), env.get("PATH", ""))
        egress = effective_egress(binding, connector) if support is not None else []
        if run.transport == "socket" or egress:
            launch.socket_dirs = (socket_dir(folder, uid),)
        socket_path = None
        if run.transport == "socket":  # a path socket crosses the network namespace
            socket_path = env["HANDLER_CONNECTOR_SOCKET"] = str(launch.socket_dirs[0] / "mcp.sock")
        if support is None:
            _warn_unsandboxed()
            command = limited_command(command, limits)
        else:
            command = await _boxed(launch, snapshot, root, binding_name, command, egress, limits, parking)
    except BaseException:
        await launch.cleanup()
        raise
    stderr = StderrLog(binding_name, secrets, base / f"{binding_name}.stderr.log")
    launch.stderr = stderr
    launch.spec = LaunchSpec(name=binding_name, command=tuple(command), cwd=str(folder), env=env,
                             start_timeout=run.startSeconds, max_line_bytes=max_line_bytes, on_stderr=stderr.feed,
                             socket_path=socket_path, mask=stderr.mask, handoff=launch.handoff)
    return launch


def kit_env(root: Path) -> dict[str, str]:
    """What a connector written on the kit reads: the interfaces' folder (`HANDLER_INTERFACES`) and the kit's
    folder on its PYTHONPATH (both bound read-only into its sandbox by `box_view`), whichever Python it runs on."""
    env = {"HANDLER_INTERFACES": str((root / "catalog/interfaces").absolute())}
    kit = kit_folder()
    if kit is not None:
        env["PYTHONPATH"] = str(kit)
    return env


def _meet_needs(connector: Connector, binding_name: str, env: dict[str, str]) -> None:
    """Put the connector's own environment first on its PATH (see the module docstring); refuse the start when
    that environment is not built or the machine lacks a Debian package or program it declares."""
    try:
        environment = require_environment(connector)
    except ConnectorStartError as exc:
        raise exc.reworded(f"binding '{binding_name}': {exc.message}") from None
    if environment is not None:
        env["PATH"] = str(environment / "bin") + os.pathsep + env["PATH"]
    missing = missing_on_machine(connector.spec.needs, env["PATH"])
    if missing:
        raise ConnectorNotSetUpError(f"binding '{binding_name}': {missing.describe(connector.name)}")


async def _boxed(launch: Launch, snapshot: Snapshot, root: Path, binding_name: str,
                 command: list[str], egress: list[str], limits: Limits, parking: Parking | None) -> list[str]:
    """`command` in its sandbox (`sandbox.boxed`, after `sandbox.entering`): its view, its proxy and relay, its
    cgroups (a parked spare's, which is then handed the sandbox to run)."""
    uid = launch.host_uid
    relay = None
    forwards, hosts = raw_forwards(egress)
    if egress:
        launch.proxy = EgressProxy(launch.socket_dirs[0] / "egress.sock", egress, owner=binding_name)
        await launch.proxy.start()
        if uid is not None:
            os.chown(launch.proxy.socket_path, uid, uid)
        relay = [sys.executable, "-m", "reconciler.connectors.relay", "--proxy", str(launch.proxy.socket_path),
                 *(arg for f in forwards for arg in ("--forward", f.to_arg()))]
    listens = snapshot.connectors[snapshot.bindings[binding_name].connector or ""].spec.run.transport == "socket"
    writable = list(launch.socket_dirs) if listens else []
    launch.space = CallSpace(binding_name)
    launch.writable, launch.disk_bytes = tuple(writable), limits.disk_bytes
    view = box_view(snapshot, root, binding_name, command, writable, etc_files(launch.folder, uid, hosts),
                    [] if listens else launch.socket_dirs)
    # As root, a parked spare's leaves; as a user, only where the host delegated cgroups to it (`cgroups`).
    spare = parking.take(limits.processes, limits.memory_bytes) if uid is not None and parking is not None else None
    launch.cgroups = (spare.cgroups if spare is not None
                      else make_cgroups(launch.folder.name, limits.processes, limits.memory_bytes))
    seccomp = launch.folder / "seccomp.bpf"
    write_seccomp(seccomp)
    box = boxed(command, view, limits, host_uid=uid, relay=relay)
    if spare is not None:
        launch.handoff = spare.handoff(box, seccomp)
    return [*entering(seccomp, launch.cgroups.procs if launch.cgroups is not None else ()), *box]


def raw_forwards(egress: Sequence[str]) -> tuple[list[Forward], dict[str, str]]:
    """A raw TCP forward for each entry naming an exact host and port (see `relay`), and the `/etc/hosts` lines
    (host -> loopback address) that send the connector's connections there."""
    forwards: list[Forward] = []
    hosts: dict[str, str] = {}
    for entry in egress:
        host, _, port = entry.rpartition(":")
        host = host.strip("[]").lower()
        if "*" in (host, port) or not port.isdigit():
            continue
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            # its own loopback address (all of 127/8 is the sandbox's loopback), from 127.0.0.2 on
            listen = hosts.setdefault(host, str(ipaddress.ip_address("127.0.0.2") + len(hosts)))
        else:
            if not address.is_loopback:
                continue  # an outside address cannot be a loopback listener: HTTP clients still reach it by the proxy
            listen = str(address)
        forwards.append(Forward(listen, int(port), f"{host if ':' not in host else f'[{host}]'}:{port}"))
    return forwards, hosts


def box_view(snapshot: Snapshot, root: Path, binding_name: str, command: Sequence[str], writable: Sequence[Path],
             files: Mapping[str, str], readable_too: Sequence[Path] = ()) -> BoxView:
    """What the connector sees beyond the system (see `sandbox`): its connector's folder, the interfaces (the
    contracts, public), the Python it runs on and the service's code (for the relay and the wrapper), the
    connector kit's folder, the
    program it names, read-only; `writable`. Nothing else of the config tree: not the profiles, not the
    other bindings, not another connector's code."""
    connector = snapshot.connectors[snapshot.bindings[binding_name].connector or ""]
    readable = [root / connector.folder, root / "catalog/interfaces", SERVICE_CODE, Path(sys.prefix),
                Path(sys.base_prefix), *filter(None, [kit_folder()]), *readable_too]
    environment = environment_path(connector)
    if environment is not None:  # its own Python environment, and the installation its bin/python links to
        readable += [environment, *filter(None, [runtime_home(environment)])]
    if command and Path(command[0]).is_absolute():
        program = Path(command[0]).resolve().parent
        readable.append(program.parent if program.name == "bin" else program)  # its runtime: lib/ beside bin/
    # Its folder's __pycache__ folders are shown empty: a compiled file there (a timestamp one whose header copies
    # the source's mtime and size, or an "unchecked hash" one) never runs in place of the reviewed source.
    emptied = [Path(f) for f, _, _ in os.walk(root / connector.folder) if Path(f).name == "__pycache__"]
    blanked = []
    for binding in snapshot.bindings.values():
        for ref in binding.spec.secrets.values():
            if not isinstance(ref, str) and ref.file is not None:  # a str is a literal: refused at start
                path = Path(ref.file).expanduser()
                blanked.append(path if path.is_absolute() else root / path)

    def real(paths: Sequence[Path]) -> tuple[str, ...]:
        kept = {str(p.resolve()) for p in paths if p.exists()}
        return tuple(p for p in kept if p not in {"/", "/usr"} and not p.startswith("/usr/"))

    return BoxView(real(readable), real(writable), files, real(blanked), real(emptied))


def etc_files(folder: Path, uid: int | None, hosts: Mapping[str, str]) -> dict[str, str]:
    """`/etc/passwd`, `group` and `hosts` of the sandbox, written into the launch's folder."""
    me = uid if uid is not None else os.getuid()
    contents = {
        "passwd": f"root:x:0:0:root:/root:/usr/sbin/nologin\nconnector:x:{me}:{me}:connector:/tmp:/usr/sbin/nologin\n"
                  "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"root:x:0:\nconnector:x:{me}:\nnogroup:x:65534:\n",
        "hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                 + "".join(f"{address}\t{host}\n" for host, address in hosts.items()),
    }
    etc = folder / "etc"
    etc.mkdir(mode=0o755)
    out = {}
    for name, text in contents.items():
        (etc / name).write_text(text)
        (etc / name).chmod(0o644)
        out[f"/etc/{name}"] = str(etc / name)
    return out


def program_found(command: Sequence[str], path: str, fix: str = "install it, or declare it in [needs]",
                  where: str = "its [run]") -> list[str]:
    """`command` with its program made absolute through `path` (a PATH), so a sandbox can bind its runtime; a program
    found nowhere refuses the start, naming `where` it is written and the `fix`."""
    command = list(command)
    if command and "/" not in command[0]:
        found = shutil.which(command[0], path=path)
        if found is None:  # nothing to run: the machine lacks it, which no retry changes
            raise ConnectorNotSetUpError(f"the program {command[0]} of {where} is not on its PATH ({path}); {fix}")
        command = [found, *command[1:]]
    return command


def _private_dir(folder: Path, setting: str) -> None:
    """The connector's folders are 0700 and ours (docs/architecture.md §6): its stderr and calls are nobody else's."""
    try:
        ensure_private_dir(folder, setting)
    except PrivatePlaceError as exc:
        raise ConnectorStartError(str(exc)) from None


def limited_command(command: Sequence[str], limits: Limits) -> list[str]:
    """`command` under `limits`, set by util-linux's `prlimit` (the router spawns from a thread, where a
    preexec function is unsafe); where prlimit is missing the command runs unbounded, with a warning."""
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        log.warning("prlimit is not installed: connector processes run without memory, CPU and file-size limits")
        return list(command)
    return [prlimit, f"--data={limits.memory_bytes}", f"--cpu={limits.cpu_seconds}", f"--fsize={limits.file_bytes}",
            "--", *command]


def socket_dir(folder: Path, uid: int | None) -> Path:
    """A folder for the connector's sockets, bound into its sandbox: `folder/sock`, or a short folder under /tmp
    when that path is too long for a unix socket (about 107 bytes)."""
    path = folder / "sock"
    if len(os.fsencode(path / "egress.sock")) <= _MAX_SOCKET_PATH:
        path.mkdir(mode=0o700)
    else:
        path = Path(tempfile.mkdtemp(dir="/tmp", prefix="hx"))
    if uid is not None:
        os.chown(path, uid, uid)
    return path


def _warn_unsandboxed() -> None:
    global _warned_no_sandbox  # noqa: PLW0603 - one warning per router process, whatever starts first
    if not _warned_no_sandbox:
        _warned_no_sandbox = True
        log.warning("connectors run WITHOUT a sandbox (--no-sandbox): they see this machine's files and processes "
                    "and reach any host, with no egress allow-list; their environment and rlimits are still confined")


def _setting_text(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)

