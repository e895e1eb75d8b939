"""Where a router keeps its sockets and its state, with the defaults of design §3.

`HANDLER_RUN_DIR` (sockets, per-call folders) defaults to `$XDG_RUNTIME_DIR/handler`, else
`/tmp/handler-$UID`: short, since a unix socket path holds at most ~107 bytes. `HANDLER_STATE_DIR`
(the call log `calls.jsonl`, connectors' stderr) defaults to `.handler/` under the config root.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["MAX_SOCKET_PATH", "default_run_dir", "default_state_dir", "socket_path"]

MAX_SOCKET_PATH = 107  # sun_path is 108 bytes on Linux, one of them the terminating NUL


def default_run_dir() -> Path:
    given = os.environ.get("HANDLER_RUN_DIR")
    if given:
        return Path(given)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "handler"
    return Path(f"/tmp/handler-{os.getuid()}")  # noqa: S108 - per-user and created 0700; the design's default


def default_state_dir(root: Path) -> Path:
    given = os.environ.get("HANDLER_STATE_DIR")
    return Path(given) if given else root / ".handler"


def socket_path(run_dir: Path, profile: str) -> Path:
    return run_dir / "profiles" / f"{profile}.sock"
