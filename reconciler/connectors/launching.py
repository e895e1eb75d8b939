"""Building one connector process's launch from its binding, its connector and the sandbox.

The pool (`pool.ConnectorPool`) calls `prepare_launch` each time it starts a binding's process. The
launch is everything that process gets and nothing more:

- a private working folder under the state folder (`connectors/<binding>.<hash>/`), its HOME and
  its current folder, removed when the process stops;
- the confined environment: the connector's declared settings (the binding's value, else the
  manifest's default) and secrets (resolved now, from the binding's references), plus PATH, LANG
  and HOME; nothing else of the router's environment;
- rlimits from the connector's `[sandbox]` (or the defaults), set with `prlimit`;
- on Linux, its own network namespace; the egress it may reach (the binding's `egress`, else the
  connector's) goes through an `EgressProxy` on a unix socket; `egress = []` means no proxy and no
  network at all. Where namespaces are unavailable, the launch is refused unless the router was
  started with `--no-sandbox` (which warns once);
- on Linux, its own mount namespace too, with the view `fs_view` computes: the router's state and
  run folders and the user's home are empty but for the connector's own folders, code and tools
  (see `sandbox`); where mount namespaces are unavailable it runs without one, with a warning;
- relative paths in `run.command` resolve against the connector's folder
  (`command = ["python3", "main.py"]` runs the connector's own `main.py`);
- its stderr, line by line, to the log `handler.connector` and to `connectors/<binding>.stderr.log`,
  with every secret value masked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from reconciler.config.snapshot import Binding, Connector, Snapshot
from reconciler.connectors.client import LaunchSpec
from reconciler.connectors.egress import EgressProxy
from reconciler.connectors.errors import ConnectorStartError
from reconciler.connectors.sandbox import (
    FsView,
    Limits,
    confined_env,
    limits_for,
    mounts_available,
    namespaces_available,
    sandboxed_command,
)
from reconciler.connectors.secrets import resolve_secret
from reconciler.places import PrivatePlaceError, ensure_private_dir, open_private_file
from reconciler.wire.framing import DEFAULT_MAX_LINE_BYTES, LineFramer, Oversize

__all__ = ["Launch", "StderrLog", "declared_env", "effective_egress", "limited_command", "prepare_launch",
           "resolve_command"]

log = logging.getLogger("handler.connector")
_MAX_SOCKET_PATH = 100  # unix socket paths are capped near 107 bytes
_MAX_STDERR_LINE = 4000
_warned_no_sandbox = False
_warned_no_mounts = False


@dataclass
class Launch:
    """One process's launch and what the pool must clean up after it."""

    spec: LaunchSpec
    folder: Path  # the private working folder
    proxy: EgressProxy | None = None
    secrets: tuple[str, ...] = field(default=(), repr=False)  # the values to mask in its stderr
    socket_dirs: tuple[Path, ...] = ()  # short folders for sockets, when the working folder is too deep
    stderr: StderrLog | None = None

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
        for folder in (*self.socket_dirs, self.folder):
            shutil.rmtree(folder, ignore_errors=True)


class StderrLog:
    """Receives a process's stderr in chunks and logs it line by line, secrets masked."""

    def __init__(self, binding: str, secrets: Sequence[str], path: Path | None = None) -> None:
        self.binding = binding
        self.path = path  # also appended here (0600), masked the same: the binding's own stderr log
        # Longest first: a secret containing another is masked whole.
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._framer = LineFramer(_MAX_STDERR_LINE * 4, oversize="pass")

    def add_secrets(self, secrets: Sequence[str]) -> None:
        self._secrets = sorted({*self._secrets, *(s for s in secrets if s)}, key=len, reverse=True)

    def mask(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def feed(self, data: bytes) -> None:
        # A line with no end is logged in pieces as it comes, never buffered past the limit.
        for item in self._framer.feed(data):
            self._emit(item.data if isinstance(item, Oversize) else item)

    def _emit(self, line: bytes) -> None:
        text = self.mask(line.decode(errors="replace").rstrip("\r\n"))
        if not text.strip():
            return
        log.info("connector of binding '%s': %s", self.binding, text[:_MAX_STDERR_LINE])
        if self.path is not None:
            fd = open_private_file(self.path)
            try:
                os.write(fd, (text + "\n").encode())
            finally:
                os.close(fd)


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
            raise ConnectorStartError(f"binding '{binding.name}': {exc.message}") from None
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
                         run_dir: Path | None = None) -> Launch:
    """Everything one process of `binding_name` needs; see the module docstring."""
    binding = snapshot.bindings[binding_name]
    connector = snapshot.connectors[binding.connector or ""]
    run = connector.spec.run
    if not run.command:
        raise ConnectorStartError(f"connector '{connector.name}' has no run command")
    if sandbox and not namespaces_available():
        raise ConnectorStartError(
            f"binding '{binding_name}': this machine gives no network namespaces, so connector "
            f"'{connector.name}' cannot be sandboxed; start the router with --no-sandbox to run it unconfined")
    declared, secrets = await declared_env(binding, connector, root)
    digest = hashlib.sha256(f"{binding.content_hash}:{connector.content_hash}".encode()).hexdigest()[:10]
    base = state_dir / "connectors"
    _private_dir(base, "HANDLER_STATE_DIR")
    folder = Path(tempfile.mkdtemp(dir=base, prefix=f"{binding_name}.{digest}."))
    (folder / "tmp").mkdir(mode=0o700)
    env = confined_env(declared, folder)
    command = limited_command(resolve_command(run.command, root / connector.folder), limits_for(connector.spec.sandbox))
    proxy = None
    socket_dirs: list[Path] = []
    socket_path = None
    if run.transport == "socket":  # a path socket crosses the network namespace
        socket_path = str(_short_socket(folder, "mcp.sock", socket_dirs))
        env["HANDLER_CONNECTOR_SOCKET"] = socket_path
    if sandbox:
        egress = effective_egress(binding, connector)
        if egress:
            proxy = EgressProxy(_short_socket(folder, "egress.sock", socket_dirs), egress, owner=binding_name)
            await proxy.start()
        view = None
        if mounts_available():
            view = fs_view(snapshot, root, folder, state_dir, run_dir, binding_name, command, env, socket_dirs)
        else:
            _warn_no_mounts()
        command = sandboxed_command(command, proxy.socket_path if proxy is not None else None, view)
    else:
        _warn_unsandboxed()
    stderr = StderrLog(binding_name, secrets, base / f"{binding_name}.stderr.log")
    spec = LaunchSpec(name=binding_name, command=tuple(command), cwd=str(folder), env=env,
                      max_line_bytes=max_line_bytes, on_stderr=stderr.feed, socket_path=socket_path,
                      mask=stderr.mask)
    return Launch(spec, folder, proxy, secrets, tuple(socket_dirs), stderr)


