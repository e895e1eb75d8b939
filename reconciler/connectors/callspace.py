"""A sandboxed connector's call files: in a size-limited tmpfs only its sandbox mounts (docs/architecture.md §6).

Its sandbox (`sandbox.boxed`) mounts a tmpfs of its `[sandbox] diskMb` at `INSIDE`; it is the only
place the connector may write that outlives its process's own `/tmp`. The kernel counts every byte
of it, a file unlinked but still open included, until that file is closed: a connector that keeps
an output's descriptor after its call cannot write past the limit on the host. The router reaches
the tmpfs through the sandbox's root (`/proc/<pid>/root`) to stage each call's inputs and read its
outputs (`files.CallFolder`), opening it once per process and holding that descriptor, which keeps
the tmpfs, and what a call left in it, until the launch is cleaned up (`Launch.cleanup` calls `close`).

Called by the launch (`launching.Launch.call_space`), which the pool hands to the call path.
"""

from __future__ import annotations

import os
from pathlib import Path

from reconciler.connectors.errors import ConnectorCrashedError

__all__ = ["INSIDE", "CallSpace"]

INSIDE = Path("/calls")  # the tmpfs's path in the sandbox


class CallSpace:
    """The call space of one launch's processes: the descriptor of the tmpfs of its current sandbox."""

    def __init__(self, binding: str) -> None:
        self.binding = binding
        self._fd: int | None = None
        self._pid: int | None = None

    def reach(self, pid: int) -> Path:
        """The router's path to the call space of the sandbox that bubblewrap's process `pid` runs, opened the first
        time a call of that process asks. `ConnectorCrashedError` when it cannot be reached (the sandbox ended)."""
        if self._pid != pid or self._fd is None:
            self.close()
            self._fd, self._pid = _open_space(pid, self.binding), pid
        return Path(f"/proc/self/fd/{self._fd}")

    def close(self) -> None:
        """Let go of the tmpfs: its memory is freed once the sandbox has ended too."""
        fd, self._fd, self._pid = self._fd, None, None
        if fd is not None:
            os.close(fd)


def _open_space(pid: int, binding: str) -> int:
    """The tmpfs at `INSIDE` in the sandbox of bubblewrap's process `pid`, opened from the sandbox's root without
    following a link, and checked to be a mount of its own (nothing the connector made in its place)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if not children:
            raise FileNotFoundError(f"bubblewrap (pid {pid}) runs no sandbox")
        root = os.open(f"/proc/{children[0]}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConnectorCrashedError(f"connector of binding '{binding}': its sandbox is gone, so its call folder "
                                    f"cannot be reached ({exc.strerror or exc}); retrying starts it again") from None
    try:
        space = os.open(INSIDE.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root)
        mounted = os.fstat(space).st_dev != os.fstat(root).st_dev
    except OSError as exc:
        raise ConnectorCrashedError(f"connector of binding '{binding}': its call folder {INSIDE} cannot be opened "
                                    f"({exc.strerror or exc}); retrying starts it again") from None
    finally:
        os.close(root)
    if not mounted:  # the connector cannot mount; a folder of the sandbox's root in its place is not the tmpfs
        os.close(space)
        raise ConnectorCrashedError(f"connector of binding '{binding}': {INSIDE} in its sandbox is not the tmpfs its "
                                    "sandbox mounted, so nothing is staged there; the call is refused")
    return space
