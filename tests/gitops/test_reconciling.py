"""The reconcile loop on real trees: apply, keep the last good revision, refuse emptying, record status."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from reconciler.config import FolderSource
from reconciler.gitops.reconciling import ReconcileLoop
from reconciler.gitops.status import read_status
from tests.gitops.swaps import Swaps


def _reconciler(root: Path) -> tuple[ReconcileLoop, Swaps]:
    swaps = Swaps()
    return ReconcileLoop(
        FolderSource(root), swaps, label=f"worktree {root}", status_file=root / ".handler/status.json"
    ), swaps


def test_good_revisions_apply_and_a_broken_one_keeps_the_last_good(shipped_tree: Path) -> None:
    reconciler, swaps = _reconciler(shipped_tree)
    first = asyncio.run(reconciler.reconcile("start"))
    assert (first.result, len(swaps.live)) == ("applied", 1)
    assert reconciler.status.ready

    profile = shipped_tree / "config/profiles/researcher.toml"
    good = profile.read_text()
    profile.write_text(good.replace('"ocr-local"', '"ocr-mistral-perso"'))
    second = asyncio.run(reconciler.reconcile("watch"))
    assert (second.result, len(swaps.live)) == ("applied", 2)
    assert swaps.live[-1].profiles["researcher"].selections["ocr"].binding == "ocr-mistral-perso"
    assert any("researcher: ocr: ocr-local" in c for c in second.changes)

    profile.write_text(good.replace('"ocr-local"', '"ocr-nowhere"'))
    broken = asyncio.run(reconciler.reconcile("watch"))
    assert broken.result == "invalid"
    assert len(swaps.live) == 2  # nothing swapped: the last good revision keeps serving
    assert reconciler.live is swaps.live[-1]
    assert [(f["code"], f["file"]) for f in broken.findings if f["severity"] == "error"] == [
        ("P001", "config/profiles/researcher.toml")
    ]
    status = read_status(shipped_tree / ".handler/status.json")
    assert status is not None
    assert status["ready"] is False
    assert status["applied"]["generation"] == 2
    assert status["lastAttempt"]["revision"] == broken.revision
    assert "still serving" in status["reason"]
    assert [h["result"] for h in status["history"]] == ["invalid", "applied", "applied"]

    profile.write_text(good)
    fixed = asyncio.run(reconciler.reconcile("watch"))
    assert (fixed.result, len(swaps.live)) == ("applied", 3)
    assert reconciler.status.ready


def test_attempts_that_come_to_the_same_are_one_entry_of_the_history_and_the_applied_one_stays(
        shipped_tree: Path) -> None:
    """A poll every 30 s of a broken head (or a deleted branch) filled the ten entries within five minutes and
    pushed the revision applied out of `handler status`."""
    reconciler, _ = _reconciler(shipped_tree)
    assert asyncio.run(reconciler.reconcile("start")).result == "applied"
    profile = shipped_tree / "config/profiles/researcher.toml"
    profile.write_text(profile.read_text().replace('"ocr-local"', '"ocr-nowhere"'))
    for _ in range(12):
        assert asyncio.run(reconciler.reconcile("poll")).result == "invalid"
    status = read_status(shipped_tree / ".handler/status.json")
    assert status is not None
    assert [(h["result"], h.get("repeats", 1)) for h in status["history"]] == [("invalid", 12), ("applied", 1)]
    assert status["history"][0]["first"] < status["history"][0]["time"]
    assert status["lastAttempt"]["repeats"] == 12
    assert asyncio.run(reconciler.reconcile("watch")).result == "invalid"  # another cause: an entry of its own
    assert [h["reason"] for h in reconciler.status.to_dict()["history"]] == ["watch", "poll", "start"]


def test_an_unchanged_tree_is_not_swapped_again(shipped_tree: Path) -> None:
    reconciler, swaps = _reconciler(shipped_tree)
    asyncio.run(reconciler.reconcile("start"))
    again = asyncio.run(reconciler.reconcile("poll"))
    assert again.result == "unchanged"
    assert len(swaps.live) == 1


def test_removing_every_profile_is_refused_unless_org_allows_it(shipped_tree: Path) -> None:
    reconciler, swaps = _reconciler(shipped_tree)
    asyncio.run(reconciler.reconcile("start"))
    saved = {p: p.read_text() for p in (shipped_tree / "config/profiles").iterdir()}
    for path in saved:
        path.unlink()
    refused = asyncio.run(reconciler.reconcile("watch"))
    assert refused.result == "refused"
    assert "allowEmpty" in refused.message
    assert len(swaps.live) == 1
    org = shipped_tree / "config/org.toml"
    org.write_text(org.read_text().replace("allowEmpty = false", "allowEmpty = true"))
    assert asyncio.run(reconciler.reconcile("watch")).result == "applied"
    assert swaps.live[-1].profiles == {}


def test_emptying_one_profile_in_use_is_refused(shipped_tree: Path) -> None:
    reconciler, _swaps = _reconciler(shipped_tree)
    asyncio.run(reconciler.reconcile("start"))
    org = shipped_tree / "config/org.toml"
    org.write_text(
        org.read_text()
        .replace('requires = ["llm/v1"]', "requires = []")
        .replace('services = { llm = "llm-openai" }', "services = {}")
    )
    (shipped_tree / "config/profiles/auditor.toml").write_text(
        'apiVersion = "handler.profile/v1"\nname = "auditor"\ngroup = "research"\nscope = "work/auditor"\n'
    )
    attempt = asyncio.run(reconciler.reconcile("watch"))
    assert attempt.result == "refused", (attempt.message, json.dumps(attempt.findings)[:500])
    assert "auditor" in attempt.message


def test_a_defect_in_the_loader_or_the_swap_is_an_error_attempt_and_the_next_change_applies(
        shipped_tree: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Nothing raised inside reconcile may end whoever follows the source (it did end the work tree's watcher): an
    error of ours is the attempt's result, logged whole, and the last good revision serves on."""
    reconciler, swaps = _reconciler(shipped_tree)
    assert asyncio.run(reconciler.reconcile("start")).result == "applied"
    profile = shipped_tree / "config/profiles/researcher.toml"
    good = profile.read_text()
    real_load = reconciler._loader.load

    def broken_load(source: object) -> object:
        raise RuntimeError("a defect in the loader")

    monkeypatch.setattr(reconciler._loader, "load", broken_load)
    failed = asyncio.run(reconciler.reconcile("watch"))
    assert failed.result == "error"
    assert "the loader failed (RuntimeError('a defect in the loader'))" in failed.message
    monkeypatch.setattr(reconciler._loader, "load", real_load)

    async def broken_swap(snapshot: object) -> int:
        raise RuntimeError("a defect in the swap")

    reconciler._swap = broken_swap
    profile.write_text(good.replace('"ocr-local"', '"ocr-mistral-perso"'))
    refused = asyncio.run(reconciler.reconcile("watch"))
    assert refused.result == "error"
    assert "the router failed to apply it (RuntimeError('a defect in the swap')); still serving" in refused.message
    assert reconciler.live is swaps.live[-1]  # the last good revision
    assert "Traceback" in caplog.text  # both logged whole, for the bug report

    reconciler._swap = swaps
    applied = asyncio.run(reconciler.reconcile("watch"))
    assert (applied.result, len(swaps.live)) == ("applied", 2)


def test_a_failure_each_poll_meets_again_is_logged_once(shipped_tree: Path, caplog: pytest.LogCaptureFixture) -> None:
    """'revision ... not applied' (and a defect's traceback) at every poll filled the service's log."""
    from reconciler.config import HandlerError

    async def refusing(snapshot: object) -> int:
        raise HandlerError("profile p's socket path is 119 bytes long")

    async def failing(snapshot: object) -> int:
        raise RuntimeError("a defect")

    for swap, said in ((refusing, "not applied: profile p's socket path"), (failing, "the router failed to apply")):
        caplog.clear()
        reconciler = ReconcileLoop(FolderSource(shipped_tree), swap, label="t")
        assert asyncio.run(reconciler.reconcile("poll")).result == "error"
        first = [r.getMessage() for r in caplog.records]
        assert any(said in line for line in first), first
        for _ in range(3):
            assert asyncio.run(reconciler.reconcile("poll")).result == "error"
        assert [r.getMessage() for r in caplog.records] == first  # nothing more
        assert reconciler.status.to_dict()["history"][0]["repeats"] == 4