def _private_dir(folder: Path, setting: str) -> None:
    """The connector's folders are 0700 and ours (docs/architecture.md §6): its stderr and calls are nobody else's."""
    try:
        ensure_private_dir(folder, setting)
    except PrivatePlaceError as exc:
        raise ConnectorStartError(str(exc)) from None


def fs_view(snapshot: Snapshot, root: Path, folder: Path, state_dir: Path, run_dir: Path | None, binding_name: str,
            command: Sequence[str], env: Mapping[str, str], socket_dirs: Sequence[Path] = ()) -> FsView:
    """What the connector sees (see `sandbox`): the router's run and state folders and the user's home
    hidden; its folder, its call folder and its socket folders writable; the config tree, its Python
    and its PATH readable; the config tree, the service's Python and code read-only wherever they are."""
    hidden = [state_dir, Path.home()]
    writable = [folder, *socket_dirs]
    if run_dir is not None:
        hidden.append(run_dir)
        calls = run_dir / "calls" / binding_name
        _private_dir(calls, "HANDLER_RUN_DIR")
        writable.append(calls)
    code = Path(__file__).resolve().parents[2]  # the service's own code (its source tree, when installed editable)
    readable = [root, code, Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent]
    if command and Path(command[0]).is_absolute():
        readable.append(Path(command[0]).resolve().parent)
    readable += [Path(p) for p in env.get("PATH", "").split(os.pathsep) if p]
    blanked = []
    for binding in snapshot.bindings.values():
        for ref in binding.spec.secrets.values():
            if not isinstance(ref, str) and ref.file is not None:  # a str is a literal: refused at start
                path = Path(ref.file).expanduser()
                blanked.append(path if path.is_absolute() else root / path)

    # What a connector could rewrite to act later with more than its own rights: the config tree (other
    # connectors' code), the service's Python and its own code.
    frozen = [root, Path(sys.prefix), Path(sys.base_prefix), code]

    def real(paths: Sequence[Path]) -> tuple[str, ...]:
        return tuple(str(p.resolve()) for p in paths if p.resolve() != Path("/"))

    return FsView(real(hidden), real(writable), real(readable), real(blanked), real(frozen))


def limited_command(command: Sequence[str], limits: Limits) -> list[str]:
    """`command` under `limits`, set by util-linux's `prlimit` (the router spawns from a thread, where a
    preexec function is unsafe); where prlimit is missing the command runs unbounded, with a warning."""
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        log.warning("prlimit is not installed: connector processes run without memory, CPU and file-size limits")
        return list(command)
    return [prlimit, f"--data={limits.memory_bytes}", f"--cpu={limits.cpu_seconds}", f"--fsize={limits.file_bytes}",
            "--", *command]


def _short_socket(folder: Path, name: str, made: list[Path]) -> Path:
    """`folder/name`, or, when that is too long for a unix socket, a path in a new short folder (added to `made`)."""
    path = folder / name
    if len(os.fsencode(path)) <= _MAX_SOCKET_PATH:
        return path
    short = Path(tempfile.mkdtemp(dir="/tmp", prefix="hx"))  # the state folder is too deep
    made.append(short)
    return short / name


def _warn_no_mounts() -> None:
    global _warned_no_mounts  # noqa: PLW0603 - one warning per router process
    if not _warned_no_mounts:
        _warned_no_mounts = True
        log.warning("this machine gives no mount namespaces: sandboxed connectors have their own network but can "
                    "read the router's files (its state folder, sockets and the user's home)")


def _warn_unsandboxed() -> None:
    global _warned_no_sandbox  # noqa: PLW0603 - one warning per router process, whatever starts first
    if not _warned_no_sandbox:
        _warned_no_sandbox = True
        log.warning("connectors run WITHOUT a sandbox (--no-sandbox): no network namespace and no egress "
                    "allow-list; their environment and rlimits are still confined")


def _setting_text(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)

