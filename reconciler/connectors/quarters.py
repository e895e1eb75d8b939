"""Where each binding's connector lives on the host: the uid it runs as.

Kept for the router's life, one per binding, whatever process of it runs (a restart, a drained process beside its
successor): the pool makes one `Quarters` and every supervisor of a binding's process asks it
(`supervisor.Supervisor.host_uid`), for its launch and for the call folders of its calls.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

__all__ = ["HOST_UID_BASE", "HOST_UID_SPAN", "Quarters"]

# Host uids for connectors when the router is root: far above any account, below 2^31 (some tools read uids signed).
HOST_UID_BASE = 0x50000000
HOST_UID_SPAN = 1 << 24


class Quarters:
    """Each binding's host uid, chosen on first use and kept for the router's life."""

    def __init__(self, state_dir: Path, *, sandbox: bool) -> None:
        self._state = state_dir
        self._sandbox = sandbox
        self._uids: dict[str, int] = {}

    def host_uid(self, binding_name: str) -> int | None:
        """The host uid `binding_name`'s connector runs as when the router is root and sandboxes it, else None.

        Each binding has its own, kept for the router's life, so no two connectors share files or a process
        count (docs/architecture.md §6); it is derived from the state folder and the binding, so a router
        restarted on the same folder finds the files its connectors left as theirs.
        """
        if not self._sandbox or os.geteuid() != 0:
            return None
        uid = self._uids.get(binding_name)
        if uid is None:
            taken = set(self._uids.values())
            seed = zlib.crc32(f"{self._state}:{binding_name}".encode())
            uid = next(HOST_UID_BASE + (seed + i) % HOST_UID_SPAN for i in range(HOST_UID_SPAN)
                       if HOST_UID_BASE + (seed + i) % HOST_UID_SPAN not in taken)
            self._uids[binding_name] = uid
        return uid
