"""The work-tree watcher: one save is one reload, and files outside the config folders are ignored.

No fixed sleeps: the test waits until the watcher reports a file it writes. Changes are reported
in order, so once a sentinel written after the burst has been reported, any batch the burst could
have been split into has been reported too.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from reconciler.gitops.watching import watch_tree

DEADLINE = 10.0


class Batches:
    """What the watcher reported: the paths of each batch, and why it reconciled."""

    def __init__(self) -> None:
        self.paths: list[set[str]] = []
        self.reasons: list[str] = []

    def note(self, paths: set[str]) -> None:
        self.paths.append(paths)

    async def on_change(self, reason: str) -> None:
        self.reasons.append(reason)

    def naming(self, path: Path) -> int:
        """How many batches named `path`."""
        return sum(1 for batch in self.paths if str(path) in batch)

    async def until_named(self, path: Path, *, rewrite: bool = False) -> None:
        """Wait until a batch names `path`; with `rewrite`, write it again at each look (the watcher may
        not be registered yet when it is first written)."""
        async with asyncio.timeout(DEADLINE):
            while not self.naming(path):
                if rewrite:
                    path.write_text("# a probe\n")
                await asyncio.sleep(0.05)


def test_a_save_triggers_one_reload_and_other_files_none(shipped_tree: Path) -> None:
    root = shipped_tree.resolve()
    profiles = root / "config/profiles"
    profile = profiles / "researcher.toml"

    async def scenario() -> Batches:
        batches = Batches()
        stop = asyncio.Event()
        task = asyncio.create_task(watch_tree(root, batches.on_change, stop, note=batches.note))
        await batches.until_named(profiles / "probe.toml", rewrite=True)  # the watcher is registered
        (root / "notes.txt").write_text("not config")
        (profiles / ".researcher.toml.swp").write_text("editor swap file")
        text = profile.read_text()
        for i in range(5):  # an editor's burst of writes on one save
            profile.write_text(text + f"# {i}\n")
        await batches.until_named(profile)
        (profiles / "sentinel.toml").write_text("# written after the burst was reported\n")
        await batches.until_named(profiles / "sentinel.toml")
        stop.set()
        await task
        return batches

    batches = asyncio.run(scenario())
    assert batches.naming(profile) == 1  # one save, one reload
    assert batches.naming(root / "notes.txt") == 0
    assert batches.naming(profiles / ".researcher.toml.swp") == 0
    assert batches.reasons == ["watch"] * len(batches.paths)
