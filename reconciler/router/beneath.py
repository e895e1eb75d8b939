"""Opening a path below a folder without ever following a symbolic link (docs/architecture.md §6, rule S4).

`files` calls it for every file argument: at step 4 to check an input, at step 7 to copy it, at step 10
to read what a connector wrote and to write it into the scope. Each folder component is opened from
its parent's descriptor (openat, O_NOFOLLOW | O_DIRECTORY), so a folder swapped for a symlink between
a check and a copy is refused, never followed. The last component is looked at before it is opened
and opened with O_NONBLOCK: only a regular file is accepted, and a FIFO, device or socket is refused
before any read, so no worker thread can block on one.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Sequence
from typing import Final

from reconciler.config.errors import HandlerError

__all__ = ["RefusedPathError", "describe_mode", "open_folder", "open_regular"]

_DIR_FLAGS: Final = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_PATH", os.O_RDONLY)
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_KINDS: Final = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"),
                 (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                 (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class RefusedPathError(HandlerError):
    """A path a walk below a folder refused: missing, or `kind` found at its last component (`final`) or before."""

    def __init__(self, kind: str, *, final: bool, missing: bool = False) -> None:
        super().__init__(f"{'missing' if missing else kind} ({'last' if final else 'a folder'} component)")
        self.kind, self.final, self.missing = kind, final, missing


def describe_mode(mode: int) -> str:
    """What a file of this `st_mode` is, for a message: 'a named pipe (FIFO)'."""
    return next((kind for test, kind in _KINDS if test(mode)), "a special file")


def _refusal(folder: int, leaf: str, exc: OSError, final: bool) -> RefusedPathError:
    """Why `leaf` of `folder` would not open, told from what is there, which is looked at and never followed."""
    try:
        mode = os.stat(leaf, dir_fd=folder, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return RefusedPathError("nothing", final=final, missing=True)
    except OSError:
        return RefusedPathError(f"something that cannot be opened ({exc.strerror})", final=final)
    return RefusedPathError(describe_mode(mode) if final or stat.S_ISLNK(mode) else "a file", final=final)


def _step_into(folder: int, leaf: str, create: bool, mode: int) -> int:
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(leaf, mode, dir_fd=folder)
    try:
        return os.open(leaf, _DIR_FLAGS, dir_fd=folder)
    except OSError as exc:
        raise _refusal(folder, leaf, exc, final=False) from None


def open_folder(base: str, parts: Sequence[str], *, create: bool = False, mode: int = 0o755) -> int:
    """A descriptor of `base/parts...`, walked one component at a time from `base`'s descriptor (openat with
    O_NOFOLLOW): a component that is a symlink is refused, never followed, whenever it was swapped in
    (docs/architecture.md §6). `create` makes the missing folders. Raises `RefusedPathError`."""
    fd = os.open(base, os.O_DIRECTORY | os.O_CLOEXEC | getattr(os, "O_PATH", os.O_RDONLY))
    try:
        for part in parts:
            fd, parent = _step_into(fd, part, create, mode), fd
            os.close(parent)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(base: str, parts: Sequence[str]) -> tuple[int, int]:
    """(fd, size) of the regular file `base/parts...`, opened for reading without following a symlink in any
    component and without blocking (O_NONBLOCK): a FIFO, device or socket is refused before any read."""
    folder = open_folder(base, parts[:-1])
    try:
        mode = os.stat(parts[-1], dir_fd=folder, follow_symlinks=False).st_mode  # a device is never opened
        if not stat.S_ISREG(mode):
            raise RefusedPathError(describe_mode(mode), final=True)
        fd = os.open(parts[-1], _READ_FLAGS, dir_fd=folder)
    except OSError as exc:
        raise _refusal(folder, parts[-1], exc, final=True) from None
    finally:
        os.close(folder)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # swapped since the look above: refused still, and nothing was read
        os.close(fd)
        raise RefusedPathError(describe_mode(info.st_mode), final=True)
    return fd, info.st_size
