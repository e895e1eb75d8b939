"""The compiled rulebooks of the latest snapshots: compiled once each, never another snapshot's, none kept alive."""

from __future__ import annotations

import gc
import weakref

from reconciler.governance.rulebook_cache import RulebookCache
from tests.governance.builders import make_snapshot


def test_a_snapshot_is_compiled_once() -> None:
    cache = RulebookCache()
    snapshot = make_snapshot({"p": {}})
    assert cache.rulebook(snapshot) is cache.rulebook(snapshot)


def test_another_snapshot_of_the_same_revision_gets_its_own_rulebook() -> None:
    cache = RulebookCache()
    first, second = make_snapshot({"p": {}}, revision="r1"), make_snapshot({"q": {}}, revision="r1")
    assert cache.rulebook(first).entry("p", "search_query") is not None
    book = cache.rulebook(second)
    assert book.entry("q", "search_query") is not None
    assert book.entry("p", "search_query") is None
    assert cache.rulebook(first).entry("p", "search_query") is not None


def test_the_cache_keeps_no_snapshot_alive() -> None:
    cache = RulebookCache()
    snapshot = make_snapshot({"p": {}})
    cache.rulebook(snapshot)
    gone = weakref.ref(snapshot)
    del snapshot
    gc.collect()
    assert gone() is None
    fresh = make_snapshot({"q": {}})  # the same revision, maybe at the same address: compiled for itself
    assert cache.rulebook(fresh).entry("q", "search_query") is not None


def test_only_the_latest_revisions_are_kept() -> None:
    cache = RulebookCache(keep=2)
    snapshots = [make_snapshot({"p": {}}, revision=f"r{i}") for i in range(3)]
    books = [cache.rulebook(s) for s in snapshots]
    assert cache.rulebook(snapshots[2]) is books[2]
    assert cache.rulebook(snapshots[1]) is books[1]
    assert cache.rulebook(snapshots[0]) is not books[0]  # pushed out by the third, compiled again
