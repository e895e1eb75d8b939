"""What a connector needs beyond the service (`[needs]`, docs/config.md): its own Python environment, and the
Debian packages and programs the machine must have.

- **Python packages** install into an environment of the connector's own, never into the service's: a
  virtualenv made from the service's Python (the same interpreter, none of the service's packages), built
  under `default_envs_dir()` in a folder named by a hash of what the connector declares and of that
  interpreter (`environment_key`), so connectors declaring the same packages share one, and a change of
  either builds a new one. Only `handler connector install` builds (`build_environment`), its package
  builds and setup commands in a sandbox (`buildbox`: another uid, no secret, the registries only, its
  own folder the one it writes), since they run the connector author's code; the service
  never installs anything: a launch whose environment is missing is refused, naming that command
  (`require_environment`). An environment counts as built once its marker file is written, last; its
  folders are 0755 and files 0644, since a connector may run as another uid (the router is root).
- **Debian packages and programs** are the machine's: checked when a connector starts
  (`missing_on_machine`), never by `handler validate`, which runs in pull requests elsewhere.

Called by `launching` (the environment's path, the checks at start) and by `handler connector install`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from reconciler.config.models import Needs
from reconciler.config.snapshot import Connector
from reconciler.connectors.buildbox import BuildBox, local_paths, npm_registry, pip_settings, registry_egress
from reconciler.connectors.errors import ConnectorNotSetUpError, ConnectorStartError
from reconciler.connectors.sandbox import sandbox_support
from reconciler.places import default_envs_dir

__all__ = ["MARKER", "Missing", "build_environment", "environment_key", "environment_path", "environment_ready",
           "missing_on_machine", "require_environment", "runtime_home"]

MARKER = "handler-environment.json"  # written last: an environment without it is unfinished
_PIP_TIMEOUT = 1800


def environment_key(needs: Needs) -> str:
    """The hash naming a connector's environment: its sorted requirements and the interpreter it is made from."""
    declared = {
        "python": sorted("".join(r.split()) for r in needs.python),  # spacing is not meaning
        **({"setup": needs.setup} if needs.setup else {}),  # (absent when empty: existing environments keep their name)
        "interpreter": [platform.python_implementation(), platform.python_version(), _base_python()],
    }
    return hashlib.sha256(json.dumps(declared, sort_keys=True).encode()).hexdigest()[:16]


def environment_path(connector: Connector, envs: Path | None = None) -> Path | None:
    """The folder of `connector`'s own environment, or None when it declares no Python packages."""
    if not connector.spec.needs.python:
        return None
    return (envs if envs is not None else default_envs_dir()) / environment_key(connector.spec.needs)


def environment_ready(path: Path) -> bool:
    return (path / MARKER).is_file() and (path / "bin" / "python").exists()


def require_environment(connector: Connector, envs: Path | None = None) -> Path | None:
    """The built environment of `connector` (None when it declares no Python packages).

    Raises `ConnectorStartError` naming `handler connector install` when it is not built: the service never builds.
    """
    path = environment_path(connector, envs)
    if path is not None and not environment_ready(path):
        raise ConnectorNotSetUpError(
            f"connector '{connector.name}' runs on an environment of its own ({', '.join(connector.spec.needs.python)})"
            f" that is not built on this machine (expected in {path}); run `handler connector install "
            f"{connector.name}`, then start it again")
    return path


def runtime_home(environment: Path) -> Path | None:
    """The installation of the Python an environment was made from (its `pyvenv.cfg` `home`'s parent), which
    its `bin/python` links to: the sandbox must show it too."""
    try:
        lines = (environment / "pyvenv.cfg").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            home = Path(value.strip())
            return home.parent if home.name == "bin" else home
    return None


@dataclass(frozen=True, slots=True)
class Missing:
    """What the machine lacks of a connector's `[needs]`, and how to install it."""

    debian: tuple[str, ...] = ()
    programs: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.debian or self.programs)

    def describe(self, connector: str) -> str:
        parts = []
        if self.debian:
            parts.append(f"the Debian package{'s' if len(self.debian) > 1 else ''} {', '.join(self.debian)} "
                         f"(apt-get install {' '.join(self.debian)})")
        if self.programs:
            parts.append(f"the program{'s' if len(self.programs) > 1 else ''} {', '.join(self.programs)} on its PATH")
        return f"connector '{connector}' needs {' and '.join(parts)}, missing on this machine; install, then retry"


def missing_on_machine(needs: Needs, path: str) -> Missing:
    """The Debian packages of `needs` not installed here (when this is a Debian-like system with dpkg) and its
    programs not found on `path`."""
    programs = tuple(p for p in needs.programs if shutil.which(p, path=path) is None)
    return Missing(tuple(p for p in needs.debian if not _debian_installed(p)), programs)


_installed: set[str] = set()  # packages once found installed; a missing one is asked again at the next start


