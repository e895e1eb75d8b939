"""How a connector process is confined: its environment, its folder, its limits, its network.

- environment: only the connector's declared secrets and settings, plus PATH, LANG and a HOME in
  the process's private folder; nothing else of the router's environment leaks in;
- resources: memory (RLIMIT_DATA: private writable memory; not RLIMIT_AS, whose address-space count
  breaks runtimes that reserve large unmapped regions, like V8's WebAssembly), CPU time and file
  size bounded by rlimits (the connector manifest's `[sandbox]`, else the defaults here);
- network (Linux): its own network namespace, entered with `unshare --net`, so a connector with
  `egress = []` has no network at all; declared egress goes through the router's allow-list proxy
  (`egress.EgressProxy`) by way of the relay `netns_init` runs inside the namespace;
- filesystem (Linux): its own mount namespace, where the router's private folders are empty (an
  `FsView`): the run folder (every profile's socket, every other binding's call folders), the state
  folder (the store, the call log, the link key, other connectors' folders and logs) and the
  router user's home, except what the connector needs bound back in — its own folder and call
  folder (writable), its code, the Python and the tools it runs (read-only). The config tree, the
  service's Python and its code are read-only, so a connector cannot rewrite another connector or
  the router to act later with their rights. Files that bindings name as secrets read as empty.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from reconciler.config.models import SandboxSpec
from reconciler.connectors.netns_init import FsView

__all__ = ["DEFAULT_LIMITS", "FsView", "Limits", "confined_env", "limits_for", "mounts_available",
           "namespaces_available", "sandboxed_command"]

_PASSED = ("PATH", "LANG", "LC_ALL", "TZ")


@dataclass(frozen=True, slots=True)
class Limits:
    memory_bytes: int
    cpu_seconds: int
    file_bytes: int


DEFAULT_LIMITS = Limits(memory_bytes=4 << 30, cpu_seconds=3600, file_bytes=1 << 30)


def limits_for(spec: SandboxSpec) -> Limits:
    """The manifest's `[sandbox]` limits, each falling back to the default."""
    return Limits(
        memory_bytes=spec.memoryMb * (1 << 20) if spec.memoryMb else DEFAULT_LIMITS.memory_bytes,
        cpu_seconds=spec.cpuSeconds or DEFAULT_LIMITS.cpu_seconds,
        file_bytes=spec.fileBytes or DEFAULT_LIMITS.file_bytes,
    )


def confined_env(declared: Mapping[str, str], home: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a connector process: what it declared, and what any process needs."""
    source = os.environ if base is None else base
    env = {name: source[name] for name in _PASSED if name in source}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    # `python3` in a connector's command is the Python the service runs on (its virtualenv's, with the
    # MCP SDK), not whatever the system's PATH finds first.
    own = str(Path(sys.executable).parent)
    if own not in env["PATH"].split(os.pathsep):
        env["PATH"] = own + os.pathsep + env["PATH"]
    env.setdefault("LANG", "C.UTF-8")
    env["HOME"] = str(home)
    env["TMPDIR"] = str(home / "tmp")
    env.update(declared)
    return env


@functools.cache
def namespaces_available() -> bool:
    """Whether this machine lets the router give a process its own network namespace."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    try:
        done = subprocess.run([unshare, "--net", "--", "true"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def sandboxed_command(command: Sequence[str], proxy_socket: Path | None, view: FsView | None = None) -> list[str]:
    """`command` run in new network (and, with `view`, mount) namespaces, reaching out only through
    `proxy_socket` (if any)."""
    unshare = shutil.which("unshare") or "unshare"
    proxy = ["--proxy", str(proxy_socket)] if proxy_socket is not None else []
    fs = ["--fs", view.to_arg()] if view is not None else []
    spaces = ["--net", "--mount", "--propagation", "private"] if view is not None else ["--net"]
    return [unshare, *spaces, "--", sys.executable, "-m", "reconciler.connectors.netns_init", *proxy, *fs, "--",
            *command]


@functools.cache
def mounts_available() -> bool:
    """Whether this machine lets the router give a process its own mount namespace (with tmpfs mounts)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = "import ctypes, sys; sys.exit(ctypes.CDLL(None, use_errno=True).mount(b'none', b'/tmp', b'tmpfs', 0, None))"
    try:
        done = subprocess.run([unshare, "--mount", "--propagation", "private", "--", sys.executable, "-c", probe],
                              capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
