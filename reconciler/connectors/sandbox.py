"""How a connector process is confined (docs/architecture.md §6): bubblewrap builds its world from nothing.

- environment: only the connector's declared secrets and settings, plus PATH, LANG and a HOME;
  nothing else of the router's environment leaks in (`confined_env`);
- namespaces: its own PID (its own `/proc`: no router process is visible, and every process it starts
  ends with it: `--die-with-parent`, bubblewrap's init as PID 1), network (loopback only; declared
  egress goes through the router's allow-list proxy by way of `relay`), IPC, UTS and cgroup namespaces;
- identity: when the router runs as root, each binding's connector runs as its own unprivileged host
  uid and gid (`setpriv` inside the sandbox, or `relay` when it has egress), with no capability left,
  `no_new_privs`, and `pids` and `memory` cgroups; as an ordinary user, in a user namespace mapped
  onto that user, with no capability either (rlimits bound it, and cgroups where the host delegated
  some to that user; see docs/architecture.md §6 for what that leaves open);
- the filesystem (a `BoxView`): an empty root with read-only `/usr`, the few `/etc` files a program
  needs (the C library's, CA certificates, time zones; a generated `passwd`, `group` and `hosts`), the
  runtime and code it runs, read-only; a size-capped private `/tmp` as its HOME, `/dev/shm` capped
  alike, and its call space (`callspace`), a tmpfs capped at its `diskMb`: whatever it writes counts
  there until closed, an unlinked file it keeps open included; its socket folder (a socket connector's,
  where it listens) the only host folder it may write. Nothing else of the host: no `/run`, no home,
  no state or run folder, no other socket;
- system calls: the seccomp filter of `seccomp`;
- limits: memory (RLIMIT_DATA; not RLIMIT_AS, whose address-space count breaks runtimes that reserve
  large unmapped regions), CPU time, file size and processes, from the manifest's `[sandbox]` or the
  defaults here; what it keeps in its socket folder, measured by the pool (`diskwatch`). As root, the
  memory cgroup also counts its tmpfs pages, memfds and shared memory; as an ordinary user, with no
  cgroup of its own, those are bounded only by the tmpfs sizes (see docs/architecture.md §6).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from reconciler.config.models import SandboxSpec
from reconciler.connectors.callspace import INSIDE
from reconciler.connectors.diskwatch import DEFAULT_DISK_BYTES
from reconciler.connectors.seccomp import SeccompUnavailableError, filter_program

__all__ = ["DEFAULT_LIMITS", "BoxView", "Limits", "Support", "boxed", "confined_env", "entering", "limits_for",
           "sandbox_support", "write_seccomp"]

_PASSED = ("PATH", "LANG", "LC_ALL", "TZ")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
# What a program may need of /etc: the loader, name lookups (files only), CA certificates, time zones, MIME types.
_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl", "ca-certificates", "ca-certificates.conf",
        "pki", "resolv.conf", "nsswitch.conf", "host.conf", "gai.conf", "localtime", "timezone", "mime.types",
        "protocols", "services", "fonts", "os-release", "debian_version")
_NAMESPACES = ("--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try")
_TMP = "/tmp"  # noqa: S108 - the sandbox's own: a size-capped tmpfs
USERNS_HINT = ("this machine refuses unprivileged user namespaces: allow them (Debian: sysctl "
               "kernel.unprivileged_userns_clone=1; Ubuntu 24.04: sysctl "
               "kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile that lets /usr/bin/bwrap "
               "create them), run the router as root, or start it with --no-sandbox to run connectors unconfined")


@dataclass(frozen=True, slots=True)
class Limits:
    memory_bytes: int
    cpu_seconds: int
    file_bytes: int
    processes: int
    tmp_bytes: int
    disk_bytes: int = DEFAULT_DISK_BYTES  # its call space's size (`callspace`), and its socket folder's most


DEFAULT_LIMITS = Limits(memory_bytes=4 << 30, cpu_seconds=3600, file_bytes=1 << 30, processes=256,
                        tmp_bytes=512 << 20)


def limits_for(spec: SandboxSpec) -> Limits:
    """The manifest's `[sandbox]` limits, each falling back to the default."""
    return Limits(
        memory_bytes=spec.memoryMb * (1 << 20) if spec.memoryMb else DEFAULT_LIMITS.memory_bytes,
        cpu_seconds=spec.cpuSeconds or DEFAULT_LIMITS.cpu_seconds,
        file_bytes=spec.fileBytes or DEFAULT_LIMITS.file_bytes,
        processes=spec.processes or DEFAULT_LIMITS.processes,
        tmp_bytes=spec.tmpMb * (1 << 20) if spec.tmpMb else DEFAULT_LIMITS.tmp_bytes,
        disk_bytes=spec.diskMb * (1 << 20) if spec.diskMb else DEFAULT_LIMITS.disk_bytes,
    )