def _debian_installed(package: str) -> bool:
    if package in _installed:
        return True
    dpkg = shutil.which("dpkg-query")
    if dpkg is None:
        return True  # not a Debian system: its programs, checked on PATH, stand for it
    done = subprocess.run([dpkg, "-W", "-f=${db:Status-Abbrev}", package], capture_output=True, text=True,
                          timeout=30, check=False)
    if done.returncode == 0 and done.stdout.startswith("ii"):
        _installed.add(package)
        return True
    return False


def build_environment(connector: Connector, envs: Path | None = None,
                      say: Callable[[str], None] = lambda _: None, *, sandbox: bool = True) -> bool:
    """Build `connector`'s environment unless it is built; True when this call built it.

    A virtualenv without pip, from the interpreter the service runs on, then the service's pip installs the
    requirements into it (`pip --python`) and the setup commands run, each in the build's sandbox
    (`buildbox`; unconfined only with `sandbox=False`, the installer's `--no-sandbox`). Raises
    `ConnectorStartError` when the build fails or no sandbox can be built (the unfinished folder is removed).
    Two installs at once wait for each other on a lock file beside the folder.
    """
    path = environment_path(connector, envs)
    if path is None:
        return False
    support = sandbox_support() if sandbox else None
    if support is not None and not support.ok:
        raise ConnectorStartError(f"its packages' builds and setup run in a sandbox, which cannot be built here: "
                                  f"{support.reason} (for `handler connector install`: --no-sandbox builds as "
                                  "you, with your environment and network, for code you trust)")
    path.parent.mkdir(parents=True, exist_ok=True)
    _readable(path.parent)
    with _locked(path.parent / f"{path.name}.lock"):
        if environment_ready(path):
            return False
        shutil.rmtree(path, ignore_errors=True)
        requirements = [" ".join(r.split()) for r in connector.spec.needs.python]
        say(f"{connector.name}: installing {', '.join(requirements)} into {path}")
        try:
            _run([_base_python(), "-m", "venv", "--without-pip", str(path)], "making the virtualenv")
            if sandbox:
                asyncio.run(_build_boxed(connector, path, requirements, say))
            else:
                _build_unconfined(connector, path, requirements, say)
            (path / MARKER).write_text(json.dumps({"connector": connector.name, "python": requirements}, indent=1))
            _make_readable(path)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
    return True


def _pip_install(path: Path, requirements: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "pip", "--python", str(path / "bin" / "python"), "install", "--quiet",
            "--disable-pip-version-check", "--no-input", *requirements]


async def _build_boxed(connector: Connector, path: Path, requirements: Sequence[str],
                       say: Callable[[str], None]) -> None:
    """pip, then the setup commands, in the build's sandbox: pip's registries only (npm's too for setup)."""
    settings = pip_settings()
    readable = [*local_paths(settings), *filter(None, [runtime_home(path)])]
    async with BuildBox(path, registry_egress(settings), settings, readable=readable) as box:
        await box.run(_pip_install(path, requirements), "pip install")
    setup = connector.spec.needs.setup
    if setup:
        registry = npm_registry()
        async with BuildBox(path, registry_egress(settings, registry), settings, readable=readable) as box:
            for command in setup:
                say(f"{connector.name}: setting up: {' '.join(command)}")
                await box.run(_in_environment(command, path), f"setup command {command[0]!r}",
                              extra_env={"NPM_CONFIG_REGISTRY": registry})


def _build_unconfined(connector: Connector, path: Path, requirements: Sequence[str],
                      say: Callable[[str], None]) -> None:
    """The build as the installing user, with its environment and network (`--no-sandbox`)."""
    _run(_pip_install(path, requirements), "pip install")
    for command in connector.spec.needs.setup:
        say(f"{connector.name}: setting up: {' '.join(command)}")
        _run(_in_environment(command, path), f"setup command {command[0]!r}", cwd=path)


def _in_environment(command: Sequence[str], environment: Path) -> list[str]:
    """A setup command with `python`/`python3` first meaning the environment's own Python."""
    first = str(environment / "bin" / "python") if command[0] in ("python", "python3") else command[0]
    return [first, *command[1:]]


def _run(command: Sequence[str], what: str, cwd: Path | None = None) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=_PIP_TIMEOUT, check=False,
                          env=_build_env(os.environ), cwd=cwd)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise ConnectorStartError(f"{what} failed (exit status {done.returncode}): " + " / ".join(said[-6:]))


def _build_env(source: Mapping[str, str]) -> dict[str, str]:
    """The build's environment: the caller's, less a virtualenv's own variables (the new one is chosen by path)."""
    return {k: v for k, v in source.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH")}


def _base_python() -> str:
    """The interpreter the service's own virtualenv (if any) was made from."""
    return str(Path(getattr(sys, "_base_executable", sys.executable) or sys.executable))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _readable(folder: Path) -> None:
    with contextlib.suppress(OSError):
        folder.chmod(0o755)


def _make_readable(root: Path) -> None:
    """Folders 0755 and files 0644 (executables 0755), whatever the umask: a connector of another uid reads them."""
    for folder, _dirs, files in os.walk(root):
        Path(folder).chmod(0o755)
        for name in files:
            file = Path(folder, name)
            if not file.is_symlink():
                file.chmod(0o755 if os.access(file, os.X_OK) else 0o644)
