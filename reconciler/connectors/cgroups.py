"""The `pids` and `memory` cgroups of one connector process (docs/architecture.md §6).

Each launch gets a leaf of its own under `handler/` in each controller it can write: cgroup v1 (below
the router's own cgroup in `/sys/fs/cgroup/pids/` and `/sys/fs/cgroup/memory/`, so connectors stay within
the limits the host set on the router) or v2 (`/sys/fs/cgroup/`, with both controllers enabled below
the root). The sandbox's first process — the shell at the head of its command, or a process parked
ahead of need (`parking`), whose leaves get the binding's limits when a start takes it — writes its
own pid into each leaf's `cgroup.procs` before anything else runs, so every process the connector
starts is counted. When the
process has stopped, `remove` kills whatever is left in the leaves and removes them; `sweep_stale`, at a
pool's start, removes the empty leaves a router stopped by `kill -9` left behind (and may take those of a
crashed connector waiting to restart: its restart makes them again, `remake`). A router that is not
root makes them where the host delegated a cgroup v1 hierarchy to its user: its own cgroup in
`memory` and `pids`, made writable by that user (chowned to it); the memory cgroup then counts the
connector's memfds and shared memory, which RLIMIT_DATA does not. Where no cgroup can be made (not
root and nothing delegated, a delegated cgroup v2 subtree, which is not used yet, or a read-only
`/sys/fs/cgroup`), the launch goes on under its rlimits alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ConnectorCgroups", "make_cgroups", "sweep_stale"]

log = logging.getLogger("handler.connector")
_ROOT = Path("/sys/fs/cgroup")
_warned = False


@dataclass(frozen=True, slots=True)
class ConnectorCgroups:
    leaves: tuple[Path, ...]
    limits: tuple[tuple[Path, str], ...] = ()  # (limit file, "processes" or "memory") in the leaves

    @property
    def procs(self) -> tuple[str, ...]:
        return tuple(str(leaf / "cgroup.procs") for leaf in self.leaves)

    def set_limits(self, processes: int, memory_bytes: int) -> None:
        """Bound the leaves (again): at once for what is in them already; OSError when the kernel refuses."""
        for file, what in self.limits:
            _write(file, processes if what == "processes" else memory_bytes)

    def remake(self, processes: int, memory_bytes: int) -> None:
        """Make again, bounded as before, the leaves that are gone: another router's `sweep_stale` may take them while
        the process they bound waits out its restart's backoff (empty, and as old as its launch). OSError when the
        kernel refuses."""
        for leaf in self.leaves:
            leaf.mkdir(mode=0o755, exist_ok=True)
        self.set_limits(processes, memory_bytes)

    def remove(self) -> None:
        """Kill what is left in the leaves, then remove them."""
        for leaf in self.leaves:
            for _ in range(50):
                pids = _read_pids(leaf)
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.01)
            for _ in range(50):  # a task just reaped may hold its cgroup a moment longer (EBUSY)
                try:
                    leaf.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def make_cgroups(name: str, processes: int, memory_bytes: int) -> ConnectorCgroups | None:
    """Leaves named `name` bounding processes and memory; None where none can be made here."""
    v2 = (_ROOT / "cgroup.controllers").exists()  # one hierarchy
    if os.geteuid() != 0 and (v2 or not _delegated()):
        return None
    leaves: list[Path] = []
    limits: list[tuple[Path, str]] = []
    try:
        if v2:
            leaf = _leaf(_ROOT, name, v2=True)
            leaves.append(leaf)
            limits += [(leaf / "pids.max", "processes"), (leaf / "memory.max", "memory")]
        else:
            for controller, limit_file, what in _V1:
                if (_ROOT / controller / "cgroup.procs").exists():
                    leaf = _leaf(_ROOT / controller / _own_path(controller), name, v2=False)
                    leaves.append(leaf)
                    limits.append((leaf / limit_file, what))
        made = ConnectorCgroups(tuple(leaves), tuple(limits))
    except OSError as exc:
        ConnectorCgroups(tuple(leaves)).remove()
        _warn(f"cannot make cgroups under {_ROOT} ({exc.strerror}); connectors are bounded by rlimits only")
        return None
    try:
        made.set_limits(processes, memory_bytes)
    except OSError as exc:
        made.remove()
        _warn(f"cannot bound cgroups under {_ROOT} ({exc.strerror}); connectors are bounded by rlimits only")
        return None
    return made if leaves else None


def sweep_stale(min_age: float = 60.0) -> int:
    """Remove leaves nobody is in that were made over `min_age` seconds ago: what a router stopped by `kill -9`
    left (its connectors ended with it, their leaves stayed). A leaf being set up this moment is younger, and
    one in use is not empty, so another router's are safe. Returns how many were removed."""
    if os.geteuid() != 0:
        return 0
    parents = ([_ROOT / "handler"] if (_ROOT / "cgroup.controllers").exists()
               else [_ROOT / c / _own_path(c) / "handler" for c in ("pids", "memory")])
    removed = 0
    cutoff = time.time() - min_age
    for parent in parents:
        with contextlib.suppress(OSError):
            for leaf in parent.iterdir():
                with contextlib.suppress(OSError):
                    if leaf.is_dir() and leaf.stat().st_mtime < cutoff and not _read_pids(leaf):
                        leaf.rmdir()
                        removed += 1
    return removed


_V1 = (("pids", "pids.max", "processes"), ("memory", "memory.limit_in_bytes", "memory"))


def _delegated() -> bool:
    """Whether the router's own cgroup in each v1 controller is its user's to write: a hierarchy delegated to it."""
    return all(os.access(_ROOT / controller / _own_path(controller), os.W_OK) for controller, _, _ in _V1)


def _own_path(controller: str) -> str:
    """The router's own cgroup in a v1 hierarchy (relative), so that its connectors' leaves sit inside it and stay
    within whatever limits the host set on the router (a systemd unit's, a container's)."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controller in controllers.split(","):
                return path.strip("/")
    except (OSError, ValueError):
        pass
    return ""


def _leaf(base: Path, name: str, *, v2: bool) -> Path:
    parent = base / "handler"
    parent.mkdir(mode=0o755, exist_ok=True)
    if v2:
        _write(base / "cgroup.subtree_control", "+pids +memory")
        _write(parent / "cgroup.subtree_control", "+pids +memory")
    leaf = parent / name
    leaf.mkdir(mode=0o755)
    return leaf


def _write(path: Path, value: object) -> None:
    path.write_text(f"{value}\n")


def _read_pids(leaf: Path) -> list[int]:
    try:
        return [int(line) for line in (leaf / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _warn(message: str) -> None:
    global _warned  # noqa: PLW0603 - one warning per router process
    if not _warned:
        _warned = True
        log.warning(message)