def confined_env(declared: Mapping[str, str], home: Path, base: Mapping[str, str] | None = None, *,
                 tmp: Path | None = None, system_path: bool = False) -> dict[str, str]:
    """The whole environment of a connector process: what it declared, and what any process needs.

    `system_path`: PATH is the system's folders (what a sandbox holds), not the router's own PATH.
    """
    source = os.environ if base is None else base
    env = {name: source[name] for name in _PASSED if name in source}
    if system_path or "PATH" not in env:
        env["PATH"] = SYSTEM_PATH
    # `python3` in a connector's command is the Python the service runs on (its virtualenv's, with the
    # MCP SDK), not whatever the system's PATH finds first.
    own = str(Path(sys.executable).parent)
    if own not in env["PATH"].split(os.pathsep):
        env["PATH"] = own + os.pathsep + env["PATH"]
    env.setdefault("LANG", "C.UTF-8")
    env["HOME"] = str(home)
    env["TMPDIR"] = str(tmp if tmp is not None else home / "tmp")
    env.update(declared)
    return env


@dataclass(frozen=True, slots=True)
class Support:
    """Whether connectors can be sandboxed here, and how."""

    ok: bool
    privileged: bool  # the router is root: each connector gets its own host uid and cgroups
    reason: str = ""  # when not ok: why, and what to change


