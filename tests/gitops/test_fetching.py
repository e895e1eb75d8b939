"""The git source: a mirror of a bare repository, fetched after pushes, read from commits only."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from reconciler.config import SourceError
from reconciler.gitops.fetching import GitMirror
from reconciler.gitops.reconciling import ReconcileLoop
from tests.gitops.swaps import Swaps


def test_pushed_commits_are_applied_and_broken_ones_are_not(
    remote: tuple[Path, Path], tmp_path: Path, git: Callable[..., str]
) -> None:
    bare, clone = remote
    mirror = GitMirror(str(bare), "main", tmp_path / "state/mirror")
    swaps = Swaps()
    reconciler = ReconcileLoop(mirror, swaps, label=f"git {bare}@main")
    first = asyncio.run(reconciler.reconcile("start"))
    assert first.result == "applied"
    assert first.revision == git(clone, "rev-parse", "HEAD")

    profile = clone / "config/profiles/researcher.toml"
    good = profile.read_text()
    profile.write_text(good.replace('"ocr-local"', '"ocr-mistral-perso"'))
    git(clone, "commit", "-qam", "researcher reads with mistral")
    git(clone, "push", "-q", "origin", "HEAD:main")
    assert asyncio.run(reconciler.reconcile("poll")).result == "unchanged"  # not fetched yet
    mirror.fetch()
    swapped = asyncio.run(reconciler.reconcile("webhook"))
    assert swapped.result == "applied"
    assert swaps.live[-1].profiles["researcher"].selections["ocr"].binding == "ocr-mistral-perso"

    profile.write_text(good.replace('"ocr-local"', '"ocr-missing"'))
    git(clone, "commit", "-qam", "a typo")
    git(clone, "push", "-q", "origin", "HEAD:main")
    mirror.fetch()
    broken = asyncio.run(reconciler.reconcile("webhook"))
    assert broken.result == "invalid"
    assert broken.revision == git(clone, "rev-parse", "HEAD")
    assert len(swaps.live) == 2

    profile.write_text(good)
    git(clone, "commit", "-qam", "fix")
    git(clone, "push", "-q", "origin", "HEAD:main")
    mirror.fetch()
    assert asyncio.run(reconciler.reconcile("webhook")).result == "applied"
    assert swaps.live[-1].profiles["researcher"].selections["ocr"].binding == "ocr-local"


def test_an_unreachable_remote_is_a_source_error(tmp_path: Path) -> None:
    mirror = GitMirror(str(tmp_path / "nowhere.git"), "main", tmp_path / "mirror")
    with pytest.raises(SourceError, match="cannot fetch"):
        mirror.fetch()
