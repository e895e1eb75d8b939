"""What a sandboxed socket connector keeps in its socket folder, bounded (docs/architecture.md §6).

A connector's calls keep their files in its call space, a tmpfs of its `[sandbox] diskMb` the kernel
holds it to (`callspace`). The one host folder it may still write is a socket connector's socket
folder, where it listens and the router connects: on the host's disk, where RLIMIT_FSIZE bounds each
file it writes but not how many. While its process runs, the pool measures that folder every
`CHECK_SECONDS` (`measure`: allocated bytes, so a sparse file counts what it takes, and entries, no
link followed, counting stopped once either passes its bound). Over its `diskMb` (default
`DEFAULT_DISK_BYTES`) or `MOST_ENTRIES` entries, the process is killed, which fails its calls in
flight, and what it left there is removed (`remove_left`: what was there before the kill) before the
next start. A file it unlinks and keeps open there is not seen: that gap stays open for socket
connectors (docs/architecture.md §6); a stdio connector writes no host folder at all."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from reconciler.places import remove_tree

__all__ = ["CHECK_SECONDS", "DEFAULT_DISK_BYTES", "KILL_MARGIN_NS", "MOST_ENTRIES", "Usage", "measure", "remove_left"]

log = logging.getLogger("handler.connectors")

DEFAULT_DISK_BYTES = 2 << 30
MOST_ENTRIES = 100_000
CHECK_SECONDS = 0.5
KILL_MARGIN_NS = 10_000_000  # what changed within 10 ms before the kill is left (the next check counts it)


@dataclass(frozen=True, slots=True)
class Usage:
    bytes: int
    entries: int

    def over(self, most_bytes: int, most_entries: int = MOST_ENTRIES) -> str | None:
        """What is over its bound, said for the operator; None when nothing is."""
        if self.bytes > most_bytes:
            return f"more than {_mib(most_bytes)} (its [sandbox] diskMb) in the folders it may write"
        if self.entries > most_entries:
            return f"more than {most_entries:,} files and folders in the folders it may write"
        return None


def measure(folders: Sequence[Path], most_bytes: int, most_entries: int = MOST_ENTRIES) -> Usage:
    """The bytes allocated to what `folders` hold and how many entries they hold; no link followed, and counting
    stops once either passes its bound. A folder or entry that goes away while counted is not counted."""
    stack = [str(folder) for folder in folders]
    total = entries = 0
    while stack:
        try:
            listing = os.scandir(stack.pop())
        except OSError:
            continue
        with listing:
            for entry in listing:
                entries += 1
                try:
                    info = entry.stat(follow_symlinks=False)
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                except OSError:
                    continue
                total += info.st_blocks * 512
                if total > most_bytes or entries > most_entries:
                    return Usage(total, entries)
    return Usage(total, entries)


def remove_left(folder: Path, before_ns: int) -> int:
    """Remove what `folder` holds whose status last changed before `before_ns` (the time of the kill, on the
    system's clock): what the killed process wrote, not a call folder made after it, whose change time the
    process could not have set. Sockets stay (the router's, which the next process uses). How many entries went."""
    removed = 0
    try:
        listing = os.scandir(folder)
    except FileNotFoundError:
        return 0
    with listing:
        for entry in listing:
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:  # gone already
                continue
            if info.st_ctime_ns >= before_ns or stat.S_ISSOCK(info.st_mode):
                continue
            try:
                remove_tree(entry.path)
                removed += 1
            except OSError as exc:
                log.warning("could not remove %s, left by a connector stopped for what it wrote: %s", entry.path,
                            exc.strerror or exc)
    return removed


def _mib(size: int) -> str:
    return f"{size / (1 << 20):,.0f} MiB"