@functools.cache
def sandbox_support() -> Support:
    """Probe once: bubblewrap present, libseccomp loadable, and a trial sandbox that starts."""
    privileged = os.geteuid() == 0
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return Support(False, privileged, "bubblewrap is not installed (Debian and Ubuntu: apt-get install "
                                          "bubblewrap); install it, or start the router with --no-sandbox")
    missing = [tool for tool in (_PRLIMIT, _SETPRIV) if not Path(tool).exists()]
    if missing:
        return Support(False, privileged, f"{' and '.join(missing)} missing (util-linux); install util-linux, or "
                                          "start the router with --no-sandbox")
    try:
        filter_program()
    except SeccompUnavailableError as exc:
        return Support(False, privileged, f"{exc}, or start the router with --no-sandbox")
    trial = [bwrap, *_NAMESPACES, *([] if privileged else ["--unshare-user"]), "--die-with-parent",
             *_system_binds(), "--proc", "/proc", "--dev", "/dev", "--", "/usr/bin/env", "true"]
    try:
        done = subprocess.run(trial, capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Support(False, privileged, f"bubblewrap could not run ({exc}); start the router with --no-sandbox")
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        cause = said[-1] if said else f"exit status {done.returncode}"
        return Support(False, privileged, f"bubblewrap cannot build a sandbox here ({cause}); {USERNS_HINT}")
    return Support(True, privileged)


def write_seccomp(path: Path) -> None:
    """The seccomp program, written where the launch reads it (a file, so every restart reads it again)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(filter_program())


@dataclass(frozen=True, slots=True)
class BoxView:
    """What a connector sees beyond the system: folders bound at their own path, files placed in `/etc`."""

    readable: tuple[str, ...] = ()  # bound read-only (its code, its runtime)
    writable: tuple[str, ...] = ()  # bound read-write (a socket connector's socket folder)
    files: Mapping[str, str] = field(default_factory=dict)  # path in the sandbox -> host file, read-only
    blanked: tuple[str, ...] = ()  # files inside a bound folder that read as empty (other bindings' secrets)
    emptied: tuple[str, ...] = ()  # folders inside a bound folder shown empty and read-only (its __pycache__)


def entering(seccomp: Path, cgroup_procs: Sequence[str] = ()) -> list[str]:
    """The head of a sandboxed command: a short shell that moves itself into the connector's cgroups (root
    only) and opens the seccomp program on descriptor 9, then runs the rest (a parked spare, `spare`,
    does the same)."""
    return [shutil.which("sh") or "/bin/sh", "-c", _ENTER, str(seccomp), *cgroup_procs, "--"]


def boxed(command: Sequence[str], view: BoxView, limits: Limits, *, host_uid: int | None,
          relay: Sequence[str] | None = None, chdir: str = _TMP) -> list[str]:
    """bubblewrap running `command`, its seccomp program read from descriptor 9.

    With `host_uid` (the router is root) the sandbox keeps only what the next step needs to become that
    uid (`setpriv`, or `relay`, which also binds its forwards' ports first); without it, the user
    namespace holds the user's own uid and no capability outside it. `prlimit`, last, sets the rlimits
    on the connector: inside the user namespace, so the process count binds the connector's own
    processes, not every process of the user running the router. `chdir`: its current folder inside (its own
    `/tmp`, or an agent run's scope).
    """
    limited = [_PRLIMIT, f"--data={limits.memory_bytes}", f"--cpu={limits.cpu_seconds}",
               f"--fsize={limits.file_bytes}", f"--nproc={limits.processes}", "--"]
    caps = ["--cap-drop", "ALL"]
    if host_uid is not None:
        caps += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    if relay is not None:
        caps += ["--cap-add", "CAP_NET_BIND_SERVICE"]  # SMTP's 587 and the like, bound by the relay
    box = [shutil.which("bwrap") or "bwrap", *_NAMESPACES, *([] if host_uid is not None else ["--unshare-user"]),
           "--die-with-parent", "--new-session", *caps, *_system_binds(), *_etc_binds(view.files),
           "--proc", "/proc", "--dev", "/dev", *_writable_mounts(limits), *_view_binds(view), "--chdir", chdir,
           "--seccomp", "9", "--"]
    inner = [*limited, *command]
    if relay is not None:
        inner = [*relay, *(["--uid", str(host_uid)] if host_uid is not None else []), "--", *inner]
    elif host_uid is not None:
        inner = [_SETPRIV, f"--reuid={host_uid}", f"--regid={host_uid}", "--clear-groups", "--inh-caps=-all",
                 "--no-new-privs", "--", *inner]
    return [*box, *inner]


# $0: the seccomp program; then each cgroup's `cgroup.procs` up to `--`; then the command.
_ENTER = 'while [ "$1" != "--" ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@" 9< "$0"'
_SETPRIV = "/usr/bin/setpriv"
_PRLIMIT = "/usr/bin/prlimit"
_SHM = "/dev/shm"  # noqa: S108 - the sandbox's own, capped alike


def _writable_mounts(limits: Limits) -> list[str]:
    """The tmpfs mounts it may write, each of a fixed size the kernel holds it to: `/tmp` and `/dev/shm` (which
    `--dev` would leave on its unsized `/dev`), and the call space, walkable but not listable by another uid."""
    return ["--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", _TMP,
            "--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", _SHM,
            "--perms", "0711", "--size", str(limits.disk_bytes), "--tmpfs", str(INSIDE)]


def _system_binds() -> list[str]:
    """`/usr` read-only, and the top-level folders that merged-/usr systems keep as links into it."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path(f"/{top}")
        if path.is_symlink():
            args += ["--symlink", str(path.readlink()), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    return args


def _etc_binds(files: Mapping[str, str]) -> list[str]:
    args = ["--perms", "0755", "--dir", "/etc"]  # bubblewrap would make it 0700: nothing in it readable by the uid
    for name in _ETC:
        path = Path("/etc", name)
        if path.exists() and str(path) not in files:
            args += ["--ro-bind", str(path.resolve()), str(path)]
    made = {"/", "/etc"}
    for dest, source in files.items():
        for parent in reversed(Path(dest).parents):  # each made 0755, as /etc is, for its own uid to walk
            if str(parent) not in made:
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", source, dest]
    return args


def _view_binds(view: BoxView) -> list[str]:
    """The view's folders, shallowest first (a folder bound inside another comes after it), each parent made
    0755 so the connector's own uid can walk to what is bound there."""
    args: list[str] = []
    made: set[str] = {"/", "/usr", _TMP, "/etc", "/proc", "/dev", str(INSIDE)}
    binds = [(p, "--ro-bind") for p in view.readable] + [(p, "--bind") for p in view.writable]
    for path, how in sorted(set(binds), key=lambda b: (b[0].count("/"), b[0])):
        for parent in reversed(Path(path).parents):
            name = str(parent)
            if name not in made and not name.startswith("/usr/") and not _bound_above(name, binds):
                made.add(name)
                args += ["--perms", "0755", "--dir", name]
        made.add(path)
        args += [how, path, path]
    for file in view.blanked:
        if _bound_above(file, binds):
            args += ["--ro-bind", "/dev/null", file]
    for folder in view.emptied:
        if _bound_above(folder, binds):
            args += ["--tmpfs", folder, "--remount-ro", folder]
    return args


def _bound_above(path: str, binds: Sequence[tuple[str, str]]) -> bool:
    return any(path.startswith(p.rstrip("/") + "/") for p, _ in binds)
