"""The work-tree watcher: one save is one reload, and files outside the config folders are ignored."""

from __future__ import annotations

import asyncio
from pathlib import Path

from reconciler.gitops.watching import watch_tree


def test_a_save_triggers_one_reload_and_other_files_none(shipped_tree: Path) -> None:
    async def scenario() -> list[str]:
        calls: list[str] = []
        changed = asyncio.Event()

        async def on_change(reason: str) -> None:
            calls.append(reason)
            changed.set()

        stop = asyncio.Event()
        task = asyncio.create_task(watch_tree(shipped_tree, on_change, stop))
        await asyncio.sleep(0.2)  # let the watcher register before the first write
        (shipped_tree / "notes.txt").write_text("not config")
        (shipped_tree / "config/profiles/.researcher.toml.swp").write_text("editor swap file")
        profile = shipped_tree / "config/profiles/researcher.toml"
        text = profile.read_text()
        for i in range(5):  # an editor's burst of writes on one save
            profile.write_text(text + f"# {i}\n")
        async with asyncio.timeout(5):
            await changed.wait()
        await asyncio.sleep(0.3)  # a second batch, if the burst had been split, would land by now
        stop.set()
        await task
        return calls

    assert asyncio.run(scenario()) == ["watch"]
