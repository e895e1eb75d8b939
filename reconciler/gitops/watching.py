"""The work-tree source: reconcile whenever a file of the config tree is saved.

watchfiles reports changes in batches; its debounce folds an editor's burst of writes (a temp file,
a rename, a chmod) into one batch, so one save is one reload.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import watchfiles

from reconciler.config.sources import TREE_FOLDERS

__all__ = ["watch_tree"]

log = logging.getLogger("handler.reconciler")


def _in_tree(root: Path) -> Callable[[watchfiles.Change, str], bool]:
    folders = tuple(str(root / f) + "/" for f in TREE_FOLDERS)
    connectors = str(root / "catalog/connectors") + "/"

    def keep(change: watchfiles.Change, path: str) -> bool:
        name = Path(path).name
        if path.startswith(connectors):  # every file of a connector's folder is the tree's, hidden ones too
            return True
        return path.startswith(folders) and not name.startswith(".") and not name.endswith(("~", ".swp", ".tmp"))

    return keep


async def watch_tree(
    root: Path,
    on_change: Callable[[str], Awaitable[object]],
    stop: asyncio.Event,
    debounce_ms: int = 50,
    note: Callable[[set[str]], None] | None = None,
) -> None:
    """Call `on_change("watch")` after each batch of saves under `root`'s config folders, until `stop`.

    `note`, when given, first gets the batch's paths (a `FolderSource` then reads only those).
    """
    root = root.resolve()
    async for changes in watchfiles.awatch(
        root, watch_filter=_in_tree(root), debounce=debounce_ms, step=20, stop_event=stop, recursive=True
    ):
        log.debug("watch: %d change(s), e.g. %s", len(changes), next(iter(changes))[1])
        if note is not None:
            note({path for _, path in changes})
        await on_change("watch")
