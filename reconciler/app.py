"""Assembles the running service from the rooms: `handler serve` runs a router on a config tree.

`serve` takes a checked snapshot (the CLI loads and prints it), builds the `Router` with its
governance gate, opens the profiles' sockets and runs until SIGINT or SIGTERM. SIGHUP reloads the
tree: a revision with errors is refused and the live one keeps serving. The reconcile loop that
watches the tree and git belongs to the gitops room; this is the plain server.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from reconciler.config import ConfigError, FolderSource, Loader, Snapshot
from reconciler.governance.gate import Gate
from reconciler.router.places import default_run_dir, default_state_dir
from reconciler.router.server import Router

__all__ = ["run_router", "serve"]


def serve(snapshot: Snapshot, *, root: Path, run_dir: Path | None = None, state_dir: Path | None = None,
          gate: Gate | None = None, on_ready: Callable[[Router], None] | None = None) -> int:
    """Serve `snapshot` (loaded from `root`) until a signal; returns the exit code."""
    if not snapshot.ok:
        raise ConfigError(snapshot.errors)
    router = Router(snapshot, root=root, run_dir=run_dir or default_run_dir(),
                    state_dir=state_dir or default_state_dir(root), gate=gate)
    _run(run_router(router, root, on_ready))
    return 0


def _run(main: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


async def run_router(router: Router, root: Path, on_ready: Callable[[Router], None] | None = None) -> None:
    """Start `router`, reload on SIGHUP, stop on SIGINT/SIGTERM, and close everything it started."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loader = Loader()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(_reload(router, loader, root)))
    try:
        await router.start()
        if on_ready is not None:
            on_ready(router)
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(sig)
        await router.aclose()


async def _reload(router: Router, loader: Loader, root: Path) -> None:
    snapshot = loader.load(FolderSource(root))
    if not snapshot.ok:
        print(f"handler serve: revision {snapshot.revision[:12]} has {len(snapshot.errors)} error(s); still serving "
              f"generation {router.live.number} (run `handler validate` to see them)", file=sys.stderr)
        return
    generation = await router.swap(snapshot)
    print(f"handler serve: generation {generation.number} (revision {snapshot.revision[:12]}) serves new sessions",
          file=sys.stderr)
