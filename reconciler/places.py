"""Where the service keeps its sockets and its state: the defaults of docs/architecture.md §3, in one place.

`HANDLER_RUN_DIR` (sockets, per-call folders) defaults to `$XDG_RUNTIME_DIR/handler`, else
`/tmp/handler-$UID`: short, since a unix socket path holds at most ~107 bytes. `HANDLER_STATE_DIR`
(the call log `calls.jsonl`, connectors' stderr, `status.json`, the governance store's SQLite file)
defaults to `.handler/` under the config root. Called by the router, the bridge, `handler up`,
`handler serve` and the CLI's commands that read the state folder.

It stands below every room, outside `reconciler.config`, and imports only the standard library:
the bridge an agent starts for every interface reads it without loading the config room.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
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
    return Path(f"/tmp/handler-{os.getuid()}")  # noqa: S108 - per-user and created 0700; the documented default


def default_state_dir(root: Path, env: Mapping[str, str] | None = None) -> Path:
    """`HANDLER_STATE_DIR` of `env` (default: the process's environment), else `.handler/` under `root`."""
    given = (os.environ if env is None else env).get("HANDLER_STATE_DIR")
    return Path(given) if given else root / ".handler"


def socket_path(run_dir: Path, profile: str) -> Path:
    return run_dir / "profiles" / f"{profile}.sock"
